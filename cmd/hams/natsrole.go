package main

import (
	"crypto/tls"
	"strings"

	"github.com/hams-go/hams/internal/natsd"
)

// runNATS is the `hams nats` role: the embedded coordination engine as a
// process of its own (a JetStream-enabled nats-server, R1, file storage),
// so that it outlives the managers. `hams up|demo|chaos` start it first
// and restart it in place (same port, same store) when it dies; every
// manager, frontend and sidecar gets its URL with --nats.
//
// Security: --nats-auth names the credentials directories (one per
// deployment served; natsd.GenerateCredentials writes them, the server
// reads only their users.json): only those nkey users connect, each with
// its role's subject permissions (natsd.Permissions). --tls-cert,
// --tls-key and --tls-ca make the client port mutual TLS. Without either
// the server is open (--insecure says so explicitly; both are logged).
func runNATS(args []string) error {
	fs := newFlagSet("nats")
	listen := fs.String("listen", "127.0.0.1:4222", "client address (port -1: random)")
	store := fs.String("store", "", "JetStream store directory (required)")
	syncAlways := fs.Bool("sync-always", false, "fsync every JetStream write before acknowledging it (docs/coordination.md)")
	authDirs := fs.String("nats-auth", "", "comma-separated NATS credentials directories (users.json of each deployment served, as `hams up` writes them): only their nkey users connect, with their role's subject permissions (docs/security.md); empty: no authentication")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	logFormat := fs.String("log-format", "json", "log format on stderr: json or text")
	var tf tlsFlags
	tf.register(fs)
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
	var serverTLS *tls.Config
	if tf.insecure || tf.cert != "" || tf.key != "" || tf.ca != "" {
		src, err := tf.load("nats", log)
		if err != nil {
			return err
		}
		if src != nil {
			serverTLS = src.ServerConfig()
		}
	}
	var auth *natsd.Auth
	if *authDirs != "" {
		if tf.insecure {
			return usageErr("nats: --insecure and --nats-auth exclude each other")
		}
		if auth, err = natsd.LoadAuth(splitList(*authDirs)...); err != nil {
			return &exitError{code: 2, err: err}
		}
		log.Info("NATS users", "users", len(auth.Users), "credentials", *authDirs)
	}
	srv, err := natsd.New(natsd.Config{Listen: *listen, StoreDir: *store, SyncAlways: *syncAlways, TLS: serverTLS, Auth: auth, Logger: log})
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
	printReady(map[string]any{"role": "nats", "nats": srv.URL(), "store": *store,
		"tls": serverTLS != nil, "auth": strings.Join(splitList(*authDirs), ",")})
	log.Info("serving", "nats", srv.URL(), "store", *store, "tls", serverTLS != nil, "auth", auth != nil)
	if err := g.Wait(); err != nil {
		log.Error("stopped with error", "err", err)
		return err
	}
	log.Info("stopped")
	return nil
}
