package frontend

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func le(pred string, predSeq uint64, model string, seq uint64) *hamsv1.LineageEntry {
	return &hamsv1.LineageEntry{PredModel: pred, PredSeq: predSeq, Model: model, Seq: seq, OutputDigest: fmt.Sprintf("d-%s-%d", model, seq)}
}

func TestReplyDepsTakesHighestSeqOfReplicatedStatefulModels(t *testing.T) {
	stateful := map[string]bool{"s": true, "t": true}
	lin := []*hamsv1.LineageEntry{
		le("frontend", 9, "p", 3),
		le("p", 3, "s", 4),
		le("p", 3, "s", 7), // interleaved fan-in: s ran the request's parts twice
		le("s", 7, "u", 2), // u is stateful but not replicated: not in the set
		le("u", 2, "t", 1),
		le("s", 4, "t", 1), // join entry: same (t, 1) again
	}
	deps := replyDeps(lin, stateful)
	if len(deps) != 2 || deps["s"] != 7 || deps["t"] != 1 {
		t.Fatalf("deps %v, want s:7 t:1", deps)
	}
	if d := replyDeps([]*hamsv1.LineageEntry{le("frontend", 1, "p", 1)}, stateful); d != nil {
		t.Fatalf("deps of a stateless lineage %v, want none", d)
	}
	if d := replyDeps(nil, stateful); d != nil {
		t.Fatalf("deps of no lineage %v", d)
	}
}

func TestHoldsReleaseWhenEveryDependencyIsDurable(t *testing.T) {
	h := newHolds()
	resp := func(id uint64) *hamsv1.PredictResponse { return &hamsv1.PredictResponse{ReqId: id, Service: "svc"} }
	if !h.hold(1, resp(1), nil, t0, t0.Add(time.Second)) || h.len() != 0 {
		t.Fatal("a reply without dependencies must leave at once and not be kept")
	}
	if h.hold(2, resp(2), map[string]uint64{"s": 5}, t0, t0.Add(time.Second)) {
		t.Fatal("reply 2 released before s is durable to 5")
	}
	if h.hold(3, resp(3), map[string]uint64{"s": 3, "t": 2}, t0, t0.Add(2*time.Second)) {
		t.Fatal("reply 3 released before s and t are durable")
	}
	if h.len() != 2 {
		t.Fatalf("held %d, want 2", h.len())
	}
	if got := h.durable("s", 4); len(got) != 0 {
		t.Fatalf("s durable to 4 released %v (3 still needs t)", got)
	}
	if got := h.durable("t", 2); len(got) != 1 || got[0].reqID != 3 || got[0].resp.ReqId != 3 {
		t.Fatalf("t durable to 2 released %v, want reply 3", got)
	}
	if got := h.durable("s", 4); len(got) != 0 {
		t.Fatalf("a repeated notice released %v", got)
	}
	if got := h.durable("s", 9); len(got) != 1 || got[0].reqID != 2 {
		t.Fatalf("s durable to 9 released %v, want reply 2", got)
	}
	if h.len() != 0 || h.gate.Held() != 0 || h.byDue.Len() != 0 {
		t.Fatalf("state left: held %d gate %d heap %d", h.len(), h.gate.Held(), h.byDue.Len())
	}
	// Known durability releases a later reply at once.
	if !h.hold(4, resp(4), map[string]uint64{"s": 9, "t": 1}, t0, t0.Add(time.Second)) {
		t.Fatal("reply 4 depends only on durable states")
	}
}

func TestHoldsReleaseSeveralInReqIDOrder(t *testing.T) {
	h := newHolds()
	for id := uint64(10); id > 0; id-- {
		if h.hold(id, &hamsv1.PredictResponse{ReqId: id}, map[string]uint64{"s": id}, t0, t0.Add(time.Second)) {
			t.Fatalf("reply %d released early", id)
		}
	}
	got := h.durable("s", 6)
	if len(got) != 6 {
		t.Fatalf("released %d, want 6", len(got))
	}
	for i, r := range got {
		if r.reqID != uint64(i+1) {
			t.Fatalf("release order %d at %d", r.reqID, i)
		}
	}
}

func TestHoldsDropAndExpireLeaveNoState(t *testing.T) {
	h := newHolds()
	deps := map[string]uint64{"s": 5, "t": 1}
	h.hold(1, &hamsv1.PredictResponse{ReqId: 1, Service: "svc"}, deps, t0, t0.Add(time.Second))
	h.hold(2, &hamsv1.PredictResponse{ReqId: 2, Service: "svc"}, deps, t0, t0.Add(3*time.Second))
	h.hold(3, &hamsv1.PredictResponse{ReqId: 3, Service: "svc"}, deps, t0, t0.Add(2*time.Second))
	if d, ok := h.nextDeadline(); !ok || !d.Equal(t0.Add(time.Second)) {
		t.Fatalf("next deadline %v %v", d, ok)
	}
	if !h.drop(1) || h.drop(1) || h.drop(99) {
		t.Fatal("drop must report a held reply once, and nothing for unknown ones")
	}
	if d, _ := h.nextDeadline(); !d.Equal(t0.Add(2 * time.Second)) {
		t.Fatalf("next deadline after drop %v", d)
	}
	h.durable("t", 1)
	if got := h.expire(t0.Add(1500 * time.Millisecond)); len(got) != 0 {
		t.Fatalf("expired early: %v", got)
	}
	got := h.expire(t0.Add(2 * time.Second))
	if len(got) != 1 || got[0].reqID != 3 {
		t.Fatalf("expired %v, want reply 3", got)
	}
	st := status.Convert(got[0].err)
	if st.Code() != codes.DeadlineExceeded || !msgHas(st.Message(), "request 3", `"svc"`, "s (seq 5, durable 0)") || strings.Contains(st.Message(), "t (") {
		t.Fatalf("expiry status %v", st)
	}
	h.expire(t0.Add(time.Hour))
	if h.len() != 0 || h.gate.Held() != 0 || h.byDue.Len() != 0 {
		t.Fatalf("state left: held %d gate %d heap %d", h.len(), h.gate.Held(), h.byDue.Len())
	}
	if _, ok := h.nextDeadline(); ok {
		t.Fatal("next deadline of an empty hold area")
	}
	// Dropped and expired replies are not released by later notices.
	if got := h.durable("s", 100); len(got) != 0 {
		t.Fatalf("late notice released %v", got)
	}
}

func TestAuditReplyRecord(t *testing.T) {
	a := tensor.FromFloat32("a", []int64{1, 2}, []float32{1, 2})
	b := tensor.FromFloat32("b", []int64{1, 1}, []float32{3})
	c := tensor.FromInt64("c", []int64{1}, []int64{4})
	resp := &hamsv1.PredictResponse{
		ReqId: 42, RequestId: "client-id",
		Outputs: []*hamsv1.ModelOutput{{Model: "x", Tensors: []*hamsv1.Tensor{a, b}}, {Model: "y", Tensors: []*hamsv1.Tensor{c}}},
		// j joins p and q: two entries for (j, 1), one step in the record.
		Lineage: []*hamsv1.LineageEntry{le("frontend", 1, "p", 1), le("frontend", 1, "q", 2), le("p", 1, "j", 1), le("q", 2, "j", 1), le("j", 1, "x", 3), le("j", 1, "y", 3)},
	}
	rec := auditReply(resp)
	if rec.ReqID != "42" {
		t.Fatalf("req_id %q, want the frontend's 42", rec.ReqID)
	}
	if rec.ReplyDigest != tensor.Digest(a, b, c) {
		t.Fatalf("reply digest %s, want digest of a, b, c", rec.ReplyDigest)
	}
	var got []string
	for _, s := range rec.Lineage {
		got = append(got, fmt.Sprintf("%s:%d:%s", s.Model, s.Seq, s.OutputDigest))
	}
	want := "[p:1:d-p-1 q:2:d-q-2 j:1:d-j-1 x:3:d-x-3 y:3:d-y-3]"
	if fmt.Sprint(got) != want {
		t.Fatalf("lineage %v, want %s", got, want)
	}
	if empty := auditReply(&hamsv1.PredictResponse{ReqId: 1}); empty.Lineage == nil || len(empty.Lineage) != 0 {
		t.Fatalf("a reply without lineage must write lineage [] (not null): %#v", empty.Lineage)
	}
}

// An item that names an execution a failover lost is refused whenever it
// arrives (a late speculative output of the deposed primary, or one kept
// aside for a request injected after the failover); the re-execution,
// stamped with the new epoch, and what the failover kept are not.
func TestHoldsLostLater(t *testing.T) {
	h := newHolds()
	ent := func(model string, seq, epoch uint64) []*hamsv1.LineageEntry {
		return []*hamsv1.LineageEntry{{Model: "m0", Seq: 7, Epoch: 1}, {Model: model, Seq: seq, Epoch: epoch}}
	}
	h.notice("route", 1, 480)
	if h.lostLater(ent("route", 490, 1)) {
		t.Fatal("no failover yet: nothing is lost")
	}
	h.notice("route", 2, 488) // the backup took over from 488
	h.notice("route", 2, 494) // and re-executed beyond it
	cases := []struct {
		name    string
		lineage []*hamsv1.LineageEntry
		lost    bool
	}{
		{"old epoch beyond the takeover point", ent("route", 490, 1), true},
		{"old epoch at the takeover point", ent("route", 488, 1), false},
		{"the re-execution", ent("route", 490, 2), false},
		{"another model", ent("motion", 490, 1), false},
		{"unstamped (judged at the failover only)", ent("route", 490, 0), false},
	}
	for _, c := range cases {
		if got := h.lostLater(c.lineage); got != c.lost {
			t.Errorf("%s: lost %v, want %v", c.name, got, c.lost)
		}
	}
	// A second failover: what the first lost stays lost.
	h.notice("route", 3, 500)
	if !h.lostLater(ent("route", 495, 1)) || !h.lostLater(ent("route", 501, 2)) || h.lostLater(ent("route", 499, 2)) {
		t.Fatal("after a second failover")
	}
	for i := range 2 * maxFailovers {
		h.notice("route", uint64(4+i), 600)
	}
	if n := len(h.failovers["route"]); n != maxFailovers {
		t.Fatalf("%d failovers remembered, want %d", n, maxFailovers)
	}
}
