package manager

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hams-go/hams/internal/coord"
	"github.com/hams-go/hams/internal/natsd"
)

// NATSAuth is the manager's NATS credentials (Config.NATSAuth).
type NATSAuth struct {
	// Users the embedded server admits, each with the permissions of its
	// role (natsd.LoadAuth of the deployment's credentials directory).
	// Required with the embedded server; ignored with an external NATS
	// (Config.NATSURL), which has its own users.
	Users *natsd.Auth
	// Client is the manager's own nkey (natsd.LoadClient, role manager of
	// Config.Deployment), with the TLS configuration for an external
	// server (the embedded one is reached in-process, without TLS).
	Client *natsd.Client
}

// coordOpenTimeout bounds the creation of the coordination streams.
const coordOpenTimeout = 10 * time.Second

// natsConn is the manager's connection to NATS, with the embedded server
// when it runs one.
type natsConn struct {
	nc *nats.Conn
	// srv is the embedded server (nil with an external NATS), run by
	// srvRun's goroutine until stopSrv; it restarts itself in place after
	// a store failure (a full disk), and the in-process connection
	// reconnects to the new one (nats.InProcessServer(srv)).
	srv     *natsd.Server
	stopSrv context.CancelFunc
	srvDone chan error
	url     string // what other processes connect to
	tempDir string // removed at close when StoreDir was empty
}

// checkNATSAuth checks that the manager's credentials are a manager's of
// its deployment, and that an embedded server has users.
func checkNATSAuth(cfg *Config) error {
	a := cfg.NATSAuth
	if a == nil {
		return nil
	}
	if a.Client == nil {
		return fmt.Errorf("%w: NATSAuth without the manager's Client credentials", ErrConfig)
	}
	want := natsd.Identity{Role: natsd.RoleManager, Deployment: cfg.Deployment.Name}
	if got := a.Client.Identity(); got != want {
		return fmt.Errorf("%w: NATSAuth.Client is %s, want %s", ErrConfig, got, want)
	}
	if cfg.NATSURL == "" && a.Users == nil {
		return fmt.Errorf("%w: NATSAuth without Users for the embedded server", ErrConfig)
	}
	return nil
}

// connectNATS starts the embedded server (cfg.NATSURL empty) or connects to
// the external one. With cfg.NATSAuth the manager authenticates with its
// nkey, the embedded server admits only NATSAuth.Users (with cfg.TLS it
// also requires mutual TLS on its client port), and the manager creates
// the deployment's coordination streams, which the other roles, not
// permitted to, only bind (coord.Bind).
func connectNATS(cfg *Config, log *slog.Logger) (*natsConn, error) {
	if err := checkNATSAuth(cfg); err != nil {
		return nil, err
	}
	if cfg.NATSURL != "" {
		opts := []nats.Option{
			nats.Name("hams-manager/" + cfg.Deployment.Name),
			nats.MaxReconnects(-1),
			nats.ReconnectWait(100 * time.Millisecond),
			nats.Timeout(5 * time.Second),
		}
		if cfg.NATSAuth != nil {
			opts = append(opts, cfg.NATSAuth.Client.Options()...)
		}
		nc, err := nats.Connect(cfg.NATSURL, opts...)
		if err != nil {
			return nil, fmt.Errorf("manager: connect to NATS %s: %w", cfg.NATSURL, err)
		}
		c := &natsConn{nc: nc, url: cfg.NATSURL}
		if err := c.openCoord(cfg); err != nil {
			c.close()
			return nil, err
		}
		return c, nil
	}

	c := &natsConn{}
	dir := cfg.StoreDir
	if dir == "" {
		var err error
		dir, err = os.MkdirTemp("", "hams-jetstream-*")
		if err != nil {
			return nil, fmt.Errorf("manager: JetStream temp store dir: %w", err)
		}
		c.tempDir = dir
		log.Info("no JetStream store dir given; deployment state lives in a temporary directory removed at exit", "dir", dir)
	}
	ncfg := natsd.Config{Name: "hams-manager", Listen: cfg.NATSListen, StoreDir: dir, SyncAlways: cfg.SyncAlways, Logger: log}
	if cfg.NATSAuth != nil {
		ncfg.Auth = cfg.NATSAuth.Users
		if cfg.TLS != nil {
			ncfg.TLS = cfg.TLS.ServerConfig()
		}
	}
	srv, err := natsd.New(ncfg)
	if err != nil {
		c.close()
		return nil, fmt.Errorf("manager: embedded NATS server: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	c.srv, c.stopSrv, c.srvDone = srv, stop, make(chan error, 1)
	go func() { c.srvDone <- srv.Run(ctx) }()
	select {
	case <-srv.Ready():
	case err := <-c.srvDone:
		c.srvDone <- err // for close
		c.close()
		return nil, fmt.Errorf("manager: embedded NATS server: %w", err)
	}
	c.url = srv.URL()
	opts := []nats.Option{nats.InProcessServer(srv), nats.Name("hams-manager/" + cfg.Deployment.Name),
		nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}
	if cfg.NATSAuth != nil {
		opts = append(opts, cfg.NATSAuth.Client.InProcessOptions()...)
	}
	nc, err := nats.Connect(c.url, opts...)
	if err != nil {
		c.close()
		return nil, fmt.Errorf("manager: in-process NATS connection: %w", err)
	}
	c.nc = nc
	if err := c.openCoord(cfg); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// openCoord creates the deployment's coordination streams when NATS is
// authenticated (the manager is the role permitted to; without
// authentication every component creates them itself, coord.Open).
func (c *natsConn) openCoord(cfg *Config) error {
	if cfg.NATSAuth == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), coordOpenTimeout)
	defer cancel()
	// KVReplicas, as every component's coord.Open has it (cmd/hams
	// --nats-replicas), so the configurations agree.
	if _, err := coord.Open(ctx, c.nc, cfg.Deployment.Name, cfg.KVReplicas); err != nil {
		return fmt.Errorf("manager: create the coordination streams: %w", err)
	}
	return nil
}

// close drains nothing (the manager has no pending publishes once its
// goroutines are done), closes the connection, stops the embedded server
// and waits for it.
func (c *natsConn) close() {
	if c.nc != nil {
		c.nc.Close()
	}
	if c.stopSrv != nil {
		c.stopSrv()
		<-c.srvDone
	}
	if c.tempDir != "" {
		_ = os.RemoveAll(c.tempDir)
	}
}
