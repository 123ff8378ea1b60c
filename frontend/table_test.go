package frontend

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func sinkItem(reqID uint64, model string, seq uint64, lineage ...*hamsv1.LineageEntry) *hamsv1.Item {
	out := tensor.FromFloat32("out", []int64{1, 1}, []float32{float32(seq)})
	l := append(append([]*hamsv1.LineageEntry(nil), lineage...), &hamsv1.LineageEntry{PredModel: "x", PredSeq: 1, Model: model, Seq: seq, OutputDigest: tensor.Digest(out)})
	return &hamsv1.Item{ReqId: reqID, Tensors: []*hamsv1.Tensor{out}, Lineage: l}
}

func TestTableDenseIDsAndSingleSink(t *testing.T) {
	tb := newTable()
	a := tb.add("s", "r1", []string{"m"}, t0.Add(time.Second))
	b := tb.add("s", "", []string{"m"}, t0.Add(time.Second))
	if a != 1 || b != 2 {
		t.Fatalf("req_ids %d, %d; want 1, 2", a, b)
	}
	res, c := tb.deliver("m", sinkItem(a, "m", 7))
	if res != completed || c == nil || c.err != nil {
		t.Fatalf("deliver: %v %+v", res, c)
	}
	if c.resp.GetReqId() != a || c.resp.GetRequestId() != "r1" || c.resp.GetService() != "s" {
		t.Fatalf("reply header %+v", c.resp)
	}
	if len(c.resp.Outputs) != 1 || c.resp.Outputs[0].Model != "m" || len(c.resp.Lineage) != 1 {
		t.Fatalf("reply %+v", c.resp)
	}
	if tb.len() != 1 {
		t.Fatalf("len %d, want 1", tb.len())
	}
	// A second item for a completed request is dropped.
	if res, _ := tb.deliver("m", sinkItem(a, "m", 7)); res != unknownReq {
		t.Fatalf("late item: %v", res)
	}
}

func TestTableJoinOfSeveralSinks(t *testing.T) {
	tb := newTable()
	id := tb.add("s", "", []string{"a", "b", "c"}, t0.Add(time.Second))
	shared := &hamsv1.LineageEntry{PredModel: "frontend", PredSeq: id, Model: "p", Seq: 3, OutputDigest: "d"}
	if res, c := tb.deliver("c", sinkItem(id, "c", 1, shared)); res != partStored || c != nil {
		t.Fatalf("first part: %v", res)
	}
	if res, _ := tb.deliver("c", sinkItem(id, "c", 1, shared)); res != duplicatePart {
		t.Fatalf("duplicate part: %v", res)
	}
	if res, _ := tb.deliver("zzz", sinkItem(id, "zzz", 1)); res != unexpectedSink {
		t.Fatalf("unexpected sink: %v", res)
	}
	if res, _ := tb.deliver("a", sinkItem(id, "a", 2, shared)); res != partStored {
		t.Fatalf("second part: %v", res)
	}
	res, c := tb.deliver("b", sinkItem(id, "b", 5, shared))
	if res != completed || c.err != nil {
		t.Fatalf("last part: %v %v", res, c)
	}
	var models []string
	for _, o := range c.resp.Outputs {
		models = append(models, o.Model)
	}
	if strings.Join(models, ",") != "a,b,c" {
		t.Fatalf("outputs in order %v, want a,b,c", models)
	}
	// Union of lineage: the shared entry once, plus one per sink.
	if len(c.resp.Lineage) != 4 {
		t.Fatalf("lineage %v, want 4 entries", c.resp.Lineage)
	}
	n := 0
	for _, l := range c.resp.Lineage {
		if l.Model == "p" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("shared lineage entry appears %d times", n)
	}
	if tb.len() != 0 {
		t.Fatalf("table not empty: %d", tb.len())
	}
}

func TestTableErrorItemCompletesAtOnce(t *testing.T) {
	tb := newTable()
	id := tb.add("s", "", []string{"a", "b"}, t0.Add(time.Second))
	bad := &hamsv1.Item{ReqId: id, Error: "model a: tensor \"x\" is bad", ErrorCode: int32(codes.InvalidArgument)}
	res, c := tb.deliver("a", bad)
	if res != completed || c.resp != nil {
		t.Fatalf("error item: %v %+v", res, c)
	}
	if st := status.Convert(c.err); st.Code() != codes.InvalidArgument || st.Message() != bad.Error {
		t.Fatalf("error %v", c.err)
	}
	if res, _ := tb.deliver("b", sinkItem(id, "b", 1)); res != unknownReq {
		t.Fatalf("part after error: %v", res)
	}
	// An error without a usable code is Unknown.
	id2 := tb.add("s", "", []string{"a"}, t0.Add(time.Second))
	_, c = tb.deliver("a", &hamsv1.Item{ReqId: id2, Error: "boom"})
	if status.Code(c.err) != codes.Unknown {
		t.Fatalf("code %v, want Unknown", status.Code(c.err))
	}
}

func TestTableExpiry(t *testing.T) {
	tb := newTable()
	late := tb.add("s", "", []string{"a", "b"}, t0.Add(3*time.Second))
	early := tb.add("s", "", []string{"a", "b"}, t0.Add(1*time.Second))
	mid := tb.add("s", "", []string{"a"}, t0.Add(2*time.Second))
	if d, ok := tb.nextDeadline(); !ok || !d.Equal(t0.Add(time.Second)) {
		t.Fatalf("nextDeadline %v %v", d, ok)
	}
	tb.deliver("a", sinkItem(early, "a", 1))
	if got := tb.expire(t0.Add(999 * time.Millisecond)); len(got) != 0 {
		t.Fatalf("expired early: %v", got)
	}
	got := tb.expire(t0.Add(2 * time.Second))
	if len(got) != 2 || got[0].reqID != early || got[1].reqID != mid {
		t.Fatalf("expired %v, want [%d %d]", got, early, mid)
	}
	for _, c := range got {
		if status.Code(c.err) != codes.DeadlineExceeded {
			t.Fatalf("code %v", status.Code(c.err))
		}
	}
	if !strings.Contains(status.Convert(got[0].err).Message(), "[b]") {
		t.Fatalf("expiry message does not name the missing sink: %v", got[0].err)
	}
	if res, _ := tb.deliver("b", sinkItem(early, "b", 1)); res != unknownReq {
		t.Fatalf("item after expiry: %v", res)
	}
	if !tb.remove(late) || tb.remove(late) {
		t.Fatal("remove should report pending once")
	}
	if _, ok := tb.nextDeadline(); ok || tb.len() != 0 {
		t.Fatal("table not empty")
	}
}

func TestReplyCacheTTLAndLRU(t *testing.T) {
	c := newReplyCache(2, time.Minute)
	k := func(s string) idemKey { return idemKey{service: "s", requestID: s} }
	c.put(k("a"), &hamsv1.PredictResponse{ReqId: 1}, nil, t0)
	c.put(k("b"), &hamsv1.PredictResponse{ReqId: 2}, nil, t0)
	if v, ok := c.get(k("a"), t0.Add(time.Second)); !ok || v.resp.ReqId != 1 {
		t.Fatal("a missing")
	}
	// b is least recently used now; adding c evicts it.
	c.put(k("c"), nil, status.Error(codes.InvalidArgument, "x"), t0.Add(time.Second))
	if _, ok := c.get(k("b"), t0.Add(time.Second)); ok {
		t.Fatal("b should have been evicted")
	}
	if v, ok := c.get(k("c"), t0.Add(2*time.Second)); !ok || status.Code(v.err) != codes.InvalidArgument {
		t.Fatal("c missing")
	}
	// Same request_id in another service is another key.
	if _, ok := c.get(idemKey{service: "t", requestID: "a"}, t0); ok {
		t.Fatal("keys must be scoped by service")
	}
	if _, ok := c.get(k("a"), t0.Add(time.Minute)); ok {
		t.Fatal("a should have expired")
	}
	if c.len() != 1 {
		t.Fatalf("len %d, want 1", c.len())
	}
	off := newReplyCache(-1, time.Minute)
	off.put(k("a"), nil, nil, t0)
	if off.len() != 0 {
		t.Fatal("disabled cache stored an entry")
	}
}
