package main

import (
	"crypto/tls"
	"strings"

	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/harness"
	"github.com/hams-go/hams/internal/natsd"
	"github.com/hams-go/hams/internal/pki"
)

// parseSignedSize is natsd.ParseSize with a leading minus allowed (-1:
// no check).
func parseSignedSize(s string) (int64, error) {
	if t := strings.TrimSpace(s); strings.HasPrefix(t, "-") {
		n, err := natsd.ParseSize(t[1:])
		return -max(n, 1), err
	}
	return natsd.ParseSize(s)
}

// runNATS is the `hams nats` role: the embedded coordination engine as a
// process of its own (a JetStream-enabled nats-server, file storage), so
// that it outlives the managers. `hams up|demo|chaos` start it first and
// restart it in place (same port, same store) when it dies; every
// manager, frontend and sidecar gets its URL with --nats.
//
// Cluster: --cluster HOST:PORT (the route port), --routes (the
// nats-route:// URLs of the nodes, this one's may be listed) and --name
// (unique per node) make it one node of a JetStream cluster; components
// then get every node's URL and create streams and buckets with
// --nats-replicas 3 (docs/coordination.md). With certificates the routes
// are mutual TLS, and a route's peer must hold a NATS server certificate
// of the deployment (natsd.RouteTLS): that is the routes' authentication.
//
// Disk: the store's file system must have --store-min-free available at
// start (else it exits, naming both sizes); a JetStream whose store
// failed a write (a full disk) is restarted in place once that much is
// free again (natsd.Server.Run).
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
	name := fs.String("name", "", "server name, unique per node of a cluster (JetStream's server_name; default hams-nats)")
	clusterAddr := fs.String("cluster", "", "route address HOST:PORT: join a JetStream cluster (with --routes and --name)")
	clusterName := fs.String("cluster-name", natsd.DefaultClusterName, "cluster name, the same on every node")
	routes := fs.String("routes", "", "comma-separated nats-route://HOST:PORT of the cluster's nodes (this node's own may be listed)")
	minFree := fs.String("store-min-free", "64MiB", "free space the store's file system must have at start, and before JetStream is restarted after a full disk (negative: no check)")
	maxStore := fs.String("max-store", "0", "JetStream's file storage limit (max_file_store); 0: nats-server's default")
	authDirs := fs.String("nats-auth", "", "comma-separated NATS credentials directories (users.json of each deployment served, as `hams up` writes them): only their nkey users connect, with their role's subject permissions (docs/security.md); empty: no authentication")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	logFormat := fs.String("log-format", "json", "log format on stderr: json or text")
	var tf tlsFlags
	tf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *store == "" {
		return harness.Usagef("nats: --store is required")
	}
	log, err := newLogger(*logLevel, *logFormat)
	if err != nil {
		return err
	}
	log = log.With("role", "nats")
	minFreeB, err := parseSignedSize(*minFree)
	if err != nil {
		return harness.Usagef("nats: --store-min-free: %v", err)
	}
	maxStoreB, err := natsd.ParseSize(*maxStore)
	if err != nil {
		return harness.Usagef("nats: --max-store: %v", err)
	}
	if (*routes != "" || *name != "") && *clusterAddr == "" {
		return harness.Usagef("nats: --routes and --name need --cluster")
	}
	var serverTLS *tls.Config
	var src *pki.Source
	if tf.insecure || tf.cert != "" || tf.key != "" || tf.ca != "" {
		if src, err = tf.load("nats", log); err != nil {
			return err
		}
		if src != nil {
			serverTLS = src.ServerConfig()
		}
	}
	var auth *natsd.Auth
	if *authDirs != "" {
		if tf.insecure {
			return harness.Usagef("nats: --insecure and --nats-auth exclude each other")
		}
		if auth, err = natsd.LoadAuth(cluster.SplitList(*authDirs)...); err != nil {
			return &harness.ExitError{Code: 2, Err: err}
		}
		log.Info("NATS users", "users", len(auth.Users), "credentials", *authDirs)
	}
	cfg := natsd.Config{Name: *name, Listen: *listen, StoreDir: *store, SyncAlways: *syncAlways, TLS: serverTLS, Auth: auth,
		MinFree: minFreeB, MaxStore: maxStoreB, Logger: log}
	if *clusterAddr != "" {
		cfg.Cluster = &natsd.Cluster{Name: *clusterName, Listen: *clusterAddr, Routes: cluster.SplitList(*routes)}
		if src != nil {
			cfg.Cluster.TLS = natsd.RouteTLS(src)
		}
	}
	srv, err := natsd.New(cfg)
	if err != nil {
		return &harness.ExitError{Code: 2, Err: err}
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
	ready := map[string]any{"role": "nats", "nats": srv.URL(), "store": *store,
		"tls": serverTLS != nil, "auth": strings.Join(cluster.SplitList(*authDirs), ",")}
	if *clusterAddr != "" {
		ready["route"] = natsd.RouteURL(srv.NATS())
		ready["name"] = *name
	}
	printReady(ready)
	log.Info("serving", "fields", ready)
	if err := g.Wait(); err != nil {
		log.Error("stopped with error", "err", err)
		return err
	}
	log.Info("stopped")
	return nil
}
