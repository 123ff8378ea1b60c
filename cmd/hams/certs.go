package main

// Certificates. `hams certs` creates a deployment's CA and per-component
// certificates (for deployments run by hand, compose, Kubernetes without
// cert-manager). `hams up|demo|chaos|bench` create their own under
// <run dir>/certs unless --insecure: each child process gets a
// certificate of its own identity (--tls-cert/--tls-key/--tls-ca) and
// only this process holds the CA key, so a stolen component certificate
// speaks for that component only.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

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
	return p.issuer.Source(certFileName(name), id)
}

// files issues (once per name) the certificate of id for child name.
func (p *deployPKI) files(name string, id pki.Identity) (pki.Files, error) {
	return p.issuer.Files(certFileName(name), id)
}

// certFileName makes a child name (role:model.i) a file name.
func certFileName(name string) string { return launch.FileName(name) }

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

// directSource is the identity of bench's direct chain towards model m's
// model server: a sidecar of m (nil when insecure or m's backend is a
// Clipper stub, which has no internal TLS).
func (d *deployment) directSource(m string) (*pki.Source, error) {
	if d.pki == nil {
		return nil, nil
	}
	if mc := d.dep.Model(m); mc == nil || !d.backendTLS(mc) {
		return nil, nil
	}
	return d.pki.source("bench-direct-"+m, sidecarIdentity(m, "bench"))
}

// natsAuthArgs name the NATS credentials directory for a child that
// connects to NATS (none when insecure).
func (d *deployment) natsAuthArgs() []string {
	if d.natsAuth == "" {
		return nil
	}
	return []string{"--nats-auth", d.natsAuth}
}

// tlsArgs are the flags that give the child process name its identity
// (--insecure when the deployment runs without).
func (d *deployment) tlsArgs(name string, id pki.Identity) ([]string, error) {
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
func sidecarIdentity(model, instance string) pki.Identity {
	return pki.Identity{Role: pki.RoleSidecar, Model: model, Instance: certFileName(instance)}
}

func modelServerIdentity(instance string, models ...string) pki.Identity {
	id := pki.Identity{Role: pki.RoleModelServer, Instance: certFileName(instance)}
	if len(models) > 0 {
		id.Model, id.Models = models[0], models[1:]
	}
	return id
}

// runCerts is `hams certs`.
func runCerts(args []string) error {
	fs := newFlagSet("certs")
	dir := fs.String("dir", "certs", "directory of the CA (ca.crt, ca.key: created when missing) and the certificates")
	deployment := fs.String("deployment", "", "deployment name (default: the --config file's)")
	cfgPath := fs.String("config", "", "deployment YAML: issue the default set for it (manager, frontend, nats, admin, supervisor, and a sidecar and a model server per model)")
	var ids stringList
	fs.Var(&ids, "identity", "issue a certificate for NAME=ROLE[/MODEL[/INSTANCE]] (repeatable; roles: manager, frontend, sidecar, modelserver, supervisor, nats, admin)")
	hosts := fs.String("hosts", "127.0.0.1,localhost", "comma-separated DNS names and IPs for the certificates' SANs (host-name verifying clients: NATS tools, curl)")
	validity := fs.Duration("validity", pki.DefaultCertValidity, "certificate lifetime")
	jsonOut := fs.String("json", "", "write the issued files as JSON to this file")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	type want struct {
		name string
		id   pki.Identity
	}
	var wants []want
	if *cfgPath != "" {
		dep, err := loadDeployment(*cfgPath)
		if err != nil {
			return &exitError{code: 2, err: err}
		}
		if *deployment == "" {
			*deployment = dep.Name
		}
		wants = append(wants, want{"manager", pki.Identity{Role: pki.RoleManager}}, want{"frontend", pki.Identity{Role: pki.RoleFrontend}},
			want{"nats", pki.Identity{Role: pki.RoleNATS}}, want{"admin", pki.Identity{Role: pki.RoleAdmin}}, want{"supervisor", pki.Identity{Role: pki.RoleSupervisor}})
		for _, m := range dep.Models {
			wants = append(wants, want{"sidecar-" + m.Name, sidecarIdentity(m.Name, "")}, want{"modelserver-" + m.Name, modelServerIdentity("", m.Name)})
		}
	}
	for _, s := range ids {
		name, spec, ok := strings.Cut(s, "=")
		if !ok || name == "" {
			return usageErr("certs: --identity %q: want NAME=ROLE[/MODEL[/INSTANCE]]", s)
		}
		parts := strings.Split(spec, "/")
		role, err := pki.ParseRole(parts[0])
		if err != nil {
			return usageErr("certs: --identity %q: %v", s, err)
		}
		id := pki.Identity{Role: role}
		if len(parts) > 1 {
			id.Model = parts[1]
		}
		if len(parts) > 2 {
			id.Instance = parts[2]
		}
		if len(parts) > 3 {
			return usageErr("certs: --identity %q: too many segments", s)
		}
		wants = append(wants, want{name, id})
	}
	if *deployment == "" {
		return usageErr("certs: --deployment or --config is required")
	}
	if len(wants) == 0 {
		return usageErr("certs: nothing to issue: give --config or --identity")
	}
	if err := (pki.Identity{Deployment: *deployment, Role: pki.RoleAdmin}).Validate(); err != nil {
		return usageErr("certs: --deployment: %v", err)
	}
	ca, err := pki.LoadOrCreateCA(*dir, *deployment, time.Now())
	if err != nil {
		return err
	}
	out := map[string]pki.Files{}
	for _, w := range wants {
		w.id.Deployment = *deployment
		pair, err := ca.Issue(w.id, splitList(*hosts), time.Now(), *validity)
		if err != nil {
			return usageErr("certs: %s: %v", w.name, err)
		}
		f, err := pair.Write(*dir, certFileName(w.name))
		if err != nil {
			return err
		}
		out[w.name] = f
		fmt.Printf("%-28s %s  (%s, %s)\n", w.name, w.id, f.Cert, f.Key)
	}
	fmt.Printf("CA: %s (its key %s stays with the operator; components get ca.crt only)\n", filepath.Join(*dir, pki.CACertFile), filepath.Join(*dir, pki.CAKeyFile))
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(out, "", "  ")
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("certs: --json: %w", err)
		}
	}
	return nil
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }
