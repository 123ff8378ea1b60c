package recovery

import (
	"testing"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// A restarted backup process is admitted as a fresh spare (SpareJoined)
// while the round for its old incarnation runs; that round's new backup
// cannot be started (no instance starter: Kubernetes, compose). When the
// round ends, m has a live primary, no backup and a live spare: the spare
// becomes m's backup and is synced. Before, SpareJoined during a round
// was dropped and m stayed without a backup (TestReportedBackupWithoutSpare
// of the manager failed about once in 30 runs under load).
func TestSpareJoinedDuringARoundBecomesTheBackup(t *testing.T) {
	tr := newTranscript(t)
	// No spare of m to begin with.
	var ps []*hamsv1.Placement
	for _, p := range tr.topo.Placements {
		if p.ComponentId != "m/sp" {
			ps = append(ps, p)
		}
	}
	tr.topo.Placements = ps
	tr.topology("m/sp gone")
	tr.fail = func(a Action) bool { return a.Kind == StartInstance && a.Role == hamsv1.Role_ROLE_BACKUP }
	tr.dies("m/b")
	tr.topo.Placements = append(tr.topo.Placements, &hamsv1.Placement{ComponentId: "m/fresh", Model: "m",
		Role: hamsv1.Role_ROLE_STANDBY, SidecarAddress: "m/fresh:1", Epoch: 1, Alive: true})
	tr.topology("+m/fresh ROLE_STANDBY (restarted, admitted fresh)")
	tr.feed("spare joined m/fresh", tr.m.onSpareJoined("m/fresh"))
	tr.settle()
	tr.check(`
		> topology: m/sp gone
		> topology: m/b dead
		> suspect m/b
		< #1 StartInstance(m ROLE_BACKUP)
		> topology: +m/fresh ROLE_STANDBY (restarted, admitted fresh)
		> spare joined m/fresh
		> #1 failed
		< Unrecoverable(m: new backup could not be started: injected failure)
		< #2 Rewire([{m/fresh m ROLE_BACKUP 1}])
		> topology: rewired
		> #2 done
		< #3 SyncBackup(m/fresh@m epoch=1 primary=m/p:1)
		< #4 StartInstance(m ROLE_STANDBY)
		> #3 done
		> topology: +m/new1 ROLE_STANDBY
		> #4 done
	`)
}
