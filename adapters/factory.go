// Package adapters holds the backend adapters, one package per backend
// behind the interface the sidecar owns (sidecar.Backend): reference,
// tfserving, triton, clipper. This package is their factory: New builds
// the adapter a model's deployment entry names, NewPool the ParM pool of
// a pooled model.
package adapters

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

// newBackend builds the sidecar's backend for model m at addr. role names
// the instance (primary or backup) so shared-memory keys of two instances
// on one host do not collide. The returned close releases the connection.
func New(dep *config.Deployment, m *config.Model, addr, role string, log *slog.Logger, tlsSrc *pki.Source) (sidecar.Backend, func(), error) {
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
		if m.Stateful && Managed(m) {
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
		if m.Stateful && Managed(m) {
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

// Managed reports whether m's backend is started by the deployment's
// orchestrator (a deployment file without a backend address: see
// config.Backend.Address).
func Managed(m *config.Model) bool { return m.Backend.Address == "" }
