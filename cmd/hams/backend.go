package main

import (
	"fmt"
	"log/slog"

	"google.golang.org/grpc"

	"github.com/hams-go/hams/adapters/clipper"
	"github.com/hams-go/hams/adapters/reference"
	"github.com/hams-go/hams/adapters/tfserving"
	"github.com/hams-go/hams/adapters/triton"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/cuda"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/hamsmd"
	"github.com/hams-go/hams/internal/pki"
	"github.com/hams-go/hams/internal/shm"
	"github.com/hams-go/hams/refserver/models"
	"github.com/hams-go/hams/sidecar"
)

// replicated reports whether model m of dep runs as primary + backup: a
// stateful model with ha stateful under an NSPB-family mode (the sidecar's
// own rule, sidecar.replicationOf; replay's stateful models run as in bare
// mode).
func replicated(dep *config.Deployment, m *config.Model) bool {
	return m != nil && m.Stateful && m.HA == "stateful" && dep.RunMode().Replicates()
}

// spared reports whether model m of dep runs in replay mode (stateful, ha
// stateful, mode replay): a primary that logs its inputs and checkpoints
// to JetStream, plus a spare instance (started in the backup role, with a
// model server of its own) that replays them when the primary fails.
func spared(dep *config.Deployment, m *config.Model) bool { return dep.Replays(m) }

// hasBackup reports whether model m of dep gets a second instance in the
// backup role: an NSPB-family backup or a replay-mode spare.
func hasBackup(dep *config.Deployment, m *config.Model) bool {
	return replicated(dep, m) || spared(dep, m)
}

// coordinated reports whether dep's processes need the coordination engine
// (durability and completion notices, replay mode's log and checkpoints):
// some model is replicated or runs in replay mode.
func coordinated(dep *config.Deployment) bool {
	for i := range dep.Models {
		if hasBackup(dep, &dep.Models[i]) {
			return true
		}
	}
	return false
}

// newBackend builds the sidecar's backend for model m at addr. role names
// the instance (primary or backup) so shared-memory keys of two instances
// on one host do not collide. The returned close releases the connection.
func newBackend(dep *config.Deployment, m *config.Model, addr, role string, log *slog.Logger, tlsSrc *pki.Source) (sidecar.Backend, func(), error) {
	maxMsg := dep.Limits.MaxMessageBytes
	// Calls that run a batch carry its requests' identity (hamsmd: the
	// sidecar is the Source on its context). tlsSrc: a HAMS model server
	// with certificates (mutual TLS; nil: plaintext).
	dial := func() (*grpc.ClientConn, error) {
		opts := []grpc.DialOption{grpc.WithChainUnaryInterceptor(hamsmd.UnaryClientInterceptor())}
		if tlsSrc != nil {
			opts = append(opts, grpcx.DialTLS(tlsSrc))
		}
		return grpcx.Dial(addr, maxMsg, opts...)
	}
	switch m.Backend.Type {
	case "", "reference":
		cc, err := dial()
		if err != nil {
			return nil, nil, err
		}
		be := reference.New(cc, m.Backend.Model, m.Backend.Timeout.D())
		return be, func() { be.Close(); cc.Close() }, nil
	case "triton":
		cc, err := dial()
		if err != nil {
			return nil, nil, err
		}
		cfg := triton.Config{Conn: cc, Model: m.Backend.Model, Version: m.Backend.Version, Timeout: m.Backend.Timeout.D(),
			KeyPrefix: "hams-" + shm.KeyPart(m.Name) + "-" + role, Logger: log, TypedInputs: m.Backend.TypedInputs}
		if m.Stateful && managed(m) {
			// The backend is our reference model server: its explicit
			// state starts where the internal-state model would (zeros
			// for lstm, the seeded weights for olearn), not at zeros.
			init, err := models.InitialState(m)
			if err != nil {
				cc.Close()
				return nil, nil, fmt.Errorf("model %q: initial state: %w", m.Name, err)
			}
			cfg.InitialState = init
		}
		if m.Stateful {
			mem := triton.StateMemory{Kind: m.Backend.StateMemory, Device: m.Backend.CUDADevice}
			if mem.Kind == triton.MemoryCUDA {
				// Fail at start, naming why, rather than at the first
				// Describe (which the sidecar would retry forever): the
				// adapter never falls back to system shared memory.
				if err := probeCUDA(mem.Device); err != nil {
					cc.Close()
					return nil, nil, fmt.Errorf("model %q: backend state_memory cuda: %w", m.Name, err)
				}
			}
			be, err := triton.NewStateful(cfg, triton.WithStateMemory(mem))
			if err != nil {
				cc.Close()
				return nil, nil, err
			}
			return be, func() { be.Close(); cc.Close() }, nil
		}
		be, err := triton.New(cfg)
		if err != nil {
			cc.Close()
			return nil, nil, err
		}
		return be, func() { cc.Close() }, nil
	case "tfserving":
		cc, err := dial()
		if err != nil {
			return nil, nil, err
		}
		cfg := tfserving.ConfigFrom(m.Backend)
		cfg.Logger = log
		if m.Stateful && managed(m) {
			// As for triton: our reference model server's explicit state
			// starts where the internal-state model would.
			init, err := models.InitialState(m)
			if err != nil {
				cc.Close()
				return nil, nil, fmt.Errorf("model %q: initial state: %w", m.Name, err)
			}
			cfg.InitialState = init
		}
		be, err := tfserving.New(cc, cfg)
		if err != nil {
			cc.Close()
			return nil, nil, err
		}
		return be, func() { cc.Close() }, nil
	case "clipper":
		cfg, err := clipper.ConfigFrom(m.Backend)
		if err != nil {
			return nil, nil, fmt.Errorf("model %q: %w", m.Name, err)
		}
		cfg.Address = addr
		cfg.Logger = log
		be, err := clipper.New(cfg)
		if err != nil {
			return nil, nil, err
		}
		return be, func() { be.Close() }, nil
	}
	return nil, nil, fmt.Errorf("model %q: backend type %q is not one of %v", m.Name, m.Backend.Type, config.BackendTypes)
}

// probeCUDA opens and releases CUDA device ordinal: no usable driver or
// no such device is an error that says which.
func probeCUDA(ordinal int) error {
	d, err := cuda.Open(ordinal)
	if err != nil {
		return err
	}
	return d.Close()
}

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
