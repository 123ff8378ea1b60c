package checker

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

const yamlDep = `
name: t
mode: bare
models:
  - {name: a, kind: prep}
  - {name: b, kind: classifier}
  - {name: c, kind: classifier}
services:
  - name: s
    edges: [[frontend, a], [a, b], [a, c], [b, frontend], [c, frontend]]
    inputs: [{name: images, datatype: FP32, shape: [-1, 784]}]
`

func newChecker(t *testing.T) *Checker {
	t.Helper()
	d, err := config.Parse([]byte(yamlDep))
	if err != nil {
		t.Fatal(err)
	}
	spec := []*hamsv1.TensorSpec{{Name: "scores", Datatype: "FP32", Shape: []int64{-1, 10}}}
	descs := map[string]*hamsv1.ModelDescription{"b": {Outputs: spec}, "c": {Outputs: spec}}
	s, err := ServiceOf(d, "s", descs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ServiceOf(d, "nope", descs); err == nil {
		t.Fatal("unknown service accepted")
	}
	return New(s)
}

func request(rows int64) *hamsv1.PredictRequest {
	return &hamsv1.PredictRequest{Service: "s", Inputs: []*hamsv1.Tensor{tensor.FromFloat32("images", []int64{rows, 784}, make([]float32, rows*784))}}
}

// good builds a correct reply whose models executed it at seq n.
func good(n uint64, rows int64) *hamsv1.PredictResponse {
	out := func(m string) *hamsv1.ModelOutput {
		return &hamsv1.ModelOutput{Model: m, Tensors: []*hamsv1.Tensor{tensor.FromFloat32("scores", []int64{rows, 10}, make([]float32, rows*10))}}
	}
	return &hamsv1.PredictResponse{
		Service: "s",
		Outputs: []*hamsv1.ModelOutput{out("b"), out("c")},
		Lineage: []*hamsv1.LineageEntry{
			{PredModel: "frontend", PredSeq: n, Model: "a", Seq: n},
			{PredModel: "a", PredSeq: n, Model: "b", Seq: n},
			{PredModel: "a", PredSeq: n, Model: "c", Seq: n},
		},
	}
}

func TestGoodRepliesPass(t *testing.T) {
	c := newChecker(t)
	for i, key := range []string{"r1", "r2", "r3"} {
		c.Sent(key, request(2))
		if err := c.Check(key, good(uint64(i+1), 2)); err != nil {
			t.Fatal(err)
		}
	}
	s := c.Finish()
	if s.Sent != 3 || s.Replies != 3 || s.Correct != 3 || s.Violations != 0 || s.Errors != 0 {
		t.Fatalf("summary %+v", s)
	}
}

func TestEachViolationIsCaught(t *testing.T) {
	cases := []struct {
		name string
		kind string
		mut  func(r *hamsv1.PredictResponse)
	}{
		{"missing sink output", KindOutputs, func(r *hamsv1.PredictResponse) { r.Outputs = r.Outputs[:1] }},
		{"extra output", KindOutputs, func(r *hamsv1.PredictResponse) {
			r.Outputs = append(r.Outputs, &hamsv1.ModelOutput{Model: "a"})
		}},
		{"wrong tensor name", KindOutputs, func(r *hamsv1.PredictResponse) { r.Outputs[0].Tensors[0].Name = "logits" }},
		{"wrong datatype", KindOutputs, func(r *hamsv1.PredictResponse) { r.Outputs[0].Tensors[0].Datatype = "FP64" }},
		{"wrong trailing dim", KindOutputs, func(r *hamsv1.PredictResponse) {
			r.Outputs[1].Tensors[0] = tensor.FromFloat32("scores", []int64{2, 9}, make([]float32, 18))
		}},
		{"wrong rows", KindOutputs, func(r *hamsv1.PredictResponse) {
			r.Outputs[1].Tensors[0] = tensor.FromFloat32("scores", []int64{3, 10}, make([]float32, 30))
		}},
		{"truncated data", KindOutputs, func(r *hamsv1.PredictResponse) {
			r.Outputs[1].Tensors[0].Data = r.Outputs[1].Tensors[0].Data[:8]
		}},
		{"model missing from lineage", KindLineage, func(r *hamsv1.PredictResponse) { r.Lineage = r.Lineage[:2] }},
		{"dangling pred link", KindLineage, func(r *hamsv1.PredictResponse) { r.Lineage[1].PredSeq = 99 }},
		{"foreign model in lineage", KindLineage, func(r *hamsv1.PredictResponse) {
			r.Lineage = append(r.Lineage, &hamsv1.LineageEntry{PredModel: "frontend", PredSeq: 1, Model: "zz", Seq: 1})
		}},
		{"zero seq", KindLineage, func(r *hamsv1.PredictResponse) { r.Lineage[2].Seq = 0 }},
		{"wrong service", KindUnknown, func(r *hamsv1.PredictResponse) { r.Service = "other" }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newChecker(t)
			c.Sent("k", request(2))
			r := good(1, 2)
			tc.mut(r)
			err := c.Check("k", r)
			if !errors.Is(err, ErrViolation) {
				t.Fatalf("not caught: %v", err)
			}
			s := c.Finish()
			if s.ByKind[tc.kind] == 0 || s.Correct != 0 {
				t.Fatalf("summary %+v, want a %s violation (err %v)", s, tc.kind, err)
			}
		})
	}
}

func TestCrossReplyViolations(t *testing.T) {
	c := newChecker(t)
	c.Sent("r1", request(1))
	c.Sent("r2", request(1))
	c.Sent("r3", request(1))
	c.Sent("r4", request(1))
	if err := c.Check("r1", good(1, 1)); err != nil {
		t.Fatal(err)
	}
	// r2 reuses b's seq 1: a conflict.
	r2 := good(2, 1)
	r2.Lineage[1] = proto.Clone(good(1, 1).Lineage[1]).(*hamsv1.LineageEntry)
	r2.Lineage[1].PredSeq = 2
	if err := c.Check("r2", r2); err == nil || !strings.Contains(err.Error(), "b seq 1") {
		t.Fatalf("conflict not caught: %v", err)
	}
	// Second reply to r1.
	if err := c.Check("r1", good(5, 1)); err == nil {
		t.Fatal("duplicate reply not caught")
	}
	// Reply to a request never sent.
	if err := c.Check("ghost", good(6, 1)); err == nil {
		t.Fatal("unknown reply not caught")
	}
	// r3 failed: an error, not a violation; an answer after it is a duplicate.
	c.Failed("r3", errors.New("unavailable"))
	if err := c.Check("r3", good(7, 1)); err == nil {
		t.Fatal("reply after error not caught")
	}
	// r4 never answered: lost.
	s := c.Finish()
	want := map[string]int{KindConflict: 1, KindDuplicate: 2, KindUnknown: 1, KindLost: 1}
	for k, n := range want {
		if s.ByKind[k] != n {
			t.Fatalf("%s: got %d, want %d (summary %+v)", k, s.ByKind[k], n, s)
		}
	}
	if s.Errors != 1 || s.Correct != 1 || len(s.Examples) == 0 {
		t.Fatalf("summary %+v", s)
	}
}

func TestUncheckedService(t *testing.T) {
	c := newChecker(t)
	c.Sent("x", &hamsv1.PredictRequest{Service: "other"})
	if err := c.Check("x", good(1, 1)); !errors.Is(err, ErrViolation) {
		t.Fatalf("reply for an unchecked service: %v", err)
	}
}

// TestSeqReuseAcrossRestart: a conflict on a model restarted between the
// first request's send and the second reply is seq_reuse; a conflict on
// another model, or on the same model without a restart in between, stays
// a conflict.
func TestSeqReuseAcrossRestart(t *testing.T) {
	c := newChecker(t)
	clock := time.Unix(1000, 0)
	c.now = func() time.Time { return clock }
	tick := func() time.Time { clock = clock.Add(time.Second); return clock }

	c.Sent("r1", request(1))
	tick()
	if err := c.Check("r1", good(1, 1)); err != nil {
		t.Fatal(err)
	}
	c.Restarted("a", tick()) // a restarts and numbers from 1 again
	tick()
	c.Sent("r2", request(1))
	tick()
	// r2: a seq 1 again (restart in between), and b, c seq 1 again (no
	// restart of b or c).
	err := c.Check("r2", good(1, 1))
	if err == nil || !strings.Contains(err.Error(), "across a restart of a") {
		t.Fatalf("seq reuse not reported: %v", err)
	}
	// r3 sent after the restart reuses a seq 2 of r4, also sent after it:
	// a conflict within one incarnation.
	c.Sent("r3", request(1))
	c.Sent("r4", request(1))
	tick()
	if err := c.Check("r3", good(2, 1)); err != nil {
		t.Fatal(err)
	}
	r4 := good(3, 1)
	r4.Lineage[0].Seq, r4.Lineage[1].PredSeq, r4.Lineage[2].PredSeq = 2, 2, 2
	if err := c.Check("r4", r4); err == nil || !strings.Contains(err.Error(), "a seq 2 appears") || strings.Contains(err.Error(), "restart") {
		t.Fatalf("conflict after the restart: %v", err)
	}
	s := c.Finish()
	if s.ByKind[KindSeqReuse] != 1 || s.ByKind[KindConflict] != 3 || s.Violations != 4 {
		t.Fatalf("summary %+v", s)
	}
}
