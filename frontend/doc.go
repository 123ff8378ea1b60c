// Package frontend is the client-facing side of HAMS-Go: it accepts
// predictions for a service (gRPC hamsv1.Frontend and an HTTP/JSON API on a
// second listener), sends each request into the service graph and answers
// the client when every sink model of the graph has delivered its output.
//
// Request path: a request is validated against the service's declared
// inputs (unknown service NotFound; bad tensors InvalidArgument naming the
// tensor; too many bytes ResourceExhausted), given a dense req_id and put in
// the request table (table.go), a pure structure that knows which sink
// models each pending request waits for, what has arrived, and when each
// request expires (the clock is passed in). One hamsv1.Item per entry model
// then leaves over that entry edge's edge.Sender (one long-lived
// Dataplane.Forward stream per frontend -> entry edge, which numbers,
// buffers and resends items). The sink edges come back on the internal
// gRPC server (Config.InternalListener, the address registered in the
// topology; the client listener serves the client APIs only and answers
// Unimplemented for every method of an internal service), served by an
// edge.Receiver that reorders and dedups per edge and
// hands in-order items to the table; when the last sink's item of a request
// arrives (or any item carries an error), the waiting client is answered:
// outputs sorted by model name plus the union of the parts' lineage, or the
// item's gRPC status.
//
// Approximate replies (ParM): a sink item is marked Approximate when its
// tensors, or those of any item it was computed from, are a parity
// model's reconstruction. A reply is approximate when any of its sink
// items is; the flag lives on the reply (PredictResponse.approximate), so
// it travels wherever the reply does (hold area, reply cache, request log
// records, the answers other frontends release) and every client-facing
// surface marks it, and only it: the HAMS gRPC API's approximate field,
// the HTTP API's "approximate": true, KServe v2's response parameter
// hams_approximate = bool true, TF Serving's response header
// hams-approximate: true, the audit record's "approximate": true, and
// hams_frontend_approximate_replies_total{service}.
//
// Reply gating (protocol step 5, paper IV-D: the frontend is a special
// model whose "apply" is sending the reply): in the early-release modes
// (nspb, nspb-s2) a reply whose sinks all arrived depends, for every
// replicated stateful model (stateful, ha: stateful) in its merged lineage,
// on the highest seq the lineage names for that model. It waits in the hold
// area (gating.go: an nspb.ReplyGate plus the replies and their deadlines)
// until Config.Coord's durability notices show every such model durable up
// to that seq; Run keeps one durability watch over all those models
// (restarted with backoff when it fails). Errors are never held. In bare,
// remus, nspb-s1 and replay replies leave at once (the primaries hold
// outputs themselves where the mode needs it). The table, the hold area and
// the calls share one lock, so a request is in exactly one of them.
//
// Completion notices: with a Coord, the req_id of every answered request
// (reply, error, deadline, shutdown) is published once in a
// hamsv1.CompletionNotice, batched (25 ms or 1024 ids: every sidecar
// watches them, so fewer, larger notices) by a loop Run owns,
// so primaries garbage-collect saved outputs; what is queued at shutdown is
// flushed before Run returns.
//
// Audit: with Config.AuditDir, every reply released to a client is written
// to AuditDir/<Name>/replies.jsonl (req_id = the frontend req_id, lineage
// steps in traversal order, digest of all output tensors in reply order),
// off the request path, flushed every 100 ms and at shutdown.
//
// Deadlines: the client's deadline or Limits.RequestTimeout, whichever is
// first; a request that passes it is answered DeadlineExceeded and leaves
// the table or the hold area (late items for it are dropped). An expiry
// loop enforces those deadlines even if no caller is waiting.
//
// Idempotency: a client request_id that is in flight joins the running
// execution; one answered recently (bounded LRU with TTL, replycache.go) gets
// the same answer. Deadline, cancellation and shutdown answers are not
// remembered, so a retry after them executes again.
//
// Request log and several frontends (requestlog.go, with Config.Log): every
// accepted request is appended to the JetStream request log, and
// acknowledged there, before anything of it enters the graph; a request
// the log refuses is answered Unavailable. req_ids carry this process's
// incarnation (coord.FrontendIncarnation) in their 24 high bits and are
// dense below, so no two frontends or restarts share one; without a log
// they are 1, 2, ... as before. Only one frontend injects requests: the
// one the topology names for config.Frontend (Config.Address equal to
// Resolver.Resolve(config.Frontend)), because the sink edges of every
// sidecar go there and because two frontends sending on one frontend ->
// entry edge would fence each other off at the entry model (a receiver
// refuses the sender incarnation that is not the newest). The others log
// their requests and wait for the answer the leader records; the leader
// consumes the log and injects them. Every answer (reply or model error)
// of an injected request is recorded once (first writer wins) before it
// is released; a frontend that loses the race releases the recorded one
// instead, so all attempts of a request, on any frontend, get one answer.
// A client request_id claims its key in the log: a retry on any frontend
// joins the logged attempt and gets its recorded answer; an attempt whose
// deadline passed unanswered is replaced (the retry executes again). Only
// the injecting frontend publishes completion notices and audit records;
// it writes a reply's audit record before it records the answer (other
// frontends see the record as NATS routes it and may release it before
// this one has JetStream's acknowledgement, and this one may die
// meanwhile). If another frontend's newer sender incarnation fences the
// leader off an entry edge (two frontends both believed they led for a
// moment), the leader takes the edge back with a newer incarnation
// (retakeEntry).
//
// Takeover: every frontend consumes the log while it follows and keeps
// its open requests (logged, answer not seen) in a log mirror. When the
// topology names it (the leader died), it injects, with their original
// req_ids, the mirror's open requests whose answer a look-up begun after
// the takeover does not find (an answer released before the takeover was
// recorded before it, so such a look-up sees it; the reply watch may lag
// and is never trusted to mean "unanswered"), and asks every sink model
// to Resend what it keeps for the frontend edge (items the dead leader
// had acknowledged). Records the consumer delivers later are injected
// after the same look-up, or at once when they were logged after the
// takeover (stream sequence at or above one this frontend logged while
// leading). A request injected although answered (a record that reached
// JetStream after its look-up) is answered from its record when that
// arrives. Sink items for requests not (yet) in the table are kept aside
// (bounded) and used when their request is injected. Exactly one
// frontend takes over: the one the manager's topology names.
//
// Recovery hooks: the internal gRPC server also serves hamsv1.Replication:
// GetLineageSummary answers as the successor of the sink models (from the
// lineage of the sink items received: max seq of the failed model,
// contiguous prefixes of the models upstream of it, consumed_beyond false),
// Resend resends on an entry edge the items kept (acknowledged, not yet
// answered) above after_edge_seq and the unacknowledged ones, to
// to_address at epoch. The other calls answer FailedPrecondition.
//
// Rollback of held replies: the hold area tracks the epoch of each
// model's durability notices. A notice at a higher epoch means a new
// primary took over from state durable at durable_seq: held replies that
// depend on the model beyond it came from lost speculative state; they
// are never released but go back to the table (with the parts that do not
// depend on the lost state) to await the re-executed items, and parts of
// pending requests from the lost state are dropped.
//
// Pass-through (passthrough.go, retrofit mode): a stateless ha: off model
// alone in its service (config.Deployment.PassThrough) has no sidecar and
// is not among the services above. The TF Serving and KServe v2 endpoints
// forward calls for it to its backend.address as received (the backend's
// model name swapped in, the client's metadata but reserved and hams-
// keys, HAMS's identity added: internal/hamsmd), and hand back the
// backend's answer, header, trailer and gRPC status unchanged; nothing is
// logged, gated or recorded. The API the backend does not speak, and the
// HAMS API, answer Unimplemented for it.
//
// Run serves gRPC, HTTP, one sender per entry edge, the expiry loop and,
// when configured, the durability watch, the completion loop and the audit
// loop until its context ends, answers what is pending with Unavailable,
// flushes completions and the audit log, and waits for everything it
// started.
package frontend
