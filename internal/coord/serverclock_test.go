package coord

import (
	"context"
	"sync"
	"testing"
	"time"
)

// skewed is a clock off by d from this host's.
func skewed(d time.Duration) func() time.Time { return func() time.Time { return time.Now().Add(d) } }

// near fails unless got is within tol of want.
func near(t *testing.T, what string, got, want time.Time, tol time.Duration) {
	t.Helper()
	if d := got.Sub(want); d > tol || d < -tol {
		t.Fatalf("%s: %v, want %v ± %v (off by %v)", what, got, want, tol, d)
	}
}

func TestServerClockOffsetSeesSkew(t *testing.T) {
	nc := embedded(t)
	ctx := context.Background()
	for _, skew := range []time.Duration{time.Hour, -time.Hour, 0} {
		c := openT(t, nc)
		c.SetClock(skewed(skew))
		off, err := c.ServerClockOffset(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d := off - skew; d > time.Second || d < -time.Second {
			t.Fatalf("clock skewed by %v: offset %v", skew, off)
		}
	}
}

// A frontend whose clock is an hour behind logs a request; a frontend on
// the right clock retries it within its deadline. The retry must join the
// logged attempt (with its deadline on the retrying frontend's clock), not
// execute the request a second time. Comparing the writer's absolute
// deadline with the reader's clock (the earlier format) took the record
// for an hour expired.
func TestLogRequestClaimUnderClockSkew(t *testing.T) {
	nc := embedded(t)
	ctx := context.Background()
	behind, right := openT(t, nc), openT(t, nc)
	behind.SetClock(skewed(-time.Hour))
	first := &LoggedRequest{ReqID: 1, Frontend: "behind", Deadline: behind.now().Add(30 * time.Second), Request: req("svc", "k", []byte{1})}
	if ex, err := behind.LogRequest(ctx, first); err != nil || ex != nil {
		t.Fatalf("log: %v %v", ex, err)
	}
	ex, err := right.LogRequest(ctx, &LoggedRequest{ReqID: 2, Frontend: "right", Deadline: right.now().Add(30 * time.Second), Request: req("svc", "k", []byte{2})})
	if err != nil || ex == nil || ex.ReqID != 1 {
		t.Fatalf("retry of a live request logged by a frontend an hour behind: %+v %v (executed twice)", ex, err)
	}
	near(t, "deadline on the retrying frontend's clock", ex.Deadline, right.now().Add(30*time.Second), 2*time.Second)

	// The other way round: a record that expired a second ago, written
	// by a frontend an hour ahead, is expired for everyone.
	ahead := openT(t, nc)
	ahead.SetClock(skewed(time.Hour))
	if _, err := ahead.LogRequest(ctx, &LoggedRequest{ReqID: 3, Frontend: "ahead", Deadline: ahead.now().Add(-time.Second), Request: req("svc", "j", nil)}); err != nil {
		t.Fatal(err)
	}
	ex, err = right.LogRequest(ctx, &LoggedRequest{ReqID: 4, Frontend: "right", Deadline: right.now().Add(30 * time.Second), Request: req("svc", "j", nil)})
	if err != nil || ex != nil {
		t.Fatalf("retry of an expired, unanswered request logged by a frontend an hour ahead: %+v %v (want it replaced)", ex, err)
	}
}

// A follower whose clock is an hour ahead watches the log one minute back:
// it must still get the records written just now, with their deadlines on
// its own clock (a start time on its clock was an hour in the server's
// future, and the watch saw nothing).
func TestWatchRequestsUnderClockSkew(t *testing.T) {
	nc := embedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	writer, follower := openT(t, nc), openT(t, nc)
	writer.SetClock(skewed(-time.Hour))
	follower.SetClock(skewed(time.Hour))
	if _, err := writer.LogRequest(ctx, &LoggedRequest{ReqID: 7, Frontend: "w", Deadline: writer.now().Add(20 * time.Second), Request: req("svc", "", nil)}); err != nil {
		t.Fatal(err)
	}
	got := make(chan *LoggedRequest, 4)
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- follower.WatchRequests(wctx, time.Minute, func(r *LoggedRequest, _ bool) { got <- r }) }()
	select {
	case r := <-got:
		if r.ReqID != 7 {
			t.Fatalf("record %d, want 7", r.ReqID)
		}
		near(t, "deadline on the follower's clock", r.Deadline, follower.now().Add(20*time.Second), 2*time.Second)
	case <-ctx.Done():
		t.Fatal("the follower an hour ahead saw no record")
	}
	wcancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A probe that fails (no request-log stream: as while it elects a leader)
// leaves the last estimate in use; with none, the error is returned.
func TestServerClockOffsetKeepsLastEstimate(t *testing.T) {
	nc := embedded(t)
	ctx := context.Background()
	c := openT(t, nc)
	var mu sync.Mutex
	now := time.Now().Add(time.Hour)
	c.SetClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	first, err := c.ServerClockOffset(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.js.DeleteStream(ctx, RequestsStream("rl")); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	now = now.Add(2 * serverClockTTL) // the estimate is stale: a probe is due
	mu.Unlock()
	if off, err := c.ServerClockOffset(ctx); err != nil || off != first {
		t.Fatalf("after a failed probe: %v %v, want the last estimate %v", off, err, first)
	}
	fresh := openT(t, nc) // recreates the stream
	if err := fresh.js.DeleteStream(ctx, RequestsStream("rl")); err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.ServerClockOffset(ctx); err == nil {
		t.Fatal("a first probe without the stream succeeded")
	}
}
