package datapath

import (
	"errors"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func item(from string, req uint64) *hamsv1.Item {
	return &hamsv1.Item{FromModel: from, ReqId: req}
}

func TestJoinerJoin(t *testing.T) {
	j, err := NewJoiner([]string{"a", "b", "frontend"}, config.FanInJoin, 10)
	if err != nil {
		t.Fatal(err)
	}
	if d, _, _ := j.Add(item("b", 1)); d != nil {
		t.Fatal("completed with one part")
	}
	if d, _, _ := j.Add(item("frontend", 1)); d != nil {
		t.Fatal("completed with two parts")
	}
	if d, _, _ := j.Add(item("a", 2)); d != nil {
		t.Fatal("req 2 completed")
	}
	d, ev, err := j.Add(item("a", 1))
	if err != nil || d == nil || len(ev) != 0 || !d.Complete {
		t.Fatalf("join: %v %v %v", d, ev, err)
	}
	for i, want := range []string{"a", "b", "frontend"} {
		if d.Parts[i].FromModel != want {
			t.Fatalf("part %d from %s, want %s (pred order)", i, d.Parts[i].FromModel, want)
		}
	}
	if j.Waiting() != 1 {
		t.Fatalf("waiting %d", j.Waiting())
	}
	if _, _, err := j.Add(item("a", 2)); !errors.Is(err, ErrDupPart) {
		t.Fatalf("dup part: %v", err)
	}
	if _, _, err := j.Add(item("zzz", 2)); !errors.Is(err, ErrUnknownPred) {
		t.Fatalf("unknown pred: %v", err)
	}
}

func TestJoinerInterleaveAndSinglePred(t *testing.T) {
	j, _ := NewJoiner([]string{"a", "b"}, config.FanInInterleave, 10)
	for _, from := range []string{"a", "b", "a"} {
		d, _, err := j.Add(item(from, 1))
		if err != nil || d == nil || len(d.Parts) != 1 || d.Parts[0].FromModel != from {
			t.Fatalf("interleave: %v %v", d, err)
		}
	}
	j, _ = NewJoiner([]string{"a"}, config.FanInJoin, 10)
	if d, _, _ := j.Add(item("a", 1)); d == nil {
		t.Fatal("single predecessor join waited")
	}
}

func TestJoinerBound(t *testing.T) {
	j, _ := NewJoiner([]string{"a", "b"}, config.FanInJoin, 2)
	j.Add(item("a", 1))
	j.Add(item("a", 2))
	_, ev, _ := j.Add(item("a", 3))
	if len(ev) != 1 || ev[0].ReqID != 1 || ev[0].Complete || ev[0].Parts[0] == nil || ev[0].Parts[1] != nil {
		t.Fatalf("evicted %v", ev)
	}
	if j.Waiting() != 2 {
		t.Fatalf("waiting %d", j.Waiting())
	}
	if _, _, err := j.Add(item("b", 1)); !errors.Is(err, ErrLatePart) {
		t.Fatalf("late part: %v", err)
	}
	if d, _, _ := j.Add(item("b", 3)); d == nil {
		t.Fatal("req 3 not completed")
	}
}

func TestJoinerExpire(t *testing.T) {
	j, _ := NewJoiner([]string{"a", "b"}, config.FanInJoin, 10)
	t0 := time.Unix(1000, 0)
	mk := func(req uint64, dl time.Duration) *hamsv1.Item {
		it := item("a", req)
		if dl != 0 {
			it.DeadlineUnixNano = t0.Add(dl).UnixNano()
		}
		return it
	}
	j.Add(mk(1, 5*time.Millisecond))
	j.Add(mk(2, 0))
	j.Add(mk(3, 2*time.Millisecond))
	if got := j.NextDeadline(); !got.Equal(t0.Add(2 * time.Millisecond)) {
		t.Fatalf("next deadline %v", got)
	}
	if ex := j.Expire(t0.Add(time.Millisecond)); len(ex) != 0 {
		t.Fatalf("expired early %v", ex)
	}
	ex := j.Expire(t0.Add(2 * time.Millisecond))
	if len(ex) != 1 || ex[0].ReqID != 3 {
		t.Fatalf("expired %v", ex)
	}
	if got := j.NextDeadline(); !got.Equal(t0.Add(5 * time.Millisecond)) {
		t.Fatalf("next deadline %v", got)
	}
	ex = j.Expire(t0.Add(time.Second))
	if len(ex) != 1 || ex[0].ReqID != 1 || j.Waiting() != 1 || !j.NextDeadline().IsZero() {
		t.Fatalf("expired %v waiting %d", ex, j.Waiting())
	}
}

func TestNewJoinerRejects(t *testing.T) {
	if _, err := NewJoiner(nil, config.FanInJoin, 1); err == nil {
		t.Fatal("no preds accepted")
	}
	if _, err := NewJoiner([]string{"a"}, "zip", 1); err == nil {
		t.Fatal("bad mode accepted")
	}
}

// A superseding part for a completed join (an upstream stateful model's
// re-execution after failover) re-forms the request with the other parts
// remembered, which will not come again; without RememberJoined it starts
// a new join that waits for them.
func TestJoinerRejoinsSupersedingPart(t *testing.T) {
	j, err := NewJoiner([]string{"s", "x", "y"}, config.FanInJoin, 10)
	if err != nil {
		t.Fatal(err)
	}
	j.RememberJoined(2)
	for _, p := range []string{"s", "x", "y"} {
		j.Add(item(p, 1))
	}
	again := item("s", 1)
	again.Lineage = []*hamsv1.LineageEntry{{PredModel: "frontend", PredSeq: 1, Model: "s", Seq: 9}}
	d, _, err := j.Add(again)
	if err != nil || d == nil || !d.Complete || d.Parts[0] != again || d.Parts[1].FromModel != "x" || d.Parts[2].FromModel != "y" {
		t.Fatalf("re-formed join: %+v %v", d, err)
	}
	if j.Waiting() != 0 {
		t.Fatalf("waiting %d after a re-join", j.Waiting())
	}
	// Bounded: the oldest completed joins are forgotten.
	for id := uint64(2); id <= 3; id++ {
		for _, p := range []string{"s", "x", "y"} {
			j.Add(item(p, id))
		}
	}
	if d, _, _ := j.Add(item("s", 1)); d != nil || j.Waiting() != 1 {
		t.Fatalf("forgotten req 1 re-formed: %v (waiting %d)", d, j.Waiting())
	}
	if d, _, _ := j.Add(item("x", 3)); d == nil || !d.Complete {
		t.Fatal("remembered req 3 not re-formed")
	}
	// Off by default.
	j2, _ := NewJoiner([]string{"s", "x"}, config.FanInJoin, 10)
	j2.Add(item("s", 1))
	j2.Add(item("x", 1))
	if d, _, _ := j2.Add(item("s", 1)); d != nil || j2.Waiting() != 1 {
		t.Fatal("re-formed without RememberJoined")
	}
}
