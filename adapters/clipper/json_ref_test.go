package clipper

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// The hand-written JSON of json.go against the code it replaced (kept
// here verbatim as the reference: refJSONRows, refAppendNumber, refBody)
// and against encoding/json.

// refJSONRows encodes every row of t as a JSON value: numbers as a flat
// array, BYTES [N] as one string per row.
func refJSONRows(t *hamsv1.Tensor) ([]json.RawMessage, error) {
	n := int(t.Shape[0])
	out := make([]json.RawMessage, n)
	if t.Datatype == tensor.Bytes {
		if len(t.Shape) != 1 {
			return nil, fmt.Errorf("BYTES input must be [rows] (one string per row), is %v", t.Shape)
		}
		for i, e := range wire.BytesElems(t.Data) {
			s, err := json.Marshal(string(e))
			if err != nil {
				return nil, err
			}
			out[i] = s
		}
		return out, nil
	}
	es := tensor.ElemSize(t.Datatype)
	per := len(t.Data) / n / es
	for i := range n {
		var buf bytes.Buffer
		buf.WriteByte('[')
		for j := range per {
			if j > 0 {
				buf.WriteByte(',')
			}
			off := (i*per + j) * es
			if err := refAppendNumber(&buf, t.Datatype, t.Data[off:off+es]); err != nil {
				return nil, fmt.Errorf("row %d element %d: %w", i, j, err)
			}
		}
		buf.WriteByte(']')
		out[i] = buf.Bytes()
	}
	return out, nil
}

func refAppendNumber(buf *bytes.Buffer, dt string, b []byte) error {
	var scratch [32]byte
	var s []byte
	switch dt {
	case tensor.FP32:
		v := math.Float32frombits(binary.LittleEndian.Uint32(b))
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("%v cannot travel in JSON", v)
		}
		s = strconv.AppendFloat(scratch[:0], float64(v), 'g', -1, 32)
	case tensor.FP64:
		v := math.Float64frombits(binary.LittleEndian.Uint64(b))
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("%v cannot travel in JSON", v)
		}
		s = strconv.AppendFloat(scratch[:0], v, 'g', -1, 64)
	case tensor.Int8:
		s = strconv.AppendInt(scratch[:0], int64(int8(b[0])), 10)
	case tensor.Int16:
		s = strconv.AppendInt(scratch[:0], int64(int16(binary.LittleEndian.Uint16(b))), 10)
	case tensor.Int32:
		s = strconv.AppendInt(scratch[:0], int64(int32(binary.LittleEndian.Uint32(b))), 10)
	case tensor.Int64:
		s = strconv.AppendInt(scratch[:0], int64(binary.LittleEndian.Uint64(b)), 10)
	case tensor.Uint8:
		s = strconv.AppendUint(scratch[:0], uint64(b[0]), 10)
	case tensor.Bool:
		s = []byte{'0'}
		if b[0] != 0 {
			s[0] = '1'
		}
	default:
		return fmt.Errorf("datatype %s cannot be sent to Clipper (numbers or BYTES only)", dt)
	}
	buf.Write(s)
	return nil
}

// refBody is the body the old predict assembled from the rows.
func refBody(rows []json.RawMessage) []byte {
	if len(rows) == 1 {
		return append(append([]byte(`{"input":`), rows[0]...), '}')
	}
	body := []byte(`{"input_batch":[`)
	for i, r := range rows {
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, r...)
	}
	return append(body, "]}"...)
}
