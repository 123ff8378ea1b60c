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
	// Name is the server name (default "hams-nats").
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
	Auth   *Auth
	Logger *slog.Logger
}

func (c *Config) check() (host string, port int, err error) {
	h, p, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return "", 0, fmt.Errorf("%w: Listen %q: %v", ErrConfig, c.Listen, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < -1 || n > 65535 {
		return "", 0, fmt.Errorf("%w: Listen %q: bad port", ErrConfig, c.Listen)
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
	return h, n, nil
}

// Start starts a JetStream-enabled server as cfg says and waits until it
// accepts connections. It returns the server and the nats:// URL other
// processes dial (an unspecified listen host is replaced by loopback).
// The caller shuts the server down (Shutdown, WaitForShutdown).
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
	opts := &server.Options{
		ServerName: cfg.Name,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		SyncAlways: cfg.SyncAlways,
		NoLog:      true,
		NoSigs:     true,
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
	if cfg.TLS == nil || cfg.Auth == nil {
		cfg.Logger.Warn("NATS client port is not fully secured (insecure mode)", "listen", cfg.Listen,
			"tls", cfg.TLS != nil, "auth", cfg.Auth != nil)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, "", fmt.Errorf("natsd: new server on %s: %w", cfg.Listen, err)
	}
	debug := cfg.Logger.Enabled(context.Background(), slog.LevelDebug)
	srv.SetLoggerV2(Logger{L: cfg.Logger.With("component", "nats-server")}, debug, false, false)
	srv.Start()
	if !srv.ReadyForConnections(readyTimeout) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, "", fmt.Errorf("natsd: server on %s not ready after %v", cfg.Listen, readyTimeout)
	}
	return srv, ClientURL(srv), nil
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

// Server is a long-running embedded server (the `hams nats` role).
type Server struct {
	cfg   Config
	ready chan struct{}
	url   string // set before ready is closed
}

// New validates cfg; it does no I/O.
func New(cfg Config) (*Server, error) {
	if _, _, err := cfg.check(); err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, ready: make(chan struct{})}, nil
}

// Ready is closed once the server accepts connections.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// URL is the nats:// URL clients dial; valid once Ready is closed.
func (s *Server) URL() string {
	select {
	case <-s.ready:
		return s.url
	default:
		return ""
	}
}

// Run starts the server and serves until ctx ends, then shuts it down
// and waits for it. A server that stops on its own is an error.
func (s *Server) Run(ctx context.Context) error {
	srv, url, err := Start(s.cfg)
	if err != nil {
		return err
	}
	s.url = url
	close(s.ready)
	stopped := make(chan struct{})
	go func() { srv.WaitForShutdown(); close(stopped) }()
	select {
	case <-ctx.Done():
		srv.Shutdown()
		<-stopped
		return nil
	case <-stopped:
		return fmt.Errorf("natsd: server on %s stopped", url)
	}
}

// Logger maps nats-server's log levels to slog: notices are Debug (a
// healthy server is silent at Info), warnings and errors keep their
// level, traces are dropped.
type Logger struct{ L *slog.Logger }

func (n Logger) Noticef(format string, v ...any) { n.L.Debug(fmt.Sprintf(format, v...)) }
func (n Logger) Warnf(format string, v ...any)   { n.L.Warn(fmt.Sprintf(format, v...)) }
func (n Logger) Fatalf(format string, v ...any)  { n.L.Error(fmt.Sprintf(format, v...)) }
func (n Logger) Errorf(format string, v ...any)  { n.L.Error(fmt.Sprintf(format, v...)) }
func (n Logger) Debugf(format string, v ...any)  { n.L.Debug(fmt.Sprintf(format, v...)) }
func (n Logger) Tracef(string, ...any)           {}
