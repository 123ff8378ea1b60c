// Package coord is HAMS-Go's coordination layer on NATS JetStream: the
// small, ordered metadata of the protocol. State itself never goes through
// JetStream (it streams sidecar-to-sidecar over gRPC; see docs/measurements.md
// for the numbers behind that choice).
//
// Layout, per deployment D:
//   - stream HAMS_D_DURABLE, subjects hams.D.durable.<model>: one
//     hamsv1.DurabilityNotice per applied snapshot. A watcher starts from the
//     last notice of each model (DeliverLastPerSubject), so a component that
//     (re)starts learns every current durable seq at once; MaxMsgsPerSubject
//     bounds the stream.
//   - stream HAMS_D_COMPLETED, subject hams.D.completed: the frontend's
//     hamsv1.CompletionNotice batches; primaries garbage-collect saved
//     outputs of completed requests.
//
// Persistence: both streams use file storage without SyncAlways. A notice
// only reports a fact that stays true and can be re-derived (the backup
// applied the state; GetMaxSeq asks the backup itself during recovery), so
// losing the last notices in a NATS crash costs liveness (a reply waits for
// the next notice), never consistency. Publishes carry a Nats-Msg-Id so a
// retried publish is not stored twice.
package coord
