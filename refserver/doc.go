// Package refserver is the reference model server: it hosts the Go models
// of refserver/models named in a deployment and serves them on
// one gRPC port through four APIs:
//
//   - hams.v1.ModelRuntime (what the sidecar drives: Describe, Infer, the
//     Compute/Update split of stateful models, chunked ReadState and
//     WriteState with a SHA-256 check);
//   - KServe v2 inference.GRPCInferenceService (typed and raw contents;
//     request parameter "sequence_id" is the stream id of stateful models,
//     or the BYTES input "hams_stream_ids" gives one per row; system and
//     CUDA shared memory: System/CudaSharedMemoryRegister/Status/Unregister
//     and tensors in registered regions, with Triton's error codes and
//     messages; CUDA regions are another process's device allocations,
//     opened from their raw cudaIpcMemHandle_t and copied to and from the
//     host around the CPU model, see cudashm.go);
//   - TF Serving tensorflow.serving.PredictionService (Predict,
//     GetModelMetadata) and ModelService (GetModelStatus).
//
// A stateful kind with the param `state: explicit` keeps no state: its
// state tensors are extra inputs s_in and outputs s_out (see
// models.StateIn), the form adapters/triton double-buffers in shared
// memory (docs/triton.md). SetReady marks a model not ready.
//
// Config.Straggle makes the server a seeded straggler for ParM and
// hedging experiments (straggle.go): time from New is cut into windows of
// StraggleConfig.Period, each slow with probability Fraction as a pure
// function of (Seed, window); in a slow window every Infer and Compute
// call, on all three APIs, waits Delay plus seeded jitter (or, with
// Freeze, until the slow windows end) before it computes, and ends at once
// with its request context. ParseStraggle reads the flag form
// "seed=7,period=200ms,fraction=0.2,delay=40ms,jitter=5ms,freeze=false";
// hams_modelserver_straggle_delayed_total and
// hams_modelserver_straggle_delay_seconds_total count what it held.
//
// Bad input never crashes the server: unknown models are NotFound, malformed
// tensors InvalidArgument naming the tensor, an Update of a batch that is
// not staged FailedPrecondition. New validates and builds the models (no
// I/O); Run serves on the given listener until its context ends.
package refserver
