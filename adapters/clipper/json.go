package clipper

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// The JSON of the predict path, written by hand: a batch-1 Fashion-MNIST
// request is 784 numbers, and encoding/json's reflection plus the growth of
// one buffer per row cost the sidecar more than the network call around
// them (docs/adapters.md). The text is the same as before byte for byte
// (strconv's shortest representation, 'g' format); the answer is decoded
// by a fast path that accepts only what it can decode exactly as
// encoding/json does and hands everything else to encoding/json.

// bodyPool holds the scratch buffers request bodies are encoded in; a body
// is copied out of its scratch buffer (one allocation of the exact size),
// so the HTTP transport owns what it sends and may retry it.
var bodyPool = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledBody bounds the scratch buffers kept for reuse (a large batch
// does not pin its buffer).
const maxPooledBody = 1 << 20

// encodeBody encodes the rows of t as a predict body: {"input": row} for
// one row, {"input_batch": [row, ...]} for several; numbers as a flat
// array per row, BYTES [N] as one JSON string per row. It returns the body
// and the number of rows.
func encodeBody(t *hamsv1.Tensor) ([]byte, int, error) {
	bp := bodyPool.Get().(*[]byte)
	buf, n, err := appendBody((*bp)[:0], t)
	var body []byte
	if err == nil {
		body = append(make([]byte, 0, len(buf)), buf...)
	}
	if cap(buf) <= maxPooledBody {
		*bp = buf[:0]
		bodyPool.Put(bp)
	}
	return body, n, err
}

func appendBody(dst []byte, t *hamsv1.Tensor) ([]byte, int, error) {
	n := int(t.Shape[0])
	single := n == 1
	if single {
		dst = append(dst, `{"input":`...)
	} else {
		dst = append(dst, `{"input_batch":[`...)
	}
	var err error
	if t.Datatype == tensor.Bytes {
		if len(t.Shape) != 1 {
			return dst, n, fmt.Errorf("BYTES input must be [rows] (one string per row), is %v", t.Shape)
		}
		for i, e := range wire.BytesElems(t.Data) {
			if i > 0 {
				dst = append(dst, ',')
			}
			// encoding/json's escaping (HTML characters, invalid UTF-8,
			// U+2028/9), as before; strings are not the hot path.
			s, err := json.Marshal(string(e))
			if err != nil {
				return dst, n, err
			}
			dst = append(dst, s...)
		}
	} else {
		es := tensor.ElemSize(t.Datatype)
		per := len(t.Data) / n / es
		for i := range n {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, '[')
			if dst, err = appendRow(dst, t.Datatype, t.Data[i*per*es:(i+1)*per*es], per); err != nil {
				return dst, n, fmt.Errorf("row %d %w", i, err)
			}
			dst = append(dst, ']')
		}
	}
	if single {
		dst = append(dst, '}')
	} else {
		dst = append(dst, "]}"...)
	}
	return dst, n, nil
}

// appendRow appends the per elements of row (datatype dt, little endian)
// as comma-separated JSON numbers.
func appendRow(dst []byte, dt string, row []byte, per int) ([]byte, error) {
	if per == 0 {
		return dst, nil
	}
	switch dt {
	case tensor.FP32:
		for j := range per {
			if j > 0 {
				dst = append(dst, ',')
			}
			bits := binary.LittleEndian.Uint32(row[4*j:])
			switch {
			case bits == 0: // +0, the commonest pixel: strconv says "0" too
				dst = append(dst, '0')
			case bits&0x7f800000 == 0x7f800000: // NaN or ±Inf
				return dst, fmt.Errorf("element %d: %v cannot travel in JSON", j, math.Float32frombits(bits))
			default:
				dst = strconv.AppendFloat(dst, float64(math.Float32frombits(bits)), 'g', -1, 32)
			}
		}
	case tensor.FP64:
		for j := range per {
			if j > 0 {
				dst = append(dst, ',')
			}
			v := math.Float64frombits(binary.LittleEndian.Uint64(row[8*j:]))
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return dst, fmt.Errorf("element %d: %v cannot travel in JSON", j, v)
			}
			dst = strconv.AppendFloat(dst, v, 'g', -1, 64)
		}
	case tensor.Int8:
		for j := range per {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendInt(dst, int64(int8(row[j])), 10)
		}
	case tensor.Int16:
		for j := range per {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendInt(dst, int64(int16(binary.LittleEndian.Uint16(row[2*j:]))), 10)
		}
	case tensor.Int32:
		for j := range per {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendInt(dst, int64(int32(binary.LittleEndian.Uint32(row[4*j:]))), 10)
		}
	case tensor.Int64:
		for j := range per {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendInt(dst, int64(binary.LittleEndian.Uint64(row[8*j:])), 10)
		}
	case tensor.Uint8:
		for j := range per {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendUint(dst, uint64(row[j]), 10)
		}
	case tensor.Bool:
		for j := range per {
			if j > 0 {
				dst = append(dst, ',')
			}
			c := byte('0')
			if row[j] != 0 {
				c = '1'
			}
			dst = append(dst, c)
		}
	default:
		return dst, fmt.Errorf("element 0: datatype %s cannot be sent to Clipper (numbers or BYTES only)", dt)
	}
	return dst, nil
}

// decodeAnswer decodes a predict answer into ba as json.Unmarshal(data,
// ba) does.
func decodeAnswer(data []byte, ba *batchAnswer) error {
	if fastAnswer(data, ba) {
		return nil
	}
	*ba = batchAnswer{}
	return json.Unmarshal(data, ba)
}

// answerKeys are the JSON names of batchAnswer's fields (encoding/json
// matches them case-insensitively; the fast path only exactly).
var answerKeys = [][]byte{[]byte("query_id"), []byte("output"), []byte("default"), []byte("default_explanation"),
	[]byte("batch_predictions"), []byte("error"), []byte("cause")}

// fastAnswer decodes the common answer, one object with the fields of a
// single query's answer, and reports false (ba possibly half filled) for
// anything it does not decode exactly as encoding/json would: invalid
// JSON, a batch answer, escaped keys or strings, keys that match a field
// only case-insensitively, values of an unexpected type.
func fastAnswer(data []byte, ba *batchAnswer) bool {
	if !json.Valid(data) {
		return false
	}
	// From here on the document is valid JSON: the scanning below does
	// not check the grammar again.
	i := skipWS(data, 0)
	if data[i] != '{' {
		return false
	}
	*ba = batchAnswer{}
	i = skipWS(data, i+1)
	for data[i] != '}' {
		// data[i] is the '"' of a key.
		ke := skipString(data, i)
		key := data[i+1 : ke-1]
		i = skipWS(data, ke)
		i = skipWS(data, i+1) // past ':'
		ve := skipValue(data, i)
		v := data[i:ve]
		switch string(key) {
		case "query_id":
			if string(v) == "null" {
				ba.QueryID = nil
				break
			}
			id, ok := parseInt64(v)
			if !ok {
				return false // a fraction, an exponent, out of range, not a number
			}
			ba.QueryID = &id
		case "output":
			ba.Output = json.RawMessage(v)
		case "default":
			switch string(v) {
			case "true":
				ba.Default = true
			case "false":
				ba.Default = false
			case "null":
			default:
				return false
			}
		case "default_explanation", "error", "cause":
			if string(v) == "null" {
				break
			}
			s, ok := plainString(v)
			if !ok {
				return false
			}
			switch string(key) {
			case "default_explanation":
				ba.DefaultExplanation = s
			case "error":
				ba.Error = s
			default:
				ba.Cause = s
			}
		default:
			// Batch answers take the general path; so do keys that
			// encoding/json would match to a field case-insensitively or
			// after unescaping.
			if string(key) == "batch_predictions" || bytes.IndexByte(key, '\\') >= 0 {
				return false
			}
			for _, k := range answerKeys {
				if bytes.EqualFold(key, k) {
					return false
				}
			}
		}
		i = skipWS(data, ve)
		if data[i] == ',' {
			i = skipWS(data, i+1)
		}
	}
	return true
}

// plainString returns the text of a JSON string value without escapes
// that is valid UTF-8 (false for anything else).
func plainString(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	s := v[1 : len(v)-1]
	for _, c := range s {
		if c == '\\' {
			return "", false
		}
	}
	if !utf8.Valid(s) {
		return "", false
	}
	return string(s), true
}

// parseInt64 parses a JSON integer (no fraction or exponent) that fits
// an int64.
func parseInt64(v []byte) (int64, bool) {
	neg := len(v) > 0 && v[0] == '-'
	if neg {
		v = v[1:]
	}
	if len(v) == 0 || len(v) > 19 {
		return 0, false
	}
	var u uint64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		u = u*10 + uint64(c-'0')
	}
	switch {
	case neg && u <= 1<<63:
		return int64(-u), true
	case !neg && u < 1<<63:
		return int64(u), true
	}
	return 0, false
}

func skipWS(d []byte, i int) int {
	for i < len(d) && (d[i] == ' ' || d[i] == '\t' || d[i] == '\n' || d[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at d[i] ('"').
func skipString(d []byte, i int) int {
	for i++; i < len(d); i++ {
		switch d[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(d)
}

// skipValue returns the index after the (valid) JSON value at d[i].
func skipValue(d []byte, i int) int {
	switch d[i] {
	case '"':
		return skipString(d, i)
	case '{', '[':
		depth := 0
		for ; i < len(d); i++ {
			switch d[i] {
			case '"':
				i = skipString(d, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return len(d)
	}
	for i < len(d) {
		switch d[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// fastNumbers parses an output that is one JSON number or a flat array of
// JSON numbers, appending the values to vals; w is -1 for a number, else
// the array's length. ok is false for anything else (strings, nested
// arrays, null, numbers out of float64's range, bad grammar): the caller
// takes encoding/json's path, which decides and words the error.
func fastNumbers(raw []byte, vals []float64) (_ []float64, w int, ok bool) {
	if len(raw) == 0 {
		return vals, 0, false
	}
	if raw[0] != '[' {
		if numberEnd(raw, 0) != len(raw) {
			return vals, 0, false
		}
		v, err := strconv.ParseFloat(string(raw), 64)
		if err != nil {
			return vals, 0, false
		}
		return append(vals, v), -1, true
	}
	start := len(vals)
	i := skipWS(raw, 1)
	if i < len(raw) && raw[i] == ']' {
		return vals, 0, skipWS(raw, i+1) == len(raw)
	}
	for {
		e := numberEnd(raw, i)
		if e < 0 {
			return vals[:start], 0, false
		}
		v, err := strconv.ParseFloat(string(raw[i:e]), 64)
		if err != nil {
			return vals[:start], 0, false
		}
		vals = append(vals, v)
		i = skipWS(raw, e)
		if i >= len(raw) {
			return vals[:start], 0, false
		}
		if raw[i] == ']' {
			if skipWS(raw, i+1) != len(raw) {
				return vals[:start], 0, false
			}
			return vals, len(vals) - start, true
		}
		if raw[i] != ',' {
			return vals[:start], 0, false
		}
		i = skipWS(raw, i+1)
	}
}

// numberEnd returns the index after the JSON number (RFC 8259 grammar)
// starting at b[i], or -1 when none starts there.
func numberEnd(b []byte, i int) int {
	digits := func(i int) int {
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b):
		return -1
	case b[i] == '0':
		i++
	case b[i] >= '1' && b[i] <= '9':
		i = digits(i + 1)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		j := digits(i + 1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}
