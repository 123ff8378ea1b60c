package harness

import (
	"slices"
	"strings"

	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/config"
)

// CheckMode rejects unknown and not yet implemented modes.
func CheckMode(mode string) error {
	if !slices.Contains(config.Modes, mode) {
		return Usagef("--mode %q: unknown mode (one of %s)", mode, strings.Join(config.Modes, ", "))
	}
	if !slices.Contains(cluster.ImplementedModes, mode) {
		return Usagef("--mode %s: not implemented in this build (it runs %s)", mode, strings.Join(cluster.ImplementedModes, ", "))
	}
	return nil
}

// checkModeFlag checks a --mode flag that may be left out (empty: the
// deployment file's mode, applyModeFlag).
func checkModeFlag(flag string) error {
	if flag == "" {
		return nil
	}
	return CheckMode(flag)
}

// setCheckpointEvery applies a --checkpoint-every flag (0: keep the
// deployment's replay.checkpoint_every).
func setCheckpointEvery(dep *config.Deployment, n int) error {
	if n == 0 {
		return nil
	}
	if n < 0 {
		return Usagef("--checkpoint-every %d: must be positive", n)
	}
	dep.Replay.CheckpointEvery = n
	if err := dep.Validate(); err != nil {
		return Usagef("--checkpoint-every %d: %v", n, err)
	}
	return nil
}
