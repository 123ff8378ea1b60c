// Package tfserving is the sidecar Backend over a running TensorFlow
// Serving model server (gRPC, conventionally port 8500): retrofit mode,
// where HAMS is put in front of an existing fleet without changing it.
//
// Calls:
//   - Infer / Compute: tensorflow.serving.PredictionService/Predict with
//     model_spec {name, version or version_label, signature_name} from the
//     Config. Inputs travel as tensor_content (or the typed *_val fields with
//     Config.TypedInputs); outputs are decoded from either encoding
//     (internal/wire). Predict is never retried: it may not be idempotent
//     (a stateful model) and the sidecar owns recovery.
//   - Describe: PredictionService/GetModelMetadata (metadata_field
//     "signature_def"), the configured signature (default
//     "serving_default") turned into a hamsv1.ModelDescription.
//   - Health: ModelService/GetModelStatus; AVAILABLE is ready, every other
//     state (or an error_code in its status) is Unavailable naming it.
//     GetModelMetadata and GetModelStatus are idempotent and retried on
//     Unavailable with the go-grpc-middleware v2 retry interceptor
//     (internal/grpcretry, which retries only the methods it is given).
//
// Every call is bounded by Config.Timeout; gRPC status codes of TF Serving
// reach the sidecar unchanged (InvalidArgument, NotFound, Unavailable,
// DeadlineExceeded), prefixed with what was attempted.
//
// Stateful models (state as explicit tensors, DESIGN "backend state, three
// ways"): a signature whose inputs include "state/<name>" and whose outputs
// include "state_next/<name>" (same dtype, fully defined shape) keeps its
// state in the adapter, not in TF Serving. The adapter holds two buffers,
// current and next: Compute feeds current as the state/* inputs and keeps
// the returned state_next/* tensors as next; Update(batch) makes next
// current (a pointer flip: a buffer is never written after it was
// produced, so ReadState's tensors stay valid while the next batch
// computes); ReadState returns current and its version (number of updates
// applied); WriteState overwrites current and drops a staged next. The
// initial state is zeros. State tensors are hidden from Describe's inputs
// and outputs, which the sidecar uses to pick what it feeds.
//
// Stream ids: a signature with an input named "hams_stream_ids" (BYTES,
// one element per row) receives the batch's stream id of every row, so a
// model can key per-stream state slots by it.
package tfserving
