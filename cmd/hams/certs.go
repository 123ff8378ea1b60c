package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/harness"
	"github.com/hams-go/hams/internal/pki"
)

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
		dep, err := cluster.LoadDeployment(*cfgPath)
		if err != nil {
			return &harness.ExitError{Code: 2, Err: err}
		}
		if *deployment == "" {
			*deployment = dep.Name
		}
		wants = append(wants, want{"manager", pki.Identity{Role: pki.RoleManager}}, want{"frontend", pki.Identity{Role: pki.RoleFrontend}},
			want{"nats", pki.Identity{Role: pki.RoleNATS}}, want{"admin", pki.Identity{Role: pki.RoleAdmin}}, want{"supervisor", pki.Identity{Role: pki.RoleSupervisor}})
		for _, m := range dep.Models {
			wants = append(wants, want{"sidecar-" + m.Name, cluster.SidecarIdentity(m.Name, "")}, want{"modelserver-" + m.Name, cluster.ModelServerIdentity("", m.Name)})
		}
	}
	for _, s := range ids {
		name, spec, ok := strings.Cut(s, "=")
		if !ok || name == "" {
			return harness.Usagef("certs: --identity %q: want NAME=ROLE[/MODEL[/INSTANCE]]", s)
		}
		parts := strings.Split(spec, "/")
		role, err := pki.ParseRole(parts[0])
		if err != nil {
			return harness.Usagef("certs: --identity %q: %v", s, err)
		}
		id := pki.Identity{Role: role}
		if len(parts) > 1 {
			id.Model = parts[1]
		}
		if len(parts) > 2 {
			id.Instance = parts[2]
		}
		if len(parts) > 3 {
			return harness.Usagef("certs: --identity %q: too many segments", s)
		}
		wants = append(wants, want{name, id})
	}
	if *deployment == "" {
		return harness.Usagef("certs: --deployment or --config is required")
	}
	if len(wants) == 0 {
		return harness.Usagef("certs: nothing to issue: give --config or --identity")
	}
	if err := (pki.Identity{Deployment: *deployment, Role: pki.RoleAdmin}).Validate(); err != nil {
		return harness.Usagef("certs: --deployment: %v", err)
	}
	ca, err := pki.LoadOrCreateCA(*dir, *deployment, time.Now())
	if err != nil {
		return err
	}
	out := map[string]pki.Files{}
	for _, w := range wants {
		w.id.Deployment = *deployment
		pair, err := ca.Issue(w.id, cluster.SplitList(*hosts), time.Now(), *validity)
		if err != nil {
			return harness.Usagef("certs: %s: %v", w.name, err)
		}
		f, err := pair.Write(*dir, cluster.CertFileName(w.name))
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

func (s *stringList) String() string { return strings.Join(*s, ",") }

func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }
