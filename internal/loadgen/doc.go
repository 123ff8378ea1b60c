// Package loadgen drives HAMS-Go services the way a client would: it
// generates seeded inputs for a service from its config.Service.Inputs
// (real Fashion-MNIST images for 784-wide image inputs when the dataset is
// installed), runs closed-loop clients against the hamsv1.Frontend gRPC API
// with a per-request deadline, and keeps latency statistics (p50/p99/mean
// by sorting the recorded latencies, throughput over the run's wall time).
//
// Main loop (Run): Concurrency workers each send one request, wait for its
// reply or error, hand the Result to the caller's callback, record it, and
// send the next, until the duration or request budget is spent or ctx ends.
package loadgen
