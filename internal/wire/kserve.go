package wire

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
)

// ContentsCount is the number of typed values c holds over all fields.
func ContentsCount(c *inference.InferTensorContents) int {
	if c == nil {
		return 0
	}
	return len(c.BoolContents) + len(c.IntContents) + len(c.Int64Contents) + len(c.UintContents) +
		len(c.Uint64Contents) + len(c.Fp32Contents) + len(c.Fp64Contents) + len(c.BytesContents)
}

// FromKServe builds a raw tensor from KServe v2 tensor metadata and either
// raw bytes (hasRaw: the tensor's entry of raw_input_contents or
// raw_output_contents) or typed contents. Typed contents must be in the
// datatype's field only and hold exactly one value per element (KServe has
// no broadcast rule); both typed and raw is an error.
func FromKServe(name, datatype string, shape []int64, c *inference.InferTensorContents, raw []byte, hasRaw bool) (*hamsv1.Tensor, error) {
	return fromKServe(name, datatype, shape, c, raw, hasRaw, -1)
}

// FromInferInputLimit is FromInferInput for a decode that may produce at
// most limit bytes of data (what is left of a request's budget): typed
// contents decode to up to 8 bytes per byte on the wire (an INT64 value
// of 0 is one byte of varint), so a tensor whose data would be larger is
// refused with ErrTooLarge before anything is allocated.
func FromInferInputLimit(in *inference.ModelInferRequest_InferInputTensor, raw []byte, hasRaw bool, limit int64) (*hamsv1.Tensor, error) {
	if in == nil {
		return nil, fmt.Errorf("%w: nil input tensor", ErrInvalid)
	}
	return fromKServe(in.Name, in.Datatype, in.Shape, in.Contents, raw, hasRaw, max(limit, 0))
}

func fromKServe(name, datatype string, shape []int64, c *inference.InferTensorContents, raw []byte, hasRaw bool, limit int64) (*hamsv1.Tensor, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: tensor without a name", ErrInvalid)
	}
	if tensor.ElemSize(datatype) < 0 {
		return nil, fmt.Errorf("%w: tensor %q: unsupported datatype %q", ErrInvalid, name, datatype)
	}
	n, size, err := shapeSize(name, datatype, shape)
	if err != nil {
		return nil, err
	}
	if limit >= 0 {
		dec := int64(len(raw))
		switch {
		case hasRaw:
		case datatype != tensor.Bytes:
			// What the values present decode to (ContentsToRaw refuses a
			// count other than the shape's before it allocates).
			dec = min(size, int64(ContentsCount(c))*int64(tensor.ElemSize(datatype)))
		default:
			dec = 0
			for _, b := range c.GetBytesContents() {
				dec += int64(4 + len(b))
			}
		}
		if dec > limit {
			return nil, fmt.Errorf("%w: tensor %q: %s %v decodes to %d bytes, over the %d bytes left of the request's limit", ErrTooLarge, name, datatype, shape, dec, limit)
		}
	}
	t := &hamsv1.Tensor{Name: name, Datatype: datatype, Shape: shape}
	if hasRaw {
		if ContentsCount(c) > 0 {
			return nil, fmt.Errorf("%w: tensor %q: both typed contents and raw contents", ErrInvalid, name)
		}
		t.Data = raw
		if t.Data == nil {
			t.Data = []byte{}
		}
	} else if t.Data, err = ContentsToRaw(name, datatype, c, n); err != nil {
		return nil, err
	}
	if err := tensor.Validate(t); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return t, nil
}

// FromInferInput converts one ModelInferRequest input (raw is its entry of
// raw_input_contents when hasRaw).
func FromInferInput(in *inference.ModelInferRequest_InferInputTensor, raw []byte, hasRaw bool) (*hamsv1.Tensor, error) {
	if in == nil {
		return nil, fmt.Errorf("%w: nil input tensor", ErrInvalid)
	}
	return FromKServe(in.Name, in.Datatype, in.Shape, in.Contents, raw, hasRaw)
}

// FromInferOutput converts one ModelInferResponse output (raw is its entry
// of raw_output_contents when hasRaw).
func FromInferOutput(out *inference.ModelInferResponse_InferOutputTensor, raw []byte, hasRaw bool) (*hamsv1.Tensor, error) {
	if out == nil {
		return nil, fmt.Errorf("%w: nil output tensor", ErrInvalid)
	}
	return FromKServe(out.Name, out.Datatype, out.Shape, out.Contents, raw, hasRaw)
}

// ContentsToRaw encodes typed contents of datatype dt holding n elements.
// The count of values present is checked against n before anything is
// allocated, and the data is sized from the values present, never from n
// (a client's shape alone cannot make it allocate).
func ContentsToRaw(name, dt string, c *inference.InferTensorContents, n int64) ([]byte, error) {
	if c == nil {
		c = &inference.InferTensorContents{}
	}
	es := tensor.ElemSize(dt)
	var b []byte
	count := func(got int, field string) error {
		if int64(got) != n || ContentsCount(c) != got {
			return fmt.Errorf("%w: tensor %q: %s shape wants %d elements in %s, contents hold %d (of %d typed values)", ErrInvalid, name, dt, n, field, got, ContentsCount(c))
		}
		b = make([]byte, 0, got*max(es, 0))
		return nil
	}
	rangeErr := func(i int, v any) error {
		return fmt.Errorf("%w: tensor %q: value %v at index %d is out of range for %s", ErrInvalid, name, v, i, dt)
	}
	switch dt {
	case tensor.FP32:
		if err := count(len(c.Fp32Contents), "fp32_contents"); err != nil {
			return nil, err
		}
		for _, v := range c.Fp32Contents {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
	case tensor.FP64:
		if err := count(len(c.Fp64Contents), "fp64_contents"); err != nil {
			return nil, err
		}
		for _, v := range c.Fp64Contents {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
		}
	case tensor.Int64:
		if err := count(len(c.Int64Contents), "int64_contents"); err != nil {
			return nil, err
		}
		for _, v := range c.Int64Contents {
			b = binary.LittleEndian.AppendUint64(b, uint64(v))
		}
	case tensor.Int32, tensor.Int16, tensor.Int8:
		if err := count(len(c.IntContents), "int_contents"); err != nil {
			return nil, err
		}
		for i, v := range c.IntContents {
			if !signedRange(int64(v), es) {
				return nil, rangeErr(i, v)
			}
			b = appendUint(b, uint64(v), es)
		}
	case tensor.Uint8, Uint16, Uint32:
		if err := count(len(c.UintContents), "uint_contents"); err != nil {
			return nil, err
		}
		for i, v := range c.UintContents {
			if !unsignedRange(uint64(v), es) {
				return nil, rangeErr(i, v)
			}
			b = appendUint(b, uint64(v), es)
		}
	case Uint64:
		if err := count(len(c.Uint64Contents), "uint64_contents"); err != nil {
			return nil, err
		}
		for _, v := range c.Uint64Contents {
			b = binary.LittleEndian.AppendUint64(b, v)
		}
	case tensor.Bool:
		if err := count(len(c.BoolContents), "bool_contents"); err != nil {
			return nil, err
		}
		for _, v := range c.BoolContents {
			if v {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
		}
	case tensor.Bytes:
		if err := count(len(c.BytesContents), "bytes_contents"); err != nil {
			return nil, err
		}
		b = joinBytes(c.BytesContents)
	default:
		return nil, fmt.Errorf("%w: tensor %q: datatype %s has no typed contents field; send it as raw contents", ErrInvalid, name, dt)
	}
	return b, nil
}

// Contents encodes a raw tensor's data as typed InferTensorContents (FP16
// and BF16 have no typed field: an error).
func Contents(t *hamsv1.Tensor) (*inference.InferTensorContents, error) {
	if err := tensor.Validate(t); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	c := &inference.InferTensorContents{}
	es := tensor.ElemSize(t.Datatype)
	d := t.Data
	n := 0
	if es > 0 {
		n = len(d) / es
	}
	switch t.Datatype {
	case tensor.FP32:
		c.Fp32Contents = make([]float32, n)
		for i := range n {
			c.Fp32Contents[i] = math.Float32frombits(binary.LittleEndian.Uint32(d[4*i:]))
		}
	case tensor.FP64:
		c.Fp64Contents = make([]float64, n)
		for i := range n {
			c.Fp64Contents[i] = math.Float64frombits(binary.LittleEndian.Uint64(d[8*i:]))
		}
	case tensor.Int64:
		c.Int64Contents = make([]int64, n)
		for i := range n {
			c.Int64Contents[i] = int64(binary.LittleEndian.Uint64(d[8*i:]))
		}
	case tensor.Int32, tensor.Int16, tensor.Int8:
		c.IntContents = make([]int32, n)
		for i := range n {
			c.IntContents[i] = int32(readSigned(d[es*i:], es))
		}
	case tensor.Uint8, Uint16, Uint32:
		c.UintContents = make([]uint32, n)
		for i := range n {
			c.UintContents[i] = uint32(readUint(d[es*i:], es))
		}
	case Uint64:
		c.Uint64Contents = make([]uint64, n)
		for i := range n {
			c.Uint64Contents[i] = binary.LittleEndian.Uint64(d[8*i:])
		}
	case tensor.Bool:
		c.BoolContents = make([]bool, n)
		for i := range n {
			c.BoolContents[i] = d[i] != 0
		}
	case tensor.Bytes:
		c.BytesContents = splitBytes(d)
	default:
		return nil, fmt.Errorf("%w: tensor %q: datatype %s has no typed contents field; send it as raw contents", ErrInvalid, t.Name, t.Datatype)
	}
	return c, nil
}

// InferInput is the request metadata of a raw tensor; its data goes into
// raw_input_contents at the same index.
func InferInput(t *hamsv1.Tensor) *inference.ModelInferRequest_InferInputTensor {
	return &inference.ModelInferRequest_InferInputTensor{Name: t.GetName(), Datatype: t.GetDatatype(), Shape: t.GetShape()}
}

// InferOutput is the response metadata of a raw tensor; its data goes into
// raw_output_contents at the same index.
func InferOutput(t *hamsv1.Tensor) *inference.ModelInferResponse_InferOutputTensor {
	return &inference.ModelInferResponse_InferOutputTensor{Name: t.GetName(), Datatype: t.GetDatatype(), Shape: t.GetShape()}
}

// RawInputs pairs a ModelInferRequest's raw_input_contents with its inputs
// as Triton does (InferGRPCToInput): in order, one entry for each input
// without a shared-memory region (parameter shared_memory_region), so a
// request may mix raw and shared-memory inputs; with raw contents present,
// an input carrying typed contents is an error ("contents field must not
// be specified when using raw_input_contents"), though an empty contents
// message, which some clients set on every input, is taken as none.
// Entries left over must be empty (the placeholders some clients send for
// shared-memory inputs). raws[i] is input i's entry and takes[i] whether it
// takes one (the hasRaw of FromInferInput). With no raw_input_contents, no
// input takes one.
func RawInputs(inputs []*inference.ModelInferRequest_InferInputTensor, raw [][]byte) (raws [][]byte, takes []bool, err error) {
	raws, takes = make([][]byte, len(inputs)), make([]bool, len(inputs))
	if len(raw) == 0 {
		return raws, takes, nil
	}
	next := 0
	for i, in := range inputs {
		if _, inShm := in.GetParameters()[ParamShmRegion]; inShm {
			continue
		}
		if ContentsCount(in.GetContents()) > 0 {
			return nil, nil, fmt.Errorf("%w: tensor %q: contents must not be given when the request uses raw_input_contents", ErrInvalid, in.GetName())
		}
		if next == len(raw) {
			return nil, nil, fmt.Errorf("%w: tensor %q: no raw_input_contents entry left (%d entries, one per input without shared memory)", ErrInvalid, in.GetName(), len(raw))
		}
		raws[i], takes[i] = raw[next], true
		next++
	}
	for j, extra := range raw[next:] {
		if len(extra) > 0 {
			return nil, nil, fmt.Errorf("%w: raw_input_contents entry %d (%d bytes) belongs to no input: %d entries for the %d inputs without shared memory", ErrInvalid, next+j, len(extra), len(raw), next)
		}
	}
	return raws, takes, nil
}
