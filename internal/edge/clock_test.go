package edge

import (
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// deadlineSink records what arrived, with the deadlines the receiver set.
type deadlineSink struct {
	mu        sync.Mutex
	ids       []uint64
	deadlines map[uint64]int64
}

func (s *deadlineSink) deliver(_ string, items []*hamsv1.Item) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, it := range items {
		s.ids = append(s.ids, it.GetReqId())
		s.deadlines[it.GetReqId()] = it.GetDeadlineUnixNano()
		if it.GetDeadlineRemainingNano() != 0 {
			panic("deadline_remaining_nano delivered: the receiver converts it")
		}
	}
}

func (s *deadlineSink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

// A sender restarted on a host whose clock is an hour behind (and whose
// process nonce happens to be below its predecessor's) takes the edge
// over at once: nothing orders two processes by time. Its deadlines,
// set on its own clock, hold on the receiver's.
func TestRestartedSenderWithEarlierClockTakesOver(t *testing.T) {
	sk := &deadlineSink{deadlines: map[uint64]int64{}}
	r := NewReceiver("b", sk.deliver, nil, WithDedup(0, nil))
	lis := listen(t, "127.0.0.1:0")
	defer serve(t, lis, r)()
	res := NewStaticResolver(map[string]string{"b": lis.Addr().String()})

	old, stopOld := startSender(t, SenderConfig{From: "a", To: "b", Resolver: res, Incarnations: NewIncarnationSourceNonce(1 << 39)})
	for i := uint64(1); i <= 5; i++ {
		old.Send(&hamsv1.Item{ReqId: i})
	}
	old.Resend(ResendSpec{After: math.MaxUint64}) // a later counter of the old process
	old.Send(&hamsv1.Item{ReqId: 6})
	waitFor(t, "the old sender's items", func() bool { return sk.count() == 6 })
	stopOld()

	behind := func() time.Time { return time.Now().Add(-time.Hour) }
	snd, stop := startSender(t, SenderConfig{From: "a", To: "b", Resolver: res, Now: behind, Incarnations: NewIncarnationSourceNonce(1)})
	defer stop()
	sent := time.Now()
	snd.Send(&hamsv1.Item{ReqId: 7, DeadlineUnixNano: behind().Add(10 * time.Second).UnixNano()},
		&hamsv1.Item{ReqId: 8, DeadlineUnixNano: behind().Add(-time.Second).UnixNano()},
		&hamsv1.Item{ReqId: 9})
	waitFor(t, "the restarted sender's items", func() bool { return sk.count() == 9 })
	got := time.Now()
	sk.mu.Lock()
	defer sk.mu.Unlock()
	// 10 s left on the sender's clock is 10 s left on the receiver's (not
	// an hour less), give or take the time on the wire.
	if d := sk.deadlines[7]; d < sent.Add(10*time.Second).UnixNano() || d > got.Add(10*time.Second).UnixNano() {
		t.Fatalf("deadline 10 s away at the sender is %v away at the receiver", time.Unix(0, d).Sub(got))
	}
	if d := sk.deadlines[8]; d == 0 || d > got.UnixNano() {
		t.Fatalf("an expired deadline arrived as %d (now %d)", d, got.UnixNano())
	}
	if d := sk.deadlines[9]; d != 0 {
		t.Fatalf("no deadline arrived as %d", d)
	}
}

// Another process's sender at the same epoch replaces the current one; the
// replaced one cannot take the edge back with the incarnation it had (nor
// an older one of its own), a lower epoch is refused whatever its
// incarnation, and the current sender's stream goes on meanwhile. A
// replaced sender that starts a newer incarnation (a leading frontend
// taking its entry edge back) is a new stream again; a huge incarnation
// fences nothing.
func TestStaleSenderCannotFence(t *testing.T) {
	sk := newSink()
	r := NewReceiver("b", sk.deliver, nil)
	e := r.edge("a")
	const nA, nB = 7, 3
	inc := func(n, c uint64) uint64 { return n<<counterBits | c }
	batch := func(epoch, in uint64, seq uint64, req uint64) *hamsv1.ForwardBatch {
		return &hamsv1.ForwardBatch{FromModel: "a", ToModel: "b", Epoch: epoch, Incarnation: in,
			Items: []*hamsv1.Item{{ReqId: req, EdgeSeq: seq}}}
	}
	refused := func(what string, b *hamsv1.ForwardBatch, want string) {
		t.Helper()
		m, err := r.accept(e, "a", b, false)
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), want) || m != 0 {
			t.Fatalf("%s: max_in_order %d, %v; want a refusal naming %q", what, m, err, want)
		}
	}
	ok := func(what string, b *hamsv1.ForwardBatch, wantMax uint64) {
		t.Helper()
		m, err := r.accept(e, "a", b, false)
		if err != nil || m != wantMax {
			t.Fatalf("%s: max_in_order %d, %v; want %d", what, m, err, wantMax)
		}
	}
	ok("A", batch(1, inc(nA, 2), 1, 1), 1)
	ok("A", batch(1, inc(nA, 2), 2, 2), 2)
	refused("A's previous incarnation (an old stream's tail)", batch(1, inc(nA, 1), 3, 3), staleIncarnation)
	ok("B replaces A (lower nonce and counter)", batch(1, inc(nB, 1), 1, 10), 1)
	refused("A again", batch(1, inc(nA, 2), 3, 3), staleIncarnation)
	refused("A, an older incarnation", batch(1, inc(nA, 1), 1, 4), staleIncarnation)
	ok("B goes on", batch(1, inc(nB, 1), 2, 11), 2)
	refused("C at a lower epoch", batch(0, inc(99, 1), 1, 20), "stale epoch")
	ok("B still goes on", batch(1, inc(nB, 1), 3, 12), 3)
	ok("A takes the edge back with a newer incarnation", batch(1, inc(nA, 3), 1, 5), 1)
	refused("B after A took it back", batch(1, inc(nB, 1), 4, 13), staleIncarnation)
	ok("2^64-1", batch(1, math.MaxUint64, 1, 30), 1)
	ok("B's newer incarnation after 2^64-1", batch(1, inc(nB, 2), 1, 14), 1)
	if got := sk.items["a"]; len(got) != 8 {
		t.Fatalf("delivered %v", got)
	}

	// The memory of replaced nonces is bounded.
	for n := uint64(100); n < 100+3*MaxRetiredNonces; n++ {
		ok("another process", batch(1, inc(n, 1), 1, n), 1)
	}
	if len(e.inc.retired) > MaxRetiredNonces || len(e.inc.retiredOrder) != len(e.inc.retired) {
		t.Fatalf("%d retired nonces (%d in order), bound %d", len(e.inc.retired), len(e.inc.retiredOrder), MaxRetiredNonces)
	}
}

// Over the network: B, another process on the same edge and epoch, takes
// over; A, still running, is refused (its owner hears of it through
// OnStaleIncarnation) and B's traffic is undisturbed.
func TestStaleSenderRefusedOverTheNetwork(t *testing.T) {
	sk := newSink()
	r := NewReceiver("b", sk.deliver, nil)
	lis := listen(t, "127.0.0.1:0")
	defer serve(t, lis, r)()
	res := NewStaticResolver(map[string]string{"b": lis.Addr().String()})
	var staleA atomic.Int32
	a, stopA := startSender(t, SenderConfig{From: "a", To: "b", Resolver: res, Incarnations: NewIncarnationSourceNonce(5),
		MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, OnStaleIncarnation: func() { staleA.Add(1) }})
	defer stopA()
	a.Send(&hamsv1.Item{ReqId: 1})
	waitFor(t, "A's item", func() bool { return sk.count("a") == 1 })
	b, stopB := startSender(t, SenderConfig{From: "a", To: "b", Resolver: res, Incarnations: NewIncarnationSourceNonce(4)})
	defer stopB()
	b.Send(&hamsv1.Item{ReqId: 100})
	waitFor(t, "B's item", func() bool { return sk.count("a") == 2 })
	a.Send(&hamsv1.Item{ReqId: 2})
	waitFor(t, "A refused as stale", func() bool { return staleA.Load() > 0 })
	for i := uint64(101); i <= 110; i++ {
		b.Send(&hamsv1.Item{ReqId: i})
	}
	waitFor(t, "B's items", func() bool { return sk.count("a") == 12 })
	sk.mu.Lock()
	defer sk.mu.Unlock()
	for _, id := range sk.items["a"] {
		if id == 2 {
			t.Fatalf("the replaced sender's item was delivered: %v", sk.items["a"])
		}
	}
}

// A restarted sender resending what its predecessor delivered (a promoted
// instance's conservative resend) is deduplicated by request key across
// the change of process.
func TestResendDedupAcrossSenderRestart(t *testing.T) {
	sk := newSink()
	r := NewReceiver("b", sk.deliver, nil, WithDedup(0, nil))
	lis := listen(t, "127.0.0.1:0")
	defer serve(t, lis, r)()
	res := NewStaticResolver(map[string]string{"b": lis.Addr().String()})
	item := func(id uint64) *hamsv1.Item {
		return &hamsv1.Item{ReqId: id, Lineage: []*hamsv1.LineageEntry{{PredModel: "frontend", PredSeq: id, Model: "a", Seq: id}}}
	}
	old, stopOld := startSender(t, SenderConfig{From: "a", To: "b", Resolver: res, Incarnations: NewIncarnationSourceNonce(9)})
	for i := uint64(1); i <= 5; i++ {
		old.Send(item(i))
	}
	waitFor(t, "the old sender's items", func() bool { return sk.count("a") == 5 })
	stopOld()
	snd, stop := startSender(t, SenderConfig{From: "a", To: "b", Resolver: res, Incarnations: NewIncarnationSourceNonce(2),
		Now: func() time.Time { return time.Now().Add(-time.Hour) }})
	defer stop()
	for i := uint64(3); i <= 7; i++ {
		snd.Send(item(i))
	}
	waitFor(t, "the new items", func() bool { return sk.count("a") == 7 })
	waitFor(t, "acked", func() bool { return snd.Backlog() == 0 })
	sk.mu.Lock()
	defer sk.mu.Unlock()
	if got := sk.items["a"]; len(got) != 7 || got[5] != 6 || got[6] != 7 || r.Duplicates() != 3 {
		t.Fatalf("delivered %v, %d duplicates; want 1..7 and 3 duplicates", got, r.Duplicates())
	}
}

// Incarnations of one source grow within a nonce; a counter overflow moves
// to another nonce.
func TestIncarnationSource(t *testing.T) {
	s := NewIncarnationSource()
	a, b := s.Next(), s.Next()
	if IncarnationNonce(a) == 0 || IncarnationNonce(a) != IncarnationNonce(b) || IncarnationCounter(b) != IncarnationCounter(a)+1 {
		t.Fatalf("incarnations %x then %x", a, b)
	}
	if n := NewIncarnationSource().Next(); IncarnationNonce(n) == IncarnationNonce(a) {
		t.Fatalf("two sources share nonce %x", IncarnationNonce(n))
	}
	f := NewIncarnationSourceNonce(3)
	f.counter = 1<<counterBits - 1
	if n := f.Next(); IncarnationNonce(n) != 4 || IncarnationCounter(n) != 1 {
		t.Fatalf("after overflow %x", n)
	}
	s.counter = 1<<counterBits - 1
	if n := s.Next(); IncarnationNonce(n) == IncarnationNonce(a) || IncarnationCounter(n) != 1 {
		t.Fatalf("after overflow %x (nonce was %x)", n, IncarnationNonce(a))
	}
}

// The wire copy carries every field of the item but the local deadline,
// which becomes the time left; the original is untouched.
func TestWireItemCopiesEveryField(t *testing.T) {
	it := &hamsv1.Item{}
	m := it.ProtoReflect()
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		var v protoreflect.Value
		switch {
		case fd.IsList():
			l := m.Mutable(fd).List()
			l.Append(l.NewElement())
			continue
		case fd.IsMap():
			m.Mutable(fd).Map().Set(protoreflect.ValueOfString("k").MapKey(), protoreflect.ValueOfString("v"))
			continue
		case fd.Kind() == protoreflect.StringKind:
			v = protoreflect.ValueOfString("x")
		case fd.Kind() == protoreflect.BoolKind:
			v = protoreflect.ValueOfBool(true)
		case fd.Kind() == protoreflect.Uint64Kind:
			v = protoreflect.ValueOfUint64(7)
		case fd.Kind() == protoreflect.Int64Kind:
			v = protoreflect.ValueOfInt64(7)
		case fd.Kind() == protoreflect.Int32Kind:
			v = protoreflect.ValueOfInt32(7)
		default:
			t.Fatalf("field %s of kind %v: teach this test (and cloneItem) about it", fd.Name(), fd.Kind())
		}
		m.Set(fd, v)
	}
	it.DeadlineUnixNano = 5_000
	it.DeadlineRemainingNano = 0
	w := wireItem(it, 1_000)
	if w == it || it.DeadlineUnixNano != 5_000 || it.DeadlineRemainingNano != 0 {
		t.Fatalf("the original changed or was sent: %v", it)
	}
	if w.DeadlineUnixNano != 0 || w.DeadlineRemainingNano != 4_000 {
		t.Fatalf("wire deadline %d, remaining %d", w.DeadlineUnixNano, w.DeadlineRemainingNano)
	}
	wm := w.ProtoReflect()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if fd.Name() == "deadline_unix_nano" || fd.Name() == "deadline_remaining_nano" {
			continue
		}
		if !wm.Has(fd) {
			t.Errorf("wire copy lost field %s", fd.Name())
		}
	}
	if plain := (&hamsv1.Item{ReqId: 1}); wireItem(plain, 1_000) != plain {
		t.Fatal("an item without a deadline was copied")
	}
}

func TestDeadlineConversion(t *testing.T) {
	for _, c := range []struct{ now, deadline, remaining, back int64 }{
		{1_000, 0, 0, 0},
		{1_000, 1_500, 500, 1_500},
		{1_000, 1_000, -1, 999},
		{1_000, 400, -600, 400},
		{math.MaxInt64 - 10, 5, 5 - (math.MaxInt64 - 10), 5},
		{-10, math.MaxInt64, math.MaxInt64, math.MaxInt64 - 10},
	} {
		if got := remainingNano(c.now, c.deadline); got != c.remaining {
			t.Errorf("remainingNano(%d, %d) = %d, want %d", c.now, c.deadline, got, c.remaining)
		}
		if got := localDeadline(c.now, c.remaining); got != c.back {
			t.Errorf("localDeadline(%d, %d) = %d, want %d", c.now, c.remaining, got, c.back)
		}
	}
	if got := localDeadline(math.MaxInt64-5, 10); got != math.MaxInt64 {
		t.Errorf("localDeadline overflow: %d", got)
	}
	if got := localDeadline(5, -10); got != 1 {
		t.Errorf("an expired deadline before the epoch became %d, want 1 (not 0: none)", got)
	}
}
