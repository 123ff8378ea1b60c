package sidecar

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/edge"
)

func TestShipWatchDecision(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	const bound = 500 * time.Millisecond
	type obs struct {
		ms      int
		addr    string
		ok      bool
		pending bool
		mark    uint64
		report  bool
	}
	for _, c := range []struct {
		name string
		obs  []obs
	}{
		{"idle never reports", []obs{{0, "b", true, false, 0, false}, {600, "b", true, false, 0, false}, {1200, "b", true, false, 0, false}}},
		{"a waiting snapshot without progress reports after the bound, then once per bound", []obs{
			{0, "b", true, true, 3, false}, {400, "b", true, true, 3, false}, {500, "b", true, true, 3, true},
			{600, "b", true, true, 3, false}, {1000, "b", true, true, 3, true}}},
		{"an acknowledgement restarts the count", []obs{
			{0, "b", true, true, 3, false}, {400, "b", true, true, 4, false}, {800, "b", true, true, 4, false}, {900, "b", true, true, 4, true}}},
		{"a new backup restarts the count", []obs{
			{0, "b", true, true, 3, false}, {400, "c", true, true, 3, false}, {800, "c", true, true, 3, false}, {900, "c", true, true, 3, true}}},
		{"no backup resolved: nothing to report", []obs{
			{0, "", false, true, 3, false}, {600, "", false, true, 3, false}, {1200, "", false, true, 3, false}}},
		{"drained in between restarts the count", []obs{
			{0, "b", true, true, 3, false}, {400, "b", true, false, 3, false}, {450, "b", true, true, 3, false}, {900, "b", true, true, 3, false}, {950, "b", true, true, 3, true}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var w shipWatch
			for i, o := range c.obs {
				_, rep := w.observe(at(o.ms), o.addr, o.ok, o.pending, o.mark, bound)
				if rep != o.report {
					t.Fatalf("observation %d (%+v): report %v, want %v", i, o, rep, o.report)
				}
			}
		})
	}
	if got := backupStuckAfter(0); got != defaultBackupStuck {
		t.Errorf("bound without a suspicion timeout = %v", got)
	}
	if got := backupStuckAfter(600 * time.Millisecond); got != 1800*time.Millisecond {
		t.Errorf("bound for 600ms = %v, want 1.8s", got)
	}
	if got := backupStuckAfter(70 * time.Millisecond); got != minBackupStuck {
		t.Errorf("bound for 70ms = %v, want the floor %v", got, minBackupStuck)
	}
}

// reportingBackups is a BackupResolver that reports like the manager
// client: a report "replaces" the backup (the resolver moves to replace).
type reportingBackups struct {
	suspicion time.Duration
	replace   string
	// moved, when set, is called once the backup is replaced: the
	// topology's change signal, as the manager's rewiring gives it (a
	// shipment hanging on the old backup is given up then).
	moved func()

	mu      sync.Mutex
	addr    string
	reports []string
	at      []time.Time
}

func (r *reportingBackups) ResolveBackup(string) (string, uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.addr, 1, r.addr != ""
}

func (r *reportingBackups) SuspicionTimeout() time.Duration { return r.suspicion }

func (r *reportingBackups) ReportBackup(_ context.Context, model, addr, reason string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reports = append(r.reports, fmt.Sprintf("%s@%s", model, addr))
	r.at = append(r.at, time.Now())
	if addr == r.addr {
		r.addr = r.replace
		if r.moved != nil {
			r.moved()
		}
	}
	return nil
}

func (r *reportingBackups) list() ([]string, []time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.reports...), append([]time.Time(nil), r.at...)
}

// blackhole accepts connections and never answers (a backup cut off by
// a partition that drops its packets: a shipment hangs, it does not fail).
func blackhole(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = lis.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return lis.Addr().String()
}

// Issue 18: the primary's backup is unreachable (its shipments hang):
// nothing becomes durable. After backupStuckAfter(suspicion timeout) of
// no acknowledgement the primary reports the backup, once; the manager's
// replacement (here: the resolver moves to a reachable backup) gets the
// queued snapshots, and every request becomes durable.
//
// Timing on a loaded machine: the suspicion timeout (bound 3 s) leaves
// the replacement seconds to acknowledge before it could be reported in
// turn, and the report's lateness is measured from the first shipment
// attempt, not from the first request (whose way to a snapshot is no
// part of the watch).
func TestPrimaryReportsUnreachableBackup(t *testing.T) {
	rb := &reportingBackups{suspicion: time.Second, addr: blackhole(t)}
	cut := rb.addr
	var firstShip atomic.Int64 // unix nanos of the primary's first shipment attempt
	h := startRepl(t, fmt.Sprintf(oneStateful, "nspb"), map[string]Backend{"a": newCounter(4)}, map[string]Backend{"a": newCounter(4)}, replOpts{
		tweak: func(name string, s *Sidecar) {
			if s.role != config.RolePrimary {
				return
			}
			rb.replace, _, _ = s.cfg.BackupResolver.ResolveBackup(name) // the reachable backup
			s.cfg.BackupResolver = rb
			s.cfg.ShipHook = func(context.Context, uint64) { firstShip.CompareAndSwap(0, time.Now().UnixNano()) }
			res := s.cfg.Resolver.(*edge.StaticResolver)
			rb.moved = func() {
				addr, epoch, _ := res.Resolve(config.Frontend)
				res.Set(config.Frontend, addr, epoch) // the same entry: only the change signal
			}
		},
	})
	defer h.stop()
	bound := backupStuckAfter(rb.suspicion)
	t0 := time.Now()
	const n = 12
	h.send(1, n)
	waitFor(t, "the backup reported", func() bool { r, _ := rb.list(); return len(r) > 0 })
	reports, at := rb.list()
	if reports[0] != "a@"+cut {
		t.Fatalf("report %q, want a@%s", reports[0], cut)
	}
	// Never before the bound (the first request precedes every snapshot),
	// and about the bound after the first snapshot was shipped.
	if el := at[0].Sub(t0); el < bound {
		t.Fatalf("reported %v after the first request, before the bound %v", el, bound)
	}
	if firstShip.Load() == 0 {
		t.Fatal("reported before any snapshot was shipped")
	}
	if el := at[0].Sub(time.Unix(0, firstShip.Load())); el > bound+2*time.Second {
		t.Fatalf("reported %v after the first shipment attempt, want about the bound %v", el, bound)
	}
	if seq := maxSeqOf(h.backups["a"]); seq != 0 {
		t.Fatalf("the replacement applied seq %d before the report", seq)
	}
	waitFor(t, "every request durable at the replacement backup", func() bool { return maxSeqOf(h.backups["a"]) == n && h.durable.get("a") == n })
	if r, _ := rb.list(); len(r) != 1 {
		t.Fatalf("reports %v, want one", r)
	}
	t.Logf("reported %v after the first request (bound %v)", at[0].Sub(t0), bound)
}

// A backup that acknowledges is never reported, however long the run.
func TestReachableBackupNotReported(t *testing.T) {
	rb := &reportingBackups{suspicion: 10 * time.Millisecond}
	h := startRepl(t, fmt.Sprintf(oneStateful, "nspb"), map[string]Backend{"a": newCounter(4)}, map[string]Backend{"a": newCounter(4)}, replOpts{
		tweak: func(name string, s *Sidecar) {
			if s.role != config.RolePrimary {
				return
			}
			rb.addr, _, _ = s.cfg.BackupResolver.ResolveBackup(name)
			s.cfg.BackupResolver = rb
		},
	})
	defer h.stop()
	const n = 200
	for id := uint64(1); id <= n; id++ {
		h.send(id, id)
	}
	waitFor(t, "every request durable", func() bool { return maxSeqOf(h.backups["a"]) == n })
	if r, _ := rb.list(); len(r) != 0 {
		t.Fatalf("a reachable backup was reported: %v", r)
	}
}
