package main

import (
	"github.com/hams-go/hams/internal/natsd"
)

// runNATS is the `hams nats` role: the embedded coordination engine as a
// process of its own (a JetStream-enabled nats-server, R1, file storage),
// so that it outlives the managers. `hams up|demo|chaos` start it first
// and restart it in place (same port, same store) when it dies; every
// manager, frontend and sidecar gets its URL with --nats.
func runNATS(args []string) error {
	fs := newFlagSet("nats")
	listen := fs.String("listen", "127.0.0.1:4222", "client address (port -1: random)")
	store := fs.String("store", "", "JetStream store directory (required)")
	syncAlways := fs.Bool("sync-always", false, "fsync every JetStream write before acknowledging it (docs/coordination.md)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	logFormat := fs.String("log-format", "json", "log format on stderr: json or text")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *store == "" {
		return usageErr("nats: --store is required")
	}
	log, err := newLogger(*logLevel, *logFormat)
	if err != nil {
		return err
	}
	log = log.With("role", "nats")
	srv, err := natsd.New(natsd.Config{Listen: *listen, StoreDir: *store, SyncAlways: *syncAlways, Logger: log})
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	ctx, stop := signalContext()
	defer stop()
	g := newGroup(ctx)
	g.Go("nats", srv.Run)
	select {
	case <-srv.Ready():
	case <-g.ctx.Done():
		if err := g.Wait(); err != nil {
			return err
		}
		return nil
	}
	printReady(map[string]any{"role": "nats", "nats": srv.URL(), "store": *store})
	log.Info("serving", "nats", srv.URL(), "store", *store)
	if err := g.Wait(); err != nil {
		log.Error("stopped with error", "err", err)
		return err
	}
	log.Info("stopped")
	return nil
}
