package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/hams-go/hams/internal/config"
)

// The deployment's shape in compose: as `hams up` starts it (cmd/hams
// deploy.go startDeployment), one container per process.
const (
	natsNodes = 3
	managers  = 2
	frontends = 2

	natsClientPort = 4222
	natsRoutePort  = 6222
	managerPort    = 7000
	sidecarPort    = 7100
	modelPort      = 7200
	internalPort   = 8600 // a frontend's internal gRPC (Dataplane, Replication)

	image   = "hams-go-compose:latest"
	cfgPath = "/examples/" // + the config's base name
	secrets = "/secrets"
)

// pod is one model instance: a model-server container (owning the
// network and IPC namespaces) and its sidecar's container.
type pod struct {
	model string
	// role as started: primary (the serving instance, on the data path),
	// backup or standby (spares, started after every primary).
	role config.Role
}

// name is the pod's compose service (the model server's) and host name.
func (p pod) name() string    { return p.model + "-" + p.role.String() }
func (p pod) sidecar() string { return p.name() + "-sidecar" }

type layout struct {
	dep     *config.Deployment
	cfgFile string // path inside the image
	pods    []pod
}

// layoutOf lists the pods of dep as startDeployment does: a primary per
// model, a backup and a spare backup (standby) per stateful model, a hot
// standby per stateless model placed with one.
func layoutOf(dep *config.Deployment) (*layout, error) {
	l := &layout{dep: dep}
	if !dep.RunMode().Protected() {
		return nil, errors.New("mode bare has no backups or standbys: the compose deployment is for a protected mode")
	}
	for _, m := range dep.Models {
		if m.Pooled() || m.Backend.Address != "" || (m.Backend.Type != "" && m.Backend.Type != "reference") {
			return nil, fmt.Errorf("model %q: the compose generator starts reference model servers only (no pools, no external backends)", m.Name)
		}
		l.pods = append(l.pods, pod{m.Name, config.RolePrimary})
		switch {
		case m.Stateful:
			l.pods = append(l.pods, pod{m.Name, config.RoleBackup}, pod{m.Name, config.RoleStandby})
		case dep.HasStandby(m.Name):
			l.pods = append(l.pods, pod{m.Name, config.RoleStandby})
		}
	}
	return l, nil
}

func natsName(i int) string     { return fmt.Sprintf("nats-%d", i) }
func managerName(i int) string  { return fmt.Sprintf("manager-%d", i) }
func frontendName(i int) string { return fmt.Sprintf("frontend-%d", i) }

// hostNames are the services' DNS names (the certificates' SANs).
func (l *layout) hostNames() []string {
	var out []string
	for i := range natsNodes {
		out = append(out, natsName(i))
	}
	for i := range managers {
		out = append(out, managerName(i))
	}
	for i := range frontends {
		out = append(out, frontendName(i))
	}
	for _, p := range l.pods {
		out = append(out, p.name())
	}
	return out
}

// identities are the --identity values of `hams certs`: one certificate
// per container (NAME=ROLE/MODEL/INSTANCE), the files NAME.crt, NAME.key.
func (l *layout) identities() []string {
	var out []string
	for i := range natsNodes {
		out = append(out, fmt.Sprintf("%s=nats//%d", natsName(i), i))
	}
	for i := range managers {
		out = append(out, fmt.Sprintf("%s=manager//%d", managerName(i), i))
	}
	for i := range frontends {
		out = append(out, fmt.Sprintf("%s=frontend//%d", frontendName(i), i))
	}
	for _, p := range l.pods {
		out = append(out, fmt.Sprintf("%s=sidecar/%s/%s", p.sidecar(), p.model, p.name()),
			fmt.Sprintf("%s=modelserver/%s/%s", p.name(), p.model, p.name()))
	}
	return out
}

func runGen(args []string) error {
	fs := flag.NewFlagSet("gen", flag.ContinueOnError)
	cfg := fs.String("config", "examples/ap.yaml", "deployment YAML (its base name must be under examples/: the image has /examples)")
	out := fs.String("out", "", "write here (default stdout)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dep, err := config.Load(*cfg)
	if err != nil {
		return err
	}
	l, err := layoutOf(dep)
	if err != nil {
		return err
	}
	base := (*cfg)[strings.LastIndex(*cfg, "/")+1:]
	l.cfgFile = cfgPath + base
	text := l.compose(base)
	if *out == "" {
		_, err = os.Stdout.WriteString(text)
		return err
	}
	return os.WriteFile(*out, []byte(text), 0o644)
}
