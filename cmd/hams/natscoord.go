package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hams-go/hams/internal/coord"
)

// openCoord connects to the deployment's NATS (the manager's embedded
// server or an external cluster) and opens the coordination streams. The
// connection reconnects forever (a restarted manager comes back on the
// same address); the first connect is retried until ctx ends.
func openCoord(ctx context.Context, url, deployment, name string, log *slog.Logger) (*coord.Coord, *nats.Conn, error) {
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
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS %s: %w", url, err)
	}
	for {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		co, err := coord.Open(octx, nc, deployment, 1)
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
