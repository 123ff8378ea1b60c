package tensor

import (
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func TestRoundTripAndValidate(t *testing.T) {
	x := FromFloat32("x", []int64{2, 3}, []float32{1, 2, 3, 4, 5, 6})
	v, err := Float32(x)
	if err != nil || len(v) != 6 || v[5] != 6 {
		t.Fatal(v, err)
	}
	i := FromInt64("l", []int64{2}, []int64{-1, 7})
	iv, err := Int64s(i)
	if err != nil || iv[0] != -1 || iv[1] != 7 {
		t.Fatal(iv, err)
	}
	if _, err := Float32(i); err == nil || !strings.Contains(err.Error(), `"l"`) {
		t.Fatalf("dtype mismatch not reported: %v", err)
	}
}

func TestValidateRejects(t *testing.T) {
	bytesElem := func(s string) []byte {
		b := binary.LittleEndian.AppendUint32(nil, uint32(len(s)))
		return append(b, s...)
	}
	cases := []struct {
		t    *hamsv1.Tensor
		want string
	}{
		{&hamsv1.Tensor{Name: "a", Datatype: "FP33", Shape: []int64{1}}, "unsupported datatype"},
		{&hamsv1.Tensor{Name: "b", Datatype: FP32, Shape: []int64{2}, Data: make([]byte, 4)}, "wants 8 bytes"},
		{&hamsv1.Tensor{Name: "c", Datatype: FP32, Shape: []int64{-1}}, "dimension 0 is -1"},
		{&hamsv1.Tensor{Name: "d", Datatype: Bytes, Shape: []int64{2}, Data: bytesElem("hi")}, "wants 2 BYTES elements"},
		{&hamsv1.Tensor{Name: "e", Datatype: Bytes, Shape: []int64{1}, Data: []byte{9, 0, 0, 0, 1}}, "overruns"},
		{&hamsv1.Tensor{Name: "f", Datatype: FP32, Shape: []int64{1 << 62, 1 << 62}}, "overflows"},
		// (1<<62+1)*4 wraps to 4 in int64: the 4 bytes must not pass for it
		{&hamsv1.Tensor{Name: "g", Datatype: FP32, Shape: []int64{1<<62 + 1}, Data: make([]byte, 4)}, "byte size overflows"},
		{&hamsv1.Tensor{Name: "h", Datatype: FP64, Shape: []int64{1 << 61}}, "byte size overflows"},
		{nil, "nil tensor"},
	}
	for _, c := range cases {
		err := Validate(c.t)
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%v) = %v, want %q", c.t, err, c.want)
		}
	}
	ok := &hamsv1.Tensor{Name: "s", Datatype: Bytes, Shape: []int64{2}, Data: append(bytesElem("hi"), bytesElem("")...)}
	if err := Validate(ok); err != nil {
		t.Fatal(err)
	}
}

func TestConcatSplit(t *testing.T) {
	a := FromFloat32("x", []int64{1, 2}, []float32{1, 2})
	b := FromFloat32("x", []int64{2, 2}, []float32{3, 4, 5, 6})
	c, err := Concat([]*hamsv1.Tensor{a, b})
	if err != nil || c.Shape[0] != 3 || c.Shape[1] != 2 {
		t.Fatal(c, err)
	}
	parts, err := Split(c, []uint32{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	if Digest(parts[0]) != Digest(a) || Digest(parts[1]) != Digest(b) {
		t.Fatal("split does not invert concat")
	}
	if _, err := Split(c, []uint32{1, 1}); err == nil {
		t.Fatal("split with wrong row count accepted")
	}
	bad := FromFloat32("x", []int64{1, 3}, []float32{1, 2, 3})
	if _, err := Concat([]*hamsv1.Tensor{a, bad}); err == nil || !strings.Contains(err.Error(), "batching shape") {
		t.Fatalf("concat of mismatched shapes: %v", err)
	}
	if _, err := Concat([]*hamsv1.Tensor{a, FromInt64("x", []int64{1, 2}, []int64{1, 2})}); err == nil {
		t.Fatal("concat of mismatched dtypes accepted")
	}
}

func TestSplitBySpecs(t *testing.T) {
	specs := []*hamsv1.TensorSpec{{Name: "a", Datatype: "FP32", Shape: []int64{2}}}
	if _, err := SplitBySpecs(specs, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		specs []*hamsv1.TensorSpec
		n     int
	}{
		"short":    {specs, 4},
		"long":     {specs, 12},
		"bytes":    {[]*hamsv1.TensorSpec{{Name: "s", Datatype: "BYTES", Shape: []int64{1}}}, 4},
		"negative": {[]*hamsv1.TensorSpec{{Name: "s", Datatype: "FP32", Shape: []int64{-1}}}, 4},
		// 1<<61 FP64 values are 1<<64 bytes: an int product wraps to 0
		// and would match an empty state.
		"wraps to zero": {[]*hamsv1.TensorSpec{{Name: "w", Datatype: "FP64", Shape: []int64{1 << 61}}}, 0},
		"wraps after a tensor": {[]*hamsv1.TensorSpec{{Name: "a", Datatype: "FP32", Shape: []int64{2}},
			{Name: "w", Datatype: "FP64", Shape: []int64{1 << 61}}}, 8},
	} {
		if _, err := SplitBySpecs(c.specs, make([]byte, c.n)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A state whose byte size does not fit 64 bits is refused by name, not
// wrapped to a small size.
func TestSpecsBytesOverflow(t *testing.T) {
	ok := []*hamsv1.TensorSpec{{Name: "a", Datatype: "FP32", Shape: []int64{2, 3}}, {Name: "b", Datatype: "INT64", Shape: []int64{1}}}
	if n, err := SpecsBytes(ok); err != nil || n != 32 {
		t.Fatalf("SpecsBytes = %d, %v; want 32", n, err)
	}
	for name, specs := range map[string][]*hamsv1.TensorSpec{
		"one tensor": {{Name: "w", Datatype: "FP64", Shape: []int64{1 << 61}}},
		"sum of two": {{Name: "a", Datatype: "FP32", Shape: []int64{1 << 61}}, {Name: "w", Datatype: "FP32", Shape: []int64{1 << 61}}},
		"elems wrap": {{Name: "w", Datatype: "FP32", Shape: []int64{1 << 32, 1 << 32}}},
	} {
		_, err := SpecsBytes(specs)
		if err == nil || !strings.Contains(err.Error(), `"w"`) {
			t.Errorf("%s: err %v, want one naming tensor w", name, err)
		}
	}
}

// Split refuses a row whose byte size wraps int (shape [2, 1<<61] of FP64
// with no data once matched 2*0 bytes).
func TestSplitOverflow(t *testing.T) {
	for name, x := range map[string]*hamsv1.Tensor{
		"row wraps":   {Name: "x", Datatype: FP64, Shape: []int64{2, 1 << 61}},
		"total wraps": {Name: "x", Datatype: FP32, Shape: []int64{1 << 32, 1 << 31}},
	} {
		_, err := Split(x, []uint32{1, uint32(x.Shape[0] - 1)})
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "overflows") {
			t.Errorf("%s: err %v, want ErrInvalid naming the overflow", name, err)
		}
	}
}

func TestFirstNonFinite(t *testing.T) {
	f32 := func(v ...float32) *hamsv1.Tensor { return FromFloat32("x", []int64{int64(len(v))}, v) }
	f64 := func(v ...float64) *hamsv1.Tensor {
		b := make([]byte, 8*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(x))
		}
		return &hamsv1.Tensor{Name: "x", Datatype: FP64, Shape: []int64{int64(len(v))}, Data: b}
	}
	half := func(dt string, v ...uint16) *hamsv1.Tensor {
		b := make([]byte, 2*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint16(b[2*i:], x)
		}
		return &hamsv1.Tensor{Name: "x", Datatype: dt, Shape: []int64{int64(len(v))}, Data: b}
	}
	nan32 := float32(math.NaN())
	for _, c := range []struct {
		name  string
		t     *hamsv1.Tensor
		index int
		what  string
		found bool
	}{
		{"finite FP32", f32(0, -1, math.MaxFloat32, math.SmallestNonzeroFloat32), 0, "", false},
		{"NaN FP32", f32(1, 2, nan32), 2, "NaN", true},
		{"+Inf FP32", f32(float32(math.Inf(1)), nan32), 0, "+Inf", true},
		{"-Inf FP32", f32(1, float32(math.Inf(-1))), 1, "-Inf", true},
		{"finite FP64", f64(1, math.MaxFloat64), 0, "", false},
		{"NaN FP64", f64(1, math.NaN()), 1, "NaN", true},
		{"-Inf FP64", f64(math.Inf(-1)), 0, "-Inf", true},
		{"FP16 finite", half(FP16, 0x3c00, 0x7bff), 0, "", false},
		{"FP16 NaN", half(FP16, 0x3c00, 0x7e00), 1, "NaN", true},
		{"FP16 -Inf", half(FP16, 0xfc00), 0, "-Inf", true},
		{"BF16 +Inf", half("BF16", 0x3f80, 0x7f80), 1, "+Inf", true},
		{"BF16 finite", half("BF16", 0x7f7f), 0, "", false},
		{"INT32 bits of a NaN", &hamsv1.Tensor{Name: "x", Datatype: Int32, Shape: []int64{1}, Data: []byte{0, 0, 0xc0, 0x7f}}, 0, "", false},
	} {
		i, w, ok := FirstNonFinite(c.t)
		if ok != c.found || (ok && (i != c.index || w != c.what)) {
			t.Errorf("%s: got %d %q %v, want %d %q %v", c.name, i, w, ok, c.index, c.what, c.found)
		}
	}
}

func TestBoolBytes(t *testing.T) {
	ok := &hamsv1.Tensor{Name: "b", Datatype: Bool, Shape: []int64{2}, Data: []byte{0, 1}}
	if err := Validate(ok); err != nil {
		t.Fatal(err)
	}
	bad := &hamsv1.Tensor{Name: "b", Datatype: Bool, Shape: []int64{2}, Data: []byte{1, '0'}}
	if err := Validate(bad); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "BOOL element 1 is byte 48") {
		t.Fatalf("BOOL byte 48: %v", err)
	}
}
