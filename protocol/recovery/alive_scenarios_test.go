package recovery

import (
	"testing"
)

// The case: the primary is stopped longer than the suspicion
// timeout, its backup is promoted, the spare becomes the backup; when the
// old primary resumes it is retired, never given the backup role it was
// rewired to.
func TestFalseSuspicionStatefulPrimary(t *testing.T) {
	tr := newTranscript(t)
	tr.dies("m/p")
	tr.settle()
	tr.returns("m/p")
	tr.settle()
	tr.check(`
		> topology: m/p dead
		> suspect m/p
		< #1 GetMaxSeq(m/b@m)
		< #2 GetLineageSummary(m/b@m failed=>0)
		> #1 max_seq 10
		> #2 summary max_out=10
		< #3 Promote(m/b@m epoch=2 start=0)
		> #3 done
		< #4 Rewire([{m/b m ROLE_PRIMARY 2} {m/p m ROLE_BACKUP 2}])
		> topology: rewired
		> #4 done
		< Recovered([m])
		< #5 Resend(frontend -> m after 10 epoch=2)
		< #6 Rewire([{m/sp m ROLE_BACKUP 2}])
		> #5 done
		> topology: rewired
		> #6 done
		< #7 SyncBackup(m/sp@m epoch=2 primary=m/b:1)
		< #8 StartInstance(m ROLE_STANDBY)
		> #7 done
		> topology: +m/new1 ROLE_STANDBY
		> #8 done
		> alive again m/p
		< Retire(m/p@m ROLE_BACKUP epoch=2: deposed primary of m (the backup role at epoch 2 is another instance's))
	`)
}

// The primary resumes while its failover is still querying: the decision
// waits for the round's end (the failover might fail), then it is retired.
func TestFalseSuspicionPrimaryDuringItsRound(t *testing.T) {
	tr := newTranscript(t)
	tr.dies("m/p")
	tr.returns("m/p")
	tr.settle()
	tr.check(`
		> topology: m/p dead
		> suspect m/p
		< #1 GetMaxSeq(m/b@m)
		< #2 GetLineageSummary(m/b@m failed=>0)
		> alive again m/p
		> #1 max_seq 10
		> #2 summary max_out=10
		< #3 Promote(m/b@m epoch=2 start=0)
		> #3 done
		< #4 Rewire([{m/b m ROLE_PRIMARY 2} {m/p m ROLE_BACKUP 2}])
		> topology: rewired
		> #4 done
		< Recovered([m])
		< #5 Resend(frontend -> m after 10 epoch=2)
		< #6 Rewire([{m/sp m ROLE_BACKUP 2}])
		> #5 done
		> topology: rewired
		> #6 done
		< #7 SyncBackup(m/sp@m epoch=2 primary=m/b:1)
		< #8 StartInstance(m ROLE_STANDBY)
		> #7 done
		> topology: +m/new1 ROLE_STANDBY
		> #8 done
		< Retire(m/p@m ROLE_BACKUP epoch=2: deposed primary of m (the backup role at epoch 2 is another instance's))
	`)
}

func TestFalseSuspicionBackup(t *testing.T) {
	tr := newTranscript(t)
	tr.dies("m/b")
	tr.settle()
	tr.returns("m/b")
	tr.settle()
	tr.check(`
		> topology: m/b dead
		> suspect m/b
		< #1 Rewire([{m/sp m ROLE_BACKUP 1}])
		> topology: rewired
		> #1 done
		< #2 SyncBackup(m/sp@m epoch=1 primary=m/p:1)
		< #3 StartInstance(m ROLE_STANDBY)
		> #2 done
		> topology: +m/new1 ROLE_STANDBY
		> #3 done
		> alive again m/b
		< Retire(m/b@m ROLE_BACKUP epoch=1: a dead backup is replaced by a new one, synced from the primary)
	`)
}

func TestFalseSuspicionSpare(t *testing.T) {
	tr := newTranscript(t)
	tr.dies("m/sp")
	tr.settle()
	tr.returns("m/sp")
	tr.settle()
	tr.check(`
		> topology: m/sp dead
		> suspect m/sp
		< #1 StartInstance(m ROLE_STANDBY)
		> topology: +m/new1 ROLE_STANDBY
		> #1 done
		> alive again m/sp
		< Retire(m/sp@m ROLE_STANDBY epoch=1: a dead standby is replaced by a new one)
	`)
}

func TestFalseSuspicionStatelessActive(t *testing.T) {
	tr := newTranscript(t)
	tr.dies("x/a")
	tr.settle()
	tr.returns("x/a")
	tr.settle()
	tr.check(`
		> topology: x/a dead
		> suspect x/a
		< #1 GetLineageSummary(@frontend failed=x>0)
		> #1 summary max_out=10
		< #2 Promote(x/s@x epoch=2 start=10)
		> #2 done
		< #3 Rewire([{x/s x ROLE_ACTIVE 2} {x/a x ROLE_STANDBY 1}])
		> topology: rewired
		> #3 done
		< Recovered([x])
		< #4 Resend(m -> x after 10 epoch=2)
		< #5 StartInstance(x ROLE_STANDBY)
		> #4 done
		> topology: +x/new1 ROLE_STANDBY
		> #5 done
		> alive again x/a
		< Retire(x/a@x ROLE_STANDBY epoch=2: deposed active of x (epoch 2 is another instance's))
	`)
}

// Primary and backup both stopped: m cannot be recovered. The backup comes
// back first: it holds m's state (no reply was released past what it
// applied) and the primary is still dead, so it is readmitted and failed
// over to, as for a primary that died just now; the primary, when it
// resumes, is a deposed one and retired. (Before, the backup was retired
// as a dead backup, and a primary that never came back lost m for good.)
func TestFalseSuspicionBothBackupReturnsFirst(t *testing.T) {
	tr := newTranscript(t)
	tr.dies("m/p")
	tr.dies("m/b")
	tr.settle()
	tr.returns("m/b")
	tr.settle()
	tr.returns("m/p")
	tr.settle()
	tr.check(`
		> topology: m/p dead
		> suspect m/p
		< #1 GetMaxSeq(m/b@m)
		< #2 GetLineageSummary(m/b@m failed=>0)
		> topology: m/b dead
		> suspect m/b
		< Unrecoverable(m: primary and backup both failed)
		> #1 max_seq 10
		> #2 summary max_out=10
		> alive again m/b
		< Readmit(m/b@m ROLE_BACKUP epoch=1)
		> topology: m/b readmitted
		< #3 GetMaxSeq(m/b@m)
		< #4 GetLineageSummary(m/b@m failed=>0)
		> #3 max_seq 10
		> #4 summary max_out=10
		< #5 Promote(m/b@m epoch=2 start=0)
		> #5 done
		< #6 Rewire([{m/b m ROLE_PRIMARY 2} {m/p m ROLE_BACKUP 2}])
		> topology: rewired
		> #6 done
		< Recovered([m])
		< #7 Resend(frontend -> m after 10 epoch=2)
		< #8 Rewire([{m/sp m ROLE_BACKUP 2}])
		> #7 done
		> topology: rewired
		> #8 done
		< #9 SyncBackup(m/sp@m epoch=2 primary=m/b:1)
		< #10 StartInstance(m ROLE_STANDBY)
		> #9 done
		> topology: +m/new1 ROLE_STANDBY
		> #10 done
		> alive again m/p
		< Retire(m/p@m ROLE_BACKUP epoch=2: deposed primary of m (the backup role at epoch 2 is another instance's))
	`)
}

// Primary and backup both stopped; the primary comes back first: still
// m's primary (nobody replaced it), readmitted, and a new backup is started
// and synced; the old backup, returning after that, is retired.
func TestFalseSuspicionBothPrimaryReturnsFirst(t *testing.T) {
	tr := newTranscript(t)
	tr.dies("m/p")
	tr.dies("m/b")
	tr.settle()
	tr.returns("m/p")
	tr.settle()
	tr.returns("m/b")
	tr.settle()
	tr.check(`
		> topology: m/p dead
		> suspect m/p
		< #1 GetMaxSeq(m/b@m)
		< #2 GetLineageSummary(m/b@m failed=>0)
		> topology: m/b dead
		> suspect m/b
		< Unrecoverable(m: primary and backup both failed)
		> #1 max_seq 10
		> #2 summary max_out=10
		> alive again m/p
		< Readmit(m/p@m ROLE_PRIMARY epoch=1)
		< #3 StartInstance(m ROLE_BACKUP)
		> topology: m/p readmitted
		> topology: +m/new1 ROLE_BACKUP
		< #4 SyncBackup(m/new1@m epoch=1 primary=m/p:1)
		> #3 done
		> #4 done
		> alive again m/b
		< Retire(m/b@m ROLE_BACKUP epoch=1: a dead backup is replaced by a new one, synced from the primary)
	`)
}

// The primary was killed for good while its backup was stopped: the
// backup's return is what recovers m (before, it was retired and m stayed
// down). Its promotion can still be refused (a backup behind m's durable
// position: a restarted process under its id): then m is given up again,
// and the backup, not promoted, stays readmitted and is not retried in a
// loop.
func TestFalseSuspicionBackupOfAKilledPrimaryRefusesPromotion(t *testing.T) {
	tr := newTranscript(t)
	tr.fail = func(a Action) bool { return a.Kind == Promote }
	tr.dies("m/p")
	tr.dies("m/b")
	tr.settle()
	tr.returns("m/b")
	tr.settle()
	tr.check(`
		> topology: m/p dead
		> suspect m/p
		< #1 GetMaxSeq(m/b@m)
		< #2 GetLineageSummary(m/b@m failed=>0)
		> topology: m/b dead
		> suspect m/b
		< Unrecoverable(m: primary and backup both failed)
		> #1 max_seq 10
		> #2 summary max_out=10
		> alive again m/b
		< Readmit(m/b@m ROLE_BACKUP epoch=1)
		> topology: m/b readmitted
		< #3 GetMaxSeq(m/b@m)
		< #4 GetLineageSummary(m/b@m failed=>0)
		> #3 max_seq 10
		> #4 summary max_out=10
		< #5 Promote(m/b@m epoch=2 start=0)
		> #5 failed
		< Unrecoverable(m: failover of m/b failed: injected failure)
	`)
}

// The primary's suspicion waits behind another round; it resumes before
// that round ends: nobody replaced it, it is readmitted and its queued
// suspicion dropped (no failover of a live primary).
func TestFalseSuspicionQueuedSuspicionDropped(t *testing.T) {
	tr := newTranscript(t)
	tr.dies("x/a")
	// Answer the source query: the round commits (Promote pending).
	a := tr.pending[0]
	tr.pending = tr.pending[1:]
	tr.feed("#1 summary max_out=10", tr.must(tr.m.onSummaryAnswered(a.ID, Summary{MaxOut: 10, MaxIn: map[string]uint64{"m": 10}})))
	tr.dies("m/p")
	tr.returns("m/p")
	tr.settle()
	tr.check(`
		> topology: x/a dead
		> suspect x/a
		< #1 GetLineageSummary(@frontend failed=x>0)
		> #1 summary max_out=10
		< #2 Promote(x/s@x epoch=2 start=10)
		> topology: m/p dead
		> suspect m/p
		> alive again m/p
		< Readmit(m/p@m ROLE_PRIMARY epoch=1)
		> topology: m/p readmitted
		> #2 done
		< #3 Rewire([{x/s x ROLE_ACTIVE 2} {x/a x ROLE_STANDBY 1}])
		> topology: rewired
		> #3 done
		< Recovered([x])
		< #4 Resend(m -> x after 10 epoch=2)
		< #5 StartInstance(x ROLE_STANDBY)
		> #4 done
		> topology: +x/new1 ROLE_STANDBY
		> #5 done
	`)
}

// The standby is dead already and no new one can be started; the active
// stops: its round waits for a standby that never comes and gives x up.
// The active resumes during the round: the decision waits for the round's
// end, when nobody replaced it: readmitted.
func TestFalseSuspicionStatelessNoReplacementReadmitted(t *testing.T) {
	tr := newTranscript(t)
	tr.fail = func(a Action) bool { return a.Kind == StartInstance }
	tr.pl("x/s").Alive = false
	tr.topology("x/s dead")
	tr.dies("x/a")
	tr.returns("x/a")
	tr.settle()
	tr.check(`
		> topology: x/s dead
		> topology: x/a dead
		> suspect x/a
		< #1 StartInstance(x ROLE_STANDBY)
		< #2 GetLineageSummary(@frontend failed=x>0)
		> alive again x/a
		> #1 failed
		< Unrecoverable(x: no standby: injected failure)
		> #2 summary max_out=10
		< Readmit(x/a@x ROLE_ACTIVE epoch=1)
	`)
}
