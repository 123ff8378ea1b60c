package main

import (
	"crypto/tls"
	"flag"

	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/harness"
	"github.com/hams-go/hams/internal/natsd"
	"github.com/hams-go/hams/internal/pki"
	"github.com/hams-go/hams/manager"
)

// natsAuthFlags name a component's NATS credentials: the directory
// holding its seed (natsd.SeedFile: <role>.nk, sidecar-<model>.nk; the
// directory `hams up` writes holds every role's, a real deployment gives
// each component a directory with its own seed only).
//
// They also carry --nats-replicas, the replica count of everything the
// component creates in JetStream (natsReplicas).
type natsAuthFlags struct {
	dir      string
	replicas int
}

func (f *natsAuthFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.dir, "nats-auth", "", "NATS credentials directory with this component's nkey seed (<role>.nk or sidecar-<model>.nk, written by `hams up`; docs/security.md); empty: connect to NATS without authentication")
	fs.IntVar(&f.replicas, "nats-replicas", 0, "replicas of the JetStream streams and buckets this component creates (1..5); 0: 3 when --nats lists more than one server, else 1")
}

// replicasFor is --nats-replicas, or its default for url.
func (f *natsAuthFlags) replicasFor(url string) int { return cluster.NATSReplicas(url, f.replicas) }

// client loads the credentials of id, with src's client certificate for
// a NATS server with TLS (src nil: plaintext). Nil without --nats-auth.
func (f *natsAuthFlags) client(id natsd.Identity, src *pki.Source) (*natsd.Client, error) {
	if f.dir == "" {
		return nil, nil
	}
	var tc *tls.Config
	if src != nil {
		tc = src.ClientConfig()
	}
	cl, err := natsd.LoadClient(f.dir, id, tc)
	if err != nil {
		return nil, &harness.ExitError{Code: 2, Err: err}
	}
	return cl, nil
}

// managerAuth is the manager's manager.NATSAuth: its own credentials and,
// for the embedded server (external false), the users of the directory.
// Nil without --nats-auth.
func (f *natsAuthFlags) managerAuth(deployment string, src *pki.Source, external bool) (*manager.NATSAuth, error) {
	cl, err := f.client(natsd.Identity{Role: natsd.RoleManager, Deployment: deployment}, src)
	if err != nil || cl == nil {
		return nil, err
	}
	a := &manager.NATSAuth{Client: cl}
	if !external {
		if a.Users, err = natsd.LoadAuth(f.dir); err != nil {
			return nil, &harness.ExitError{Code: 2, Err: err}
		}
	}
	return a, nil
}
