package config

import "time"

// Replay-mode defaults (mode "replay", the Lineage-Stash-style baseline).
const (
	// DefaultCheckpointEvery is the number of batches between two
	// checkpoints of a stateful model in replay mode. The HAMS paper ran
	// Lineage Stash with a checkpoint per 150 requests; the examples batch
	// up to 8 requests, so 50 batches is of that order.
	DefaultCheckpointEvery = 50
	// DefaultCheckpointIdle is how long a stateful model in replay mode
	// may be idle with batches not covered by a checkpoint before it
	// checkpoints them.
	DefaultCheckpointIdle = 100 * time.Millisecond
)

// Replay configures mode "replay": a stateful model's sidecar logs every
// batch it executes and checkpoints the model state every CheckpointEvery
// batches (and after CheckpointIdle without a batch); a replacement loads
// the latest checkpoint and re-executes the logged batches after it.
// Ignored in the other modes.
type Replay struct {
	// CheckpointEvery is the checkpoint interval in batches (default
	// DefaultCheckpointEvery, 1..1000000).
	CheckpointEvery int `yaml:"checkpoint_every"`
	// CheckpointIdle: batches not yet covered by a checkpoint are
	// checkpointed once the model has been idle this long (default
	// DefaultCheckpointIdle; at least 1ms).
	CheckpointIdle Duration `yaml:"checkpoint_idle"`
}

func (r *Replay) applyDefaults() {
	if r.CheckpointEvery == 0 {
		r.CheckpointEvery = DefaultCheckpointEvery
	}
	if r.CheckpointIdle == 0 {
		r.CheckpointIdle = Duration(DefaultCheckpointIdle)
	}
}

func (r *Replay) validate() []error {
	var errs []error
	if r.CheckpointEvery < 1 || r.CheckpointEvery > 1_000_000 {
		errs = append(errs, invalid("replay.checkpoint_every %d out of range 1..1000000", r.CheckpointEvery))
	}
	if r.CheckpointIdle.D() < time.Millisecond {
		errs = append(errs, invalid("replay.checkpoint_idle %v is below 1ms", r.CheckpointIdle.D()))
	}
	return errs
}

// Replays reports whether model m runs in replay mode: stateful, ha
// stateful, deployment mode replay (a primary that logs its inputs and
// checkpoints to JetStream, and a spare that replays them on failure).
func (d *Deployment) Replays(m *Model) bool {
	return m != nil && m.Stateful && m.HA == "stateful" && d.RunMode().Replays()
}
