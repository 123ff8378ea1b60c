// Package sidecar is the per-model proxy of HAMS-Go (the paper's "HAMS
// proxy"): it sits beside one model server (a Backend) and moves requests
// along the service graph.
//
// Request path (bare mode):
//
//	edge.Receiver (one Reorder per inbound edge: order, dedup, ack)
//	  -> inbox -> intake loop: Joiner (fan-in) -> Batcher (size, max wait)
//	  -> executor: select declared inputs, Backend.Infer (one batch in
//	     flight), split outputs per request, Lineage (Algorithm 1)
//	  -> one edge.Sender per out-edge (fan-out; the sink edge goes to the
//	     frontend).
//
// The intake's loop goroutine (intake.go) owns the Joiner and Batcher and
// never blocks on the backend, so items keep being accepted and batched
// while a batch computes. The executor goroutine owns the Lineage and the
// backend description; it runs one batch at a time and tells the loop when
// it is idle. Joiner and Batcher (package sidecar/datapath) and Lineage
// are pure state machines (time passed in) tested on their own.
//
// Request identity (callid.go): batchRequest notes the requests of the
// batch it builds and the executor is the hamsmd.Source on Run's context, so
// a backend connection dialled with hamsmd.UnaryClientInterceptor sends
// each batch call's req_ids and lineages as hams-req-id / hams-lineage-bin
// metadata (the stateful primary's Compute included: it builds its batch
// with batchRequest on the goroutine that then calls the backend).
//
// Failures are per request: an item with error set passes through without
// executing; a request that is malformed, past its deadline, or failed by
// the backend becomes an error item (error, error_code) sent to every
// successor so the frontend answers the client. A batch failing with
// InvalidArgument is re-run request by request so only the bad one fails.
//
// State manager (replicated stateful models: stateful, ha stateful, mode
// not bare; stateless models and bare mode take the path above unchanged).
// On the primary, the executor goroutine becomes a driver of an
// nspb.Pipeline (primary.go): Compute runs on its own goroutine; when it
// returns, lineage is recorded in batch order and the pipeline decides when
// to Release (fan out, and keep in the OutputLog until the frontend's
// completion notices), Update, Copy (ReadState into a snapshot, concurrent
// with the next compute in nspb, with the model stopped in remus/nspb-s2)
// and Ship. The shipper goroutine (shipper.go) sends snapshots <requests
// with lineage and digests, state, outputs> to the backup over
// Replication.ShipSnapshot in batch order, resends after a break, and
// reports acks back to the driver (release-on-ack modes release then). New
// batches are held while the output log is full or too many snapshots are
// unacknowledged (backpressure, never loss).
//
// Capture at compute (nspb, nspb-s1, with a backend whose Describe has
// state_delta, like the reference model server): Compute returns, with
// the outputs, the bytes its Update will write (the staged state as
// ranges), so snapshot n exists when compute n returns: it ships as a
// delta snapshot (delta.go), nothing is copied after the update, and the
// model is never stopped or read. With compute_installs as well, update
// n is folded into compute n+1 (install_batch_id), and issued alone only
// when no batch follows within foldIdle. A backup needs a full base
// first: the initial state (snapshot 1), a promoted or rolled-back
// primary's state, or, for a new backup, the applied state folded with
// the deltas after it. The stop-to-copy baselines (remus, nspb-s2) and
// backends without deltas copy the whole state (ReadState).
//
// A sidecar with Role backup (backup.go) serves only Replication: it
// buffers snapshots, feeds nspb.Backup (Algorithm 2) with them and with
// its PFMs' durability notices (Coord.WatchDurable), and on its actions
// installs the state in its own copy (a full snapshot replaces it, a
// delta is patched in), keeps the outputs, writes audit records and
// announces its durable seq (Coord.Announce); a writer puts the state
// into the backup's model server behind the applies (partial writes
// where the backend takes them), and a promotion flushes it first. The
// copy and the model server are one failure domain (one host), so a
// state is durable once installed in the copy.
//
// Roles and recovery (replication.go, paper IV-C and IV-E). The goroutines
// of the current role form a Stage (stage.go), which owns them through a
// run.Group: the serving stage (loop, executor or primary driver, senders,
// shipper, backup watch, own-durability watch), the backup stage (the
// applier, the state writer, the PFM watch), or an idle one (a deposed
// primary, a replay spare). A stage's Cancel and Wait are idempotent. The
// backup and the shipper see the sidecar only through Host (host.go):
// model, backend, coordination, resolvers, epoch, metrics, logger. A
// recovery order stops the stage (cancel and wait: no batch in flight, no
// snapshot being written), switches the role state, logs the transition
// at Info and starts the next stage; orders are serialised and checked
// against the instance's epoch (older epochs are refused):
//   - Promote of a backup: first, before anything of the new epoch runs
//     or is resent, DurabilityNotice{model, new epoch, max applied seq} is
//     published through Coord (a frontend drops replies it holds on the
//     lost primary's outputs beyond that seq); if it cannot be published
//     the order fails and nothing changes. Then pending snapshots are dropped; the pipeline
//     starts after the last applied batch, seqs after its max applied seq,
//     at the new epoch, with new out-edges (new sender incarnations); the
//     receiver's duplicate filter is seeded with the requests the applied
//     state covers; the last applied snapshot is shipped first to whatever
//     backup appears. Promote of a stateless standby numbers its outputs
//     after start_seq (field, or metadata hams-start-seq).
//   - Demote: a primary becomes a backup that takes the next snapshot of
//     the new epoch as its full base state (also SyncBackup of a new
//     backup); a primary re-ships, when its backup moves (also while
//     idle), every acknowledged snapshot no backup applied (the first is
//     the base): applying them makes their requests durable, so the new
//     backup needs their records and outputs. A backup acknowledges a
//     snapshot as applied only once its state is written.
//   - Backend lost: in a protected mode a backend call that finds the
//     model server unreachable (Unavailable) fails nothing: the batch is
//     retried, and after BackendLostAfter the sidecar stops (its host
//     failed; the replacement runs the requests after the resend).
//   - A stateless join remembers its last completed joins, so a part
//     that supersedes one (an upstream stateful re-execution after
//     failover, or a resend through it) re-forms the request with the
//     other branches' parts, which do not come again.
//   - Rollback: the primary keeps the last state its backup applied (acks
//     with applied, its own durability notices) and every later one until
//     it is applied; it announces the new epoch at that state's seq (as
//     Promote does), reinstalls that state, drops later outputs from the
//     output log and the lineage index, and reseeds the duplicate filter.
//   - Resend: the out-edge to to_model starts a new incarnation that
//     carries the saved outputs (the output log of a stateful primary, the
//     items an edge.Sender retains until completion otherwise) whose seq of
//     this model is above the position, then the unacknowledged ones.
//     Any running stateless sidecar serves it (a sink resends to a new
//     leader frontend: to_model "frontend"); a replicated one only as
//     the primary.
//   - GetMaxSeq, GetLineageSummary: from the lineage index (summary.go):
//     per graph edge the contiguous prefix of the predecessor's seqs seen,
//     for received items and for the requests the state covers.
//
// Receivers fence batches whose epoch is older than the topology's for the
// sending model, and drop items whose request key (edge.DedupKey) was seen
// on the edge; a backup refuses snapshots of an older epoch.
//
// Replay mode (replay.go; deployment mode replay, the Lineage-Stash-style
// baseline): a stateful model's primary runs the bare path (Infer, no
// snapshot per batch, outputs released at once) and also logs every batch
// it executes (Config.Replay, asynchronously) and checkpoints its state
// every replay.checkpoint_every batches and when idle; durable records are
// written when a checkpoint is stored. Its second instance (role backup)
// is an idle spare: on Promote it loads the newest checkpoint, re-executes
// the logged batches after it in order and sends its successors the
// re-executed outputs they have not received. Non-deterministic models
// re-execute differently, so replies released before the failure fall
// outside the durable history: the consistency checker reports it.
package sidecar
