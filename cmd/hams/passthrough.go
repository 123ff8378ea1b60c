package main

import (
	"context"
	"fmt"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/launch"
)

// Pass-through models (config.Deployment.PassThrough: ha: off, stateless,
// alone in their service, a TF Serving or KServe v2 backend) run without
// a sidecar, standby or backup: the frontend forwards their calls to the
// backend itself (frontend/passthrough.go), so the frontend needs the
// backend's address in the deployment file it reads.

// hasSidecar reports whether model m runs behind a sidecar.
func hasSidecar(dep *config.Deployment, m *config.Model) bool { return !dep.PassThrough(m.Name) }

// startPassThrough starts, before any component reads the deployment
// file, the backend of every pass-through model without a
// backend.address (one per model, restarted in place on its address: the
// model has no HA), and writes the effective deployment again with their
// addresses.
func (d *deployment) startPassThrough(ctx context.Context) error {
	started := false
	for i := range d.dep.Models {
		m := &d.dep.Models[i]
		if !d.dep.PassThrough(m.Name) {
			continue
		}
		if !managed(m) {
			d.ModelServers[m.Name] = m.Backend.Address
			continue
		}
		name := childName(roleModelServer, m.Name)
		args, key, err := d.backendArgsFor(m, name, true)
		if err != nil {
			return err
		}
		r, err := d.sup.Start(ctx, launch.Spec{Name: name, Args: args, Restart: backendRestart(args, key)})
		if err != nil {
			return fmt.Errorf("start %s (backend of pass-through model %s): %w", name, m.Name, err)
		}
		m.Backend.Address = r.String(key)
		d.ModelServers[m.Name] = m.Backend.Address
		started = true
		d.log.Info("pass-through backend started", "model", m.Name, "addr", m.Backend.Address)
	}
	if !started {
		return nil
	}
	return writeDeployment(d.dep, d.cfgPath)
}
