package manager

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/protocol/recovery"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// False suspicion (docs/recovery.md): a model instance declared dead may
// still run (stopped, descheduled, cut off for longer than the suspicion
// timeout). When it is heard from again its heartbeats do not make it
// alive: the active manager holds it dead in the topology and asks
// recovery (event recovery.AliveAgain), which answers
//   - Retire: its role was handed to another instance (or will be); it is
//     never reused. Its heartbeats and registrations are answered NotFound
//     with the reason, so its manager client gives up and its process
//     exits (a supervisor does not restart a model instance in place in a
//     protected mode); the replacement recovery started restores
//     redundancy.
//   - Readmit: nobody replaced it (it is still its model's serving
//     instance): it is alive again in its old role.
//
// Only sidecars of a protected mode are held: frontends, model servers
// and bare-mode instances come back as before (a frontend rejoins as a
// follower; bare mode has no recovery).

// holdsReturnLocked reports whether a return of the component registered
// as r from the dead is recovery's decision (caller holds mu).
func (m *Manager) holdsReturnLocked(r *hamsv1.RegisterRequest) bool {
	return r != nil && r.GetKind() == hamsv1.ComponentKind_COMPONENT_KIND_SIDECAR && m.cfg.Deployment.RunMode().Protected()
}

// errRetired answers a retired component's heartbeat or registration.
func errRetired(id, why string) error {
	return status.Errorf(codes.NotFound, "id %q: retired: it was declared dead and is never reused (%s); this process should exit, a new instance takes its place", id, why)
}

// heldReturnLocked decides, for a heartbeat or registration of id, whether
// it is held dead: known to membership, dead, a held kind, and this
// manager is active. first reports that recovery must be asked (once per
// return). Caller holds mu.
func (m *Manager) heldReturnLocked(id string) (held, first bool) {
	if !m.active.Load() || !m.holdsReturnLocked(m.regs[id]) {
		return false, false
	}
	if alive, known := m.members.Alive(id); !known || alive {
		return false, false
	}
	first = !m.returning[id]
	m.returning[id] = true
	return true, first
}

// aliveAgain asks recovery what to do with id, heard from again while
// declared dead.
func (m *Manager) aliveAgain(id string) {
	m.log.Info("component declared dead is alive again; held dead until recovery decides", "id", id)
	ev := recEvent{recovery.AliveAgain{Component: id}}
	select {
	case m.recCh <- ev:
	default:
		// The next heartbeat asks again.
		m.mu.Lock()
		delete(m.returning, id)
		m.mu.Unlock()
		m.log.Error("recovery: event queue full; alive-again event dropped", "id", id)
	}
}

// retire applies a Retire decision.
func (m *Manager) retire(a recovery.Action) (died bool) {
	m.mu.Lock()
	m.retired[a.Component] = a.Reason
	if r := m.regs[a.Component]; r != nil {
		m.retiredInc[a.Component] = r.GetIncarnation()
	}
	delete(m.returning, a.Component)
	// A component still alive to membership (recovery found it
	// unreachable and replaced it) is dead from now on.
	if died = len(m.members.Dead(a.Component)) > 0; died {
		m.metrics.deaths.Inc()
		m.updateGaugesLocked()
	}
	m.mu.Unlock()
	m.metrics.returned.WithLabelValues("retired").Inc()
	m.log.Warn("falsely suspected component retired: it is never reused and is told to exit", "id", a.Component,
		"model", a.Model, "role", a.Role.String(), "model_epoch", a.Epoch, "why", a.Reason)
	return died
}

// readmit applies a Readmit decision: id is alive again.
func (m *Manager) readmit(ctx context.Context, a recovery.Action) {
	m.mu.Lock()
	delete(m.returning, a.Component)
	acts := m.members.Registered(a.Component, time.Now())
	m.updateGaugesLocked()
	m.mu.Unlock()
	m.metrics.returned.WithLabelValues("readmitted").Inc()
	why := a.Reason
	if why == "" {
		why = "nobody replaced it"
	}
	m.log.Info("component declared dead readmitted", "id", a.Component, "model", a.Model,
		"role", a.Role.String(), "epoch", a.Epoch, "why", why)
	if len(acts) == 0 {
		return
	}
	if _, err := m.reconcile(ctx); err != nil {
		m.log.Warn("write liveness to deployment state", "id", a.Component, "err", err)
	}
}

// Retired returns the components retired so far (id -> why).
func (m *Manager) Retired() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]string, len(m.retired))
	for k, v := range m.retired {
		out[k] = v
	}
	return out
}
