package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hams-go/hams/internal/coord"
	"github.com/hams-go/hams/internal/natsd"
)

// NATSReplicas is the replica count of the coordination streams and
// buckets: flag when set, else 3 when url lists more than one server (a
// cluster: hams nats takes a comma-separated list), else 1. coord.Open never
// lowers an existing stream's count, so a component that defaults to 1
// against a cluster's R3 streams leaves them R3.
func NATSReplicas(url string, flag int) int {
	if flag > 0 {
		return flag
	}
	if len(SplitList(url)) > 1 {
		return 3
	}
	return 1
}

// openCoord connects to the deployment's NATS without credentials (see
// openCoordAuth).
func openCoord(ctx context.Context, url, deployment, name string, log *slog.Logger) (*coord.Coord, *nats.Conn, error) {
	return OpenCoordAuth(ctx, url, deployment, name, nil, log)
}

// OpenCoordAuth is openCoordReplicas with the replica count url implies
// (natsReplicas).
func OpenCoordAuth(ctx context.Context, url, deployment, name string, cl *natsd.Client, log *slog.Logger) (*coord.Coord, *nats.Conn, error) {
	return OpenCoordReplicas(ctx, url, NATSReplicas(url, 0), deployment, name, cl, log)
}

// OpenCoordReplicas connects to the deployment's NATS (the manager's
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
func OpenCoordReplicas(ctx context.Context, url string, replicas int, deployment, name string, cl *natsd.Client, log *slog.Logger) (*coord.Coord, *nats.Conn, error) {
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
