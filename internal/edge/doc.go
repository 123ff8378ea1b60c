// Package edge is the per-edge transport of the data plane, shared by the
// sidecars and the frontend: one long-lived hamsv1.Dataplane.Forward stream
// per (sender model -> receiver model) edge.
//
// Sender side (Sender): Send assigns every item a dense edge_seq (from 1, in
// call order) and appends it to a buffer that keeps it until the receiver has
// acknowledged it. Run resolves the receiver's address through a Resolver,
// opens the stream, sends everything not yet sent on that stream, and trims
// the buffer on every ForwardAck. When the stream breaks (receiver restart,
// failover, topology change) Run re-resolves the address, opens a new stream
// and resends every unacknowledged item from max_in_order+1, so a receiver
// sees every item at least once and, after dedup, exactly once.
//
// Receiver side (Receiver): Forward serves the stream. Items of one edge (keyed
// by from_model) go through a Reorder, a pure state machine that releases the
// in-order run, drops duplicates (edge_seq <= max_in_order, or already
// pending) and bounds how far ahead of max_in_order it buffers. The in-order
// items are handed to the deliver callback, then max_in_order is acknowledged:
// acks are paced (AckDelay, AckEvery), coalescing several batches into one
// ForwardAck, because an ack per batch is a write and a read next to every
// request's processing while nothing waits for it but buffer trimming.
//
// Retention and resend: acknowledged items stay with the Sender (bounded by
// count and bytes) until Complete names their request (the frontend's
// completion notices). Resend starts a new incarnation of the edge: the
// retained items (or the caller's, e.g. a stateful primary's output log)
// whose Position is above a given one, then the unacknowledged ones, are
// renumbered from 1 and streamed to a given address (a replacement the
// Resolver may not know yet). Acks of an older stream generation are
// ignored. A Receiver built WithDedup drops, per edge, items whose DedupKey
// (request id and lineage path, with the seq and output of stateful
// models) it delivered within a bounded window, since resend positions are
// conservative; SeedDedup sets that memory after a promotion or rollback.
// WithEpochs refuses batches of a deposed sender (an epoch older than the
// topology's), WithAdmit refuses all while the receiver does not serve.
//
// No wall clock crosses an edge: sender incarnations are a per-process
// random nonce and a counter, never a time (incarnation.go), and an item's
// deadline travels as the time left (deadline_remaining_nano), computed on
// the Sender's clock (SenderConfig.Now) when the item goes on the wire and
// turned into a deadline on the Receiver's clock (WithClock) on receipt.
//
// Backpressure: Send never blocks; Full/WaitNotFull tell the producer that the
// edge's backlog reached its bound so it stops producing (the sidecar stops
// starting batches, the frontend refuses requests). The deliver callback of a
// Receiver may block while its consumer is full; the stream then stops
// reading and HTTP/2 flow control pushes back on the sender.
package edge
