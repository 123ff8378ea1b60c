// Package protocol is the vocabulary every pure state machine of HAMS-Go
// speaks, in the style of etcd-io/raft: events in, a list of actions out.
// Its subpackages hold the machines, one per rule of the HAMS paper
// (docs/design.md; the paper's sections III-IV):
//
//	nspb/      the stateful primary's compute/update/copy/ship Pipeline
//	           (IV-B, IV-C, and the remus / nspb-s1 / nspb-s2 baselines),
//	           the backup's apply rule (Backup, Algorithm 2), the
//	           frontend's ReplyGate (a reply leaves when its states are
//	           durable)
//	recovery/  the manager's failover rounds (IV-E): stateless standby
//	           promotion, stateful failover with downstream promotion,
//	           rollback on correlated failures, restoring redundancy
//	lineage/   the lineage Flow (what Algorithm 1's lineages say reached
//	           whom), read to answer GetLineageSummary
//	parity/    ParM's coding groups and the replica pool's dispatch
//
// # The pattern
//
// A machine is a value with a Step method (Machine):
//
//	acts, err := m.Step(nspb.Computed{Batch: 7})
//	for _, a := range acts {
//		switch a := a.(type) {
//		case nspb.Release: // send batch a.Batch's outputs downstream
//		case nspb.Update:  // install the state staged by a.Batch
//		}
//	}
//
// An Event is something that happened: a message arrived (a snapshot, a
// durability announcement, a suspicion), or an operation the driver ran
// for an earlier action returned (Copy -> Copied, GetMaxSeq ->
// MaxSeqAnswered). Events are named in the past tense. An Action is
// something the driver must do (Release, Apply, Promote), in the order
// returned. Each package's doc lists its events, its actions, and which
// event answers which action.
//
// What a machine never does: I/O, goroutines, blocking, reading a clock.
// The drivers (sidecar/, frontend/, manager/) own sockets, goroutines and
// timers; they serialise Steps, perform actions and turn outcomes into
// events. Time is data: a machine with deadlines (parity's pool) takes
// the driver's monotonic now on its events and tells the driver when it
// next needs a TimePassed (NextDeadline); no machine counts ticks. Reads
// (Progress, Pending, Blocker, Round, Prefixes) are plain methods, not
// events: they change nothing.
//
// Errors: an event of another machine gives ErrUnknownEvent, an event the
// protocol forbids in the machine's state (a driver bug, e.g. Computed for
// a batch that never started) gives ErrOutOfOrder, an event that
// contradicts the machine's configuration ErrInvalidEvent; all leave the
// machine as it was. recovery's Machine has Step as its only entry point
// (the manager drives it so); the older direct methods of the others
// (Pipeline.Computed, Backup.Snapshot, parity's Machine.Submit, ...) stay
// beside Step and do the same; those that panicked on a driver bug still
// do.
//
// Every Event and Action renders itself on one line (String): logs and
// the transcript tests use that form. The transcripts (testdata/*.txt,
// run by TestTranscripts; go test -run TestTranscripts -update rewrites
// them) replay the paper's scenarios through Step: Figure 6's interleaving
// under NSPB, a stateful failover that promotes a downstream backup, and
// the correlated failures (rollback, both replicas lost, adjacent
// primaries); and ParM's straggler reconstruction and a join's resend
// positions. A change to a rule shows up there as a diff of actions. A
// newcomer can start with testdata/figure6.txt: it is the protocol in
// one page.
//
// Why no Ready: etcd's raft collects its outputs until the application
// asks for a Ready, because it batches log writes and messages across
// many Steps. The machines here have no such batching to do, and what a
// driver must do next depends on the event it just reported (a Copied
// lets the held Update go), so each Step returns its own actions: the
// cause stays next to its effects, in code and in transcripts.
//
// Marking: Event and Action have a marker method (ProtocolEvent,
// ProtocolAction, as protobuf's ProtoMessage) so that a random Stringer
// is not an action by accident.
package protocol
