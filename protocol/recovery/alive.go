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
	if prim := m.givenUpPrimary(p); prim != nil {
		// Its model was given up (primary and backup both failed) and
		// the primary is still dead: this backup holds the model's
		// state (no reply was released past what it applied), so it is
		// readmitted and failed over to, as if the primary had died
		// just now, once the topology shows it alive. Retiring it (a
		// dead backup is replaced) would lose the model for good.
		m.failoverOnReturn[model] = prim.GetComponentId()
		dec.Kind = Readmit
		dec.Reason = fmt.Sprintf("the backup of %s, whose primary %s is dead: failed over to", model, prim.GetComponentId())
		return []Action{dec}
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

// givenUpPrimary returns the dead primary of p's model when p, a returning
// instance, is that model's current backup and the model was given up: its
// primary is dead and was handled by a finished round, and no other backup
// that holds the state took p's place (a new backup started when p was
// lost never synced: there was no primary to sync from). Nil otherwise
// (replay mode's backups are spares that replay; they are never failed
// over to).
func (m *Machine) givenUpPrimary(p *hamsv1.Placement) *hamsv1.Placement {
	model := p.GetModel()
	if p.GetRole() != hamsv1.Role_ROLE_BACKUP || !m.g.Stateful(model) || m.cfg.Replay || p.GetSidecarAddress() == "" {
		return nil
	}
	if m.wasPrimary(p.GetComponentId()) || p.GetEpoch() < m.maxEpoch(model) || m.syncedLiveBackup(model) != nil {
		return nil
	}
	prim := m.currentPrimary(model)
	if prim == nil || prim.GetAlive() || !m.handled[prim.GetComponentId()] {
		return nil
	}
	return prim
}

// failOverToReturnedBackups recovers the dead primary of every model in
// failoverOnReturn whose readmitted backup the topology shows alive now:
// a new suspicion of the primary, which fails over to that backup.
func (m *Machine) failOverToReturnedBackups() []Action {
	var out []Action
	for _, model := range sortedKeys(m.failoverOnReturn) {
		if m.syncedLiveBackup(model) == nil {
			continue // not readmitted in this topology yet
		}
		prim := m.failoverOnReturn[model]
		delete(m.failoverOnReturn, model)
		if p := m.placement(prim); p == nil || p.GetAlive() {
			continue // the primary came back meanwhile
		}
		delete(m.handled, prim)
		out = append(out, m.onSuspected(model, hamsv1.Role_ROLE_PRIMARY, prim)...)
	}
	return out
}

// syncedLiveBackup is model's highest-epoch live backup that holds the
// model's state: not a new backup still waiting for its sync (started for
// a lost backup, not synced because no primary lived since).
func (m *Machine) syncedLiveBackup(model string) *hamsv1.Placement {
	known := m.awaitSync[model]
	return m.bestWhere(model, hamsv1.Role_ROLE_BACKUP, func(p *hamsv1.Placement) bool {
		// known: the backups there were when a new one was asked for;
		// one started since has not synced.
		return m.live(p) && (known == nil || known[p.GetComponentId()])
	})
}
