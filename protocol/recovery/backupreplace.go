package recovery

import (
	"slices"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// onSpareJoined handles SpareJoined: component joined as a live STANDBY
// (a spare backup of a stateful model: a restarted process admitted
// fresh, or a new spare). When its model has a live primary and no live backup, and
// no round runs, a round restores redundancy at once the way a lost
// backup's round does (finish: the spare is rewired to BACKUP at the
// primary's epoch, then synced from the primary, whose state overwrites
// whatever it held). A spare that joins while a round runs is looked at
// again when the round ends (endRound): the round may restore redundancy
// itself, or fail to (its new backup could not be started) and leave the
// model without a backup beside a live spare. A model with a backup needs
// none.
//
// The driver steps SpareJoined only where no new backup was asked of an instance
// starter that may still come up (two new backups would both be synced).
func (m *Machine) onSpareJoined(component string) []Action {
	if m.r != nil && !m.cfg.Replay {
		if !slices.Contains(m.sparesJoined, component) {
			m.sparesJoined = append(m.sparesJoined, component)
		}
		return nil
	}
	p := m.placement(component)
	if p == nil || !p.GetAlive() || p.GetRole() != hamsv1.Role_ROLE_STANDBY || m.cfg.Replay {
		return nil
	}
	model := p.GetModel()
	if !m.g.Stateful(model) || m.livePrimary(model, nil) == nil || m.liveBackup(model) != nil {
		return nil
	}
	delete(m.awaitSync, model)
	out := m.startRound()
	m.r.backupL[model] = true
	return append(out, m.maybeCommit()...)
}
