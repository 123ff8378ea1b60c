package cluster

import (
	"context"
	"fmt"

	"github.com/hams-go/hams/adapters"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/launch"
)

// hasSidecar reports whether model m runs behind a sidecar.
func hasSidecar(dep *config.Deployment, m *config.Model) bool { return !dep.PassThrough(m.Name) }

// startPassThrough starts, before any component reads the deployment
// file, the backend of every pass-through model without a
// backend.address (one per model, restarted in place on its address: the
// model has no HA), and writes the effective deployment again with their
// addresses.
func (d *Deployment) startPassThrough(ctx context.Context) error {
	started := false
	for i := range d.Config.Models {
		m := &d.Config.Models[i]
		if !d.Config.PassThrough(m.Name) {
			continue
		}
		if !adapters.Managed(m) {
			d.ModelServers[m.Name] = m.Backend.Address
			continue
		}
		name := ChildName(RoleModelServer, m.Name)
		args, key, err := d.backendArgsFor(m, name, true)
		if err != nil {
			return err
		}
		r, err := d.Supervisor.Start(ctx, launch.Spec{Name: name, Args: args, Restart: backendRestart(args, key)})
		if err != nil {
			return fmt.Errorf("start %s (backend of pass-through model %s): %w", name, m.Name, err)
		}
		m.Backend.Address = r.String(key)
		d.ModelServers[m.Name] = m.Backend.Address
		started = true
		d.Log.Info("pass-through backend started", "model", m.Name, "addr", m.Backend.Address)
	}
	if !started {
		return nil
	}
	return WriteDeployment(d.Config, d.cfgPath)
}
