package main

import (
	"slices"
	"strings"

	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/config"
)

// checkMode rejects unknown and not yet implemented modes.
func checkMode(mode string) error {
	if !slices.Contains(config.Modes, mode) {
		return usageErr("--mode %q: unknown mode (one of %s)", mode, strings.Join(config.Modes, ", "))
	}
	if !slices.Contains(cluster.ImplementedModes, mode) {
		return usageErr("--mode %s: not implemented in this build (it runs %s)", mode, strings.Join(cluster.ImplementedModes, ", "))
	}
	return nil
}
