// Package wire converts tensors between the project's raw form
// (hamsv1.Tensor: KServe v2 datatype name, shape, little-endian row-major
// bytes, BYTES elements as a 4-byte little-endian length then the bytes)
// and the two public wire formats the adapters, the frontend and the
// reference model server speak:
//
//   - TF Serving's tensorflow.TensorProto, in both encodings: tensor_content
//     (raw bytes) and the typed *_val fields, with TF's single-value
//     broadcast rule (one typed value with a larger shape fills it);
//     DT_STRING travels only in string_val.
//   - KServe v2 / Triton tensors, in both encodings: typed
//     InferTensorContents and raw_input_contents / raw_output_contents.
//     FP16 and BF16 exist only as raw contents.
//
// A decoder allocates nothing from a client's declared shape alone: the
// element count and byte size are overflow-checked, the values present
// counted against them first, and a TF broadcast may expand to at most
// MaxDecodedBytes (the 64 MiB gRPC message limit).
//
// Every error wraps ErrInvalid and names the tensor, so a server maps it
// to InvalidArgument and a client learns which tensor was wrong. The
// package does no I/O and holds no state.
package wire
