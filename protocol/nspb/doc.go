// Package nspb holds the decisions of the NSPB protocol (HAMS paper,
// sections IV-B to IV-D) as pure state machines in the vocabulary of
// package protocol: events in (Step), actions out, no sockets, goroutines
// or clocks. Drivers in the sidecar and the frontend perform the actions
// in the order returned.
//
//   - Graph facts: previous and next stateful models (PFM / NFM) of every
//     stateful model and of the frontend, from a service graph.
//   - Backup (Algorithm 2): buffers snapshots from the primary and applies
//     them strictly in batch order, each only once every PFM has announced
//     durability up to the seqs its requests' lineage names; after applying,
//     it announces its own durable seq to its NFMs (and the frontend).
//   - ReplyGate: the frontend's rule: a reply leaves only when every
//     stateful state in its lineage is durable (the frontend is the special
//     model whose "apply" is the reply).
//   - Pipeline: the primary's compute/update split: update n+1 waits until
//     the snapshot of state n has been copied, so the copy never sees a
//     half-updated state and the model is never stopped.
//
// # Events and actions
//
// Pipeline (driven by the sidecar's primary role), event and the
// actions it may return:
//
//	ComputeStarted  none (the driver's decision, once CanCompute)
//	Computed        Release (unless release-on-ack), Ship (capture at
//	                compute), Update
//	Updated         Copy (eager, or a requested copy), Update
//	Copied          Ship, Update
//	CopyLost        Copy (on demand)
//	Acked           Release (release-on-ack modes)
//	CopyWanted      Copy (on demand)
//
// The driver answers Update with Updated, Copy with Copied (or CopyLost),
// Ship with Acked; Release needs no answer.
//
// Backup (driven by the sidecar's backup role): SnapshotReceived and
// Durable -> Apply, each directly followed by its Announce; the driver
// publishes the Announce, which arrives as Durable at the next stateful
// models' backups and at the frontend.
//
// ReplyGate (driven by the frontend's reply gating): ReplyArrived,
// Durable, ReplyDropped -> ReleaseReply.
//
// The drivers (the sidecar's primary and backup, the frontend's reply
// gate) feed events through Step only. The direct methods (Computed,
// Snapshot, Hold, ...) are the transitions Step dispatches to, kept for
// this package's table tests; the Pipeline's panic on an out-of-order
// event where Step returns an error wrapping protocol.ErrOutOfOrder. testdata/figure6.txt under
// protocol/ is the paper's Figure 6 replayed through these machines.
package nspb
