package tensor

import (
	"strings"
	"testing"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func TestSelectInputs(t *testing.T) {
	x := FromFloat32("x", []int64{2, 1}, []float32{1, 2})
	y := FromFloat32("y", []int64{2, 2}, []float32{1, 2, 3, 4})
	x2 := FromFloat32("x", []int64{2, 1}, []float32{5, 6})
	parts := []List{{x, y}, {x2}}
	specs := func(names ...string) []*hamsv1.TensorSpec {
		var s []*hamsv1.TensorSpec
		for _, n := range names {
			s = append(s, &hamsv1.TensorSpec{Name: n})
		}
		return s
	}
	all, rows, err := SelectInputs(specs(AnyInput), parts)
	if err != nil || rows != 2 || len(all) != 3 || all[2] != x2 {
		t.Fatalf("* selected %v rows %d: %v", all, rows, err)
	}
	if got, _, err := SelectInputs(nil, parts); err != nil || len(got) != 3 {
		t.Fatalf("no declared inputs selected %v: %v", got, err)
	}
	got, _, err := SelectInputs(specs("y", "x"), parts)
	if err != nil || len(got) != 2 || got[0] != y || got[1] != x {
		t.Fatalf("declared selected %v: %v", got, err)
	}
	one, _, err := SelectInputs(nil, parts[:1])
	if err != nil || &one[0] != &parts[0][0] {
		t.Fatalf("one part is passed through without a copy: %v", err)
	}
	for _, c := range []struct {
		specs []*hamsv1.TensorSpec
		parts []List
		want  string
	}{
		{specs("z"), parts, `missing input "z"`},
		{[]*hamsv1.TensorSpec{{Name: "x", Datatype: "INT64"}}, parts, "datatype FP32, want INT64"},
		{nil, []List{{}}, "no input tensors"},
		{nil, []List{{x, FromFloat32("w", []int64{3}, []float32{1, 2, 3})}}, "has 3 rows, other inputs 2"},
		{nil, []List{{FromFloat32("s", nil, []float32{1})}}, "scalar"},
		{nil, []List{{&hamsv1.Tensor{Name: "bad", Datatype: "FP32", Shape: []int64{2}, Data: []byte{1}}}}, "tensor: invalid"},
	} {
		if _, _, err := SelectInputs(c.specs, c.parts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("SelectInputs(%v): %v, want an error with %q", c.specs, err, c.want)
		}
	}
}
