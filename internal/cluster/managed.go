package cluster

import (
	"fmt"

	"google.golang.org/grpc"

	"github.com/hams-go/hams/adapters"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/launch"
)

// ExternalAddr is m's backend address when it is a server this process
// does not start, else "".
// A pooled model's instances are started by startPools (or listed):
// its sidecar gets no model server of its own.
func ExternalAddr(m *config.Model) string {
	if m.Pooled() {
		return poolBackendAddr
	}
	return m.Backend.Address
}

// LoadDeployment reads and validates a deployment file.
func LoadDeployment(path string) (*config.Deployment, error) { return config.Load(path) }

// ParseDeployment decodes and validates a deployment.
func ParseDeployment(b []byte) (*config.Deployment, error) { return config.Parse(b) }

// backendArgs is the command line of the backend this process starts for
// m (common: --config and --log-level) and the ready-line key of its
// address: a reference model server (reference, triton and tfserving
// backends: it serves hams/v1 ModelRuntime, KServe v2 and TF Serving on
// one gRPC port) or, for clipper, the Clipper query-frontend stub.
func backendArgs(m *config.Model, common []string) (args []string, key string) {
	if m.Backend.Type == "clipper" {
		return append([]string{"clipper-stub", "--models", m.Name}, common...), "http"
	}
	return append([]string{"modelserver", "--models", m.Name}, common...), "grpc"
}

// backendArgsFor are backendArgs with the model server's identity
// (instance names the child), or --insecure for one that must stay
// plaintext (a pass-through backend stands for the operator's own TF
// Serving or Triton, which the frontend dials as it is); a Clipper stub
// takes neither.
func (d *Deployment) backendArgsFor(m *config.Model, instance string, plain bool) (args []string, key string, err error) {
	args, key = backendArgs(m, d.common)
	if m.Backend.Type == "clipper" {
		return args, key, nil
	}
	if plain {
		return append(args, "--insecure"), key, nil
	}
	ta, err := d.tlsArgs(instance, ModelServerIdentity(instance, m.Name))
	if err != nil {
		return nil, "", err
	}
	return append(args, ta...), key, nil
}

// backendTLS reports whether m's model servers were started by this
// process with certificates (a sidecar then dials them with mutual TLS).
func (d *Deployment) backendTLS(m *config.Model) bool {
	if d.pki == nil || m.Backend.Type == "clipper" {
		return false
	}
	if m.Pooled() {
		return d.startedPools[m.Name]
	}
	return adapters.Managed(m)
}

// backendTLSArgs tell a sidecar to dial its backend with mutual TLS when
// this process started that backend with a certificate.
func (d *Deployment) backendTLSArgs(m *config.Model) []string {
	if d.backendTLS(m) {
		return []string{"--backend-tls"}
	}
	return nil
}

// AdminDialOpts are the options of this process's own calls to model m's
// model servers (describe, warm-up): its admin identity where they have
// certificates.
func (d *Deployment) AdminDialOpts(m *config.Model) []grpc.DialOption {
	if m == nil || !d.backendTLS(m) {
		return nil
	}
	return []grpc.DialOption{grpcx.DialTLS(d.pki.admin)}
}

// backendRestart restarts a started backend on the address it had (key:
// the ready-line key of that address).
func backendRestart(args []string, key string) func(launch.Ready) []string {
	if key == "grpc" {
		return relisten(args, "")
	}
	return func(last launch.Ready) []string {
		out := append([]string(nil), args...)
		if a := last.String(key); a != "" {
			out = append(out, "--listen", a)
		}
		if a := last.String("metrics"); a != "" {
			out = append(out, "--metrics", a)
		}
		return out
	}
}

// OnlyService returns d reduced to service svc and its models (bench runs
// each service of a file as its own deployment).
func OnlyService(d *config.Deployment, svc string) (*config.Deployment, error) {
	s := d.Service(svc)
	if s == nil {
		return nil, fmt.Errorf("no service %q in deployment %q", svc, d.Name)
	}
	keep := map[string]bool{}
	for _, m := range s.Graph().Models() {
		keep[m] = true
	}
	out := *d
	out.Services = []config.Service{*s}
	out.Models = nil
	for _, m := range d.Models {
		if keep[m.Name] {
			out.Models = append(out.Models, m)
		}
	}
	return &out, nil
}
