// Package triton is the sidecar Backend over the KServe v2
// GRPCInferenceService that NVIDIA Triton (and the project's reference
// model server) serve.
//
// Backend (New) drives a stateless model: ModelInfer with the batch's
// tensors in raw_input_contents, outputs read from raw or typed contents,
// ModelMetadata as Describe, ServerLive + ServerReady + ModelReady as
// Health. gRPC status codes of the server reach the sidecar unchanged, and
// every call is bounded by Config.Timeout. The idempotent calls (metadata,
// health, shared memory Status) are retried on Unavailable
// (Config.Retries, internal/grpcretry); ModelInfer and shared memory
// Register and Unregister are not.
//
// Stateful (NewStateful) drives a model that serves its state as explicit
// tensors (state s is input s+"_in" and output s+"_out"). The adapter owns
// the state: two regions per state tensor, A and B, registered once, so
// the state never crosses gRPC; a server that lost them (it restarted) has
// the missing ones registered again by the next Compute, which is retried
// once, the regions' contents and which one is current unchanged. The regions are POSIX shared memory
// (SystemSharedMemoryRegister, the default) or, with
// WithStateMemory(StateMemory{Kind: MemoryCUDA}), device allocations of
// the adapter's process registered with CudaSharedMemoryRegister as raw
// cudaIpcMemHandle_t bytes (internal/cuda); ReadState and WriteState are
// then device-to-host and host-to-device copies. One region interface
// (statemem.go) hides the kind, so the double-buffer logic is shared. Compute points s_in at the current region and s_out at the
// other one; Update flips them (no model call); ReadState copies the
// current region, which no compute writes, while the next batch computes;
// WriteState overwrites the current region. See docs/triton.md for the
// ordering obligation, region naming and cleanup, and for why Triton's
// implicit sequence state cannot be replicated at all (triton#7119).
package triton
