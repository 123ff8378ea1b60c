package edge

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/grpcx"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Acknowledged items are retained until Complete; Resend sends those after
// a position (then the unacked ones) to a new address at a new
// incarnation, and a deduplicating receiver drops what it already had.
func TestResendRetainedToReplacement(t *testing.T) {
	sk1, sk2 := newSink(), newSink()
	l1, l2 := listen(t, "127.0.0.1:0"), listen(t, "127.0.0.1:0")
	defer serve(t, l1, NewReceiver("b", sk1.deliver, nil))()
	r2 := NewReceiver("b", sk2.deliver, nil, WithDedup(0, nil))
	defer serve(t, l2, r2)()
	res := NewStaticResolver(map[string]string{"b": l1.Addr().String()})
	s, stop := startSender(t, SenderConfig{From: "a", To: "b", Resolver: res, MaxRetained: 8})
	defer stop()
	for i := 1; i <= 10; i++ {
		s.Send(&hamsv1.Item{ReqId: uint64(i)})
	}
	waitFor(t, "acked", func() bool { return s.Backlog() == 0 && sk1.count("a") == 10 })
	if n := s.Retained(); n != 8 {
		t.Fatalf("retained %d, want the newest 8", n)
	}
	s.Complete(3, 4, 99)
	if n := s.Retained(); n != 6 {
		t.Fatalf("retained %d after completing 2", n)
	}
	// The replacement already has request 9 (a conservative position).
	r2.SeedDedup(map[string][]uint64{"a": {DedupKey(9, nil, nil)}})
	if n := s.Resend(ResendSpec{After: 4, Addr: l2.Addr().String(), Epoch: 2}); n != 6 {
		t.Fatalf("resent %d, want 6 (5..10)", n)
	}
	s.Send(&hamsv1.Item{ReqId: 11})
	waitFor(t, "replacement got the resent items", func() bool { return sk2.count("a") == 6 })
	sk2.mu.Lock()
	got, seqs := append([]uint64(nil), sk2.items["a"]...), append([]uint64(nil), sk2.seqs["a"]...)
	sk2.mu.Unlock()
	want := []uint64{5, 6, 7, 8, 10, 11}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("replacement got %v, want %v", got, want)
		}
	}
	if seqs[0] != 1 || r2.Duplicates() != 1 {
		t.Fatalf("new incarnation numbering %v, duplicates %d", seqs, r2.Duplicates())
	}
	// The override holds while the resolver lags, and yields once it
	// reports the receiver at the new epoch.
	if addr, _, _ := s.target(); addr != l2.Addr().String() {
		t.Fatalf("target %s while the resolver lags", addr)
	}
	res.Set("b", l2.Addr().String(), 2)
	addr, ep, _ := s.target()
	s.mu.Lock()
	o := s.override
	s.mu.Unlock()
	if addr != l2.Addr().String() || ep != 2 || o != nil {
		t.Fatalf("target %s@%d override %v", addr, ep, o)
	}
	// Resend with explicit candidates (a stateful primary's output log).
	if n := s.Resend(ResendSpec{After: 100, Items: []*hamsv1.Item{{ReqId: 50, EdgeSeq: 100}, {ReqId: 51, EdgeSeq: 101}}}); n != 1 {
		t.Fatalf("resent %d explicit items, want 1", n)
	}
	waitFor(t, "explicit item", func() bool { return sk2.count("a") == 7 })
	if st := s.Stats(); st.Resends != 7 {
		t.Fatalf("stats %+v", st)
	}
}

// Retain adds items only Resend sends.
func TestRetainOnlyForResend(t *testing.T) {
	sk := newSink()
	l := listen(t, "127.0.0.1:0")
	defer serve(t, l, NewReceiver("b", sk.deliver, nil))()
	res := NewStaticResolver(map[string]string{"b": l.Addr().String()})
	s, stop := startSender(t, SenderConfig{From: "a", To: "b", Resolver: res,
		Position: func(it *hamsv1.Item) uint64 { return it.GetReqId() * 10 }})
	defer stop()
	s.Retain(&hamsv1.Item{ReqId: 1}, &hamsv1.Item{ReqId: 2})
	s.Send(&hamsv1.Item{ReqId: 3})
	waitFor(t, "sent", func() bool { return sk.count("a") == 1 && s.Backlog() == 0 })
	if n := s.Resend(ResendSpec{After: 15}); n != 2 {
		t.Fatalf("resent %d, want 2 (positions 20 and 30)", n)
	}
	waitFor(t, "resent", func() bool { return sk.count("a") == 3 })
	// Copies made by Resend are not retained twice.
	if n := s.Retained(); n != 3 {
		t.Fatalf("retained %d", n)
	}
}

// Epoch fencing and admission refuse batches with FailedPrecondition.
func TestReceiverFencesEpochsAndAdmission(t *testing.T) {
	sk := newSink()
	var closed atomic.Bool
	r := NewReceiver("b", sk.deliver, nil,
		WithEpochs(func(from string) (uint64, bool) { return 3, from == "a" }),
		WithAdmit(func(string) error {
			if closed.Load() {
				return status.Error(codes.FailedPrecondition, "not serving")
			}
			return nil
		}))
	l := listen(t, "127.0.0.1:0")
	defer serve(t, l, r)()
	cc, err := grpcx.Dial(l.Addr().String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	// send streams one batch and returns the refusal's max_in_order with
	// the stream's error.
	send := func(from string, epoch, inc uint64) (uint64, error) {
		st, err := hamsv1.NewDataplaneClient(cc).Forward(context.Background())
		if err != nil {
			return 0, err
		}
		if err := st.Send(&hamsv1.ForwardBatch{FromModel: from, ToModel: "b", Epoch: epoch, Incarnation: inc,
			Items: []*hamsv1.Item{{EdgeSeq: 1, ReqId: 1}}}); err != nil {
			return 0, err
		}
		ack, err := st.Recv()
		if err == nil && ack.Error != "" {
			_, err = st.Recv()
			return ack.GetMaxInOrder(), err
		}
		return 0, err
	}
	if _, err := send("a", 3, 2); err != nil {
		t.Fatalf("current epoch: %v", err)
	}
	// A refusal that fences the sender acknowledges nothing: the edge's
	// max_in_order (1 now) counts another sender's items (the instance
	// that deposed this one numbers the edge on from where it stood), and
	// a sender that took it for its own would drop what it still holds.
	for _, c := range []struct {
		what       string
		epoch, inc uint64
	}{{"stale epoch", 2, 3}, {"stale incarnation", 3, 1}} {
		if m, err := send("a", c.epoch, c.inc); status.Code(err) != codes.FailedPrecondition || m != 0 {
			t.Fatalf("%s: refusal with max_in_order %d, %v", c.what, m, err)
		}
	}
	if _, err := send("x", 0, 1); err != nil {
		t.Fatalf("unfenced sender: %v", err)
	}
	closed.Store(true)
	if m, err := send("a", 4, 2); status.Code(err) != codes.FailedPrecondition || m != 0 {
		t.Fatalf("not admitted: max_in_order %d, %v", m, err)
	}
}

// DedupKey: resent copies and stateless re-executions collide; a stateful
// re-execution with another output, and another interleave branch, do not;
// the closure of a merged lineage gives the sender's key.
func TestDedupKey(t *testing.T) {
	st := func(m string) bool { return m == "s" }
	e := func(p string, ps uint64, m string, s uint64, d string) *hamsv1.LineageEntry {
		return &hamsv1.LineageEntry{PredModel: p, PredSeq: ps, Model: m, Seq: s, OutputDigest: d}
	}
	base := []*hamsv1.LineageEntry{e("frontend", 1, "s", 7, "x"), e("s", 7, "p", 3, "y")}
	k := DedupKey(1, base, st)
	if DedupKey(1, []*hamsv1.LineageEntry{e("frontend", 1, "s", 7, "x"), e("s", 7, "p", 9, "z")}, st) != k {
		t.Fatal("stateless re-execution has another key")
	}
	if DedupKey(1, []*hamsv1.LineageEntry{e("frontend", 1, "s", 7, "w"), e("s", 7, "p", 3, "y")}, st) == k {
		t.Fatal("stateful re-execution with another output has the same key")
	}
	// A stateful re-execution by a promoted instance (another epoch) that
	// repeats seq and output exactly.
	again := []*hamsv1.LineageEntry{e("frontend", 1, "s", 7, "x"), e("s", 7, "p", 3, "y")}
	again[0].Epoch = 2
	if DedupKey(1, again, st) == k {
		t.Fatal("stateful re-execution in a new epoch has the key of the lost execution")
	}
	if DedupKey(2, base, st) == k || DedupKey(1, base[:1], st) == k {
		t.Fatal("other request or path has the same key")
	}
	merged := append(append([]*hamsv1.LineageEntry{}, base...), e("frontend", 4, "q", 2, "u"), e("p", 3, "j", 1, "v"), e("q", 2, "j", 1, "v"))
	if got := DedupKey(1, Closure(merged, "p", 3), st); got != k {
		t.Fatalf("closure key %x, want %x (closure %v)", got, k, Closure(merged, "p", 3))
	}
}

// With pass-through, an exact resend is delivered again (a stateless
// first hop re-runs it for a replacement downstream) while an upstream
// re-execution of a seen request (same path, another seq) is dropped.
func TestResendPassThrough(t *testing.T) {
	sk := newSink()
	st := func(m string) bool { return m == "s" }
	r := NewReceiver("p", sk.deliver, nil, WithDedup(0, st), WithResendPassThrough())
	e := r.edge("q")
	lin := func(seq uint64) []*hamsv1.LineageEntry {
		return []*hamsv1.LineageEntry{{PredModel: "frontend", PredSeq: 1, Model: "q", Seq: seq}}
	}
	batch := func(inc, edgeSeq, qseq uint64) *hamsv1.ForwardBatch {
		return &hamsv1.ForwardBatch{FromModel: "q", ToModel: "p", Incarnation: inc,
			Items: []*hamsv1.Item{{ReqId: 1, EdgeSeq: edgeSeq, Lineage: lin(qseq)}}}
	}
	for i, c := range []struct {
		b    *hamsv1.ForwardBatch
		want int
	}{
		{batch(1, 1, 7), 1}, // first delivery
		{batch(2, 1, 7), 2}, // exact resend at a new incarnation: delivered again
		{batch(3, 1, 9), 2}, // re-executed upstream (seq 9): dropped
	} {
		if _, err := r.accept(e, "q", c.b, false); err != nil {
			t.Fatal(err)
		}
		if got := sk.count("q"); got != c.want {
			t.Fatalf("step %d: %d delivered, want %d", i, got, c.want)
		}
	}
}

// The failure olv chaos runs showed (about one kill in 15): a stateful
// model s re-executes request 1 after its failover from the same durable
// state, alone and first in line, so it repeats the lost execution's seq
// and output; the stateless first hop q in front of s ran the request again
// (a frontend resend), so the exact lineage is new while the stateful path
// is not. A stateless model p after s must run it (the frontend rolled the
// lost reply back and waits for this one): the promoted instance's epoch
// makes it a new path. Unstamped, it is dropped as a stateless re-run.
func TestStatefulReExecutionRepeatingSeqAndOutputPassesStatelessHop(t *testing.T) {
	st := func(m string) bool { return m == "s" }
	lin := func(qseq, epoch uint64) []*hamsv1.LineageEntry {
		return []*hamsv1.LineageEntry{
			{PredModel: "frontend", PredSeq: 1, Model: "q", Seq: qseq},
			{PredModel: "q", PredSeq: qseq, Model: "s", Seq: 1063, OutputDigest: "x", Epoch: epoch},
		}
	}
	batch := func(inc, qseq, epoch uint64) *hamsv1.ForwardBatch {
		return &hamsv1.ForwardBatch{FromModel: "s", ToModel: "p", Incarnation: inc,
			Items: []*hamsv1.Item{{ReqId: 1, EdgeSeq: 1, Lineage: lin(qseq, epoch)}}}
	}
	for _, c := range []struct {
		name                  string
		lostEpoch, againEpoch uint64
		want                  int
	}{
		{"stamped", 18, 19, 2},
		{"unstamped", 0, 0, 1}, // the old behaviour: the re-execution is lost
	} {
		t.Run(c.name, func(t *testing.T) {
			sk := newSink()
			r := NewReceiver("p", sk.deliver, nil, WithDedup(0, st), WithResendPassThrough())
			e := r.edge("s")
			if _, err := r.accept(e, "s", batch(1, 1148, c.lostEpoch), false); err != nil {
				t.Fatal(err)
			}
			// The promoted s sends on a new incarnation.
			if _, err := r.accept(e, "s", batch(2, 1149, c.againEpoch), false); err != nil {
				t.Fatal(err)
			}
			if got := sk.count("s"); got != c.want {
				t.Fatalf("%d delivered, want %d", got, c.want)
			}
		})
	}
}

// A Resend to an address the Resolver never confirms at the same epoch
// (a frontend that believed it led on a stale topology asked the sink
// models for a resend; frontends have no epoch) holds only for
// OverrideGrace: the sender then follows the Resolver again, without a
// topology change to wake it. Without the bound the sink edge stayed on
// the non-leading frontend for good.
func TestResendAddressDisputedAtSameEpochExpires(t *testing.T) {
	leader, stale := newSink(), newSink()
	l1, l2 := listen(t, "127.0.0.1:0"), listen(t, "127.0.0.1:0")
	defer serve(t, l1, NewReceiver("frontend", leader.deliver, nil))()
	defer serve(t, l2, NewReceiver("frontend", stale.deliver, nil))()
	res := NewStaticResolver(map[string]string{"frontend": l1.Addr().String()})
	s, stop := startSender(t, SenderConfig{From: "a", To: "frontend", Resolver: res, OverrideGrace: 300 * time.Millisecond})
	defer stop()
	s.Send(&hamsv1.Item{ReqId: 1})
	waitFor(t, "the leader got item 1", func() bool { return leader.count("a") == 1 })

	s.Resend(ResendSpec{After: ^uint64(0), Addr: l2.Addr().String()})
	s.Send(&hamsv1.Item{ReqId: 2})
	waitFor(t, "the stale frontend got item 2", func() bool { return stale.count("a") >= 1 })
	waitFor(t, "the sender back on the leader", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.override == nil
	})
	s.Send(&hamsv1.Item{ReqId: 3})
	// Item 2, which only the stale frontend acknowledged, reaches the
	// leader too (retained until completed, resent in a new incarnation).
	waitFor(t, "the leader got items 2 and 3", func() bool {
		leader.mu.Lock()
		defer leader.mu.Unlock()
		return slices.Contains(leader.items["a"], 2) && slices.Contains(leader.items["a"], 3)
	})
}
