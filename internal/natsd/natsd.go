// Package natsd runs HAMS-Go's embedded coordination engine: one
// nats-server with JetStream (R1, file storage) on a TCP client port.
//
// Two users: the manager's embedded default (manager.Config.NATSURL empty,
// the server lives inside the manager process) and the `hams nats` role,
// where the server is a process of its own so that it outlives the
// managers (`hams up|demo|chaos` start it first, point every component at
// it, and restart it in place on its port and store when it dies).
//
// Start is the one place the server's options are decided; Server wraps
// it in the project's New/Run/Ready shape for a long-running role.
//
// Security (auth.go, client.go): Config.TLS makes the client port mutual
// TLS; Config.Auth admits only the listed nkey users, each with the
// subject permissions of its role (Permissions, the one permission
// table); GenerateCredentials and LoadAuth write and read the users,
// LoadClient gives a component its connect options. Without both the
// server is open (the insecure mode).
package natsd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ErrConfig is wrapped by every Config validation error.
var ErrConfig = errors.New("natsd: invalid config")

// readyTimeout bounds the wait for the server to accept connections
// (JetStream recovers its streams from the store before that).
const readyTimeout = 30 * time.Second

// tlsTimeout bounds a client's TLS handshake.
const tlsTimeout = 2 * time.Second

// Config of an embedded server.
type Config struct {
	// Name is the server name (default "hams-nats"); JetStream's
	// server_name, unique per node in a cluster (required with Cluster).
	Name string
	// Listen is host:port of the client port (port -1: random).
	Listen string
	// StoreDir is the JetStream store directory (required).
	StoreDir string
	// SyncAlways makes JetStream fsync every write before acknowledging
	// it (see docs/coordination.md for why the default is off).
	SyncAlways bool
	// TLS of the client port (nil: plaintext). When set, every TCP client
	// must speak TLS and present a certificate the configuration verifies:
	// ClientAuth must be tls.RequireAndVerifyClientCert, or
	// RequireAnyClientCert with a VerifyPeerCertificate (what
	// pki.Source.ServerConfig returns: reloadable CA, identity of the
	// deployment). In-process connections (nats.InProcessServer) need no
	// TLS.
	TLS *tls.Config
	// Auth lists the users (nkeys, each with Permissions of its identity);
	// nil accepts anyone with every permission (the insecure mode: tests
	// and --insecure).
	Auth *Auth
	// Cluster joins a JetStream cluster (nil: a single server).
	Cluster *Cluster
	// MinFree is the free space the store's file system must have for
	// the server to start (ErrStoreTooSmall names both sizes), and what
	// Server.Run waits for before it restarts a JetStream that disabled
	// itself on a full disk. 0: DefaultMinFree; negative: no check at
	// start, and any free space will do for a restart.
	MinFree int64
	// MaxStore caps JetStream's file storage (max_file_store); 0 leaves
	// nats-server's default (most of the free disk).
	MaxStore int64
	// HealthInterval is how often Server.Run checks that JetStream is
	// still enabled (default DefaultHealthInterval).
	HealthInterval time.Duration
	Logger         *slog.Logger

	// storeFault, when set, is called for each nats-server error that
	// reports a failed store write (Server.Run sets it).
	storeFault func()
}

func (c *Config) check() (host string, port int, err error) {
	h, n, err := splitListen(c.Listen)
	if err != nil {
		return "", 0, fmt.Errorf("%w: Listen %q: %v", ErrConfig, c.Listen, err)
	}
	if c.StoreDir == "" {
		return "", 0, fmt.Errorf("%w: StoreDir is required", ErrConfig)
	}
	if c.TLS != nil {
		verified := c.TLS.ClientAuth == tls.RequireAndVerifyClientCert ||
			c.TLS.ClientAuth == tls.RequireAnyClientCert && c.TLS.VerifyPeerCertificate != nil
		if !verified {
			return "", 0, fmt.Errorf("%w: TLS.ClientAuth is %v without a verifier; want RequireAndVerifyClientCert, or RequireAnyClientCert with VerifyPeerCertificate (mutual TLS)", ErrConfig, c.TLS.ClientAuth)
		}
		if len(c.TLS.Certificates) == 0 && c.TLS.GetCertificate == nil {
			return "", 0, fmt.Errorf("%w: TLS has no server certificate", ErrConfig)
		}
	}
	if c.Auth != nil {
		if _, err := c.Auth.NkeyUsers(); err != nil {
			return "", 0, fmt.Errorf("%w: Auth: %v", ErrConfig, err)
		}
	}
	if c.Cluster != nil {
		if c.Name == "" {
			return "", 0, fmt.Errorf("%w: a cluster node needs a Name of its own (JetStream's server_name)", ErrConfig)
		}
		if err := c.Cluster.check(); err != nil {
			return "", 0, err
		}
	}
	if c.MaxStore < 0 {
		return "", 0, fmt.Errorf("%w: MaxStore %d is negative", ErrConfig, c.MaxStore)
	}
	if c.HealthInterval < 0 {
		return "", 0, fmt.Errorf("%w: HealthInterval %v is negative", ErrConfig, c.HealthInterval)
	}
	return h, n, nil
}

// Start starts a JetStream-enabled server as cfg says and waits until it
// accepts connections. It returns the server and the nats:// URL other
// processes dial (an unspecified listen host is replaced by loopback).
// The caller shuts the server down (Shutdown, WaitForShutdown). A store
// whose file system has less than cfg.MinFree free fails with
// ErrStoreTooSmall before anything starts.
func Start(cfg Config) (*server.Server, string, error) {
	host, port, err := cfg.check()
	if err != nil {
		return nil, "", err
	}
	if cfg.Name == "" {
		cfg.Name = "hams-nats"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := checkStore(cfg.StoreDir, cfg.MinFree, cfg.MaxStore); err != nil {
		return nil, "", err
	}
	opts := &server.Options{
		ServerName:        cfg.Name,
		Host:              host,
		Port:              port,
		JetStream:         true,
		StoreDir:          cfg.StoreDir,
		JetStreamMaxStore: cfg.MaxStore,
		SyncAlways:        cfg.SyncAlways,
		NoLog:             true,
		NoSigs:            true,
	}
	if cfg.TLS != nil {
		opts.TLSConfig = cfg.TLS
		opts.TLSVerify = true
		opts.TLSTimeout = tlsTimeout.Seconds()
	}
	if cfg.Auth != nil {
		users, err := cfg.Auth.NkeyUsers()
		if err != nil {
			return nil, "", fmt.Errorf("%w: Auth: %v", ErrConfig, err)
		}
		opts.Nkeys = users
	}
	if c := cfg.Cluster; c != nil {
		chost, cport, _ := splitListen(c.Listen)
		name := c.Name
		if name == "" {
			name = DefaultClusterName
		}
		opts.Cluster = server.ClusterOpts{Name: name, Host: chost, Port: cport, TLSConfig: c.TLS, TLSTimeout: tlsTimeout.Seconds()}
		if len(c.Routes) > 0 {
			opts.Routes = server.RoutesFromStr(strings.Join(c.Routes, ","))
		}
		if c.TLS == nil {
			cfg.Logger.Warn("NATS routes are not secured (insecure mode)", "cluster", name, "listen", c.Listen)
		}
	}
	if cfg.TLS == nil || cfg.Auth == nil {
		cfg.Logger.Warn("NATS client port is not fully secured (insecure mode)", "listen", cfg.Listen,
			"tls", cfg.TLS != nil, "auth", cfg.Auth != nil)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, "", fmt.Errorf("natsd: new server on %s: %w", cfg.Listen, err)
	}
	debug := cfg.Logger.Enabled(context.Background(), slog.LevelDebug)
	srv.SetLoggerV2(Logger{L: cfg.Logger.With("server", "nats-server"), storeFault: cfg.storeFault}, debug, false, false)
	srv.Start()
	if !srv.ReadyForConnections(readyTimeout) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, "", fmt.Errorf("natsd: server on %s not ready after %v", cfg.Listen, readyTimeout)
	}
	return srv, ClientURL(srv), nil
}

// waitMeta waits (at most readyTimeout) until a cluster node is current
// with a JetStream meta leader: before that every JetStream request
// (creating the coordination streams) goes unanswered until it times
// out, and the first election of a new cluster takes seconds. A node
// whose peers are all down stays unready that long and then serves
// anyway (it answers JetStream requests once a quorum is back).
func waitMeta(ctx context.Context, srv *server.Server, log *slog.Logger) {
	deadline := time.NewTimer(readyTimeout)
	defer deadline.Stop()
	poll := time.NewTicker(50 * time.Millisecond) // nats-server has no notification for it
	defer poll.Stop()
	for !srv.JetStreamIsCurrent() {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			log.Warn("no JetStream meta leader yet; serving anyway (JetStream answers once a quorum of the cluster is up)", "waited", readyTimeout)
			return
		case <-poll.C:
		}
	}
}

// ClientURL is the server's client URL with an unspecified listen host
// replaced by loopback, so it can be dialled as printed.
func ClientURL(srv *server.Server) string {
	addr, ok := srv.Addr().(*net.TCPAddr)
	if !ok {
		return srv.ClientURL()
	}
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "nats://" + net.JoinHostPort(host, strconv.Itoa(addr.Port))
}

// RouteURL is the server's nats-route:// URL (its route port, an
// unspecified host replaced by loopback); empty without a cluster.
func RouteURL(srv *server.Server) string {
	addr := srv.ClusterAddr()
	if addr == nil {
		return ""
	}
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "nats-route://" + net.JoinHostPort(host, strconv.Itoa(addr.Port))
}

// Server is a long-running embedded server (the `hams nats` role, the
// manager's embedded default). Run watches it: a JetStream whose store
// failed a write is restarted in place, the server on the same ports and
// store, once the store's file system has MinFree free again; clients
// reconnect on their own. (On a full disk nats-server's file store keeps
// the write error and fails every later write with it, "no space left on
// device", with JetStream still enabled, until the server restarts; a
// clustered server may instead disable JetStream, which needs the same.)
type Server struct {
	cfg   Config
	ready chan struct{}
	url   string // set before ready is closed

	mu       sync.Mutex
	srv      *server.Server // the current one; nil before Run starts it
	restarts int
}

// New validates cfg; it does no I/O.
func New(cfg Config) (*Server, error) {
	if _, _, err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.HealthInterval == 0 {
		cfg.HealthInterval = DefaultHealthInterval
	}
	return &Server{cfg: cfg, ready: make(chan struct{})}, nil
}

// Ready is closed once the server accepts connections and, in a cluster,
// knows its JetStream meta leader (waitMeta).
func (s *Server) Ready() <-chan struct{} { return s.ready }

// URL is the nats:// URL clients dial; valid once Ready is closed. It
// stays the same across restarts.
func (s *Server) URL() string {
	select {
	case <-s.ready:
		return s.url
	default:
		return ""
	}
}

// NATS is the current nats-server (nil before Run started it); a restart
// replaces it.
func (s *Server) NATS() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv
}

// Restarts is how many times Run restarted the server in place.
func (s *Server) Restarts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.restarts
}

// InProcessConn connects in process to the current server
// (nats.InProcessServer(s)): a connection made so reconnects to the
// server that replaced the one it lost.
func (s *Server) InProcessConn() (net.Conn, error) {
	srv := s.NATS()
	if srv == nil {
		return nil, fmt.Errorf("natsd: in-process connection: %w", ErrNotRunning)
	}
	return srv.InProcessConn()
}

// ErrNotRunning is returned for an in-process connection to a Server
// that is not running.
var ErrNotRunning = errors.New("natsd: server not running")

// pin fixes the random ports of cfg to those srv bound, so a restart
// comes back where clients and routes look for it.
func pin(cfg Config, srv *server.Server) Config {
	if a, ok := srv.Addr().(*net.TCPAddr); ok {
		host, _, _ := net.SplitHostPort(cfg.Listen)
		cfg.Listen = net.JoinHostPort(host, strconv.Itoa(a.Port))
	}
	if cfg.Cluster != nil {
		c := *cfg.Cluster
		if a := srv.ClusterAddr(); a != nil {
			host, _, _ := net.SplitHostPort(c.Listen)
			c.Listen = net.JoinHostPort(host, strconv.Itoa(a.Port))
		}
		cfg.Cluster = &c
	}
	return cfg
}

// Run starts the server and serves until ctx ends, then shuts it down
// and waits for it. A server that stops on its own is an error. Every
// HealthInterval it checks that JetStream is enabled and that nats-server
// logged no failed store write since the last start (Logger); when either
// fails, Run waits for MinFree on the store's file system and restarts
// the server in place (pin: the ports it bound, the same store).
func (s *Server) Run(ctx context.Context) error {
	var fault atomic.Bool
	first := s.cfg
	first.storeFault = func() { fault.Store(true) }
	srv, url, err := Start(first)
	if err != nil {
		return err
	}
	cfg := pin(first, srv)
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
	if cfg.Cluster != nil {
		waitMeta(ctx, srv, s.cfg.Logger)
	}
	s.url = url
	close(s.ready)
	log := s.cfg.Logger
	tick := time.NewTicker(s.cfg.HealthInterval)
	defer tick.Stop()
	var disabledSince time.Time
	var waitLogged bool
	for {
		stopped := make(chan struct{})
		go func(srv *server.Server) { srv.WaitForShutdown(); close(stopped) }(srv)
	watch:
		for {
			select {
			case <-ctx.Done():
				srv.Shutdown()
				<-stopped
				return nil
			case <-stopped:
				return fmt.Errorf("natsd: server on %s stopped", url)
			case <-tick.C:
			}
			if srv.JetStreamEnabled() && !fault.Load() {
				continue
			}
			if disabledSince.IsZero() {
				disabledSince = time.Now()
				log.Error("JetStream failed (a store write failed, or it disabled itself); the server is restarted in place once the store has room",
					"store", cfg.StoreDir, "jetstream_enabled", srv.JetStreamEnabled(), "need_free", FormatSize(restartFree(cfg.MinFree)))
			}
			free, err := FreeSpace(cfg.StoreDir)
			if err != nil || free < restartFree(cfg.MinFree) {
				if !waitLogged {
					log.Warn("waiting for free space on the JetStream store", "store", cfg.StoreDir, "free", FormatSize(free), "need", FormatSize(restartFree(cfg.MinFree)), "err", err)
					waitLogged = true
				}
				continue
			}
			srv.Shutdown()
			<-stopped
			break watch
		}
		// Restart in place: same ports, same store. A start that fails
		// (the disk filled again, a port not yet free) is retried each
		// tick until ctx ends.
		fault.Store(false)
		for {
			next, _, err := Start(cfg)
			if err == nil {
				srv = next
				break
			}
			log.Warn("restart NATS server in place; retrying", "listen", cfg.Listen, "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
		}
		s.mu.Lock()
		s.srv = srv
		s.restarts++
		s.mu.Unlock()
		log.Warn("NATS server restarted in place after a JetStream store failure", "listen", cfg.Listen, "store", cfg.StoreDir,
			"disabled_for", time.Since(disabledSince).Round(time.Millisecond))
		disabledSince, waitLogged = time.Time{}, false
	}
}

// Logger maps nats-server's log levels to slog: notices are Debug (a
// healthy server is silent at Info) except a new JetStream meta leader,
// warnings and errors keep their level, traces are dropped.
type Logger struct {
	L          *slog.Logger
	storeFault func()
}

func (n Logger) Noticef(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if strings.Contains(msg, "metadata leader") {
		// Who leads the cluster's JetStream meta group: rare, and what
		// an operator looks for after a node failure.
		n.L.Info(msg)
		return
	}
	n.L.Debug(msg)
}
func (n Logger) Warnf(format string, v ...any) {
	if strings.HasPrefix(format, routeInsecureWarning) {
		// RouteTLS verifies chain and identity itself.
		n.L.Debug(fmt.Sprintf(format, v...))
		return
	}
	n.L.Warn(fmt.Sprintf(format, v...))
}
func (n Logger) Fatalf(format string, v ...any) { n.L.Error(fmt.Sprintf(format, v...)) }
func (n Logger) Errorf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if n.storeFault != nil && isStoreFault(msg) {
		n.storeFault()
	}
	n.L.Error(msg)
}
func (n Logger) Debugf(format string, v ...any) { n.L.Debug(fmt.Sprintf(format, v...)) }
func (n Logger) Tracef(string, ...any)          {}
