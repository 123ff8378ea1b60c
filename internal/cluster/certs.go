package cluster

// Certificates. `hams certs` creates a deployment's CA and per-component
// certificates (for deployments run by hand, compose, Kubernetes without
// cert-manager). `hams up|demo|chaos|bench` create their own under
// <run dir>/certs unless --insecure: each child process gets a
// certificate of its own identity (--tls-cert/--tls-key/--tls-ca) and
// only this process holds the CA key, so a stolen component certificate
// speaks for that component only.

import (
	"github.com/hams-go/hams/internal/launch"
	"github.com/hams-go/hams/internal/pki"
)

// deployPKI is the certificate issuer of a deployment this process
// starts, with this process's own identities.
type deployPKI struct {
	issuer *pki.Issuer
	// supervisor is this process's identity towards the managers (failure
	// reports, topology reads) and the manager's calls to its instance
	// agent; admin its identity for operator calls (describe, warm-up).
	supervisor, admin *pki.Source
}

// newDeployPKI creates (or reuses) the CA in dir and this process's own
// certificates.
func newDeployPKI(dir, deployment string) (*deployPKI, error) {
	is, err := pki.NewIssuer(dir, deployment, []string{"127.0.0.1", "localhost", "::1"})
	if err != nil {
		return nil, err
	}
	p := &deployPKI{issuer: is}
	if p.supervisor, err = p.source("supervisor", pki.Identity{Role: pki.RoleSupervisor}); err != nil {
		return nil, err
	}
	if p.admin, err = p.source("admin", pki.Identity{Role: pki.RoleAdmin}); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *deployPKI) source(name string, id pki.Identity) (*pki.Source, error) {
	return p.issuer.Source(CertFileName(name), id)
}

// files issues (once per name) the certificate of id for child name.
func (p *deployPKI) files(name string, id pki.Identity) (pki.Files, error) {
	return p.issuer.Files(CertFileName(name), id)
}

// CertFileName makes a child name (role:model.i) a file name.
func CertFileName(name string) string { return launch.FileName(name) }

// supervisorSource is this process's supervisor identity (nil when
// insecure).
func (p *deployPKI) supervisorSource() *pki.Source {
	if p == nil {
		return nil
	}
	return p.supervisor
}

// adminSource is this process's operator identity (nil when insecure).
func (p *deployPKI) adminSource() *pki.Source {
	if p == nil {
		return nil
	}
	return p.admin
}

// DirectSource is the identity of bench's direct chain towards model m's
// model server: a sidecar of m (nil when insecure or m's backend is a
// Clipper stub, which has no internal TLS).
func (d *Deployment) DirectSource(m string) (*pki.Source, error) {
	if d.pki == nil {
		return nil, nil
	}
	if mc := d.Config.Model(m); mc == nil || !d.backendTLS(mc) {
		return nil, nil
	}
	return d.pki.source("bench-direct-"+m, SidecarIdentity(m, "bench"))
}

// natsAuthArgs name the NATS credentials directory for a child that
// connects to NATS (none when insecure).
func (d *Deployment) natsAuthArgs() []string {
	if d.natsAuth == "" {
		return nil
	}
	return []string{"--nats-auth", d.natsAuth}
}

// tlsArgs are the flags that give the child process name its identity
// (--insecure when the deployment runs without).
func (d *Deployment) tlsArgs(name string, id pki.Identity) ([]string, error) {
	if d.pki == nil {
		return []string{"--insecure"}, nil
	}
	f, err := d.pki.files(name, id)
	if err != nil {
		return nil, err
	}
	return []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA}, nil
}

// identity helpers for the children.
func SidecarIdentity(model, instance string) pki.Identity {
	return pki.Identity{Role: pki.RoleSidecar, Model: model, Instance: CertFileName(instance)}
}

func ModelServerIdentity(instance string, models ...string) pki.Identity {
	id := pki.Identity{Role: pki.RoleModelServer, Instance: CertFileName(instance)}
	if len(models) > 0 {
		id.Model, id.Models = models[0], models[1:]
	}
	return id
}
