// Package sidecar is the per-model proxy of HAMS-Go (the paper's "HAMS
// proxy"): it sits beside one model server (a Backend) and moves requests
// along the service graph.
//
// Request path (bare mode):
//
//	edge.Receiver (one Reorder per inbound edge: order, dedup, ack)
//	  -> inbox -> loop: Joiner (fan-in) -> Batcher (size, max wait)
//	  -> executor: select declared inputs, Backend.Infer (one batch in
//	     flight), split outputs per request, Lineage (Algorithm 1)
//	  -> one edge.Sender per out-edge (fan-out; the sink edge goes to the
//	     frontend).
//
// The loop goroutine owns the Joiner and Batcher and never blocks on the
// backend, so items keep being accepted and batched while a batch computes.
// The executor goroutine owns the Lineage and the backend description; it
// runs one batch at a time and tells the loop when it is idle. Joiner,
// Batcher and Lineage are pure state machines (time passed in) tested on
// their own.
//
// Failures are per request: an item with error set passes through without
// executing; a request that is malformed, past its deadline, or failed by
// the backend becomes an error item (error, error_code) sent to every
// successor so the frontend answers the client. A batch failing with
// InvalidArgument is re-run request by request so only the bad one fails.
//
// The state manager (replication of stateful models) hooks in after a
// batch's compute: execute is where snapshots will be taken and Update held.
package sidecar
