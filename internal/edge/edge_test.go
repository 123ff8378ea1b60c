package edge

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/grpcx"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// sink collects delivered items.
type sink struct {
	mu    sync.Mutex
	items map[string][]uint64 // from -> req ids in delivery order
	seqs  map[string][]uint64
}

func newSink() *sink { return &sink{items: map[string][]uint64{}, seqs: map[string][]uint64{}} }

func (s *sink) deliver(from string, items []*hamsv1.Item) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, it := range items {
		s.items[from] = append(s.items[from], it.ReqId)
		s.seqs[from] = append(s.seqs[from], it.EdgeSeq)
	}
}

func (s *sink) count(from string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.items[from])
}

func serve(t *testing.T, lis net.Listener, r *Receiver) (stop func()) {
	t.Helper()
	srv := grpc.NewServer()
	hamsv1.RegisterDataplaneServer(srv, r)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	return func() { srv.Stop(); <-done }
}

func listen(t *testing.T, addr string) net.Listener {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		lis, err := net.Listen("tcp", addr)
		if err == nil {
			return lis
		}
		if time.Now().After(deadline) {
			t.Fatalf("listen %s: %v", addr, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func startSender(t *testing.T, cfg SenderConfig) (*Sender, func()) {
	t.Helper()
	s, err := NewSender(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	return s, func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sender Run: %v", err)
		}
	}
}

func TestSenderReceiverLoopback(t *testing.T) {
	sk := newSink()
	rcv := NewReceiver("b", sk.deliver, nil)
	lis := listen(t, "127.0.0.1:0")
	stop := serve(t, lis, rcv)
	defer stop()
	res := NewStaticResolver(map[string]string{"b": lis.Addr().String()})
	s, stopS := startSender(t, SenderConfig{From: "a", To: "b", Resolver: res})
	defer stopS()
	const n = 1000
	for i := 1; i <= n; i++ {
		s.Send(&hamsv1.Item{ReqId: uint64(i)})
	}
	waitFor(t, "all items delivered", func() bool { return sk.count("a") == n })
	waitFor(t, "all items acked", func() bool { return s.Backlog() == 0 })
	for i, id := range sk.items["a"] {
		if id != uint64(i+1) || sk.seqs["a"][i] != uint64(i+1) {
			t.Fatalf("item %d: req %d seq %d", i, id, sk.seqs["a"][i])
		}
	}
	if rcv.MaxInOrder("a") != n || s.MaxAcked() != n || s.LastSeq() != n {
		t.Fatalf("max_in_order %d acked %d last %d", rcv.MaxInOrder("a"), s.MaxAcked(), s.LastSeq())
	}
	if got := rcv.MaxInByPred(); got["a"] != n || len(got) != 1 {
		t.Fatalf("MaxInByPred %v", got)
	}
}

// The receiver's server goes down mid-stream (items in flight are lost with
// it) and comes back on the same address: the sender reconnects, resends its
// unacked items, the receiver drops the duplicates; every item arrives once.
func TestReceiverRestartMidStream(t *testing.T) {
	sk := newSink()
	rcv := NewReceiver("b", sk.deliver, nil)
	lis := listen(t, "127.0.0.1:0")
	addr := lis.Addr().String()
	stop := serve(t, lis, rcv)
	res := NewStaticResolver(map[string]string{"b": addr})
	s, stopS := startSender(t, SenderConfig{From: "a", To: "b", Resolver: res, MaxBatchItems: 7})
	defer stopS()
	for i := 1; i <= 300; i++ {
		s.Send(&hamsv1.Item{ReqId: uint64(i)})
	}
	waitFor(t, "first items", func() bool { return sk.count("a") >= 50 })
	stop()
	// Items sent while the receiver is down must wait in the backlog.
	for i := 301; i <= 600; i++ {
		s.Send(&hamsv1.Item{ReqId: uint64(i)})
	}
	if s.Backlog() == 0 {
		t.Fatal("backlog empty while receiver is down")
	}
	stop = serve(t, listen(t, addr), rcv)
	defer stop()
	for i := 601; i <= 900; i++ {
		s.Send(&hamsv1.Item{ReqId: uint64(i)})
	}
	waitFor(t, "all delivered", func() bool { return sk.count("a") >= 900 })
	waitFor(t, "all acked", func() bool { return s.Backlog() == 0 })
	sk.mu.Lock()
	defer sk.mu.Unlock()
	if len(sk.items["a"]) != 900 {
		t.Fatalf("delivered %d items, want 900 (duplicates?)", len(sk.items["a"]))
	}
	for i, id := range sk.items["a"] {
		if id != uint64(i+1) {
			t.Fatalf("delivery %d is req %d", i, id)
		}
	}
	if st := s.Stats(); st.Reconnects == 0 {
		t.Fatalf("no reconnect recorded: %+v", st)
	}
}

// A duplicate resend of already-delivered items (two overlapping streams of
// one edge) is dropped.
func TestReceiverDropsResentDuplicates(t *testing.T) {
	sk := newSink()
	rcv := NewReceiver("b", sk.deliver, nil)
	lis := listen(t, "127.0.0.1:0")
	defer serve(t, lis, rcv)()
	cc, err := grpcx.Dial(lis.Addr().String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := hamsv1.NewDataplaneClient(cc).Forward(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(seqs ...uint64) *hamsv1.ForwardAck {
		b := &hamsv1.ForwardBatch{FromModel: "a", ToModel: "b"}
		for _, s := range seqs {
			b.Items = append(b.Items, &hamsv1.Item{EdgeSeq: s, ReqId: s})
		}
		if err := st.Send(b); err != nil {
			t.Fatal(err)
		}
		ack, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return ack
	}
	if a := send(1, 2, 4); a.MaxInOrder != 2 {
		t.Fatalf("ack %d", a.MaxInOrder)
	}
	if a := send(1, 2, 3, 4, 4); a.MaxInOrder != 4 {
		t.Fatalf("ack %d", a.MaxInOrder)
	}
	if sk.count("a") != 4 {
		t.Fatalf("delivered %v", sk.items["a"])
	}
}

func TestReceiverRejects(t *testing.T) {
	rcv := NewReceiver("b", func(string, []*hamsv1.Item) {}, nil, WithMaxPending(4))
	lis := listen(t, "127.0.0.1:0")
	defer serve(t, lis, rcv)()
	cc, err := grpcx.Dial(lis.Addr().String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cases := []struct {
		name  string
		batch *hamsv1.ForwardBatch
		code  codes.Code
	}{
		{"wrong receiver", &hamsv1.ForwardBatch{FromModel: "a", ToModel: "c"}, codes.NotFound},
		{"no sender", &hamsv1.ForwardBatch{ToModel: "b"}, codes.InvalidArgument},
		{"zero seq", &hamsv1.ForwardBatch{FromModel: "a", ToModel: "b", Items: []*hamsv1.Item{{}}}, codes.InvalidArgument},
		// (Past the bound within a stream: a stream's first batch starts
		// where its sender's unacknowledged items do, and is joined there.)
		{"too far ahead", &hamsv1.ForwardBatch{FromModel: "a", ToModel: "b", Items: []*hamsv1.Item{{EdgeSeq: 1}, {EdgeSeq: 99}}}, codes.ResourceExhausted},
		{"epoch up", &hamsv1.ForwardBatch{FromModel: "a", ToModel: "b", Epoch: 3}, codes.OK},
		{"stale epoch", &hamsv1.ForwardBatch{FromModel: "a", ToModel: "b", Epoch: 2}, codes.FailedPrecondition},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			st, err := hamsv1.NewDataplaneClient(cc).Forward(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Send(c.batch); err != nil {
				t.Fatal(err)
			}
			_ = st.CloseSend()
			var last error
			for {
				_, err := st.Recv()
				if err != nil {
					last = err
					break
				}
			}
			if errors.Is(last, io.EOF) {
				last = nil
			}
			if got := status.Code(last); got != c.code {
				t.Fatalf("code %v (%v), want %v", got, last, c.code)
			}
		})
	}
}

func TestSenderFollowsResolver(t *testing.T) {
	sk1, sk2 := newSink(), newSink()
	l1, l2 := listen(t, "127.0.0.1:0"), listen(t, "127.0.0.1:0")
	defer serve(t, l1, NewReceiver("b", sk1.deliver, nil))()
	r2 := NewReceiver("b", sk2.deliver, nil)
	defer serve(t, l2, r2)()
	res := NewStaticResolver(nil) // unresolvable at first
	s, stopS := startSender(t, SenderConfig{From: "a", To: "b", Resolver: res})
	defer stopS()
	s.Send(&hamsv1.Item{ReqId: 1})
	res.Set("b", l1.Addr().String(), 1)
	waitFor(t, "first receiver", func() bool { return sk1.count("a") == 1 })
	waitFor(t, "ack", func() bool { return s.Backlog() == 0 })
	// The new receiver took over from max_in_order 1 (recovery restores it).
	r2.Restore("a", 1)
	res.Set("b", l2.Addr().String(), 2)
	s.Send(&hamsv1.Item{ReqId: 2})
	waitFor(t, "second receiver", func() bool { return sk2.count("a") == 1 })
	if sk1.count("a") != 1 && sk1.count("a") != 2 {
		t.Fatalf("first receiver got %d", sk1.count("a"))
	}
}

func TestSenderBackpressure(t *testing.T) {
	res := NewStaticResolver(nil)
	s, err := NewSender(SenderConfig{From: "a", To: "b", Resolver: res, MaxBacklog: 3})
	if err != nil {
		t.Fatal(err)
	}
	s.Send(&hamsv1.Item{}, &hamsv1.Item{})
	if s.Full() {
		t.Fatal("full at 2 of 3")
	}
	s.Send(&hamsv1.Item{})
	if !s.Full() {
		t.Fatal("not full at 3 of 3")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := s.WaitNotFull(ctx); err == nil {
		t.Fatal("WaitNotFull returned while full")
	}
	done := make(chan error, 1)
	go func() { done <- s.WaitNotFull(context.Background()) }()
	s.ack(0, 2)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestNewSenderValidates(t *testing.T) {
	for _, cfg := range []SenderConfig{{To: "b", Resolver: NewStaticResolver(nil)}, {From: "a", Resolver: NewStaticResolver(nil)}, {From: "a", To: "b"}} {
		if _, err := NewSender(cfg); err == nil {
			t.Fatalf("accepted %+v", cfg)
		}
	}
}

// lossyAcks breaks a stream when it tries to send its k-th ack: the items
// of that batch were delivered but never acknowledged (a crash between
// delivery and ack).
type lossyAcks struct {
	hamsv1.UnimplementedDataplaneServer
	r      *Receiver
	mu     sync.Mutex
	breaks int
	wg     sync.WaitGroup // the receivers' Forward calls
}

type breakingStream struct {
	hamsv1.Dataplane_ForwardServer
	n, k   int
	broken chan struct{}
}

// Send fails the k-th ack and marks the stream broken.
func (b *breakingStream) Send(a *hamsv1.ForwardAck) error {
	b.n++
	if b.n == b.k {
		close(b.broken)
		return status.Error(codes.Unavailable, "injected ack loss")
	}
	return b.Dataplane_ForwardServer.Send(a)
}

// Forward ends the RPC when the stream breaks, as a transport failure
// does (the receiver's blocked Recv then fails too).
func (l *lossyAcks) Forward(st hamsv1.Dataplane_ForwardServer) error {
	l.mu.Lock()
	k := 0
	if l.breaks > 0 {
		l.breaks--
		k = 1
	}
	l.mu.Unlock()
	bs := &breakingStream{Dataplane_ForwardServer: st, k: k, broken: make(chan struct{})}
	done := make(chan error, 1)
	l.wg.Add(1)
	go func() { defer l.wg.Done(); done <- l.r.Forward(bs) }()
	select {
	case err := <-done:
		return err
	case <-bs.broken:
		return status.Error(codes.Unavailable, "injected ack loss")
	}
}

func TestUnackedItemsResentAndDeduplicated(t *testing.T) {
	sk := newSink()
	rcv := NewReceiver("b", sk.deliver, nil)
	srv := grpc.NewServer()
	la := &lossyAcks{r: rcv, breaks: 3}
	hamsv1.RegisterDataplaneServer(srv, la)
	lis := listen(t, "127.0.0.1:0")
	go func() { _ = srv.Serve(lis) }()
	defer la.wg.Wait()
	defer srv.Stop()
	res := NewStaticResolver(map[string]string{"b": lis.Addr().String()})
	s, stopS := startSender(t, SenderConfig{From: "a", To: "b", Resolver: res, MaxBatchItems: 5})
	defer stopS()
	for i := 1; i <= 500; i++ {
		s.Send(&hamsv1.Item{ReqId: uint64(i)})
	}
	waitFor(t, "all acked", func() bool { return s.Backlog() == 0 })
	st := s.Stats()
	if st.Reconnects < 3 || st.Resent == 0 {
		t.Fatalf("expected 3 broken streams with resends, got %+v", st)
	}
	sk.mu.Lock()
	defer sk.mu.Unlock()
	if len(sk.items["a"]) != 500 {
		t.Fatalf("delivered %d, want 500", len(sk.items["a"]))
	}
	for i, id := range sk.items["a"] {
		if id != uint64(i+1) {
			t.Fatalf("delivery %d is req %d", i, id)
		}
	}
}

// forwardTo opens a Forward stream to a Receiver of "b" serving on a
// local listener and returns it with send, which sends one batch of
// sender incarnation inc from "a" (items with the given edge_seqs, req_id
// 10000*inc+seq) and returns the acknowledgement.
func forwardTo(t *testing.T, rcv *Receiver) (hamsv1.Dataplane_ForwardClient, func(inc uint64, seqs ...uint64) *hamsv1.ForwardAck) {
	t.Helper()
	lis := listen(t, "127.0.0.1:0")
	t.Cleanup(serve(t, lis, rcv))
	cc, err := grpcx.Dial(lis.Addr().String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	st, err := hamsv1.NewDataplaneClient(cc).Forward(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(inc uint64, seqs ...uint64) *hamsv1.ForwardAck {
		t.Helper()
		b := &hamsv1.ForwardBatch{FromModel: "a", ToModel: "b", Incarnation: inc}
		for _, s := range seqs {
			b.Items = append(b.Items, &hamsv1.Item{EdgeSeq: s, ReqId: 10000*inc + s})
		}
		if err := st.Send(b); err != nil {
			t.Fatal(err)
		}
		ack, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return ack
	}
	return st, send
}

// A restarted sender (higher incarnation) numbers the edge afresh from 1: its
// items are delivered, not dropped as duplicates of the old incarnation's.
func TestReceiverResetsSequenceOnNewEpoch(t *testing.T) {
	sk := newSink()
	st, send := forwardTo(t, NewReceiver("b", sk.deliver, nil))
	if a := send(1, 1, 2, 3); a.MaxInOrder != 3 {
		t.Fatalf("ack %d", a.MaxInOrder)
	}
	if a := send(2, 1, 2); a.MaxInOrder != 2 {
		t.Fatalf("ack after restart %d, want 2", a.MaxInOrder)
	}
	if sk.count("a") != 5 {
		t.Fatalf("delivered %d items, want 5 (3 before and 2 after the restart)", sk.count("a"))
	}
	// The old incarnation's stream, still draining, is refused.
	b := &hamsv1.ForwardBatch{FromModel: "a", ToModel: "b", Incarnation: 1, Items: []*hamsv1.Item{{EdgeSeq: 4}}}
	if err := st.Send(b); err != nil {
		t.Fatal(err)
	}
	var last error
	for last == nil {
		var ack *hamsv1.ForwardAck
		ack, last = st.Recv()
		if last == nil && ack.Error == "" {
			t.Fatalf("stale incarnation acknowledged: %v", ack)
		}
	}
	if status.Code(last) != codes.FailedPrecondition {
		t.Fatalf("stale incarnation: %v", last)
	}
}

// A restarted receiver (fresh state) meets a sender that kept its
// sequence space: it starts at the sender's first unacknowledged item
// instead of holding everything while waiting for seq 1.
func TestFreshReceiverJoinsMidSequence(t *testing.T) {
	sk := newSink()
	rcv := NewReceiver("b", sk.deliver, nil)
	lis := listen(t, "127.0.0.1:0")
	defer serve(t, lis, rcv)()
	cc, err := grpcx.Dial(lis.Addr().String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := hamsv1.NewDataplaneClient(cc).Forward(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b := &hamsv1.ForwardBatch{FromModel: "a", ToModel: "b", Incarnation: 7}
	for s := uint64(5); s <= 6; s++ {
		b.Items = append(b.Items, &hamsv1.Item{EdgeSeq: s, ReqId: s})
	}
	if err := st.Send(b); err != nil {
		t.Fatal(err)
	}
	ack, err := st.Recv()
	if err != nil || ack.MaxInOrder != 6 || sk.count("a") != 2 {
		t.Fatalf("ack %v err %v delivered %d; want items 5 and 6 delivered", ack, err, sk.count("a"))
	}
}

// A receiver that took items of one sender incarnation meets a newer one
// whose numbering began at another receiver (a frontend leading again
// after another frontend led, whose takeover's resend could not reach the
// sink): it starts at the sender's first unacknowledged item. It waited
// for item 1 of the new incarnation before and refused every batch as too
// far ahead, for good (a 30-minute soak, 2026-11-27).
func TestReceiverJoinsNewIncarnationMidSequence(t *testing.T) {
	sk := newSink()
	_, send := forwardTo(t, NewReceiver("b", sk.deliver, nil))
	if a := send(1, 1, 2, 3); a.MaxInOrder != 3 || a.Error != "" {
		t.Fatalf("ack %v", a)
	}
	first := uint64(DefaultMaxPending + 2700) // beyond the reorder bound from 0
	if a := send(2, first, first+1); a.MaxInOrder != first+1 || a.Error != "" {
		t.Fatalf("ack of the new incarnation's first batch %v, want max_in_order %d", a, first+1)
	}
	if a := send(2, first+2); a.MaxInOrder != first+2 || a.Error != "" {
		t.Fatalf("ack of the next batch %v, want max_in_order %d", a, first+2)
	}
	if n := sk.count("a"); n != 6 {
		t.Fatalf("delivered %d items, want 6 (3 of the first incarnation, 3 of the second)", n)
	}
}

// A receiver that stopped receiving while its sender went on numbering the
// edge at another instance with the same incarnation (a sidecar demoted,
// another instance took the edge; a frontend that lost the lead), and that
// receives again later, starts at the sender's first unacknowledged item:
// it does not wait for the items the other instance acknowledged. A
// demoted sidecar forgets its edges (Forget); a frontend that leads again
// does not, and waited for them for good, or, when they were more than its
// reorder bound, refused every batch as too far ahead (a 30-minute soak,
// 2026-11-27, after its takeover's resend did not reach the sink).
func TestReceiverBackFromAnotherStartsWhereTheSenderStands(t *testing.T) {
	for _, c := range []struct {
		name      string
		forget    bool
		elsewhere int // items the other receiver takes meanwhile
	}{
		{"forgotten", true, 10},
		{"remembered", false, 10},
		{"remembered, past the reorder bound", false, DefaultMaxPending + 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			sk1, sk2 := newSink(), newSink()
			r1, r2 := NewReceiver("b", sk1.deliver, nil), NewReceiver("b", sk2.deliver, nil)
			l1, l2 := listen(t, "127.0.0.1:0"), listen(t, "127.0.0.1:0")
			defer serve(t, l1, r1)()
			defer serve(t, l2, r2)()
			res := NewStaticResolver(map[string]string{"b": l1.Addr().String()})
			s, stopS := startSender(t, SenderConfig{From: "a", To: "b", Resolver: res})
			defer stopS()
			send := func(from, to int) {
				for i := from; i <= to; i++ {
					s.Send(&hamsv1.Item{ReqId: uint64(i)})
				}
			}
			send(1, 10)
			waitFor(t, "1-10 at the first receiver", func() bool { return sk1.count("a") == 10 && s.Backlog() == 0 })
			res.Set("b", l2.Addr().String(), 0)
			send(11, 10+c.elsewhere)
			waitFor(t, "the next items at the second receiver", func() bool { return sk2.count("a") == c.elsewhere && s.Backlog() == 0 })
			if c.forget {
				r1.Forget()
			}
			res.Set("b", l1.Addr().String(), 0)
			first := 11 + c.elsewhere
			send(first, first+9)
			waitFor(t, "10 more at the first receiver again", func() bool { return sk1.count("a") == 20 && s.Backlog() == 0 })
			sk1.mu.Lock()
			defer sk1.mu.Unlock()
			for i, id := range sk1.items["a"][10:] {
				if id != uint64(first+i) {
					t.Fatalf("delivery %d after the return is req %d, want %d", i, id, first+i)
				}
			}
		})
	}
}
