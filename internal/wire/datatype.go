package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/hams-go/hams/internal/tensor"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
)

// ErrInvalid is wrapped by every conversion error of a malformed tensor.
var ErrInvalid = errors.New("wire: invalid tensor")

// ErrTooLarge is wrapped by a decode refused because its data would be
// over the caller's limit (FromTensorProtoLimit): a server answers
// ResourceExhausted, as for an oversized message.
var ErrTooLarge = errors.New("wire: tensor over the size limit")

// KServe v2 datatype names beyond those internal/tensor names.
const (
	Uint16 = "UINT16"
	Uint32 = "UINT32"
	Uint64 = "UINT64"
	BF16   = "BF16"
)

// Datatypes lists every KServe v2 datatype the package converts.
var Datatypes = []string{tensor.Bool, tensor.Uint8, Uint16, Uint32, Uint64, tensor.Int8, tensor.Int16,
	tensor.Int32, tensor.Int64, tensor.FP16, BF16, tensor.FP32, tensor.FP64, tensor.Bytes}

var tfToKS = map[tfpb.DataType]string{
	tfpb.DataType_DT_FLOAT: tensor.FP32, tfpb.DataType_DT_DOUBLE: tensor.FP64,
	tfpb.DataType_DT_INT32: tensor.Int32, tfpb.DataType_DT_INT16: tensor.Int16, tfpb.DataType_DT_INT8: tensor.Int8,
	tfpb.DataType_DT_UINT8: tensor.Uint8, tfpb.DataType_DT_UINT16: Uint16, tfpb.DataType_DT_UINT32: Uint32,
	tfpb.DataType_DT_UINT64: Uint64, tfpb.DataType_DT_INT64: tensor.Int64, tfpb.DataType_DT_BOOL: tensor.Bool,
	tfpb.DataType_DT_HALF: tensor.FP16, tfpb.DataType_DT_BFLOAT16: BF16, tfpb.DataType_DT_STRING: tensor.Bytes,
}

var ksToTF = func() map[string]tfpb.DataType {
	m := map[string]tfpb.DataType{}
	for k, v := range tfToKS {
		m[v] = k
	}
	return m
}()

// KServeDatatype maps a TF DataType to its KServe v2 name (false for TF
// types KServe has no name for: complex, quantized, resource, variant).
func KServeDatatype(dt tfpb.DataType) (string, bool) {
	s, ok := tfToKS[dt]
	return s, ok
}

// TFDataType maps a KServe v2 datatype name to TF's DataType (false and
// DT_INVALID for an unknown name).
func TFDataType(dt string) (tfpb.DataType, bool) {
	v, ok := ksToTF[dt]
	return v, ok
}

// MaxDecodedBytes bounds the data a decode may produce beyond the values
// the message itself carries, which today means TF Serving's one-value
// broadcast: a float_val of one value with shape [N] expands to 4N bytes
// from a 60-byte request. It equals the gRPC message limit every HAMS
// server and client uses by default (grpcx.DefaultMaxMessageBytes, 64 MiB;
// a test keeps the two equal): a larger tensor could not be forwarded to a
// model in one message anyway. Decodes whose values are all in the message
// (raw contents, tensor_content, typed values one per element) are bounded
// by the message size the gRPC server already enforced and are not
// checked against it.
const MaxDecodedBytes = 64 << 20

// shapeSize validates shape for datatype dt (whose element size must be
// known) and returns its number of elements and, for fixed-size
// datatypes, its data size in bytes (0 for BYTES). A negative dimension,
// an element count or a byte size over int64 is an error naming the
// tensor; nothing is allocated.
func shapeSize(name, dt string, shape []int64) (n, size int64, err error) {
	n, err = tensor.NumElements(shape)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: tensor %q: %w", ErrInvalid, name, err)
	}
	es := int64(max(tensor.ElemSize(dt), 0))
	if es > 0 && n > math.MaxInt64/es {
		return 0, 0, fmt.Errorf("%w: tensor %q: shape %v of %s is %d elements of %d bytes, more bytes than int64 holds", ErrInvalid, name, shape, dt, n, es)
	}
	return n, n * es, nil
}

// AppendLE appends the low size bytes (1, 2, 4 or 8) of v little-endian:
// a tensor element of that width.
func AppendLE(b []byte, v uint64, size int) []byte { return appendUint(b, v, size) }

func appendUint(b []byte, v uint64, size int) []byte {
	switch size {
	case 1:
		return append(b, byte(v))
	case 2:
		return binary.LittleEndian.AppendUint16(b, uint16(v))
	case 4:
		return binary.LittleEndian.AppendUint32(b, uint32(v))
	}
	return binary.LittleEndian.AppendUint64(b, v)
}

func readUint(b []byte, size int) uint64 {
	switch size {
	case 1:
		return uint64(b[0])
	case 2:
		return uint64(binary.LittleEndian.Uint16(b))
	case 4:
		return uint64(binary.LittleEndian.Uint32(b))
	}
	return binary.LittleEndian.Uint64(b)
}

// readSigned sign-extends a little-endian integer of size bytes.
func readSigned(b []byte, size int) int64 {
	switch size {
	case 1:
		return int64(int8(b[0]))
	case 2:
		return int64(int16(binary.LittleEndian.Uint16(b)))
	case 4:
		return int64(int32(binary.LittleEndian.Uint32(b)))
	}
	return int64(binary.LittleEndian.Uint64(b))
}

// signedRange checks v fits a signed integer of size bytes.
func signedRange(v int64, size int) bool {
	bits := uint(size * 8)
	lo, hi := -(int64(1) << (bits - 1)), int64(1)<<(bits-1)-1
	return size >= 8 || (v >= lo && v <= hi)
}

// unsignedRange checks v fits an unsigned integer of size bytes.
func unsignedRange(v uint64, size int) bool {
	return size >= 8 || v < uint64(1)<<(uint(size)*8)
}

// splitBytes cuts BYTES data into its elements (data must be valid).
func splitBytes(b []byte) [][]byte {
	var out [][]byte
	for len(b) >= 4 {
		l := binary.LittleEndian.Uint32(b)
		out = append(out, b[4:4+l])
		b = b[4+l:]
	}
	return out
}

func joinBytes(vs [][]byte) []byte {
	n := 0
	for _, v := range vs {
		n += 4 + len(v)
	}
	b := make([]byte, 0, n)
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	return b
}
