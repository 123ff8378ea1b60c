package sidecar

import (
	"context"
	"errors"
	"fmt"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/protocol/nspb"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// StatefulBackend is a Backend whose model keeps state across batches and
// splits a step into Compute (outputs from the installed state, next state
// staged) and Update (installs the staged state), so the sidecar can copy
// state n while batch n+1 computes (paper IV-B). adapters/reference
// implements it over hamsv1.ModelRuntime.
type StatefulBackend interface {
	Backend
	Compute(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error)
	Update(ctx context.Context, batchID uint64) error
	// ReadState returns the installed state (never a half-updated one) as
	// the model's state tensors in order, and its version.
	ReadState(ctx context.Context) (tensors []*hamsv1.Tensor, version uint64, err error)
	// WriteState overwrites the installed state and sets its version
	// (backup apply, rollback, demotion).
	WriteState(ctx context.Context, tensors []*hamsv1.Tensor, version uint64) error
}

// PinnedStateReader is an optional StatefulBackend extension for the
// non-stop modes. ReadStatePinned is ReadState that calls pinned once the
// backend has captured the installed state: an Update issued after pinned
// was called no longer changes what this read returns (the backend either
// keeps the captured version aside or holds the Update until the read
// ends). Large states then stop delaying the next update for the whole
// transfer. It also returns the hex SHA-256 of the state bytes when the
// backend verified one ("" otherwise), so the shipper need not hash again.
type PinnedStateReader interface {
	ReadStatePinned(ctx context.Context, pinned func()) (tensors []*hamsv1.Tensor, version uint64, digest string, err error)
}

// StateRangeWriter is an optional StatefulBackend extension of backends
// whose Describe has state_delta: WriteStateRanges patches byte ranges of
// the concatenated state (specs) into the installed state, which must be
// version base, and sets version. A backup uses it to write only what
// delta snapshots changed.
type StateRangeWriter interface {
	WriteStateRanges(ctx context.Context, specs []*hamsv1.TensorSpec, base, version uint64, ranges []*hamsv1.StateRange) error
}

// DigestStateWriter is an optional StatefulBackend extension:
// WriteStateDigest is WriteState with the hex SHA-256 of the tensors'
// bytes already known (a backup verified it on receipt).
type DigestStateWriter interface {
	WriteStateDigest(ctx context.Context, tensors []*hamsv1.Tensor, version uint64, digest string) error
}

// Coord carries the protocol's notices (satisfied by *coord.Coord).
type Coord interface {
	// Announce publishes that n.Model is durable up to n.DurableSeq.
	Announce(ctx context.Context, n *hamsv1.DurabilityNotice) error
	// WatchDurable calls fn for the last notice of each of models and for
	// every later one until ctx ends.
	WatchDurable(ctx context.Context, models []string, fn func(*hamsv1.DurabilityNotice)) error
	// WatchCompleted calls fn for every completion notice from now on.
	WatchCompleted(ctx context.Context, fn func(*hamsv1.CompletionNotice)) error
}

// BackupResolver finds a stateful model's backup sidecar (implemented by
// the manager client).
type BackupResolver interface {
	// ResolveBackup returns the gRPC address of the sidecar of model's
	// backup (it serves hamsv1.Replication) and its epoch.
	ResolveBackup(model string) (addr string, epoch uint64, ok bool)
}

// DefaultOutputLogBytes bounds a stateful primary's output log.
const DefaultOutputLogBytes = 256 << 20

// replicationOf decides whether cfg.Model is replicated as primary + backup
// (stateful, ha stateful, a mode that replicates: config.Replicated) and
// checks what that needs. Mode replay is not NSPB's: its stateful models
// run as in bare mode here.
func replicationOf(cfg Config, role config.Role) (nspb.Mode, bool, StatefulBackend, error) {
	m := cfg.Deployment.Model(cfg.Model)
	run := cfg.Deployment.RunMode()
	mode := nspb.Bare
	if run.Replicates() {
		var err error
		// The pipeline's modes are named as the deployment's (one list,
		// in protocol/nspb).
		if mode, err = nspb.ParseMode(string(run)); err != nil {
			return 0, false, nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
	}
	replicated := config.Replicated(m, run)
	if !replicated {
		if role == config.RoleBackup && !replayEnabled(cfg) {
			return 0, false, nil, fmt.Errorf("%w: role backup for model %q, which is not replicated (stateful %v, ha %q, mode %q)",
				ErrConfig, cfg.Model, m.Stateful, m.HA, cfg.Deployment.Mode)
		}
		return mode, false, nil, nil
	}
	var errs []error
	sbe, ok := cfg.Backend.(StatefulBackend)
	if !ok {
		errs = append(errs, fmt.Errorf("%w: model %q is replicated but its backend %T has no Compute/Update/ReadState/WriteState", ErrConfig, cfg.Model, cfg.Backend))
	}
	if cfg.Coord == nil {
		errs = append(errs, fmt.Errorf("%w: replicated model %q needs a Coord", ErrConfig, cfg.Model))
	}
	if role == config.RolePrimary && cfg.BackupResolver == nil {
		errs = append(errs, fmt.Errorf("%w: primary of replicated model %q needs a BackupResolver", ErrConfig, cfg.Model))
	}
	if len(errs) > 0 {
		return 0, false, nil, errors.Join(errs...)
	}
	return mode, true, sbe, nil
}
