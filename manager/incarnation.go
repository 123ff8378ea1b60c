package manager

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/manager/dashboard/timeline"
	"github.com/hams-go/hams/protocol/recovery"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// A process restarted under its component id (issue 20: a sidecar
// container restarted in its pod by a restart policy, a compose service
// restarted) re-registers with the same id before the heartbeat
// suspicion timeout fires. Its state (a primary's, a backup's) is gone,
// so it must not keep its role. Each process registers with an
// incarnation of its own (RegisterRequest.incarnation, random per
// process, manager/client). Invariants, for a model instance (sidecar) of
// a protected mode on the active manager:
//   - A registration naming a known id with another incarnation than the
//     registered one is the old incarnation's death: it is declared dead
//     at once (as a supervisor's exit report would) and recovered as for
//     a kill (a primary's backup is promoted, a lost backup or standby is
//     replaced), before the new process is given anything.
//   - The new process is held dead, like a false suspicion's return
//     (alive.go), until recovery decides. A Retire decision (its old
//     role was handed over) admits it as a fresh STANDBY of its model (a
//     spare backup of a stateful model, synced before it is ever made a
//     backup; a hot standby of a stateless one), never in its old role.
//     A Readmit (nobody could replace it) gives it its old role back.
//   - A superseded incarnation is refused for good: its heartbeats and
//     registrations are answered NotFound, so a process that was only
//     stopped, not dead, exits when it runs again.
//   - A retired id stays refused to the retired incarnation (and to
//     registrations that name none); a new incarnation under it is a new
//     process and is admitted as a fresh STANDBY.
//
// Registrations without an incarnation (older components) are matched by
// id alone, as before.

// refusedIncarnationLocked refuses a registration of a superseded
// incarnation (caller holds mu).
func (m *Manager) refusedIncarnationLocked(r *hamsv1.RegisterRequest) error {
	inc := r.GetIncarnation()
	if inc == "" || !m.superseded[r.GetId()][inc] {
		return nil
	}
	cur := ""
	if reg := m.regs[r.GetId()]; reg != nil {
		cur = reg.GetIncarnation()
	}
	return status.Errorf(codes.NotFound, "id %q: incarnation %s was superseded by %s (a new process registered under this id); this process should exit",
		r.GetId(), inc, cur)
}

// newProcessLocked: a registration of a retired id with incarnation inc
// comes from another process than the retired one (caller holds mu).
func (m *Manager) newProcessLocked(id, inc string) bool {
	return inc != "" && inc != m.retiredInc[id] && m.holdsReturnLocked(m.regs[id]) && m.active.Load()
}

// reincarnationLocked: registration r names prev's id with another
// incarnation, and the return of such an instance is recovery's decision
// (caller holds mu).
func (m *Manager) reincarnationLocked(prev, r *hamsv1.RegisterRequest) bool {
	return prev != nil && prev.GetIncarnation() != "" && r.GetIncarnation() != "" &&
		prev.GetIncarnation() != r.GetIncarnation() && m.active.Load() && m.holdsReturnLocked(prev)
}

// supersedeLocked records that r's process replaces prev's under the
// same id and declares prev's incarnation dead; died reports that it was
// alive until now (its recovery is then the caller's to start). Caller
// holds mu and has stored r in regs.
func (m *Manager) supersedeLocked(prev, r *hamsv1.RegisterRequest) (died bool) {
	id := r.GetId()
	if m.superseded[id] == nil {
		m.superseded[id] = map[string]bool{}
	}
	m.superseded[id][prev.GetIncarnation()] = true
	m.reincarnated[id] = true
	acts := m.members.Dead(id)
	m.metrics.restarts.Inc()
	m.log.Warn("component restarted under its id: its previous incarnation is declared dead (its state is lost), the new process is held until recovery decides",
		"id", id, "model", prev.GetModel(), "role", prev.GetRole().String(), "old_incarnation", prev.GetIncarnation(),
		"new_incarnation", r.GetIncarnation(), "old_pid", prev.GetPid(), "new_pid", r.GetPid(), "was_alive", len(acts) > 0)
	if len(acts) > 0 {
		m.metrics.deaths.Inc()
		return true
	}
	return false
}

// suspectNow is suspect with the topology the caller just wrote
// installed first: the recovery machine must see the death it recovers
// (a failover's old primary must not look alive and be demoted).
func (m *Manager) suspectNow(id, model string, role hamsv1.Role, why string) {
	if !m.active.Load() {
		return
	}
	m.log.Info("recovery: suspect", "id", id, "model", model, "why", why)
	m.emit(timeline.Event{Kind: timeline.Suspicion, Model: model, Component: id, Role: roleName(role), Detail: why})
	t, _ := m.hub.get()
	ev := recEvent{recovery.TopologyChanged{Topology: t}, recovery.Suspected{Model: model, Role: role, Component: id}}
	select {
	case m.recCh <- ev:
	default:
		m.log.Error("recovery: event queue full; suspicion dropped", "id", id)
	}
}

// takeReincarnated reports (once) whether id's held registration is a new
// incarnation: recovery's Retire then admits it fresh instead.
func (m *Manager) takeReincarnated(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.reincarnated[id] {
		return false
	}
	delete(m.reincarnated, id)
	return true
}

// admitFreshLocked admits id's (new) process as a STANDBY of model at the
// model's newest epoch, alive (caller holds mu).
func (m *Manager) admitFreshLocked(id, model string) {
	var ep uint64 = 1
	t, _ := m.hub.get()
	for _, p := range t.GetPlacements() {
		if p.GetModel() == model {
			ep = max(ep, p.GetEpoch())
		}
	}
	m.assigned[id] = assignment{role: hamsv1.Role_ROLE_STANDBY, epoch: ep}
	delete(m.returning, id)
	delete(m.reincarnated, id)
	m.members.Registered(id, time.Now())
	m.updateGaugesLocked()
	m.metrics.returned.WithLabelValues("fresh").Inc()
	m.log.Info("restarted component admitted as a fresh standby (its old role was handed over)", "id", id, "model", model, "epoch", ep)
}

// admitFresh applies a Retire decision for a new incarnation: admitted as
// a fresh STANDBY instead of retired.
func (m *Manager) admitFresh(ctx context.Context, a recovery.Action) {
	m.mu.Lock()
	m.admitFreshLocked(a.Component, a.Model)
	m.mu.Unlock()
	if _, err := m.reconcile(ctx); err != nil {
		m.log.Warn("write liveness to deployment state", "id", a.Component, "err", err)
	}
	m.spareJoined(a.Component)
}

// spareJoined tells recovery that id joined as a STANDBY: a stateful model
// left without a backup (no spare, and no instance starter to start one:
// a Kubernetes or compose deployment, where restart policies bring
// processes back) makes it its backup at once. With a starter the backup
// recovery asked it for restores redundancy (two new backups would race).
func (m *Manager) spareJoined(id string) {
	if m.cfg.Starter != nil || !m.active.Load() {
		return
	}
	t, _ := m.hub.get()
	ev := recEvent{recovery.TopologyChanged{Topology: t}, recovery.SpareJoined{Component: id}}
	select {
	case m.recCh <- ev:
	default:
		m.log.Error("recovery: event queue full; spare-joined event dropped", "id", id)
	}
}
