package cluster

import (
	"fmt"
	"os"
	"path/filepath"
)

// UpReady is the one line `hams up` prints (docs/design.md command-line contract).
type UpReady struct {
	FrontendGRPC  string `json:"frontend_grpc"`
	FrontendHTTP  string `json:"frontend_http"`
	TFServingGRPC string `json:"tfserving_grpc,omitempty"`
	KServeGRPC    string `json:"kserve_grpc,omitempty"`
	Manager       string `json:"manager"`
	NATS          string `json:"nats"`
	// Frontends lists every frontend's gRPC address (frontend_grpc is
	// the first), FrontendsHTTP their HTTP addresses, Managers every
	// manager (manager is the first, active at start; the others stand
	// by).
	Frontends     []string `json:"frontends"`
	FrontendsHTTP []string `json:"frontends_http"`
	Managers      []string `json:"managers"`
	// FrontendInternal is the first frontend's internal address
	// (Dataplane, Replication: for the deployment's components, never for
	// clients), FrontendsInternal every frontend's.
	FrontendInternal  string   `json:"frontend_internal,omitempty"`
	FrontendsInternal []string `json:"frontends_internal,omitempty"`
	// Metrics maps every child process (its supervisor name: manager-0,
	// frontend-0, sidecar:MODEL, modelserver:MODEL, ...) to its Prometheus
	// /metrics address (docs/operations.md).
	Metrics map[string]string `json:"metrics"`
	// BackendsNotReady lists the models whose backend did not answer its
	// health check within backendWait (upbackends.go); absent when all did.
	BackendsNotReady []string `json:"backends_not_ready,omitempty"`
	// Dashboard is the first manager's dashboard URL, Dashboards every
	// manager's (docs/dashboard.md); absent with --dashboard "".
	Dashboard  string   `json:"dashboard,omitempty"`
	Dashboards []string `json:"dashboards,omitempty"`
}

// MetricsAddrs maps every running child of d to the /metrics address of
// its ready line.
func (d *Deployment) MetricsAddrs() map[string]string {
	out := map[string]string{}
	for _, name := range d.Supervisor.Names() {
		if r, ok := d.Supervisor.Ready(name); ok && r.String("metrics") != "" {
			out[name] = r.String("metrics")
		}
	}
	return out
}

// PrepareAudit creates the audit directory and returns its absolute path
// (children run with their own working directory in mind).
func PrepareAudit(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("audit dir %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return "", fmt.Errorf("create audit dir: %w", err)
	}
	return abs, nil
}
