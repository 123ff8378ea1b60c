// Package coord is HAMS-Go's coordination layer on NATS JetStream: the
// small, ordered metadata of the protocol. State itself never goes through
// JetStream (it streams sidecar-to-sidecar over gRPC; see docs/measurements.md
// for the numbers behind that choice), except in mode replay, whose
// checkpoints must be readable by a replacement on any host.
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
//   - stream HAMS_D_REQUESTS, subjects hams.D.requests.k.<hash of service
//     and client request_id> (a request with a request_id: written with
//     expected-last-subject-sequence 0, so one attempt claims the key; an
//     attempt whose deadline passed unanswered is replaced by compare-and-set),
//     hams.D.requests.n.<req_id> (a request without one) and
//     hams.D.requests.c (chunks): the frontends' request log (requestlog.go).
//     Headers carry req_id, frontend and deadline; the body is the
//     hamsv1.PredictRequest. Kept RequestLogMaxAge (15 min), 1 GiB at most.
//   - stream HAMS_D_REPLIES, subjects hams.D.replies.r.<req_id> (written once:
//     the first frontend to record an answer wins, later writers read it) and
//     hams.D.replies.c (chunks): every answer, recorded before it is released,
//     so a retry on any frontend gets the same one. Frontends watch
//     hams.D.replies.r.* with a plain subscription (and look answers up
//     directly as a backstop).
//   - mode replay only (replaylog.go): stream HAMS_D_REPLAY, subjects
//     hams.D.replay.<model>.b (.c chunks), the input log of each stateful
//     model (one hamsv1.ReplayBatch per executed batch, trimmed up to the
//     latest checkpoint), and object store bucket HAMS_D_CKPT, objects
//     <model>/<epoch>, the latest checkpoint (hamsv1.ReplayCheckpoint and
//     the state bytes) per model and epoch.
//   - KV bucket HAMS_D_FRONTENDS, key incarnation: a compare-and-set counter
//     that gives every frontend process a number of IncarnationBits (24)
//     bits, the high bits of its req_ids, so req_ids of all frontends and
//     restarts never collide.
//
// Large records: a record over the server's max payload (1 MiB by default;
// the embedded server keeps the default) is split into chunks published
// first on the stream's .c subject; the record itself then carries only
// the chunks' stream sequences (header Hams-Chunks) and readers reassemble
// it. A request is therefore never reduced to a digest: whoever takes it
// over has its inputs.
//
// Persistence of the request log: file storage without SyncAlways, chosen
// after measuring (BenchmarkLogRequest, docs/coordination.md): on an R1
// stream nats-server writes every record to its file before it acknowledges
// it (no async flush on R1), so an acknowledged request survives a crash of
// any process, nats-server's included; only an OS crash or power loss of
// the NATS host can lose the unsynced tail (sync interval 2 min), and on the
// embedded single-machine default that takes every component and client
// down with it. SyncAlways costs 3-4x the append latency and caps the log
// at about 2,300 records/s under concurrency (against 20,000+), and a
// request needs two records. An external R3 cluster acknowledges only
// after a quorum stored the record. manager.Config.SyncAlways remains the
// switch for a single-server deployment that must survive power loss.
//
// Persistence of the notice streams: file storage without SyncAlways. A notice
// only reports a fact that stays true and can be re-derived (the backup
// applied the state; GetMaxSeq asks the backup itself during recovery), so
// losing the last notices in a NATS crash costs liveness (a reply waits for
// the next notice), never consistency. Publishes carry a Nats-Msg-Id so a
// retried publish is not stored twice.
package coord
