package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/manager"
	"github.com/hams-go/hams/manager/dashboard"
	"github.com/hams-go/hams/manager/dashboard/timeline"
)

// managerDashboard is `hams manager --dashboard ADDR`: the manager's live,
// read-only dashboard (manager/dashboard, docs/dashboard.md) over plain
// HTTP. A nil *managerDashboard is none.
type managerDashboard struct {
	lis  net.Listener
	ring *timeline.Ring
}

// newManagerDashboard listens on addr (empty: no dashboard).
func newManagerDashboard(addr string, log *slog.Logger) (*managerDashboard, error) {
	if addr == "" {
		return nil, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s (dashboard): %w", addr, err)
	}
	if host, _, _ := net.SplitHostPort(addr); !isLoopback(host) {
		log.Warn("the dashboard is plain, unauthenticated HTTP on a non-loopback address; expose it through a reverse proxy with TLS and authentication (docs/dashboard.md)", "dashboard", lis.Addr().String())
	}
	return &managerDashboard{lis: lis, ring: timeline.NewRing(0)}, nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// sink is the manager's Config.Events (nil without a dashboard).
func (d *managerDashboard) sink() timeline.Sink {
	if d == nil {
		return nil
	}
	return d.ring
}

func (d *managerDashboard) close() {
	if d != nil {
		d.lis.Close()
	}
}

// run wraps the manager's Run: it serves the dashboard beside it and
// returns when both have stopped.
func (d *managerDashboard) run(m *manager.Manager, dep *config.Deployment, id string, log *slog.Logger) (func(context.Context) error, error) {
	if d == nil {
		return m.Run, nil
	}
	ds, err := dashboard.New(dashboard.Config{Deployment: dep, Source: m, Timeline: d.ring, Listener: d.lis, ManagerID: id, Logger: log})
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var wg sync.WaitGroup
		var derr error
		wg.Add(1)
		go func() {
			defer wg.Done()
			if derr = ds.Run(ctx); derr != nil {
				cancel()
			}
		}()
		merr := m.Run(ctx)
		cancel()
		wg.Wait()
		return errors.Join(merr, derr)
	}, nil
}

// addr is the dashboard's address for the ready line ("" without one).
func (d *managerDashboard) addr() string {
	if d == nil {
		return ""
	}
	return d.lis.Addr().String()
}

// metricsAddr is the role's /metrics address, registered with the manager
// so its dashboard can scrape it ("" without --metrics).
func (r *role) metricsAddr() string {
	if r.mlis == nil {
		return ""
	}
	return r.mlis.Addr().String()
}

// defaultDashboard is the --dashboard default of up and demo: a free
// loopback port.
const defaultDashboard = "127.0.0.1:0"
