package clipper

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// randFloat32Bits draws float32 bit patterns from every class: zeros of
// both signs, subnormals, the extremes, values near 1, pixels k/255,
// arbitrary bits (NaN and Inf only when special).
func randFloat32Bits(r *rand.Rand, special bool) uint32 {
	switch r.IntN(9) {
	case 0:
		return 0
	case 1:
		return 1 << 31 // -0
	case 2:
		return r.Uint32N(1<<23) | uint32(r.IntN(2))<<31 // subnormal
	case 3:
		return math.Float32bits(math.MaxFloat32) | uint32(r.IntN(2))<<31
	case 4:
		return math.Float32bits(float32(r.IntN(256)) / 255)
	case 5:
		return math.Float32bits(float32(r.NormFloat64()))
	case 6:
		if special {
			return []uint32{0x7fc00000, 0x7f800001, 0xffc00000, 0x7f800000, 0xff800000}[r.IntN(5)]
		}
	}
	for {
		b := r.Uint32()
		if special || b&0x7f800000 != 0x7f800000 {
			return b
		}
	}
}

func randFloat64Bits(r *rand.Rand, special bool) uint64 {
	switch r.IntN(7) {
	case 0:
		return 0
	case 1:
		return 1 << 63
	case 2:
		return r.Uint64N(1<<52) | uint64(r.IntN(2))<<63
	case 3:
		return math.Float64bits(math.MaxFloat64) | uint64(r.IntN(2))<<63
	case 4:
		if special {
			return []uint64{0x7ff8000000000000, 0x7ff0000000000000, 0xfff0000000000000}[r.IntN(3)]
		}
	}
	for {
		b := r.Uint64()
		if special || b&0x7ff0000000000000 != 0x7ff0000000000000 {
			return b
		}
	}
}

// randTensor is a random input of datatype dt: [n] or [n, d] (d may be 0).
func randTensor(r *rand.Rand, dt string, special bool) *hamsv1.Tensor {
	n := 1 + r.IntN(4)
	if r.IntN(2) == 0 {
		n = 1
	}
	shape := []int64{int64(n)}
	per := 1
	if dt == tensor.Bytes {
		elems := make([][]byte, n)
		for i := range elems {
			e := make([]byte, r.IntN(12))
			for j := range e {
				e[j] = []byte("ab<>&\"\\\n\x00\xff\xe2\x80\xa8é")[r.IntN(15)]
			}
			elems[i] = e
		}
		if r.IntN(8) == 0 {
			shape = append(shape, 1)
		}
		return &hamsv1.Tensor{Name: "input", Datatype: dt, Shape: shape, Data: wire.JoinBytes(elems)}
	}
	if r.IntN(4) != 0 {
		per = r.IntN(40)
		shape = append(shape, int64(per))
	}
	es := tensor.ElemSize(dt)
	data := make([]byte, n*per*es)
	for off := 0; off < len(data); off += es {
		switch dt {
		case tensor.FP32:
			binary.LittleEndian.PutUint32(data[off:], randFloat32Bits(r, special && r.IntN(20) == 0))
		case tensor.FP64:
			binary.LittleEndian.PutUint64(data[off:], randFloat64Bits(r, special && r.IntN(20) == 0))
		case tensor.Bool:
			data[off] = byte(r.IntN(2)) // a BOOL byte is 0 or 1 (tensor.Validate)
		default:
			for k := range es {
				data[off+k] = byte(r.Uint32())
			}
		}
	}
	return &hamsv1.Tensor{Name: "input", Datatype: dt, Shape: shape, Data: data}
}

func fromFloat64(shape []int64, v []float64) *hamsv1.Tensor {
	data := make([]byte, 0, 8*len(v))
	for _, x := range v {
		data = binary.LittleEndian.AppendUint64(data, math.Float64bits(x))
	}
	return &hamsv1.Tensor{Name: "input", Datatype: tensor.FP64, Shape: shape, Data: data}
}

var allInputTypes = []string{tensor.FP32, tensor.FP64, tensor.Int8, tensor.Int16, tensor.Int32, tensor.Int64,
	tensor.Uint8, tensor.Bool, tensor.Bytes, tensor.FP16, "UINT16", "UINT32", "UINT64", "BF16"}

// TestEncodeBodyMatchesReference: the body is the old code's byte for
// byte, errors word for word, on random tensors of every datatype.
func TestEncodeBodyMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for it := range 20000 {
		dt := allInputTypes[it%len(allInputTypes)]
		in := randTensor(r, dt, it%3 == 0)
		if err := tensor.Validate(in); err != nil {
			t.Fatal(err)
		}
		body, n, err := encodeBody(in)
		rows, rerr := refJSONRows(in)
		if (err == nil) != (rerr == nil) || (err != nil && err.Error() != rerr.Error()) {
			t.Fatalf("%s %v: error %v, reference %v", dt, in.Shape, err, rerr)
		}
		if err != nil {
			continue
		}
		if want := refBody(rows); !bytes.Equal(body, want) || n != len(rows) {
			t.Fatalf("%s %v: body\n%s\nreference (%d rows)\n%s", dt, in.Shape, body, len(rows), want)
		}
		if !json.Valid(body) {
			t.Fatalf("%s: invalid JSON %s", dt, body)
		}
	}
}

// TestEncodeBodyRoundTrips: every float decodes (encoding/json) to its
// own bits, at the extremes too.
func TestEncodeBodyRoundTrips(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	vals := []float32{0, float32(math.Copysign(0, -1)), math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32,
		1e-45, 1.17549435e-38, 3.4028235e38, 1e-5, 1e21, 123456789, 0.1, 1.0 / 3}
	for range 5000 {
		vals = append(vals, math.Float32frombits(randFloat32Bits(r, false)))
	}
	body, n, err := encodeBody(tensor.FromFloat32("input", []int64{1, int64(len(vals))}, vals))
	if err != nil || n != 1 {
		t.Fatal(n, err)
	}
	var got struct{ Input []float32 }
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	for i, v := range vals {
		if math.Float32bits(got.Input[i]) != math.Float32bits(v) {
			t.Fatalf("%d: %v (%#x) came back as %v (%#x)", i, v, math.Float32bits(v), got.Input[i], math.Float32bits(got.Input[i]))
		}
	}
	f64 := []float64{0, math.Copysign(0, -1), math.MaxFloat64, -math.MaxFloat64, math.SmallestNonzeroFloat64, 1e-310, 1e308, 0.1}
	for range 5000 {
		f64 = append(f64, math.Float64frombits(randFloat64Bits(r, false)))
	}
	body, _, err = encodeBody(fromFloat64([]int64{int64(len(f64))}, f64))
	if err != nil {
		t.Fatal(err)
	}
	var got64 struct {
		InputBatch [][]float64 `json:"input_batch"`
	}
	if err := json.Unmarshal(body, &got64); err != nil {
		t.Fatal(err)
	}
	for i, v := range f64 {
		if math.Float64bits(got64.InputBatch[i][0]) != math.Float64bits(v) {
			t.Fatalf("%d: %v came back as %v", i, v, got64.InputBatch[i][0])
		}
	}
}

// TestEncodeBodyNaNInf: NaN and ±Inf cannot travel in JSON; the error
// names the row and the element, as before.
func TestEncodeBodyNaNInf(t *testing.T) {
	for _, c := range []struct {
		v    float32
		want string
	}{{float32(math.NaN()), "row 1 element 2: NaN cannot travel in JSON"},
		{float32(math.Inf(1)), "row 1 element 2: +Inf cannot travel in JSON"},
		{float32(math.Inf(-1)), "row 1 element 2: -Inf cannot travel in JSON"}} {
		vals := []float32{1, 2, 3, 4, 5, c.v}
		_, _, err := encodeBody(tensor.FromFloat32("input", []int64{2, 3}, vals))
		if err == nil || err.Error() != c.want {
			t.Fatalf("%v: %v, want %q", c.v, err, c.want)
		}
		_, _, err = encodeBody(fromFloat64([]int64{2, 3}, []float64{1, 2, 3, 4, 5, float64(c.v)}))
		if err == nil || err.Error() != c.want {
			t.Fatalf("FP64 %v: %v, want %q", c.v, err, c.want)
		}
	}
	_, _, err := encodeBody(&hamsv1.Tensor{Name: "input", Datatype: tensor.FP16, Shape: []int64{1, 1}, Data: []byte{0, 0}})
	if err == nil || err.Error() != "row 0 element 0: datatype FP16 cannot be sent to Clipper (numbers or BYTES only)" {
		t.Fatal(err)
	}
}

// answerCorpus: answers as Clipper and the stub write them, and
// everything a broken or unusual server might: all of them must decode as
// encoding/json decodes them.
var answerCorpus = []string{
	`{"query_id":1,"output":[0.1,0.2,-3e-7,1E+5,0,-0],"default":false}`,
	"{\"query_id\":29,\"output\":0.0,\"default\":false}\n",
	` { "query_id" : 7 , "output" : [ 1 , 2 ] , "default" : false } `,
	`{"query_id":3,"output":-1,"default":true,"default_explanation":"Failed to retrieve a prediction response within the specified latency SLO"}`,
	`{"query_id":3,"output":-1,"default":true,"default_explanation":"esc\"aped \u00e9 \n"}`,
	`{"query_id":3,"output":"[1,2]","default":false}`,
	`{"query_id":3,"output":"label","default":false}`,
	`{"query_id":3,"output":{"a":[1,{"b":"]}"}]},"default":false}`,
	`{"query_id":null,"output":[1]}`,
	`{"query_id":1.5,"output":[1]}`,
	`{"query_id":1e3,"output":[1]}`,
	`{"query_id":-9223372036854775808,"output":[1]}`,
	`{"query_id":9223372036854775807,"output":[1]}`,
	`{"query_id":9223372036854775808,"output":[1]}`,
	`{"query_id":-9223372036854775809,"output":[1]}`,
	`{"query_id":"5","output":[1]}`,
	`{"output":[1],"output":[2]}`,
	`{"output":[1],"default":true,"default":false}`,
	`{"output":[1],"default":null}`,
	`{"output":[1],"default":"yes"}`,
	`{"output":[1],"default":1}`,
	`{"output":null}`,
	`{"Output":[1]}`,
	`{"OUTPUT":[1],"Default":true}`,
	`{"out\u0070ut":[1]}`,
	`{"ſuery_id":2,"output":[1]}`,
	`{"extra":{"nested":[1,2,{"x":"}"}]},"output":[1],"more":"\"\\"}`,
	`{"output":[1],"error":"Query processing error","cause":"something broke"}`,
	`{"error":null,"cause":"c","output":[1]}`,
	`{"error":5,"output":[1]}`,
	"{\"error\":\"bad \xff utf8\",\"output\":[1]}",
	"{\"cause\":\"ok é ☃\",\"output\":[1]}",
	`{"batch_predictions":[{"query_id":1,"output":1,"default":false},"{\"query_id\":2,\"output\":2,\"default\":false}"]}`,
	`{}`,
	`null`,
	`[]`,
	`5`,
	`"x"`,
	``,
	`   `,
	`{"output":[1,2`,
	`{"output":[1,2]}}`,
	`{"output":[1,2]} x`,
	`{"output":[1,,2]}`,
	`{"output":01}`,
	`{"output":[1e999]}`,
	`{"output":NaN}`,
	`not json`,
	"{\"output\":\"a\tb\"}",
}

func sameDecoding(t *testing.T, data []byte) {
	t.Helper()
	var got, want batchAnswer
	err := decodeAnswer(data, &got)
	werr := json.Unmarshal(data, &want)
	if (err == nil) != (werr == nil) || (err != nil && err.Error() != werr.Error()) {
		t.Fatalf("%q: error %v, encoding/json %v", data, err, werr)
	}
	if err == nil && !reflect.DeepEqual(normal(got), normal(want)) {
		t.Fatalf("%q:\n got %+v\nwant %+v", data, normal(got), normal(want))
	}
}

// normal makes two decodings comparable (raw messages as strings, the id
// by value).
func normal(ba batchAnswer) map[string]any {
	m := map[string]any{"output": ba.Output == nil, "o": string(ba.Output), "default": ba.Default, "expl": ba.DefaultExplanation,
		"error": ba.Error, "cause": ba.Cause, "batch": ba.BatchPredictions == nil, "id": ba.QueryID == nil}
	if ba.QueryID != nil {
		m["idv"] = *ba.QueryID
	}
	var bp []string
	for _, b := range ba.BatchPredictions {
		bp = append(bp, string(b))
	}
	m["bp"] = bp
	return m
}

func TestDecodeAnswerMatchesEncodingJSON(t *testing.T) {
	for _, a := range answerCorpus {
		sameDecoding(t, []byte(a))
	}
	// The stub's and Clipper's everyday answers take the fast path.
	for _, a := range answerCorpus[:4] {
		var ba batchAnswer
		if !fastAnswer([]byte(a), &ba) {
			t.Fatalf("%s: not on the fast path", a)
		}
	}
	r := rand.New(rand.NewPCG(5, 6))
	fast := 0
	for range 5000 {
		a := randAnswer(r)
		sameDecoding(t, a)
		var ba batchAnswer
		if fastAnswer(a, &ba) {
			fast++
		}
	}
	if fast < 2500 {
		t.Fatalf("only %d of 5000 random answers took the fast path", fast)
	}
}

// randAnswer writes a random answer: fields in random order, numbers in
// every format, sometimes spaces, unknown keys, a truncation.
func randAnswer(r *rand.Rand) []byte {
	var fields []string
	if r.IntN(4) != 0 {
		fields = append(fields, fmt.Sprintf(`"query_id":%d`, r.Int64()-r.Int64()))
	}
	if r.IntN(8) != 0 {
		fields = append(fields, `"output":`+randNumbers(r))
	}
	if r.IntN(2) == 0 {
		fields = append(fields, fmt.Sprintf(`"default":%v`, r.IntN(4) == 0))
	}
	if r.IntN(4) == 0 {
		fields = append(fields, `"default_explanation":"no model \u00e9"`)
	}
	if r.IntN(8) == 0 {
		fields = append(fields, `"x-extra":[1,"]",{"y":null}]`)
	}
	r.Shuffle(len(fields), func(i, j int) { fields[i], fields[j] = fields[j], fields[i] })
	sep := ","
	if r.IntN(3) == 0 {
		sep = " ,\n "
	}
	s := "{" + strings.Join(fields, sep) + "}"
	if r.IntN(10) == 0 {
		s = s[:r.IntN(len(s))]
	}
	return []byte(s)
}

// randNumbers is a number or an array of numbers in random formats.
func randNumbers(r *rand.Rand) string {
	num := func() string {
		v := math.Float64frombits(randFloat64Bits(r, false))
		if r.IntN(2) == 0 {
			v = float64(math.Float32frombits(randFloat32Bits(r, false)))
		}
		switch r.IntN(6) {
		case 0:
			return strconv.FormatFloat(v, 'e', -1, 64)
		case 1:
			return strconv.FormatFloat(v, 'E', 3, 64)
		case 2:
			return strconv.FormatInt(r.Int64N(2000)-1000, 10)
		case 3:
			return []string{"1e400", "-1e400", "1e-400", "0.0", "-0", "1E+2", "2.5e-3"}[r.IntN(7)]
		}
		return strconv.FormatFloat(v, 'g', -1, 32)
	}
	if r.IntN(4) == 0 {
		return num()
	}
	n := r.IntN(12)
	parts := make([]string, n)
	for i := range parts {
		parts[i] = num()
	}
	sep := ","
	if r.IntN(4) == 0 {
		sep = " , "
	}
	return "[" + strings.Join(parts, sep) + "]"
}

// numbersCorpus: outputs the fast path must read exactly as
// encoding/json, or leave to it.
var numbersCorpus = []string{
	`[0.1,0.2,-3e-7,1E+5,0,-0]`, `5`, `-0`, `0.0`, `1e-400`, `[1e-400]`, `4.9e-324`, `[ 1 , 2 ]`, `[]`, `[ ]`, `[1] `,
	`1e400`, `[1e400]`, `-1e400`, `-`, `01`, `[01]`, `1.`, `.5`, `+1`, `[1,]`, `[,1]`, `[1 2]`, `[[1]]`, `"5"`, `"[1,2]"`,
	`null`, ` [1]`, `true`, `0x10`, `Infinity`, `NaN`, `[1,"a"]`, `[1`, `1e`, `1e+`, `-a`, `1.5e3x`, `[1]x`, `"x"`, ``,
	`{"a":1}`, `[null]`, `[1.7976931348623157e308]`, `[1.7976931348623159e308]`,
}

func sameNumbers(t *testing.T, raw []byte) {
	t.Helper()
	prefix := []float64{42}
	got, w, ok := fastNumbers(raw, prefix)
	row, sw, sok := slowNumbers(raw)
	if !ok {
		if len(got) != 1 || got[0] != 42 {
			t.Fatalf("%q: a declined parse changed the values: %v", raw, got)
		}
		return
	}
	if !sok || w != sw || len(got) != 1+len(row) {
		t.Fatalf("%q: fast %v (w %d), encoding/json %v (w %d, ok %v)", raw, got, w, row, sw, sok)
	}
	for i, v := range row {
		if math.Float64bits(got[1+i]) != math.Float64bits(v) {
			t.Fatalf("%q: value %d: fast %v, encoding/json %v", raw, i, got[1+i], v)
		}
	}
}

func TestFastNumbersMatchesEncodingJSON(t *testing.T) {
	for _, c := range numbersCorpus {
		sameNumbers(t, []byte(c))
	}
	for _, c := range []string{`[0.1,0.2,-3e-7,1E+5,0,-0]`, `5`, `[ 1 , 2 ]`, `[]`} {
		if _, _, ok := fastNumbers([]byte(c), nil); !ok {
			t.Fatalf("%s: not on the fast path", c)
		}
	}
	r := rand.New(rand.NewPCG(7, 8))
	fast := 0
	for range 20000 {
		raw := []byte(randNumbers(r))
		sameNumbers(t, raw)
		if _, _, ok := fastNumbers(raw, nil); ok {
			fast++
		}
	}
	if fast < 10000 {
		t.Fatalf("only %d of 20000 random outputs took the fast path", fast)
	}
}

func FuzzFastNumbers(f *testing.F) {
	for _, c := range numbersCorpus {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, raw []byte) { sameNumbers(t, raw) })
}

func FuzzDecodeAnswer(f *testing.F) {
	for _, c := range answerCorpus {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, data []byte) { sameDecoding(t, data) })
}

// TestMalformedAnswers: what a broken query frontend answers becomes an
// Internal error that quotes it.
func TestMalformedAnswers(t *testing.T) {
	for answer, want := range map[string]string{
		`not json`:                      "answer is not JSON",
		`{"output":[1,2`:                "answer is not JSON",
		`{"output":[1,2]} trailing`:     "answer is not JSON",
		`{"query_id":1.5,"output":[1]}`: "answer is not JSON",
		`{"query_id":1}`:                "has no output",
		`{"output":"label"}`:            "neither a number nor an array",
		`{"output":[1,"a"]}`:            "neither a number nor an array",
		`{"output":[1e999]}`:            "neither a number nor an array",
		`{"output":[[1,2]]}`:            "neither a number nor an array",
		`{"output":null}`:               "neither a number nor an array",
		`{"error":"Query processing error","cause":"broke"}`: "Query processing error: broke",
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(answer)) }))
		b := newB(t, srv.URL, func(c *Config) { c.App = "sum" })
		_, err := b.Infer(ctxT(t), batch([]uint32{1}, 1, 2))
		wantCode(t, answer, err, codes.Internal, want)
		srv.Close()
	}
	// A number inside a string is read, as before.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"query_id":1,"output":"[1.5, 2]","default":false}`))
	}))
	defer srv.Close()
	resp, err := newB(t, srv.URL, nil).Infer(ctxT(t), batch([]uint32{1}, 1, 2))
	if err != nil {
		t.Fatal(err)
	}
	if got := f32(t, resp.Outputs[0]); len(got) != 2 || got[0] != 1.5 || got[1] != 2 {
		t.Fatalf("string output %v", got)
	}
}

// BenchmarkEncodeBody: one Fashion-MNIST row as the adapter encodes it
// now, as it did (refJSONRows + refBody), and as encoding/json does it.
func BenchmarkEncodeBody(b *testing.B) {
	in := tensor.FromFloat32("input", []int64{1, 784}, row784())
	b.Run("adapter", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := encodeBody(in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("before", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rows, err := refJSONRows(in)
			if err != nil {
				b.Fatal(err)
			}
			_ = refBody(rows)
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		row := row784()
		for b.Loop() {
			if _, err := json.Marshal(map[string][]float32{"input": row}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkDecodeAnswer: the stub's answer of the classifier (10 scores)
// to an output tensor, now and with encoding/json only.
func BenchmarkDecodeAnswer(b *testing.B) {
	data := []byte(`{"query_id":12345,"output":[-3.1415927,0.0012345678,12.5,-0.5,1.9073486e-06,7.25,-11.875,0.33333334,2.7182817,-1],"default":false}` + "\n")
	be := &Backend{cfg: Config{Output: "scores", OutputDatatype: tensor.FP32}}
	b.Run("adapter", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var ba batchAnswer
			if err := decodeAnswer(data, &ba); err != nil {
				b.Fatal(err)
			}
			if _, err := be.outputOf([]answer{ba.answer}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var ba batchAnswer
			if err := json.Unmarshal(data, &ba); err != nil {
				b.Fatal(err)
			}
			row, _, ok := slowNumbers(ba.Output)
			if !ok || len(row) != 10 {
				b.Fatal(row)
			}
		}
	})
}
