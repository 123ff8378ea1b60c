package manager

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// natsConn is the manager's connection to NATS, with the embedded server
// when it runs one.
type natsConn struct {
	nc      *nats.Conn
	srv     *server.Server // nil with an external NATS
	url     string         // what other processes connect to
	tempDir string         // removed at close when StoreDir was empty
}

// connectNATS starts the embedded server (cfg.NATSURL empty) or connects to
// the external one.
func connectNATS(cfg *Config, log *slog.Logger) (*natsConn, error) {
	if cfg.NATSURL != "" {
		nc, err := nats.Connect(cfg.NATSURL,
			nats.Name("hams-manager/"+cfg.Deployment.Name),
			nats.MaxReconnects(-1),
			nats.ReconnectWait(100*time.Millisecond),
			nats.Timeout(5*time.Second),
		)
		if err != nil {
			return nil, fmt.Errorf("manager: connect to NATS %s: %w", cfg.NATSURL, err)
		}
		return &natsConn{nc: nc, url: cfg.NATSURL}, nil
	}

	host, portStr, err := net.SplitHostPort(cfg.NATSListen)
	if err != nil {
		return nil, fmt.Errorf("manager: NATS listen address %q: %w", cfg.NATSListen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("manager: NATS listen port %q: %w", portStr, err)
	}
	c := &natsConn{}
	dir := cfg.StoreDir
	if dir == "" {
		dir, err = os.MkdirTemp("", "hams-jetstream-*")
		if err != nil {
			return nil, fmt.Errorf("manager: JetStream temp store dir: %w", err)
		}
		c.tempDir = dir
		log.Info("no JetStream store dir given; deployment state lives in a temporary directory removed at exit", "dir", dir)
	}
	opts := &server.Options{
		ServerName: "hams-manager",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		SyncAlways: cfg.SyncAlways,
		NoLog:      true,
		NoSigs:     true,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		c.close()
		return nil, fmt.Errorf("manager: embedded NATS server: %w", err)
	}
	debug := log.Enabled(context.Background(), slog.LevelDebug)
	srv.SetLoggerV2(natsLogger{log.With("component", "nats-server")}, debug, false, false)
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		c.close()
		return nil, fmt.Errorf("manager: embedded NATS server on %s not ready after 10s", cfg.NATSListen)
	}
	c.srv = srv
	c.url = clientURL(srv)
	nc, err := nats.Connect(c.url, nats.InProcessServer(srv), nats.Name("hams-manager/"+cfg.Deployment.Name))
	if err != nil {
		c.close()
		return nil, fmt.Errorf("manager: in-process NATS connection: %w", err)
	}
	c.nc = nc
	return c, nil
}

// clientURL is the server's client URL with an unspecified listen host
// replaced by loopback, so it can be dialled as printed.
func clientURL(srv *server.Server) string {
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

// close drains nothing (the manager has no pending publishes once its
// goroutines are done), closes the connection, stops the embedded server
// and waits for it.
func (c *natsConn) close() {
	if c.nc != nil {
		c.nc.Close()
	}
	if c.srv != nil {
		c.srv.Shutdown()
		c.srv.WaitForShutdown()
	}
	if c.tempDir != "" {
		_ = os.RemoveAll(c.tempDir)
	}
}

// natsLogger maps the embedded server's log levels to slog: notices are
// Debug (a healthy server is silent at Info), warnings and errors keep
// their level, traces are dropped.
type natsLogger struct{ l *slog.Logger }

func (n natsLogger) Noticef(format string, v ...any) { n.l.Debug(fmt.Sprintf(format, v...)) }
func (n natsLogger) Warnf(format string, v ...any)   { n.l.Warn(fmt.Sprintf(format, v...)) }
func (n natsLogger) Fatalf(format string, v ...any)  { n.l.Error(fmt.Sprintf(format, v...)) }
func (n natsLogger) Errorf(format string, v ...any)  { n.l.Error(fmt.Sprintf(format, v...)) }
func (n natsLogger) Debugf(format string, v ...any)  { n.l.Debug(fmt.Sprintf(format, v...)) }
func (n natsLogger) Tracef(string, ...any)           {}
