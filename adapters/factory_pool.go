package adapters

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/pki"
	"github.com/hams-go/hams/protocol/parity"
	"github.com/hams-go/hams/sidecar"
	"github.com/hams-go/hams/sidecar/pool"
)

// newPoolBackend builds the replica pool of model m from the addresses in
// the deployment: the data instances (replicas, plus the parity slots as
// copies of the model under er and hedge) and the parity instances
// (parm). run must run for the pool to serve; closeAll releases the
// connections.
func NewPool(dep *config.Deployment, m *config.Model, role string, log *slog.Logger, reg prometheus.Registerer, tlsSrc *pki.Source) (_ *pool.Pool, run func(context.Context) error, closeAll func(), err error) {
	var closers []func()
	closeAll = func() {
		for _, c := range closers {
			c()
		}
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	if len(m.Replicas.Addresses) == 0 {
		return nil, nil, nil, fmt.Errorf("model %q: replicas has no addresses (a deployment started by hams up or demo fills them in)", m.Name)
	}
	red, err := poolRedundancy(m.Redundancy)
	if err != nil {
		return nil, nil, nil, err
	}
	dial := func(mm *config.Model, addr, name string) (sidecar.Backend, error) {
		be, closeBE, err := New(dep, mm, addr, name, log, tlsSrc)
		if err != nil {
			return nil, fmt.Errorf("model %q: instance %s at %s: %w", m.Name, name, addr, err)
		}
		closers = append(closers, closeBE)
		return be, nil
	}
	cfg := pool.Config{Model: m.Name, Redundancy: red, HedgeAfter: m.HedgeAfter.D(), CallTimeout: m.Backend.Timeout.D(), Logger: log, Registry: reg}
	dataAddrs := m.Replicas.Addresses
	if p := m.Parity; p != nil && (red == parity.RedundancyER || red == parity.RedundancyHedge) {
		dataAddrs = append(append([]string(nil), dataAddrs...), p.Backends.Addresses...)
	}
	for i, a := range dataAddrs {
		be, err := dial(m, a, role+"-r"+strconv.Itoa(i))
		if err != nil {
			return nil, nil, nil, err
		}
		cfg.Data = append(cfg.Data, be)
	}
	if red == parity.RedundancyParM {
		p := m.Parity
		if cfg.Code, err = parity.NewCode(p.K, p.R); err != nil {
			return nil, nil, nil, fmt.Errorf("model %q: %w", m.Name, err)
		}
		if cfg.Encoder, err = parity.ParseEncoder(p.Encoder); err != nil {
			return nil, nil, nil, fmt.Errorf("model %q: %w", m.Name, err)
		}
		if len(p.Image) == 3 {
			cfg.Image = [3]int{p.Image[0], p.Image[1], p.Image[2]}
		}
		cfg.DecodeAfter, cfg.FillAfter = p.DecodeAfter.D(), p.FillAfter.D()
		if p.Train == "online" {
			oc := &pool.OnlineConfig{Seed: 1}
			if o := p.Online; o != nil {
				oc = &pool.OnlineConfig{Arch: o.Arch, Buffer: o.Buffer, Holdout: o.Holdout, MinSamples: o.MinSamples, Every: o.Every.D(),
					Epochs: o.Epochs, Workers: o.Workers, MinAgreement: o.MinAgreement, Seed: 1}
			}
			cfg.Online = oc
		}
		cfg.ParityModel = p.Model
		for j := range p.R {
			cfg.ParityModels = append(cfg.ParityModels, p.ModelName(j))
		}
		pm := *m
		pm.Backend.Model = p.Model
		for i, a := range p.Backends.Addresses {
			be, err := dial(&pm, a, role+"-p"+strconv.Itoa(i))
			if err != nil {
				return nil, nil, nil, err
			}
			cfg.Parity = append(cfg.Parity, be)
		}
	}
	pl, err := pool.New(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	return pl, pl.Run, closeAll, nil
}

// poolRedundancy maps the config's redundancy onto the protocol's.
func poolRedundancy(r config.Redundancy) (parity.Redundancy, error) {
	switch r {
	case config.RedundancyNone, "":
		return parity.RedundancyNone, nil
	case config.RedundancyER:
		return parity.RedundancyER, nil
	case config.RedundancyHedge:
		return parity.RedundancyHedge, nil
	case config.RedundancyParM:
		return parity.RedundancyParM, nil
	}
	return 0, fmt.Errorf("redundancy %q is not one of none, er, hedge, parm", r)
}
