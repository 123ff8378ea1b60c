// Package tensor holds the helpers every component uses on hamsv1.Tensor:
// validation, conversion to and from Go slices, batching (concatenation and
// splitting along dimension 0) and digests. Data is always raw,
// little-endian, row-major (see protos/hams/v1/tensor.proto).
package tensor

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// ErrInvalid is wrapped by every validation error of this package.
var ErrInvalid = errors.New("tensor: invalid")

// Datatype names (KServe v2).
const (
	Bool  = "BOOL"
	Uint8 = "UINT8"
	Int8  = "INT8"
	Int16 = "INT16"
	Int32 = "INT32"
	Int64 = "INT64"
	FP16  = "FP16"
	FP32  = "FP32"
	FP64  = "FP64"
	Bytes = "BYTES"
)

// ElemSize is the byte size of one element of datatype dt; 0 for BYTES
// (variable) and -1 for an unknown datatype.
func ElemSize(dt string) int {
	switch dt {
	case Bool, Uint8, Int8:
		return 1
	case Int16, FP16, "UINT16", "BF16":
		return 2
	case Int32, FP32, "UINT32":
		return 4
	case Int64, FP64, "UINT64":
		return 8
	case Bytes:
		return 0
	}
	return -1
}

// NumElements is the product of shape; it errors on negative dimensions.
func NumElements(shape []int64) (int64, error) {
	n := int64(1)
	for i, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("%w: dimension %d is %d", ErrInvalid, i, d)
		}
		if d != 0 && n > math.MaxInt64/d {
			return 0, fmt.Errorf("%w: shape %v overflows", ErrInvalid, shape)
		}
		n *= d
	}
	return n, nil
}

// Validate checks that t's datatype is known and that its data length
// matches its shape. Errors name the tensor.
func Validate(t *hamsv1.Tensor) error {
	if t == nil {
		return fmt.Errorf("%w: nil tensor", ErrInvalid)
	}
	es := ElemSize(t.Datatype)
	if es < 0 {
		return fmt.Errorf("%w: tensor %q: unsupported datatype %q", ErrInvalid, t.Name, t.Datatype)
	}
	n, err := NumElements(t.Shape)
	if err != nil {
		return fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	if es == 0 {
		got, err := countBytesElems(t.Data)
		if err != nil {
			return fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		if int64(got) != n {
			return fmt.Errorf("%w: tensor %q: shape %v wants %d BYTES elements, data holds %d", ErrInvalid, t.Name, t.Shape, n, got)
		}
		return nil
	}
	if n > math.MaxInt64/int64(es) {
		return fmt.Errorf("%w: tensor %q: shape %v of %s: byte size overflows int64", ErrInvalid, t.Name, t.Shape, t.Datatype)
	}
	if want := n * int64(es); int64(len(t.Data)) != want {
		return fmt.Errorf("%w: tensor %q: shape %v of %s wants %d bytes, data holds %d", ErrInvalid, t.Name, t.Shape, t.Datatype, want, len(t.Data))
	}
	if t.Datatype == Bool {
		// One byte per element, 0 or 1 (what every typed encoding can
		// carry back).
		for i, b := range t.Data {
			if b > 1 {
				return fmt.Errorf("%w: tensor %q: BOOL element %d is byte %d, want 0 or 1", ErrInvalid, t.Name, i, b)
			}
		}
	}
	return nil
}

func countBytesElems(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		if len(b) < 4 {
			return 0, fmt.Errorf("%w: truncated BYTES length prefix", ErrInvalid)
		}
		l := binary.LittleEndian.Uint32(b)
		b = b[4:]
		if uint64(l) > uint64(len(b)) {
			return 0, fmt.Errorf("%w: BYTES element of %d bytes overruns data", ErrInvalid, l)
		}
		b = b[l:]
		n++
	}
	return n, nil
}

// FromFloat32 builds an FP32 tensor.
func FromFloat32(name string, shape []int64, v []float32) *hamsv1.Tensor {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return &hamsv1.Tensor{Name: name, Datatype: FP32, Shape: append([]int64(nil), shape...), Data: b}
}

// Float32 decodes an FP32 tensor (validated first).
func Float32(t *hamsv1.Tensor) ([]float32, error) {
	if err := Validate(t); err != nil {
		return nil, err
	}
	if t.Datatype != FP32 {
		return nil, fmt.Errorf("%w: tensor %q: want FP32, got %s", ErrInvalid, t.Name, t.Datatype)
	}
	v := make([]float32, len(t.Data)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return v, nil
}

// FromInt64 builds an INT64 tensor.
func FromInt64(name string, shape []int64, v []int64) *hamsv1.Tensor {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
	}
	return &hamsv1.Tensor{Name: name, Datatype: Int64, Shape: append([]int64(nil), shape...), Data: b}
}

// Int64s decodes an INT64 tensor (validated first).
func Int64s(t *hamsv1.Tensor) ([]int64, error) {
	if err := Validate(t); err != nil {
		return nil, err
	}
	if t.Datatype != Int64 {
		return nil, fmt.Errorf("%w: tensor %q: want INT64, got %s", ErrInvalid, t.Name, t.Datatype)
	}
	v := make([]int64, len(t.Data)/8)
	for i := range v {
		v[i] = int64(binary.LittleEndian.Uint64(t.Data[8*i:]))
	}
	return v, nil
}

// Rows is the size of dimension 0 (1 for a scalar).
func Rows(t *hamsv1.Tensor) int64 {
	if len(t.Shape) == 0 {
		return 1
	}
	return t.Shape[0]
}

// Concat concatenates tensors of one name along dimension 0. All parts must
// share datatype and trailing dimensions.
func Concat(parts []*hamsv1.Tensor) (*hamsv1.Tensor, error) {
	if len(parts) == 0 {
		return nil, fmt.Errorf("%w: concat of no tensors", ErrInvalid)
	}
	first := parts[0]
	if len(first.Shape) == 0 {
		return nil, fmt.Errorf("%w: tensor %q: cannot batch a scalar", ErrInvalid, first.Name)
	}
	if len(parts) == 1 {
		return first, nil
	}
	rows := int64(0)
	size := 0
	for _, p := range parts {
		if p.Datatype != first.Datatype {
			return nil, fmt.Errorf("%w: tensor %q: batching %s with %s", ErrInvalid, first.Name, first.Datatype, p.Datatype)
		}
		if len(p.Shape) != len(first.Shape) {
			return nil, fmt.Errorf("%w: tensor %q: batching rank %d with rank %d", ErrInvalid, first.Name, len(first.Shape), len(p.Shape))
		}
		for d := 1; d < len(p.Shape); d++ {
			if p.Shape[d] != first.Shape[d] {
				return nil, fmt.Errorf("%w: tensor %q: batching shape %v with %v", ErrInvalid, first.Name, first.Shape, p.Shape)
			}
		}
		rows += p.Shape[0]
		size += len(p.Data)
	}
	data := make([]byte, 0, size)
	for _, p := range parts {
		data = append(data, p.Data...)
	}
	shape := append([]int64{rows}, first.Shape[1:]...)
	return &hamsv1.Tensor{Name: first.Name, Datatype: first.Datatype, Shape: shape, Data: data}, nil
}

// Split cuts t along dimension 0 into parts of rows[i] rows. The parts
// alias t's data. BYTES tensors are not splittable.
func Split(t *hamsv1.Tensor, rows []uint32) ([]*hamsv1.Tensor, error) {
	if len(t.Shape) == 0 {
		return nil, fmt.Errorf("%w: tensor %q: cannot split a scalar", ErrInvalid, t.Name)
	}
	es := ElemSize(t.Datatype)
	if es <= 0 {
		return nil, fmt.Errorf("%w: tensor %q: cannot split datatype %s", ErrInvalid, t.Name, t.Datatype)
	}
	total := int64(0)
	for _, r := range rows {
		total += int64(r)
	}
	if total != t.Shape[0] {
		return nil, fmt.Errorf("%w: tensor %q: %d rows cannot be split as %v", ErrInvalid, t.Name, t.Shape[0], rows)
	}
	rowElems, err := NumElements(t.Shape[1:])
	if err != nil {
		return nil, err
	}
	if rowElems > math.MaxInt/int64(es) || rowElems > 0 && total > math.MaxInt/(rowElems*int64(es)) {
		return nil, fmt.Errorf("%w: tensor %q: shape %v of %s: byte size overflows int", ErrInvalid, t.Name, t.Shape, t.Datatype)
	}
	rowBytes := int(rowElems) * es
	if len(t.Data) != int(total)*rowBytes {
		return nil, fmt.Errorf("%w: tensor %q: data length %d does not match shape %v", ErrInvalid, t.Name, len(t.Data), t.Shape)
	}
	out := make([]*hamsv1.Tensor, len(rows))
	off := 0
	for i, r := range rows {
		n := int(r) * rowBytes
		shape := append([]int64{int64(r)}, t.Shape[1:]...)
		out[i] = &hamsv1.Tensor{Name: t.Name, Datatype: t.Datatype, Shape: shape, Data: t.Data[off : off+n : off+n]}
		off += n
	}
	return out, nil
}

// Digest is the hex SHA-256 of the tensors' data bytes, in order.
func Digest(ts ...*hamsv1.Tensor) string {
	h := sha256.New()
	for _, t := range ts {
		h.Write(t.Data)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// SpecsBytes is the size of a state laid out as specs (fixed shapes and
// element sizes), the bytes SplitBySpecs expects.
func SpecsBytes(specs []*hamsv1.TensorSpec) (uint64, error) {
	var total uint64
	for _, sp := range specs {
		es := ElemSize(sp.GetDatatype())
		if es <= 0 {
			return 0, fmt.Errorf("state tensor %q: datatype %q has no fixed element size", sp.GetName(), sp.GetDatatype())
		}
		n, err := NumElements(sp.GetShape())
		if err != nil {
			return 0, fmt.Errorf("state tensor %q: %w", sp.GetName(), err)
		}
		if uint64(n) > (math.MaxUint64-total)/uint64(es) {
			return 0, fmt.Errorf("state tensor %q: shape %v of %s: the state's byte size overflows", sp.GetName(), sp.GetShape(), sp.GetDatatype())
		}
		total += uint64(n) * uint64(es)
	}
	return total, nil
}

// SplitBySpecs cuts contiguous bytes (a model state) into one tensor per
// spec; the parts alias data. Specs must have fixed shapes (BYTES tensors
// are not state).
func SplitBySpecs(specs []*hamsv1.TensorSpec, data []byte) ([]*hamsv1.Tensor, error) {
	out := make([]*hamsv1.Tensor, len(specs))
	off := 0
	for i, sp := range specs {
		es := ElemSize(sp.GetDatatype())
		if es <= 0 {
			return nil, fmt.Errorf("state tensor %q: datatype %q has no fixed element size", sp.GetName(), sp.GetDatatype())
		}
		n, err := NumElements(sp.GetShape())
		if err != nil {
			return nil, fmt.Errorf("state tensor %q: %w", sp.GetName(), err)
		}
		if n > int64(len(data)-off)/int64(es) {
			return nil, fmt.Errorf("state tensor %q: shape %v of %s needs more than the %d bytes left at offset %d", sp.GetName(), sp.GetShape(), sp.GetDatatype(), len(data)-off, off)
		}
		size := int(n) * es // fits: n*es <= len(data)-off
		out[i] = &hamsv1.Tensor{Name: sp.GetName(), Datatype: sp.GetDatatype(), Shape: sp.GetShape(), Data: data[off : off+size : off+size]}
		off += size
	}
	if off != len(data) {
		return nil, fmt.Errorf("state specs cover %d bytes, state has %d", off, len(data))
	}
	return out, nil
}

// FirstNonFinite finds the first NaN or ±Inf element of a floating-point
// tensor (FP16, BF16, FP32, FP64; data as Validate checks it): its index
// and "NaN", "+Inf" or "-Inf". found is false when every element is
// finite or the datatype is not a floating-point one.
func FirstNonFinite(t *hamsv1.Tensor) (index int, what string, found bool) {
	d := t.GetData()
	// Per datatype: element size, exponent mask (all ones: not finite),
	// mantissa mask (non-zero: NaN) and sign bit.
	var size int
	var exp, man, sign uint64
	switch t.GetDatatype() {
	case FP16:
		size, exp, man, sign = 2, 0x7c00, 0x03ff, 0x8000
	case "BF16":
		size, exp, man, sign = 2, 0x7f80, 0x007f, 0x8000
	case FP32:
		size, exp, man, sign = 4, 0x7f800000, 0x007fffff, 0x80000000
	case FP64:
		size, exp, man, sign = 8, 0x7ff0000000000000, 0x000fffffffffffff, 1<<63
	default:
		return 0, "", false
	}
	for i := 0; i+size <= len(d); i += size {
		var v uint64
		switch size {
		case 2:
			v = uint64(binary.LittleEndian.Uint16(d[i:]))
		case 4:
			v = uint64(binary.LittleEndian.Uint32(d[i:]))
		default:
			v = binary.LittleEndian.Uint64(d[i:])
		}
		if v&exp != exp {
			continue
		}
		switch {
		case v&man != 0:
			return i / size, "NaN", true
		case v&sign != 0:
			return i / size, "-Inf", true
		default:
			return i / size, "+Inf", true
		}
	}
	return 0, "", false
}
