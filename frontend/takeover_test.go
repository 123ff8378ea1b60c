package frontend

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/coord"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// The log mirror (a follower's open requests) as a state machine.
func TestLogMirror(t *testing.T) {
	t0 := time.Unix(1000, 0)
	rec := func(id uint64, deadline time.Duration) *coord.LoggedRequest {
		return &coord.LoggedRequest{ReqID: id, Deadline: t0.Add(deadline)}
	}
	ids := func(rs []*coord.LoggedRequest) []uint64 {
		var out []uint64
		for _, r := range rs {
			out = append(out, r.ReqID)
		}
		return out
	}
	t.Run("open requests come out in log order", func(t *testing.T) {
		m := newLogMirror(10 * time.Second)
		for _, id := range []uint64{5, 3, 9, 4} {
			if !m.logged(rec(id, 5*time.Second), t0) {
				t.Fatalf("record %d not kept", id)
			}
		}
		m.answer(9, t0)
		if got := ids(m.take(t0.Add(time.Second))); !slices.Equal(got, []uint64{5, 3, 4}) {
			t.Fatalf("take: %v, want [5 3 4]", got)
		}
		if m.open() != 0 || len(m.take(t0)) != 0 {
			t.Fatal("take did not empty the mirror")
		}
		if !m.isAnswered(9) || m.isAnswered(5) {
			t.Fatal("take forgot the answers, or made open requests answered")
		}
	})
	t.Run("an answer seen before its record drops the record", func(t *testing.T) {
		m := newLogMirror(10 * time.Second)
		m.answer(7, t0)
		if m.logged(rec(7, 5*time.Second), t0.Add(time.Millisecond)) || m.open() != 0 {
			t.Fatal("answered request kept")
		}
	})
	t.Run("a replayed record is kept once", func(t *testing.T) {
		m := newLogMirror(10 * time.Second)
		m.logged(rec(1, 5*time.Second), t0)
		m.logged(rec(1, 5*time.Second), t0)
		if got := ids(m.take(t0)); !slices.Equal(got, []uint64{1}) {
			t.Fatalf("take: %v", got)
		}
	})
	t.Run("deadlines", func(t *testing.T) {
		m := newLogMirror(10 * time.Second)
		if m.logged(rec(1, 0), t0) {
			t.Fatal("record past its deadline kept")
		}
		m.logged(rec(2, time.Second), t0)
		m.logged(rec(3, 3*time.Second), t0)
		if got := ids(m.take(t0.Add(2 * time.Second))); !slices.Equal(got, []uint64{3}) {
			t.Fatalf("take after 2s: %v, want [3]", got)
		}
	})
	t.Run("answers are forgotten after keep and bounded in number", func(t *testing.T) {
		m := newLogMirror(time.Second)
		m.maxAnswered = 3
		m.answer(1, t0)
		if !m.isAnswered(1) {
			t.Fatal("answer not remembered")
		}
		m.answer(2, t0.Add(2*time.Second))
		if m.isAnswered(1) || !m.isAnswered(2) {
			t.Fatalf("answers after keep: %v", m.answered)
		}
		for id := uint64(3); id < 10; id++ {
			m.answer(id, t0.Add(2*time.Second))
		}
		if len(m.answered) != 3 || len(m.answeredQ) != 3 || !m.isAnswered(9) {
			t.Fatalf("answers kept: %v", m.answered)
		}
	})
	t.Run("order stays bounded by what is open", func(t *testing.T) {
		m := newLogMirror(time.Minute)
		for id := uint64(1); id <= 10000; id++ {
			m.logged(rec(id, time.Minute), t0)
			m.answer(id, t0)
		}
		if m.open() != 0 || len(m.order) > 1024+1 {
			t.Fatalf("open %d, order %d", m.open(), len(m.order))
		}
	})
	t.Run("a nil mirror (no request log) knows nothing", func(t *testing.T) {
		var m *logMirror
		m.answer(1, t0)
		if m.logged(rec(1, time.Second), t0) || m.isAnswered(1) || m.take(t0) != nil {
			t.Fatal("nil mirror kept something")
		}
	})
}

// watchCountingLog counts the request-log watches a frontend opens.
type watchCountingLog struct {
	RequestLog
	watches atomic.Int32
}

func (l *watchCountingLog) WatchRequests(ctx context.Context, lookback time.Duration, fn func(*coord.LoggedRequest, bool)) error {
	l.watches.Add(1)
	return l.RequestLog.WatchRequests(ctx, lookback, fn)
}

// ownReqID reports whether reqID was handed out by f.
func (f *Frontend) ownReqID(reqID uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ownReqIDLocked(reqID)
}

// mirAnswered reports whether f's log mirror saw reqID answered.
func (f *Frontend) mirAnswered(reqID uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mir.isAnswered(reqID)
}

// TestTakeoverInjectsMirroredRequestsWithoutRescan: a follower mirrors the
// log while the leader serves; when the topology names it, it injects the
// dead leader's unanswered request from its mirror at once, on the watch
// it had open all along (no new scan of the log), and leaves the answered
// ones alone.
func TestTakeoverInjectsMirroredRequestsWithoutRescan(t *testing.T) {
	co := openLog(t)
	yaml := fmt.Sprintf(testYAML, "5s")
	e := newEnvWith(t, envOpts{yaml: yaml, config: func(c *Config) { c.Log = co; c.Name = "fe-a" }})
	wl := &watchCountingLog{RequestLog: co}
	fb := e.addFrontend(t, yaml, func(c *Config) { c.Log = wl; c.Name = "fe-b" })
	eventually(t, "leadership settled", func() bool { return e.fe.isLeader() && !fb.fe.isLeader() && wl.watches.Load() == 1 })
	// Answered requests: the follower must not inject them again.
	for i := range 3 {
		e.mustEcho(float32(i))
	}
	req := &hamsv1.PredictRequest{Service: "echo", RequestId: "m-1", StreamId: "hold:a", Inputs: echoInputs(1, 3)}
	first := e.predictAsync(ctxT(t, 10*time.Second), req)
	eventually(t, "request injected by the leader", func() bool { return len(e.fe.pendingIDs()) == 1 })
	orig := e.fe.pendingIDs()[0]
	e.stop()
	if r := await(t, "dead leader's answer", first); status.Code(r.err) != codes.Unavailable {
		t.Fatalf("call on the stopped leader: %v", r.err)
	}
	e.res.set(config.Frontend, fb.addr)
	eventually(t, "b adopted the open request", func() bool {
		ids := fb.fe.pendingIDs()
		return fb.fe.isLeader() && len(ids) == 1 && ids[0] == orig
	})
	if got := counterValue(fb.fe.m.adopted); got != 1 {
		t.Fatalf("survivor adopted %v requests, want 1 (the answered ones are not open)", got)
	}
	if n := wl.watches.Load(); n != 1 {
		t.Fatalf("request-log watches %d, want 1: the takeover scanned the log again", n)
	}
	if n := e.models["a"].executed.Load(); n != 3 {
		t.Fatalf("a executed %d times before the open request was let through, want 3 (the answered ones, once each)", n)
	}
	close(e.models["a"].gate)
	retry, err := fb.client.Predict(ctxT(t, 5*time.Second), req)
	if err != nil || retry.GetReqId() != orig {
		t.Fatalf("retry on the survivor: %v %v", retry, err)
	}
}

// blindLog is a request log whose watch delivers nothing (a consumer
// still deep in its backlog).
type blindLog struct{ RequestLog }

func (blindLog) WatchRequests(ctx context.Context, _ time.Duration, _ func(*coord.LoggedRequest, bool)) error {
	<-ctx.Done()
	return nil
}

// TestJoinedAttemptInjectedByLeader: a client retries the request of a
// dead leader on the new leader, whose log consumer has not reached the
// record yet: the retry joins the logged attempt and the leader injects it
// at once (a look-up begun while it leads finds no answer), with the
// original req_id.
func TestJoinedAttemptInjectedByLeader(t *testing.T) {
	co := openLog(t)
	yaml := fmt.Sprintf(testYAML, "5s")
	e := newEnvWith(t, envOpts{yaml: yaml, config: func(c *Config) { c.Log = co; c.Name = "fe-a" }})
	fb := e.addFrontend(t, yaml, func(c *Config) { c.Log = blindLog{co}; c.Name = "fe-b" })
	eventually(t, "leadership settled", func() bool { return e.fe.isLeader() && !fb.fe.isLeader() })
	req := &hamsv1.PredictRequest{Service: "echo", RequestId: "j-1", StreamId: "hold:a", Inputs: echoInputs(1, 5)}
	first := e.predictAsync(ctxT(t, 10*time.Second), req)
	eventually(t, "request injected by the leader", func() bool { return len(e.fe.pendingIDs()) == 1 })
	orig := e.fe.pendingIDs()[0]
	e.stop()
	if r := await(t, "dead leader's answer", first); status.Code(r.err) != codes.Unavailable {
		t.Fatalf("call on the stopped leader: %v", r.err)
	}
	e.res.set(config.Frontend, fb.addr)
	eventually(t, "b leads", fb.fe.isLeader)
	if n := len(fb.fe.pendingIDs()); n != 0 {
		t.Fatalf("b injected %d requests without a log consumer", n)
	}
	retry := make(chan result, 1)
	go func() {
		resp, err := fb.client.Predict(ctxT(t, 10*time.Second), req)
		retry <- result{resp, err}
	}()
	eventually(t, "b injected the joined attempt", func() bool {
		ids := fb.fe.pendingIDs()
		return len(ids) == 1 && ids[0] == orig
	})
	close(e.models["a"].gate)
	r := await(t, "retry on b", retry)
	if r.err != nil || r.resp.GetReqId() != orig {
		t.Fatalf("retry on the new leader: %v %v, want req_id %d", r.resp, r.err, orig)
	}
}

// lagLog is a request log whose deliveries lag behind JetStream as the
// test says, the way a loaded follower's do: while holdRequests is set the
// request consumer's records are held (the consumer is behind the log);
// while holdReplies is set the reply watch's records are held (a reply
// record on its way); while blockAcks is set LogRequest returns only
// after releaseAcks (the record is stored, its acknowledgement late).
// Held records are delivered in order, on release, through the watch's
// own callback, never concurrently with its other deliveries.
type lagLog struct {
	RequestLog
	mu           sync.Mutex // serialises deliveries (a watch calls fn on one goroutine)
	holdRequests bool
	holdReplies  bool
	heldReqs     []func()
	heldReplies  []func()
	acks         chan struct{} // nil: acks are not blocked
	stored       atomic.Int32  // LogRequest calls whose record is stored
	delivered    atomic.Int32  // request records delivered as they came
}

func (l *lagLog) WatchRequests(ctx context.Context, lookback time.Duration, fn func(*coord.LoggedRequest, bool)) error {
	return l.RequestLog.WatchRequests(ctx, lookback, func(r *coord.LoggedRequest, backlog bool) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.holdRequests {
			l.heldReqs = append(l.heldReqs, func() { fn(r, backlog) })
			return
		}
		fn(r, backlog)
		l.delivered.Add(1)
	})
}

func (l *lagLog) WatchReplies(ctx context.Context, fn func(*coord.LoggedReply)) error {
	return l.RequestLog.WatchReplies(ctx, func(r *coord.LoggedReply) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.holdReplies {
			l.heldReplies = append(l.heldReplies, func() { fn(r) })
			return
		}
		fn(r)
	})
}

func (l *lagLog) LogRequest(ctx context.Context, r *coord.LoggedRequest) (*coord.LoggedRequest, error) {
	ex, err := l.RequestLog.LogRequest(ctx, r)
	l.stored.Add(1)
	l.mu.Lock()
	acks := l.acks
	l.mu.Unlock()
	if acks != nil {
		<-acks
	}
	return ex, err
}

func (l *lagLog) set(fn func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fn()
}

// releaseRequests delivers the held request records (the consumer
// catches up) and returns once the callback returned for each.
func (l *lagLog) releaseRequests() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.holdRequests = false
	for _, d := range l.heldReqs {
		d()
	}
	l.heldReqs = nil
}

// releaseReplies delivers the held reply records (late).
func (l *lagLog) releaseReplies() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.holdReplies = false
	for _, d := range l.heldReplies {
		d()
	}
	l.heldReplies = nil
}

func (l *lagLog) releaseAcks() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.acks != nil {
		close(l.acks)
		l.acks = nil
	}
}

// TestTakeoverLateRecordOfAnsweredRequest is the race that broke the first
// fast takeover: the leader answered a request (its reply record is in
// JetStream), and died; the new leader's log consumer delivers that
// request's record only after the takeover, and its reply watch has not
// delivered the reply record yet (both lag on a loaded machine). The new
// leader must look the answer up before it injects such a record, not
// inject it as a new one: the request is not run again, and a client
// re-asking it gets the recorded answer.
func TestTakeoverLateRecordOfAnsweredRequest(t *testing.T) {
	co := openLog(t)
	yaml := fmt.Sprintf(testYAML, "5s")
	e := newEnvWith(t, envOpts{yaml: yaml, config: func(c *Config) { c.Log = co; c.Name = "fe-a" }})
	ll := &lagLog{RequestLog: co}
	fb := e.addFrontend(t, yaml, func(c *Config) { c.Log = ll; c.Name = "fe-b" })
	eventually(t, "leadership settled", func() bool { return e.fe.isLeader() && !fb.fe.isLeader() })
	// b's consumer is past its start: the records from here on are new to
	// it (not backlog, which a consumer looks up anyway).
	e.mustEcho(1)
	eventually(t, "b's consumer delivered a record", func() bool { return ll.delivered.Load() >= 1 })
	ll.set(func() { ll.holdRequests, ll.holdReplies = true, true })

	req := &hamsv1.PredictRequest{Service: "echo", RequestId: "late-1", Inputs: echoInputs(1, 4)}
	resp, err := e.client.Predict(ctxT(t, 5*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	e.stop()
	e.res.set(config.Frontend, fb.addr)
	eventually(t, "b leads", fb.fe.isLeader)

	// The consumer catches up after the takeover; the reply record is
	// still on its way.
	ll.releaseRequests()
	eventually(t, "b looked the late record's answer up", func() bool { return fb.fe.mirAnswered(resp.ReqId) })
	if got := counterValue(fb.fe.m.adopted); got != 0 {
		t.Fatalf("the new leader injected %v answered requests", got)
	}
	// The client re-asks it on the new leader: the recorded answer.
	again, err := fb.client.Predict(ctxT(t, 5*time.Second), req)
	if err != nil || !proto.Equal(again, resp) {
		t.Fatalf("re-asked answered request on the new leader: %v %v, want %v", again, err, resp)
	}
	ll.releaseReplies()
	if n := e.models["a"].executed.Load(); n != 2 {
		t.Fatalf("a executed %d times, want 2 (the warm-up and the request, once each): the answered request ran again", n)
	}
	if got := counterValue(fb.fe.m.recorded.WithLabelValues("own")); got != 0 {
		t.Fatalf("the new leader recorded %v answers of its own", got)
	}
	eventually(t, "no state left on b", func() bool {
		fb.fe.mu.Lock()
		defer fb.fe.mu.Unlock()
		return fb.fe.table.len()+len(fb.fe.calls)+len(fb.fe.inflight) == 0
	})
}

// TestTakeoverMirroredRequestWithLateReplyRecord: the follower's mirror
// holds an answered request as open (its reply record has not reached the
// reply watch) when it takes over: the takeover looks it up and does not
// inject it.
func TestTakeoverMirroredRequestWithLateReplyRecord(t *testing.T) {
	co := openLog(t)
	yaml := fmt.Sprintf(testYAML, "5s")
	e := newEnvWith(t, envOpts{yaml: yaml, config: func(c *Config) { c.Log = co; c.Name = "fe-a" }})
	wl := &watchCountingLog{RequestLog: co}
	ll := &lagLog{RequestLog: wl}
	fb := e.addFrontend(t, yaml, func(c *Config) { c.Log = ll; c.Name = "fe-b" })
	eventually(t, "leadership settled", func() bool {
		return e.fe.isLeader() && !fb.fe.isLeader() && wl.watches.Load() == 1
	})
	// Past its start, b's consumer delivers records as new (a backlog
	// record's answer is looked up while following).
	e.mustEcho(1)
	eventually(t, "b's consumer delivered a record", func() bool { return ll.delivered.Load() >= 1 })
	ll.set(func() { ll.holdReplies = true })
	req := &hamsv1.PredictRequest{Service: "echo", RequestId: "late-2", Inputs: echoInputs(1, 6)}
	resp, err := e.client.Predict(ctxT(t, 5*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "b mirrors the request as open", func() bool {
		fb.fe.mu.Lock()
		defer fb.fe.mu.Unlock()
		_, ok := fb.fe.mir.pending[resp.ReqId]
		return ok
	})
	e.stop()
	e.res.set(config.Frontend, fb.addr)
	eventually(t, "b took over and looked the answer up", func() bool { return fb.fe.isLeader() && fb.fe.mirAnswered(resp.ReqId) })
	if got := counterValue(fb.fe.m.adopted); got != 0 || len(fb.fe.pendingIDs()) != 0 {
		t.Fatalf("the new leader injected %v answered requests", got)
	}
	again, err := fb.client.Predict(ctxT(t, 5*time.Second), req)
	if err != nil || !proto.Equal(again, resp) {
		t.Fatalf("re-asked answered request on the new leader: %v %v, want %v", again, err, resp)
	}
	ll.releaseReplies()
	if n := e.models["a"].executed.Load(); n != 2 {
		t.Fatalf("a executed %d times, want 2 (the warm-up and the request, once each)", n)
	}
}

// TestTakeoverOwnCallAnsweredWhileItsLogAckWasLate: a follower logs a
// client's request; the leader injects and answers it, and dies; the
// follower's log acknowledgement, its consumer's delivery and the reply
// record all reach it only after it took over. Its own waiting call must
// not be injected on the late acknowledgement as if it had been logged
// while leading: it is answered from the record, and the request runs
// once.
func TestTakeoverOwnCallAnsweredWhileItsLogAckWasLate(t *testing.T) {
	co := openLog(t)
	yaml := fmt.Sprintf(testYAML, "5s")
	e := newEnvWith(t, envOpts{yaml: yaml, config: func(c *Config) { c.Log = co; c.Name = "fe-a" }})
	ll := &lagLog{RequestLog: co}
	fb := e.addFrontend(t, yaml, func(c *Config) { c.Log = ll; c.Name = "fe-b" })
	eventually(t, "leadership settled", func() bool { return e.fe.isLeader() && !fb.fe.isLeader() })
	ll.set(func() { ll.holdRequests, ll.holdReplies, ll.acks = true, true, make(chan struct{}) })

	req := &hamsv1.PredictRequest{Service: "echo", RequestId: "own-1", Inputs: echoInputs(1, 8)}
	res := make(chan result, 1)
	go func() {
		resp, err := fb.client.Predict(ctxT(t, 10*time.Second), req)
		res <- result{resp, err}
	}()
	eventually(t, "the leader answered and recorded b's request", func() bool {
		return counterValue(e.fe.m.recorded.WithLabelValues("own")) == 1
	})
	e.stop()
	e.res.set(config.Frontend, fb.addr)
	eventually(t, "b leads", fb.fe.isLeader)
	ll.releaseAcks()
	r := await(t, "b's own call", res)
	if r.err != nil || !fb.fe.ownReqID(r.resp.GetReqId()) {
		t.Fatalf("b's call: %v %v", r.resp, r.err)
	}
	ll.releaseRequests()
	ll.releaseReplies()
	if n := e.models["a"].executed.Load(); n != 1 {
		t.Fatalf("a executed %d times, want 1: the answered request ran again", n)
	}
	if got := counterValue(fb.fe.m.recorded.WithLabelValues("own")); got != 0 {
		t.Fatalf("b recorded %v answers of its own", got)
	}
}
