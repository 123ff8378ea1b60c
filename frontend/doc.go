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
// buffers and resends items). The sink edges come back on the same gRPC
// server, served by an edge.Receiver that reorders and dedups per edge and
// hands in-order items to the table; when the last sink's item of a request
// arrives (or any item carries an error), the waiting client is answered:
// outputs sorted by model name plus the union of the parts' lineage, or the
// item's gRPC status.
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
// hamsv1.CompletionNotice, batched (5 ms or 256 ids) by a loop Run owns,
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
// Run serves gRPC, HTTP, one sender per entry edge, the expiry loop and,
// when configured, the durability watch, the completion loop and the audit
// loop until its context ends, answers what is pending with Unavailable,
// flushes completions and the audit log, and waits for everything it
// started.
package frontend
