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
// items are handed to the deliver callback, then max_in_order is acknowledged.
//
// Backpressure: Send never blocks; Full/WaitNotFull tell the producer that the
// edge's backlog reached its bound so it stops producing (the sidecar stops
// starting batches, the frontend refuses requests). The deliver callback of a
// Receiver may block while its consumer is full; the stream then stops
// reading and HTTP/2 flow control pushes back on the sender.
package edge
