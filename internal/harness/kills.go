package harness

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hams-go/hams/internal/run"

	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/launch"
	"github.com/hams-go/hams/internal/loadgen"
	"github.com/hams-go/hams/internal/netfault"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// killReport is one entry of the report's kills.
//
// recovery_ms is measured at the client: from the SIGKILL to the moment
// the first reply arrives for a request that was sent at or after the kill
// and whose lineage names the killed model (any model for a manager
// kill). For a frontend kill it is the first reply to a request that was
// sent to the killed frontend and answered after the kill (an attempt in
// flight there, retried on another frontend, or a later request of a
// client that sends there first): the time until the dead frontend's
// clients are served again, which includes the takeover of its requests
// by the new leading frontend when the killed one led. Such a request cannot have been served by the killed
// process, so the reply shows the replacement serving: the promoted
// backup or standby for a primary or stateless kill; for a backup kill,
// the primary whose outputs became durable again at a new (synced) backup,
// since the frontend releases a reply only when its stateful states are
// durable. Closed-loop clients stuck on requests in flight at the kill send
// new requests only after those complete, so the figure includes one
// request's latency after the service resumed.
type killReport struct {
	Target string `json:"target"`
	// Kind is what failed in protocol terms: primary, backup, stateless
	// (the active instance of a stateless model), standby, manager or
	// frontend.
	Kind string `json:"kind"`
	// Process is the supervised child signalled (e.g. backup-sidecar:m.2).
	Process    string  `json:"process,omitempty"`
	AtMs       float64 `json:"at_ms"`
	RecoveryMs float64 `json:"recovery_ms"` // -1: no successful reply after the kill
	// RestartMs: a process restarted in place (manager, frontend; every
	// process in bare mode) until its ready line; -1 if never or not
	// restarted in place.
	RestartMs float64 `json:"restart_ms"`
	// RestoredMs: until the topology again had a live serving instance,
	// backup (replicated models) or standby (stateless models) for every
	// model, and every replicated model's backup had applied a base from
	// its primary (cluster.UnsyncedBackups: a backup that has not cannot
	// be promoted), i.e. redundancy was restored; -1 if not within the
	// run.
	RestoredMs float64 `json:"restored_ms"`
	// Unrestored: what the last check before the report still lacked
	// (a missing instance, an unsynced backup).
	Unrestored []string `json:"unrestored,omitempty"`
	Recovered  bool     `json:"recovered"`
	Error      string   `json:"error,omitempty"`
	// Note says what a manager or frontend was doing when it was killed:
	// active or standby (manager), leading or follower (frontend).
	Note string `json:"note,omitempty"`
	// NewActive: after a manager kill, the manager process that answered
	// as active when the control plane was whole again (a standby that
	// took the lease over, or the killed one restarted).
	NewActive string `json:"new_active,omitempty"`
	// Fault is how the target failed: kill (SIGKILL, the default),
	// freeze (SIGSTOP for DurationMs, then SIGCONT) or partition (cut off
	// the network for DurationMs, then healed).
	Fault      string  `json:"fault,omitempty"`
	DurationMs float64 `json:"duration_ms,omitempty"`

	killAt   time.Time
	model    string
	services []string
	// frontendKill: a frontend was killed, frontend is its index (as in
	// loadgen.Result.Frontends).
	frontendKill bool
	frontend     int
}

// killTracker matches replies to kills (recovery_ms).
type killTracker struct {
	mu    sync.Mutex
	kills []*killReport
	// recovered is signalled (closed) per kill when its first qualifying
	// reply arrived.
	done map[*killReport]chan struct{}
}

func newKillTracker() *killTracker { return &killTracker{done: map[*killReport]chan struct{}{}} }

func (kt *killTracker) add(kr *killReport) chan struct{} {
	kt.mu.Lock()
	defer kt.mu.Unlock()
	kt.kills = append(kt.kills, kr)
	ch := make(chan struct{})
	kt.done[kr] = ch
	return ch
}

// reply records a successful reply of service svc.
func (kt *killTracker) reply(svc string, r loadgen.Result) {
	done := r.Sent.Add(r.Latency)
	kt.mu.Lock()
	defer kt.mu.Unlock()
	for _, kr := range kt.kills {
		if kr.killAt.IsZero() || kr.Recovered || !slices.Contains(kr.services, svc) {
			continue
		}
		if kr.frontendKill {
			// Sent to the killed frontend, answered after the kill: sent
			// after it, or retried away from it.
			if !slices.Contains(r.Frontends, kr.frontend) || done.Before(kr.killAt) ||
				(r.Sent.Before(kr.killAt) && len(r.Frontends) < 2) {
				continue
			}
		} else if r.Sent.Before(kr.killAt) || (kr.model != "" && !lineageHas(r, kr.model)) {
			continue
		}
		kr.Recovered = true
		kr.RecoveryMs = cluster.MsSince(kr.killAt, done)
		close(kt.done[kr])
	}
}

func lineageHas(r loadgen.Result, model string) bool {
	for _, e := range r.Reply.GetLineage() {
		if e.GetModel() == model {
			return true
		}
	}
	return false
}

func (kt *killTracker) snapshot() []killReport {
	kt.mu.Lock()
	defer kt.mu.Unlock()
	out := make([]killReport, 0, len(kt.kills))
	for _, kr := range kt.kills {
		out = append(out, *kr)
	}
	return out
}

// killNow SIGKILLs the process that plays role for model now and tracks
// its recovery: kr is filled in (under kt.mu) as the outcome becomes
// known. It returns after the kill; the waits (restart in place, restored
// redundancy) run until ctx ends and are done when the returned channel
// closes.
// kr must have been added to kt.
func killNow(ctx context.Context, d *cluster.Deployment, kt *killTracker, kr *killReport, role cluster.ChildRole, model string, loadStart time.Time) (waits chan struct{}) {
	return signalNow(ctx, d, kt, kr, role, model, loadStart, 0)
}

// freezeNow stops the process that plays role for model (SIGSTOP) for
// freeze, then lets it go on (SIGCONT): a false suspicion when freeze
// exceeds the suspicion timeout. recovery_ms and restored_ms are measured
// as for a kill; restored_ms also waits until the frozen model instance is
// no longer alive in the topology (retired, docs/recovery.md "False
// suspicion") and, for a frozen manager or frontend, until it serves
// again (a manager or frontend answers only after the SIGCONT). The waits
// end after the SIGCONT at the earliest.
func freezeNow(ctx context.Context, d *cluster.Deployment, kt *killTracker, kr *killReport, role cluster.ChildRole, model string, loadStart time.Time, freeze time.Duration) (waits chan struct{}) {
	return signalNow(ctx, d, kt, kr, role, model, loadStart, freeze)
}

// partitionNow cuts the target process off the network (every packet it
// sends, every packet for its ports: internal/netfault) for dur, then
// heals it; recovery is tracked as for a kill.
func partitionNow(ctx context.Context, d *cluster.Deployment, kt *killTracker, kr *killReport, role cluster.ChildRole, model string, loadStart time.Time, dur time.Duration) (waits chan struct{}) {
	return faultNow(ctx, d, kt, kr, role, model, loadStart, faultPartition, dur)
}

// faultKind is how a chaos target fails.
type faultKind uint8

const (
	faultKill faultKind = iota
	faultFreeze
	faultPartition
)

func (f faultKind) String() string {
	return [...]string{"kill", "freeze", "partition"}[f]
}

// signalNow is killNow (freeze 0: SIGKILL) and freezeNow.
func signalNow(ctx context.Context, d *cluster.Deployment, kt *killTracker, kr *killReport, role cluster.ChildRole, model string, loadStart time.Time, freeze time.Duration) (waits chan struct{}) {
	if freeze > 0 {
		return faultNow(ctx, d, kt, kr, role, model, loadStart, faultFreeze, freeze)
	}
	return faultNow(ctx, d, kt, kr, role, model, loadStart, faultKill, 0)
}

// readyPorts are the TCP ports a child's ready line names as its own
// listeners. "nats" is the coordination engine's listener only in its own
// ready line: a manager's names the server it connects to, and dropping
// packets for that port cut every process off NATS whenever a manager was
// partitioned (two soaks lost requests that way, 2026-11-27).
func readyPorts(r launch.Ready) []int {
	keys := []string{"grpc", "internal", "http", "metrics"}
	if r.String("role") == "nats" {
		keys = append(keys, "nats")
	}
	var out []int
	for _, k := range keys {
		a := r.String(k)
		if a == "" {
			continue
		}
		if u, err := url.Parse(a); err == nil && u.Host != "" {
			a = u.Host
		}
		if _, p, err := net.SplitHostPort(a); err == nil {
			if n, err := strconv.Atoi(p); err == nil && n > 0 {
				out = append(out, n)
			}
		}
	}
	return out
}

// faultNow applies fault to the target (for dur, but a kill) and tracks
// its recovery.
func faultNow(ctx context.Context, d *cluster.Deployment, kt *killTracker, kr *killReport, role cluster.ChildRole, model string, loadStart time.Time, fault faultKind, dur time.Duration) (waits chan struct{}) {
	freeze := time.Duration(0)
	if fault == faultFreeze {
		freeze = dur
	}
	waits = make(chan struct{})
	rt, err := d.ResolveTarget(ctx, role, model)
	if err != nil {
		kt.mu.Lock()
		kr.Error = err.Error()
		kt.mu.Unlock()
		close(waits)
		return waits
	}
	before, _ := d.Supervisor.Ready(rt.Child)
	at := time.Now()
	var kerr error
	var iso *netfault.Isolation
	switch fault {
	case faultPartition:
		pid, ok := d.Supervisor.Pid(rt.Child)
		if !ok {
			kerr = fmt.Errorf("partition %s: no such process", rt.Child)
		} else {
			iso, kerr = netfault.Isolate(pid, readyPorts(before)...)
		}
	case faultFreeze:
		_, kerr = d.Supervisor.Kill(rt.Child, syscall.SIGSTOP)
	default:
		_, kerr = d.Supervisor.Kill(rt.Child, syscall.SIGKILL)
	}
	kt.mu.Lock()
	kr.Kind, kr.Process, kr.Note = rt.Kind, rt.Child, rt.Note
	kr.Fault = fault.String()
	if fault != faultKill {
		kr.DurationMs = float64(dur) / float64(time.Millisecond)
	}
	if freeze > 0 {
		kr.Note = strings.TrimPrefix(kr.Note+", frozen "+freeze.Round(time.Millisecond).String(), ", ")
	}
	if iso != nil {
		kr.Note = strings.TrimPrefix(kr.Note+", partitioned "+dur.Round(time.Millisecond).String(), ", ")
	}
	kr.killAt, kr.AtMs = at, cluster.MsSince(loadStart, at)
	kr.model = model
	if role.ControlPlane() {
		kr.model = ""
	}
	if role == cluster.RoleFrontend {
		kr.frontendKill, kr.frontend = true, rt.Index
	}
	if kerr != nil {
		kr.Error = kerr.Error()
	}
	kt.mu.Unlock()
	if kerr != nil {
		close(waits)
		return waits
	}
	inPlace := (rt.Inst == nil || !d.Protected()) && fault == faultKill
	go func() {
		defer close(waits)
		var wg sync.WaitGroup
		if iso != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Heal after dur (also when the run ends first: the
				// rules must not outlive the run).
				t := time.NewTimer(dur)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
				}
				if err := iso.Heal(); err != nil {
					d.Log.Warn("heal partitioned child", "child", rt.Child, "err", err)
				}
			}()
		}
		if freeze > 0 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// SIGCONT after freeze (also when the run ends first: a
				// stopped child would not stop on SIGTERM).
				t := time.NewTimer(freeze)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
				}
				if _, err := d.Supervisor.Kill(rt.Child, syscall.SIGCONT); err != nil {
					// It may have exited (retired) or been killed meanwhile.
					d.Log.Info("resume frozen child", "child", rt.Child, "err", err)
				}
			}()
		}
		if inPlace {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := d.Supervisor.WaitReady(ctx, rt.Child, before.Generation)
				if err == nil {
					kt.mu.Lock()
					kr.RestartMs = cluster.MsSince(at, r.At)
					kt.mu.Unlock()
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Let the manager notice the death first: until then the
			// topology still lists the dead instance as alive. A freeze
			// or a partition is judged once it has ended: the process
			// then serves again, or was replaced.
			wait := 50 * time.Millisecond
			if fault != faultKill {
				wait = time.Until(at.Add(dur)) + 50*time.Millisecond
			}
			if !run.Sleep(ctx, wait) {
				return
			}
			for {
				restarted := true
				if inPlace {
					r, ok := d.Supervisor.Ready(rt.Child)
					restarted = ok && r.Generation > before.Generation
				}
				t, err := d.Topology(ctx)
				var lacking []string
				if err == nil {
					// Also kept for a run that gives up: what was missing.
					// Not from a check the run's end cut short: every
					// metrics read then fails, and each backup would be
					// reported unsynced.
					lacking = d.Lacking(ctx, t)
					if ctx.Err() == nil {
						kt.mu.Lock()
						kr.Unrestored = lacking
						kt.mu.Unlock()
					}
				}
				if err == nil && restarted && len(lacking) == 0 && controlRestored(ctx, d, t, rt.Kind) {
					if fault != faultKill || rt.Inst == nil || !cluster.AliveID(t, rt.Inst.ID) || !d.Protected() {
						now := time.Now()
						newActive := ""
						if rt.Kind == "manager" {
							if i := d.ManagerSet.ActiveIndex(ctx); i >= 0 {
								newActive = cluster.ChildName("manager", strconv.Itoa(i))
							}
						}
						kt.mu.Lock()
						kr.RestoredMs = cluster.MsSince(at, now)
						kr.NewActive = newActive
						kt.mu.Unlock()
						return
					}
				}
				if !run.Sleep(ctx, 20*time.Millisecond) {
					return
				}
			}
		}()
		wg.Wait()
	}()
	return waits
}

// controlRestored reports, after a manager or frontend kill, whether the
// control plane is whole again: a manager answers as active (a standby
// took the lease over, or the restarted one took it back) and every
// manager process serves; every frontend is registered again.
func controlRestored(ctx context.Context, d *cluster.Deployment, t *hamsv1.Topology, kind string) bool {
	switch kind {
	case "manager":
		active := false
		for _, a := range d.ManagerSet.Ask(ctx) {
			if a.Err != nil {
				return false
			}
			active = active || a.Active
		}
		return active
	case "frontend":
		for _, f := range d.FrontendInternals {
			if !slices.Contains(t.GetFrontends(), f) {
				return false
			}
		}
	}
	return true
}

// killRoles are the roles a --kill target may name.
func killRoles() []cluster.ChildRole {
	return []cluster.ChildRole{cluster.RoleSidecar, cluster.RoleModelServer, cluster.RoleBackupSidecar, cluster.RoleBackupModelServer, cluster.RoleStandbySidecar, cluster.RoleStandbyModelSrv, cluster.RoleFrontend, cluster.RoleManager, cluster.RoleNATS}
}

func killRoleList() string {
	return fmt.Sprint(killRoles())
}

// freezePrefix marks a --kill spec that freezes instead of killing:
// freeze:ROLE[:MODEL]@AFTER+DURATION (SIGSTOP at AFTER, SIGCONT DURATION
// later), e.g. freeze:sidecar:ap-motion@5s+3s.
const freezePrefix = "freeze:"

// partitionPrefix marks a --kill spec that cuts the process off the
// network instead: partition:ROLE[:MODEL]@AFTER+DURATION (root).
const partitionPrefix = "partition:"

// parseFreeze parses a freeze:ROLE[:MODEL]@AFTER+DURATION spec (s with
// its prefix); ROLE[:MODEL]@AFTER is parsed as a kill's.
func parseFreeze(s string) (killSpec, error) {
	rest := strings.TrimPrefix(s, freezePrefix)
	spec, dur, ok := strings.Cut(rest, "+")
	if !ok {
		return killSpec{}, fmt.Errorf("--kill %q: want %sROLE:MODEL@AFTER+DURATION (e.g. %ssidecar:ap-motion@5s+3s)", s, freezePrefix, freezePrefix)
	}
	d, err := time.ParseDuration(dur)
	if err != nil || d <= 0 {
		return killSpec{}, fmt.Errorf("--kill %q: bad freeze duration %q (want e.g. 3s)", s, dur)
	}
	k, err := parseKill(spec)
	if err != nil {
		return killSpec{}, fmt.Errorf("--kill %q: %w", s, err)
	}
	if k.Role == cluster.RoleNATS {
		return killSpec{}, fmt.Errorf("--kill %q: freezing nats is not supported", s)
	}
	k.Freeze = d
	return k, nil
}
