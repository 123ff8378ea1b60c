package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
)

// FromTensorProto converts a TF TensorProto named name into a raw tensor.
// A non-empty tensor_content wins over the typed fields (as in TF); else
// the typed field of the dtype must hold exactly as many values as the
// shape has elements, or one value, which is broadcast to all of them.
// An empty typed field for a non-empty shape is an error (TF would fill
// zeros; a silent all-zero input is more often a client bug). A missing
// tensor_shape is a scalar, as in TF; unknown_rank is an error. The shape
// is checked (no negative dimension, element count and byte size within
// int64) and the values present counted before anything is allocated; a
// broadcast may expand to at most MaxDecodedBytes.
func FromTensorProto(name string, tp *tfpb.TensorProto) (*hamsv1.Tensor, error) {
	return fromTensorProto(name, tp, -1)
}

// FromTensorProtoLimit is FromTensorProto for a decode that may produce at
// most limit bytes of data (what is left of a request's budget): a tensor
// whose data would be larger is refused with ErrTooLarge before anything
// is allocated. A server decoding several tensors of one request passes
// what the earlier ones left, so that N broadcast inputs of a small
// message cannot expand to N times the limit.
func FromTensorProtoLimit(name string, tp *tfpb.TensorProto, limit int64) (*hamsv1.Tensor, error) {
	return fromTensorProto(name, tp, max(limit, 0))
}

func fromTensorProto(name string, tp *tfpb.TensorProto, limit int64) (*hamsv1.Tensor, error) {
	if tp == nil {
		return nil, fmt.Errorf("%w: tensor %q: empty TensorProto", ErrInvalid, name)
	}
	dt, ok := tfToKS[tp.Dtype]
	if !ok {
		return nil, fmt.Errorf("%w: tensor %q: unsupported dtype %v", ErrInvalid, name, tp.Dtype)
	}
	if tp.TensorShape.GetUnknownRank() {
		return nil, fmt.Errorf("%w: tensor %q: shape of unknown rank", ErrInvalid, name)
	}
	shape := make([]int64, len(tp.TensorShape.GetDim()))
	for i, d := range tp.TensorShape.GetDim() {
		if d.GetSize() < 0 {
			return nil, fmt.Errorf("%w: tensor %q: dimension %d is %d", ErrInvalid, name, i, d.GetSize())
		}
		shape[i] = d.GetSize()
	}
	n, size, err := shapeSize(name, dt, shape)
	if err != nil {
		return nil, err
	}
	if limit >= 0 {
		if dec := decodedSize(dt, tp, n, size); dec > limit {
			return nil, fmt.Errorf("%w: tensor %q: %s %v decodes to %d bytes, over the %d bytes left of the request's limit", ErrTooLarge, name, dt, shape, dec, limit)
		}
	}
	t := &hamsv1.Tensor{Name: name, Datatype: dt, Shape: shape}
	if len(tp.TensorContent) > 0 {
		if dt == tensor.Bytes {
			return nil, fmt.Errorf("%w: tensor %q: DT_STRING in tensor_content (use string_val)", ErrInvalid, name)
		}
		t.Data = tp.TensorContent
	} else if t.Data, err = typedTF(name, dt, tp, n, size); err != nil {
		return nil, err
	}
	if err := tensor.Validate(t); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return t, nil
}

// typedTF encodes the typed field of dt for n elements (size bytes for a
// fixed-size dt); one value with n > 1 broadcasts, up to MaxDecodedBytes.
// Nothing is allocated before the value count and the size are checked.
func typedTF(name, dt string, tp *tfpb.TensorProto, n, size int64) ([]byte, error) {
	es := tensor.ElemSize(dt)
	var (
		count int
		field string
		enc   func(b []byte, i int) ([]byte, error)
	)
	intRange := func(i int, ok bool, v any) error {
		if !ok {
			return fmt.Errorf("%w: tensor %q: value %v at index %d is out of range for %s", ErrInvalid, name, v, i, dt)
		}
		return nil
	}
	switch dt {
	case tensor.FP32:
		count, field, enc = len(tp.FloatVal), "float_val", func(b []byte, i int) ([]byte, error) {
			return binary.LittleEndian.AppendUint32(b, math.Float32bits(tp.FloatVal[i])), nil
		}
	case tensor.FP64:
		count, field, enc = len(tp.DoubleVal), "double_val", func(b []byte, i int) ([]byte, error) {
			return binary.LittleEndian.AppendUint64(b, math.Float64bits(tp.DoubleVal[i])), nil
		}
	case tensor.Int32, tensor.Int16, tensor.Int8:
		count, field, enc = len(tp.IntVal), "int_val", func(b []byte, i int) ([]byte, error) {
			v := int64(tp.IntVal[i])
			return appendUint(b, uint64(v), es), intRange(i, signedRange(v, es), v)
		}
	case tensor.Uint8, Uint16:
		count, field, enc = len(tp.IntVal), "int_val", func(b []byte, i int) ([]byte, error) {
			v := tp.IntVal[i]
			return appendUint(b, uint64(v), es), intRange(i, v >= 0 && unsignedRange(uint64(v), es), v)
		}
	case tensor.Int64:
		count, field, enc = len(tp.Int64Val), "int64_val", func(b []byte, i int) ([]byte, error) {
			return binary.LittleEndian.AppendUint64(b, uint64(tp.Int64Val[i])), nil
		}
	case Uint32:
		count, field, enc = len(tp.Uint32Val), "uint32_val", func(b []byte, i int) ([]byte, error) {
			return binary.LittleEndian.AppendUint32(b, tp.Uint32Val[i]), nil
		}
	case Uint64:
		count, field, enc = len(tp.Uint64Val), "uint64_val", func(b []byte, i int) ([]byte, error) {
			return binary.LittleEndian.AppendUint64(b, tp.Uint64Val[i]), nil
		}
	case tensor.FP16, BF16:
		count, field, enc = len(tp.HalfVal), "half_val", func(b []byte, i int) ([]byte, error) {
			// TF keeps the low 16 bits: Java's Float.floatToFloat16
			// returns a short, negative for negative halves.
			v := tp.HalfVal[i]
			return binary.LittleEndian.AppendUint16(b, uint16(v)), intRange(i, v >= math.MinInt16 && v <= math.MaxUint16, v)
		}
	case tensor.Bool:
		count, field, enc = len(tp.BoolVal), "bool_val", func(b []byte, i int) ([]byte, error) {
			if tp.BoolVal[i] {
				return append(b, 1), nil
			}
			return append(b, 0), nil
		}
	case tensor.Bytes:
		count, field, enc = len(tp.StringVal), "string_val", func(b []byte, i int) ([]byte, error) {
			b = binary.LittleEndian.AppendUint32(b, uint32(len(tp.StringVal[i])))
			return append(b, tp.StringVal[i]...), nil
		}
	default:
		return nil, fmt.Errorf("%w: tensor %q: datatype %s has no typed TensorProto field", ErrInvalid, name, dt)
	}
	broadcast := count == 1 && n > 1
	if int64(count) != n && !broadcast {
		return nil, fmt.Errorf("%w: tensor %q: shape wants %d values of %s, %s holds %d (and tensor_content is empty)", ErrInvalid, name, n, dt, field, count)
	}
	if broadcast {
		first, err := enc(nil, 0)
		if err != nil {
			return nil, err
		}
		// size of n copies of first without overflowing: n*len(first) <= limit
		if per := int64(len(first)); n > MaxDecodedBytes/per {
			if dt != tensor.Bytes {
				return nil, fmt.Errorf("%w: tensor %q: one %s value broadcast to %d elements of %s is %d bytes, over the %d-byte limit", ErrInvalid, name, field, n, dt, size, MaxDecodedBytes)
			}
			return nil, fmt.Errorf("%w: tensor %q: one %s value of %d bytes broadcast to %d elements is over the %d-byte limit", ErrInvalid, name, field, len(first)-4, n, MaxDecodedBytes)
		}
		return bytes.Repeat(first, int(n)), nil
	}
	// One value per element: the data is no larger than the values the
	// message carries (BYTES adds a 4-byte length to each).
	b := make([]byte, 0, count*max(es, 1))
	var err error
	for i := range count {
		if b, err = enc(b, i); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// ToTensorProto encodes a raw tensor compactly, as clients send large
// tensors (tf.make_tensor_proto of an ndarray): numbers in tensor_content,
// BYTES (DT_STRING) in string_val. Servers answer with ToTensorProtoTyped,
// TF Serving's default encoding of a response.
func ToTensorProto(t *hamsv1.Tensor) (*tfpb.TensorProto, error) {
	if err := tensor.Validate(t); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	dt, ok := ksToTF[t.Datatype]
	if !ok {
		return nil, fmt.Errorf("%w: tensor %q: datatype %s has no TF DataType", ErrInvalid, t.Name, t.Datatype)
	}
	tp := &tfpb.TensorProto{Dtype: dt, TensorShape: TFShape(t.Shape)}
	if t.Datatype == tensor.Bytes {
		tp.StringVal = splitBytes(t.Data)
		return tp, nil
	}
	tp.TensorContent = t.Data
	return tp, nil
}

// ToTensorProtoTyped encodes a raw tensor in the typed *_val field of its
// dtype: what TF Serving answers by default (PredictResponse outputs are
// Tensor::AsProtoField, "kAsProtoField"), so that clients reading
// outputs["x"].float_val find the values there, and what TF's Python
// make_tensor_proto emits for small tensors.
func ToTensorProtoTyped(t *hamsv1.Tensor) (*tfpb.TensorProto, error) {
	if err := tensor.Validate(t); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	dt, ok := ksToTF[t.Datatype]
	if !ok {
		return nil, fmt.Errorf("%w: tensor %q: datatype %s has no TF DataType", ErrInvalid, t.Name, t.Datatype)
	}
	tp := &tfpb.TensorProto{Dtype: dt, TensorShape: TFShape(t.Shape)}
	es := tensor.ElemSize(t.Datatype)
	d := t.Data
	n := 0
	if es > 0 {
		n = len(d) / es
	}
	switch t.Datatype {
	case tensor.FP32:
		for i := 0; i < n; i++ {
			tp.FloatVal = append(tp.FloatVal, math.Float32frombits(binary.LittleEndian.Uint32(d[4*i:])))
		}
	case tensor.FP64:
		for i := 0; i < n; i++ {
			tp.DoubleVal = append(tp.DoubleVal, math.Float64frombits(binary.LittleEndian.Uint64(d[8*i:])))
		}
	case tensor.Int32, tensor.Int16, tensor.Int8:
		for i := 0; i < n; i++ {
			tp.IntVal = append(tp.IntVal, int32(readSigned(d[es*i:], es)))
		}
	case tensor.Uint8, Uint16:
		for i := 0; i < n; i++ {
			tp.IntVal = append(tp.IntVal, int32(readUint(d[es*i:], es)))
		}
	case tensor.Int64:
		for i := 0; i < n; i++ {
			tp.Int64Val = append(tp.Int64Val, int64(binary.LittleEndian.Uint64(d[8*i:])))
		}
	case Uint32:
		for i := 0; i < n; i++ {
			tp.Uint32Val = append(tp.Uint32Val, binary.LittleEndian.Uint32(d[4*i:]))
		}
	case Uint64:
		for i := 0; i < n; i++ {
			tp.Uint64Val = append(tp.Uint64Val, binary.LittleEndian.Uint64(d[8*i:]))
		}
	case tensor.FP16, BF16:
		for i := 0; i < n; i++ {
			tp.HalfVal = append(tp.HalfVal, int32(binary.LittleEndian.Uint16(d[2*i:])))
		}
	case tensor.Bool:
		for i := 0; i < n; i++ {
			tp.BoolVal = append(tp.BoolVal, d[i] != 0)
		}
	case tensor.Bytes:
		tp.StringVal = splitBytes(d)
	}
	return tp, nil
}

// TFShape builds a TensorShapeProto.
func TFShape(shape []int64) *tfpb.TensorShapeProto {
	s := &tfpb.TensorShapeProto{}
	for _, d := range shape {
		s.Dim = append(s.Dim, &tfpb.TensorShapeProto_Dim{Size: d})
	}
	return s
}

// decodedSize is the number of data bytes tp decodes to for n elements of
// dt (size bytes for a fixed-size dt), saturating at MaxInt64; it
// allocates nothing.
func decodedSize(dt string, tp *tfpb.TensorProto, n, size int64) int64 {
	if len(tp.TensorContent) > 0 {
		return int64(len(tp.TensorContent))
	}
	if dt != tensor.Bytes {
		return size
	}
	if len(tp.StringVal) == 1 && n > 1 {
		per := int64(4 + len(tp.StringVal[0]))
		if n > math.MaxInt64/per {
			return math.MaxInt64
		}
		return n * per
	}
	var sum int64
	for _, s := range tp.StringVal {
		sum += int64(4 + len(s))
	}
	return sum
}
