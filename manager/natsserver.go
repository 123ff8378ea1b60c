package manager

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/hams-go/hams/internal/natsd"
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
	srv, url, err := natsd.Start(natsd.Config{Name: "hams-manager", Listen: cfg.NATSListen, StoreDir: dir, SyncAlways: cfg.SyncAlways, Logger: log})
	if err != nil {
		c.close()
		return nil, fmt.Errorf("manager: embedded NATS server: %w", err)
	}
	c.srv = srv
	c.url = url
	nc, err := nats.Connect(c.url, nats.InProcessServer(srv), nats.Name("hams-manager/"+cfg.Deployment.Name))
	if err != nil {
		c.close()
		return nil, fmt.Errorf("manager: in-process NATS connection: %w", err)
	}
	c.nc = nc
	return c, nil
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
