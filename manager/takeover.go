package manager

import (
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"

	"github.com/hams-go/hams/internal/config"
)

// unfinished is a suspicion a manager re-raises when it takes over.
type unfinished struct {
	id, model string
	role      hamsv1.Role
}

// unfinishedRecovery lists what a new active manager must suspect again
// in topology t. Recovery is edge-triggered: a death starts a round, and
// an active manager that is killed (or deposed) between a suspicion and
// the end of its round takes the round with it. Its successor sees the
// dead placements, written dead, and left them alone: the model stayed
// short of an instance for good (a 10-minute soak, 2026-11-26: a
// partitioned active manager retired the standbys it could not hear and
// was killed before their replacements were started).
//
// Level-triggered, so nothing is done twice: a model whose serving
// instance (primary, or active of a stateless model) is dead, with no
// live one; a replicated model with a dead backup and no live one; a
// model that has standbys (config) with a dead standby and no live one.
// For each, the dead instance is suspected again (the recovery machine
// ignores a suspicion that no longer holds: a primary already failed
// over, say). Frontends and managers are not placements.
func unfinishedRecovery(t *hamsv1.Topology, dep *config.Deployment) []unfinished {
	type key struct {
		model string
		role  hamsv1.Role
	}
	live := map[key]bool{}
	dead := map[key]*hamsv1.Placement{}
	for _, p := range t.GetPlacements() {
		if p.GetSidecarAddress() == "" {
			continue // a model server: its sidecar holds the role
		}
		k := key{p.GetModel(), p.GetRole()}
		if p.GetAlive() {
			live[k] = true
		} else if dead[k] == nil || p.GetComponentId() < dead[k].GetComponentId() {
			dead[k] = p
		}
	}
	var out []unfinished
	add := func(model string, role hamsv1.Role) {
		k := key{model, role}
		if p := dead[k]; p != nil && !live[k] {
			out = append(out, unfinished{id: p.GetComponentId(), model: model, role: role})
		}
	}
	for i := range dep.Models {
		m := &dep.Models[i]
		if m.Stateful {
			add(m.Name, hamsv1.Role_ROLE_PRIMARY)
		} else {
			add(m.Name, hamsv1.Role_ROLE_ACTIVE)
		}
		if dep.Replicated(m) {
			add(m.Name, hamsv1.Role_ROLE_BACKUP)
		}
		if dep.Replicated(m) || dep.HasStandby(m.Name) {
			add(m.Name, hamsv1.Role_ROLE_STANDBY)
		}
	}
	return out
}

// resumeRecovery suspects again, after a takeover, what unfinishedRecovery
// finds in the topology this manager took over with.
func (m *Manager) resumeRecovery() {
	t, _ := m.hub.get()
	for _, u := range unfinishedRecovery(t, m.cfg.Deployment) {
		m.suspectNow(u.id, u.model, u.role, "dead in the topology at takeover with no live instance in its role (the previous active manager's recovery did not finish)")
	}
}
