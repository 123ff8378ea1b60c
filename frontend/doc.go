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
// Deadlines: the client's deadline or Limits.RequestTimeout, whichever is
// first; a request that passes it is answered DeadlineExceeded and leaves
// the table (late items for it are dropped). An expiry loop enforces table
// deadlines even if no caller is waiting.
//
// Idempotency: a client request_id that is in flight joins the running
// execution; one answered recently (bounded LRU with TTL, replycache.go) gets
// the same answer. Deadline, cancellation and shutdown answers are not
// remembered, so a retry after them executes again.
//
// Run serves gRPC, HTTP, one sender per entry edge and the expiry loop until
// its context ends, answers what is pending with Unavailable and waits for
// everything it started.
package frontend
