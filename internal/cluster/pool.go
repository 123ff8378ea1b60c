package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/launch"
)

// poolBackendAddr is what a pooled model's sidecar is given as --backend
// and registers as its backend address: its instances are in the
// deployment file (replicas, parity.backends).
const poolBackendAddr = "pool"

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
func (d *Deployment) startPools(ctx context.Context) error {
	started := false
	for i := range d.Config.Models {
		m := &d.Config.Models[i]
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
	return WriteDeployment(d.Config, d.cfgPath)
}

// startPoolServers starts n model servers of m in parallel (role names the
// children) and returns their addresses in index order. Replicas named by
// m.Straggle get its --straggle schedule.
func (d *Deployment) startPoolServers(ctx context.Context, m *config.Model, role ChildRole, n int, extra []string) ([]string, error) {
	addrs := make([]string, n)
	errs := make([]error, n)
	done := make(chan struct{}, n)
	for i := range n {
		go func() {
			defer func() { done <- struct{}{} }()
			name := ChildName(role, m.Name) + "." + strconv.Itoa(i)
			ta, err := d.tlsArgs(name, ModelServerIdentity(name, m.Name))
			if err != nil {
				errs[i] = err
				return
			}
			args := append([]string{"modelserver", "--models", m.Name}, d.common...)
			args = append(append(args, ta...), extra...)
			if role == rolePoolReplica && m.Straggle != nil && containsInt(m.Straggle.Replicas, i) {
				args = append(args, "--straggle", m.Straggle.Spec)
			}
			r, err := d.Supervisor.Start(ctx, launch.Spec{Name: name, Args: args, Restart: relisten(args, "")})
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

// ParityModelsOf returns the model configs a parity server hosts for pool
// model m: parity model j (j < r) named parity.ModelName(j), with
// parity.kind and parity.params (weights parity.WeightsParam(j)), or the
// deployed model's own kind and params when parity.kind is unset (exact
// for a linear model without bias, whose sum encoder already weighs the
// queries by the coefficients of j).
func ParityModelsOf(m *config.Model) ([]config.Model, error) {
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

// PoolSummary names a pool's instances for logs and registration.
func PoolSummary(m *config.Model) string {
	s := strings.Join(m.Replicas.Addresses, ",")
	if m.Parity != nil && len(m.Parity.Backends.Addresses) > 0 {
		s += ";parity:" + strings.Join(m.Parity.Backends.Addresses, ",")
	}
	return s
}
