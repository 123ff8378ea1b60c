package cluster

// Restoring redundancy across processes: the `hams up|demo|chaos` parent
// serves the instance agent (internal/agent) on loopback and passes its
// URL to the managers as --starter; a start is startForRecovery. Both
// managers of an active/standby pair get the same URL; only the active one
// ever calls it.

import (
	"context"
	"fmt"

	"github.com/hams-go/hams/internal/agent"
	"github.com/hams-go/hams/internal/config"
)

func newAgent(d *Deployment) (*agent.Server, error) {
	cfg := agent.ServerConfig{
		Valid: func(model, _ string) bool { return d.Config.Model(model) != nil },
		Start: func(ctx context.Context, model, roleName string) (agent.Response, error) {
			role, err := config.ParseRole(roleName)
			if err != nil {
				return agent.Response{}, fmt.Errorf("start instance of %s: %w", model, err)
			}
			in, err := d.startForRecovery(ctx, model, role)
			if err != nil {
				return agent.Response{}, err
			}
			return agent.Response{Sidecar: in.SidecarAddr, ID: in.ID, Epoch: in.Epoch}, nil
		},
		TLS:    d.pki.supervisorSource(),
		Logger: d.Log,
	}
	return agent.Serve(cfg)
}
