package sidecar

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// healthToggle is a fakeBackend whose Health fails while sick is set,
// and for the next failNext checks, counting the checks.
type healthToggle struct {
	fakeBackend
	sick     atomic.Bool
	failNext atomic.Int64
	checks   atomic.Int64
	code     codes.Code // of a failed check: Unavailable when unset
}

// takeFailure takes one of the failNext failures, if any is left.
func (h *healthToggle) takeFailure() bool {
	for {
		n := h.failNext.Load()
		if n <= 0 {
			return false
		}
		if h.failNext.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

func (h *healthToggle) Health(context.Context) error {
	h.checks.Add(1)
	if h.sick.Load() || h.takeFailure() {
		if h.code != codes.OK {
			return statusErr(h.code, "health check answered slowly")
		}
		return statusErr(codes.Unavailable, "tfserving m: version 1 UNLOADING")
	}
	return nil
}

func healthCfg(c *Config) {
	c.HealthInterval, c.BackendLostAfter = 10*time.Millisecond, 50*time.Millisecond
}

// A model server that was healthy and stays unhealthy is a failed host in
// a protected mode: the sidecar stops (fail-stop) with errBackendLost
// naming why, although no batch ran into it.
func TestUnhealthyBackendStopsSidecar(t *testing.T) {
	h := &healthToggle{fakeBackend: fakeBackend{inputs: []string{"x"}}}
	_, _, runErr, stop := runOneWith(t, protectedChainGraph, h, healthCfg)
	defer stop()
	waitFor(t, "a passing check", func() bool { return h.checks.Load() >= 2 })
	h.sick.Store(true)
	wantBackendLost(t, runErr, "UNLOADING")
}

// What does not stop the sidecar: a failed check followed by a passing
// one; a backend that was never healthy yet (still loading); checks that
// fail without saying the backend is down; bare mode, where nothing would
// take over.
func TestHealthFailuresThatDoNotStopSidecar(t *testing.T) {
	bare := strings.Replace(protectedChainGraph, "mode: nspb", "mode: bare", 1)
	for _, c := range []struct {
		name, yaml string
		run        func(h *healthToggle)
	}{
		{"transient", protectedChainGraph, func(h *healthToggle) {
			// The backend itself fails exactly healthFailures-1 checks
			// in a row, then passes: however late this goroutine runs
			// on a loaded machine, no third check in a row fails.
			waitFor(t, "a passing check", func() bool { return h.checks.Load() >= 2 })
			h.failNext.Store(healthFailures - 1)
			waitFor(t, "two failed checks", func() bool { return h.failNext.Load() == 0 })
		}},
		{"never healthy", protectedChainGraph, func(h *healthToggle) { h.sick.Store(true) }},
		{"busy, not down", protectedChainGraph, func(h *healthToggle) {
			// A check that failed fast with DeadlineExceeded (the
			// adapter's own timeout on a loaded server) is not counted.
			waitFor(t, "a passing check", func() bool { return h.checks.Load() >= 2 })
			h.code = codes.DeadlineExceeded
			h.sick.Store(true)
		}},
		{"bare", bare, func(h *healthToggle) {
			waitFor(t, "a passing check", func() bool { return h.checks.Load() >= 2 })
			h.sick.Store(true)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := &healthToggle{fakeBackend: fakeBackend{inputs: []string{"x"}}}
			if c.name == "never healthy" {
				h.sick.Store(true)
			}
			_, _, runErr, stop := runOneWith(t, c.yaml, h, healthCfg)
			defer stop()
			c.run(h)
			// Well past healthFailures checks and BackendLostAfter.
			n := h.checks.Load()
			waitFor(t, "twenty more checks", func() bool { return h.checks.Load() >= n+20 })
			select {
			case err := <-runErr:
				t.Fatalf("sidecar stopped: %v", err)
			default:
			}
		})
	}
}
