// Package overhead holds the adapter latency benchmarks (overhead_test.go):
// per adapter (reference, tfserving, triton, clipper) at batch 1, the p50
// latency a sidecar adds over the same client calling the backend
// directly, both measured in one run, interleaved call by call, in one
// process over loopback, and the sidecar round trip split into the way in,
// the adapter's own backend call and the way out (docs/adapters.md has the
// command and numbers).
package overhead
