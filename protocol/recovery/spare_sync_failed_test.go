package recovery

import (
	"testing"
)

// A backup dies; its spare is rewired as the backup, but SyncBackup to it
// fails (it stopped answering, or refused). A new backup is started and
// synced; the spare, listed as a BACKUP and alive, must not stay beside
// it: the primary ships to whichever backup its topology lists first, so
// it could ship to the spare that nobody synced while recovery syncs the
// new one, and a later loss of either left the model without a synced
// backup, its durability stalled (a CI chaos run, 2026-11-27). It is
// retired, as a deposed primary whose demotion failed is.
func TestSpareWhoseSyncFailedIsRetired(t *testing.T) {
	tr := newTranscript(t)
	tr.fail = func(a Action) bool { return a.Kind == SyncBackup && a.Component == "m/sp" }
	tr.dies("m/b")
	tr.settle()
	tr.check(`
		> topology: m/b dead
		> suspect m/b
		< #1 Rewire([{m/sp m ROLE_BACKUP 1}])
		> topology: rewired
		> #1 done
		< #2 SyncBackup(m/sp@m epoch=1 primary=m/p:1)
		< #3 StartInstance(m ROLE_STANDBY)
		> #2 failed
		< Retire(m/sp@m ROLE_BACKUP epoch=1: spare made the backup of m not synced (injected failure): a new backup replaces it)
		< #4 StartInstance(m ROLE_BACKUP)
		> topology: +m/new1 ROLE_STANDBY
		> #3 done
		> topology: +m/new2 ROLE_BACKUP
		< #5 SyncBackup(m/new2@m epoch=1 primary=m/p:1)
		> #4 done
		> #5 done
	`)
	// The retirement comes before the new backup's start: the primary
	// never sees two live backups once the manager performs it.
}
