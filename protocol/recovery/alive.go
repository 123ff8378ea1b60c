package recovery

import (
	"fmt"
	"slices"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// onAliveAgain handles AliveAgain: component, which the driver's
// membership declared dead, was heard from again (a heartbeat or a
// registration after a false suspicion: the process was stopped,
// descheduled or cut off for longer than the suspicion timeout). The
// driver keeps it dead in the topology until the answer: exactly one
// decision action, Readmit or Retire (docs/recovery.md, "False
// suspicion").
//
// The rule: an instance whose role was handed to another instance, or will
// be (its death is being, or was, recovered), is never reused: Retire (its
// process exits; recovery has started, or starts, the instance that
// restores redundancy). An instance nobody replaced (still its model's
// serving instance at the model's epoch: recovery could not replace it, or
// has not started to) is readmitted in its old role, and a queued
// suspicion of it is dropped. While a round recovers the component or its
// model, the decision waits for the round's end (nil now; the decision
// comes with the actions that end the round).
func (m *Machine) onAliveAgain(component string) []Action {
	p := m.placement(component)
	if p == nil {
		return []Action{{Kind: Retire, Component: component, Reason: "not in the topology"}}
	}
	model := p.GetModel()
	dec := Action{Component: component, Model: model, Role: p.GetRole(), Epoch: m.maxEpoch(model)}
	if p.GetAlive() {
		// The topology already shows it alive (the driver readmitted it,
		// or another writer did): nothing to hold.
		dec.Kind = Readmit
		return []Action{dec}
	}
	if r := m.r; r != nil && (r.dead[component] || r.tasks[model] != nil) {
		// The round that recovers it (or its model) decides whether it
		// gets replaced: the decision waits for the round's end
		// (endRound), the driver holds the component dead meanwhile.
		if !slices.Contains(m.returning, component) {
			m.returning = append(m.returning, component)
		}
		return nil
	}
	if why := m.replaced(p); why != "" {
		dec.Kind, dec.Reason = Retire, why
		out := []Action{dec}
		if p.GetRole() == hamsv1.Role_ROLE_BACKUP {
			out = append(out, m.restoreBackup(model, nil)...)
		}
		return out
	}
	q := m.queued[:0]
	for _, s := range m.queued {
		if s.component != component {
			q = append(q, s)
		}
	}
	m.queued = q
	dec.Kind = Readmit
	out := []Action{dec}
	if p.GetRole() == hamsv1.Role_ROLE_PRIMARY {
		out = append(out, m.restoreBackup(model, p)...)
	}
	return out
}

// restoreBackup starts a new backup of stateful model when nothing else
// will: no round is running, the model has a live primary (prim, being
// readmitted, counts) and no live backup, and no new backup is awaited.
// The new backup is synced when it shows up (onTopologyChanged).
func (m *Machine) restoreBackup(model string, prim *hamsv1.Placement) []Action {
	if m.r != nil || m.cfg.Replay || !m.g.Stateful(model) || m.awaitSync[model] != nil || m.liveBackup(model) != nil {
		return nil
	}
	if prim == nil && m.livePrimary(model, nil) == nil {
		return nil
	}
	known := map[string]bool{}
	for _, p := range m.topo.GetPlacements() {
		if p.GetModel() == model && p.GetRole() == hamsv1.Role_ROLE_BACKUP {
			known[p.GetComponentId()] = true
		}
	}
	m.awaitSync[model] = known
	a := m.act(Action{Kind: StartInstance, Model: model, Role: hamsv1.Role_ROLE_BACKUP})
	m.starts[a.ID] = model
	return []Action{a}
}

// replaced says why placement p (dead in the topology) must not serve
// again, or "" when it is still its model's serving instance and nobody
// is replacing it.
func (m *Machine) replaced(p *hamsv1.Placement) string {
	id, model := p.GetComponentId(), p.GetModel()
	switch p.GetRole() {
	case hamsv1.Role_ROLE_PRIMARY:
		if !m.g.Stateful(model) {
			return "not a stateful model's primary"
		}
		if cur := m.currentPrimary(model); cur.GetComponentId() != id {
			return fmt.Sprintf("%s is the primary at epoch %d", cur.GetComponentId(), cur.GetEpoch())
		}
		if p.GetEpoch() < m.maxEpoch(model) {
			return fmt.Sprintf("its epoch %d is behind %s's %d", p.GetEpoch(), model, m.maxEpoch(model))
		}
		return ""
	case hamsv1.Role_ROLE_ACTIVE:
		if la := m.liveActive(model); la != nil && la.GetComponentId() != id {
			return fmt.Sprintf("%s is the active at epoch %d", la.GetComponentId(), la.GetEpoch())
		}
		if b := m.best(model, hamsv1.Role_ROLE_ACTIVE, false); b.GetComponentId() != id || p.GetEpoch() < m.maxEpoch(model) {
			return fmt.Sprintf("its epoch %d is behind %s's %d", p.GetEpoch(), model, m.maxEpoch(model))
		}
		return ""
	case hamsv1.Role_ROLE_BACKUP:
		if m.g.Stateful(model) && p.GetEpoch() > 1 && m.wasPrimary(id) {
			return fmt.Sprintf("deposed primary of %s (the backup role at epoch %d is another instance's)", model, p.GetEpoch())
		}
		return "a dead backup is replaced by a new one, synced from the primary"
	case hamsv1.Role_ROLE_STANDBY:
		if !m.g.Stateful(model) && m.wasPrimary(id) {
			return fmt.Sprintf("deposed active of %s (epoch %d is another instance's)", model, m.maxEpoch(model))
		}
		return "a dead standby is replaced by a new one"
	}
	return fmt.Sprintf("role %s is not served again", p.GetRole())
}

// wasPrimary: id was rewired from the serving role (PRIMARY, ACTIVE) by a
// recovery this machine ran (for the retirement's reason only).
func (m *Machine) wasPrimary(id string) bool { return m.deposed[id] }
