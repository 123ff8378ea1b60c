package config

// Replicated reports whether model m runs as a primary and a backup under
// mode: a stateful model with ha stateful under an NSPB-family mode
// (Mode.Replicates; replay mode's stateful models run as in bare mode and
// get a spare instead, Deployment.Replays). This is the one statement of
// the rule: the orchestrator, the adapter factory and the sidecar's
// replicationOf all decide with it.
func Replicated(m *Model, mode Mode) bool {
	return m != nil && m.Stateful && m.HA == "stateful" && mode.Replicates()
}

// Replicated reports whether model m of d runs as primary + backup
// (Replicated under d's mode).
func (d *Deployment) Replicated(m *Model) bool { return Replicated(m, d.RunMode()) }

// HasBackup reports whether model m of d gets a second instance in the
// backup role: an NSPB-family backup or a replay-mode spare.
func (d *Deployment) HasBackup(m *Model) bool { return d.Replicated(m) || d.Replays(m) }

// Coordinated reports whether d's processes need the coordination engine
// (durability and completion notices, replay mode's log and checkpoints):
// some model is replicated or runs in replay mode.
func (d *Deployment) Coordinated() bool {
	for i := range d.Models {
		if d.HasBackup(&d.Models[i]) {
			return true
		}
	}
	return false
}
