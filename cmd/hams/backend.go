package main

import (
	"github.com/hams-go/hams/internal/config"
)

// setCheckpointEvery applies a --checkpoint-every flag (0: keep the
// deployment's replay.checkpoint_every).
func setCheckpointEvery(dep *config.Deployment, n int) error {
	if n == 0 {
		return nil
	}
	if n < 0 {
		return usageErr("--checkpoint-every %d: must be positive", n)
	}
	dep.Replay.CheckpointEvery = n
	if err := dep.Validate(); err != nil {
		return usageErr("--checkpoint-every %d: %v", n, err)
	}
	return nil
}
