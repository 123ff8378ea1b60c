package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/launch"
	"github.com/hams-go/hams/internal/pki"
	"github.com/hams-go/hams/protocol/parity"
	"github.com/hams-go/hams/sidecar"
	"github.com/hams-go/hams/sidecar/pool"
)

// poolBackendAddr is what a pooled model's sidecar is given as --backend
// and registers as its backend address: its instances are in the
// deployment file (replicas, parity.backends).
const poolBackendAddr = "pool"

// newPoolBackend builds the replica pool of model m from the addresses in
// the deployment: the data instances (replicas, plus the parity slots as
// copies of the model under er and hedge) and the parity instances
// (parm). run must run for the pool to serve; closeAll releases the
// connections.
func newPoolBackend(dep *config.Deployment, m *config.Model, role string, log *slog.Logger, reg prometheus.Registerer, tlsSrc *pki.Source) (_ *pool.Pool, run func(context.Context) error, closeAll func(), err error) {
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
		be, closeBE, err := newBackend(dep, mm, addr, name, log, tlsSrc)
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

// Child names of a pool's servers.
const (
	rolePoolReplica = "pool-replica"
	rolePoolParity  = "pool-parity"
)

// startPools starts, before any component reads the deployment file, the
// model servers of every replica pool whose instances are a count (its
// replicas and its parity slots: parity models under parm, copies of the
// model under er and hedge), each restarted in place on its address (a
// pool instance is not failed over: the pool routes around it while it is
// down), and writes the effective deployment again with their addresses.
func (d *deployment) startPools(ctx context.Context) error {
	started := false
	for i := range d.dep.Models {
		m := &d.dep.Models[i]
		if !m.Pooled() {
			continue
		}
		if m.Replicas.Managed() {
			if m.Backend.Type == "clipper" {
				return fmt.Errorf("model %q: replicas: N starts reference model servers; a clipper pool lists its query frontends' addresses", m.Name)
			}
			addrs, err := d.startPoolServers(ctx, m, rolePoolReplica, m.Replicas.Count, nil)
			if err != nil {
				return err
			}
			// The schedule went to the servers' command lines; the
			// effective file lists addresses only.
			m.Replicas, m.Straggle = config.Instances{Addresses: addrs}, nil
			started = true
			d.startedPools[m.Name] = true
		}
		if p := m.Parity; p != nil && p.Backends.Managed() && m.Redundancy.UsesParitySlots() {
			var extra []string
			if m.Redundancy == config.RedundancyParM {
				extra = []string{"--parity-of", m.Name}
			}
			addrs, err := d.startPoolServers(ctx, m, rolePoolParity, p.Backends.Count, extra)
			if err != nil {
				return err
			}
			p.Backends = config.Instances{Addresses: addrs}
			started = true
			d.startedPools[m.Name] = true
		}
	}
	if !started {
		return nil
	}
	return writeDeployment(d.dep, d.cfgPath)
}

// startPoolServers starts n model servers of m in parallel (role names the
// children) and returns their addresses in index order. Replicas named by
// m.Straggle get its --straggle schedule.
func (d *deployment) startPoolServers(ctx context.Context, m *config.Model, role string, n int, extra []string) ([]string, error) {
	addrs := make([]string, n)
	errs := make([]error, n)
	done := make(chan struct{}, n)
	for i := range n {
		go func() {
			defer func() { done <- struct{}{} }()
			name := childName(role, m.Name) + "." + strconv.Itoa(i)
			ta, err := d.tlsArgs(name, modelServerIdentity(name, m.Name))
			if err != nil {
				errs[i] = err
				return
			}
			args := append([]string{"modelserver", "--models", m.Name}, d.common...)
			args = append(append(args, ta...), extra...)
			if role == rolePoolReplica && m.Straggle != nil && containsInt(m.Straggle.Replicas, i) {
				args = append(args, "--straggle", m.Straggle.Spec)
			}
			r, err := d.sup.Start(ctx, launch.Spec{Name: name, Args: args, Restart: relisten(args, "")})
			if err != nil {
				errs[i] = fmt.Errorf("start %s: %w", name, err)
				return
			}
			addrs[i] = r.String("grpc")
		}()
	}
	for range n {
		<-done
	}
	return addrs, errors.Join(errs...)
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// parityModelsOf returns the model configs a parity server hosts for pool
// model m: parity model j (j < r) named parity.ModelName(j), with
// parity.kind and parity.params (weights parity.WeightsParam(j)), or the
// deployed model's own kind and params when parity.kind is unset (exact
// for a linear model without bias, whose sum encoder already weighs the
// queries by the coefficients of j).
func parityModelsOf(m *config.Model) ([]config.Model, error) {
	if m.Parity == nil {
		return nil, fmt.Errorf("model %q has no parity block", m.Name)
	}
	var out []config.Model
	for j := range m.Parity.R {
		pm := *m
		pm.Name = m.Parity.ModelName(j)
		pm.Backend.Model = pm.Name
		if m.Parity.Kind != "" {
			pm.Kind, pm.Params = m.Parity.Kind, maps.Clone(m.Parity.Params)
			if w := m.Parity.WeightsParam(j); w != "" {
				pm.Params["weights"] = w
			}
		}
		pm.Replicas, pm.Parity, pm.Straggle, pm.Redundancy = config.Instances{}, nil, nil, ""
		out = append(out, pm)
	}
	return out, nil
}

// poolSummary names a pool's instances for logs and registration.
func poolSummary(m *config.Model) string {
	s := strings.Join(m.Replicas.Addresses, ",")
	if m.Parity != nil && len(m.Parity.Backends.Addresses) > 0 {
		s += ";parity:" + strings.Join(m.Parity.Backends.Addresses, ",")
	}
	return s
}
