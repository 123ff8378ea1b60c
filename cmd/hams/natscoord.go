package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hams-go/hams/internal/coord"
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
func (f *natsAuthFlags) replicasFor(url string) int { return natsReplicas(url, f.replicas) }

// natsReplicas is the replica count of the coordination streams and
// buckets: flag when set, else 3 when url lists more than one server (a
// cluster: nats.go takes a comma-separated list), else 1. coord.Open never
// lowers an existing stream's count, so a component that defaults to 1
// against a cluster's R3 streams leaves them R3.
func natsReplicas(url string, flag int) int {
	if flag > 0 {
		return flag
	}
	if len(splitList(url)) > 1 {
		return 3
	}
	return 1
}

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
		return nil, &exitError{code: 2, err: err}
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
			return nil, &exitError{code: 2, err: err}
		}
	}
	return a, nil
}

// openCoord connects to the deployment's NATS without credentials (see
// openCoordAuth).
func openCoord(ctx context.Context, url, deployment, name string, log *slog.Logger) (*coord.Coord, *nats.Conn, error) {
	return openCoordAuth(ctx, url, deployment, name, nil, log)
}

// openCoordAuth is openCoordReplicas with the replica count url implies
// (natsReplicas).
func openCoordAuth(ctx context.Context, url, deployment, name string, cl *natsd.Client, log *slog.Logger) (*coord.Coord, *nats.Conn, error) {
	return openCoordReplicas(ctx, url, natsReplicas(url, 0), deployment, name, cl, log)
}

// openCoordReplicas connects to the deployment's NATS (the manager's
// embedded server, `hams nats`, or a cluster: url may list several
// servers) and opens the coordination streams with replicas copies. The
// connection reconnects forever (a restarted manager comes back on the
// same address); the first connect is retried until ctx ends.
//
// With credentials (cl non-nil) the component authenticates with its
// nkey (and TLS when cl has it) and binds the streams (coord.Bind): only
// the manager may create or change them (natsd.Permissions), so a
// component that starts first waits for the manager to have created
// them. Without credentials it creates them itself (coord.Open).
func openCoordReplicas(ctx context.Context, url string, replicas int, deployment, name string, cl *natsd.Client, log *slog.Logger) (*coord.Coord, *nats.Conn, error) {
	opts := []nats.Option{
		nats.Name("hams " + name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("nats reconnected", "url", nc.ConnectedUrl()) }),
	}
	open := func(ctx context.Context, nc *nats.Conn) (*coord.Coord, error) {
		return coord.Open(ctx, nc, deployment, replicas)
	}
	if cl != nil {
		if id := cl.Identity(); id.Deployment != deployment {
			return nil, nil, fmt.Errorf("NATS credentials are %s, not of deployment %q", id, deployment)
		}
		opts = append(opts, cl.Options()...)
		// Permission violations are the server's answer to a request
		// the table does not allow: log them (the request itself only
		// times out).
		opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Warn("nats error", "err", err)
		}))
		if cl.Identity().Role != natsd.RoleManager {
			open = func(ctx context.Context, nc *nats.Conn) (*coord.Coord, error) {
				return coord.Bind(ctx, nc, deployment)
			}
		}
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS %s: %w", url, err)
	}
	for {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		co, err := open(octx, nc)
		cancel()
		if err == nil {
			return co, nc, nil
		}
		if ctx.Err() != nil {
			nc.Close()
			return nil, nil, fmt.Errorf("open coordination streams on %s: %w", url, err)
		}
		log.Warn("open coordination streams; retrying", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}
