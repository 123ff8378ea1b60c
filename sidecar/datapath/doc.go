// Package datapath holds the pure pieces of a sidecar's request path: the
// Joiner, which joins the items of one request at a fan-in (or passes
// them on one by one, interleave), and the Batcher, which groups the
// requests it forms into batches (size, max wait). Both are state
// machines without goroutines or clocks of their own: the caller passes
// the time in, owns them from one goroutine (the sidecar's request loop)
// and is told when to act (NextDeadline). They depend only on
// internal/config and the protos, and are tested on their own.
package datapath
