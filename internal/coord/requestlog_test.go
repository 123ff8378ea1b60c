package coord

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/hams-go/hams/internal/testing/natstest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// embeddedWith starts a JetStream server with opts adjusted by adjust.
func embeddedWith(t testing.TB, adjust func(*server.Options)) *nats.Conn {
	if adjust == nil {
		return natstest.Connect(t)
	}
	return natstest.Connect(t, adjust)
}

func openT(t testing.TB, nc *nats.Conn) *Coord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Open(ctx, nc, "rl", 1)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func req(service, id string, data []byte) *hamsv1.PredictRequest {
	return &hamsv1.PredictRequest{Service: service, RequestId: id, StreamId: "s",
		Inputs: []*hamsv1.Tensor{{Name: "x", Datatype: "UINT8", Shape: []int64{int64(len(data))}, Data: data}}}
}

func TestFrontendIncarnationsAreUnique(t *testing.T) {
	nc := embedded(t)
	a, b := openT(t, nc), openT(t, nc)
	ctx := context.Background()
	var mu sync.Mutex
	seen := map[uint64]bool{}
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := a
			if i%2 == 1 {
				c = b
			}
			n, err := c.FrontendIncarnation(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if seen[n] || n == 0 || n >= 1<<IncarnationBits {
				t.Errorf("incarnation %d handed out twice or out of range", n)
			}
			seen[n] = true
		}()
	}
	wg.Wait()
}

func TestLogRequestClaimsKeyOnce(t *testing.T) {
	c := openT(t, embedded(t))
	ctx := context.Background()
	dl := time.Now().Add(time.Minute)
	first := &LoggedRequest{ReqID: 11, Frontend: "fa", Deadline: dl, Request: req("svc", "k", []byte{1, 2})}
	if ex, err := c.LogRequest(ctx, first); err != nil || ex != nil || first.Seq == 0 {
		t.Fatalf("first log: %v %v seq %d", ex, err, first.Seq)
	}
	// Another attempt of the same request (any frontend) gets the first.
	ex, err := c.LogRequest(ctx, &LoggedRequest{ReqID: 99, Frontend: "fb", Deadline: dl, Request: req("svc", "k", []byte{3})})
	if err != nil || ex == nil || ex.ReqID != 11 || ex.Frontend != "fa" || !proto.Equal(ex.Request, first.Request) {
		t.Fatalf("second attempt: %+v %v", ex, err)
	}
	// The deadline travelled as time left: the same instant, up to the
	// server-clock estimate's error (serverclock.go).
	near(t, "the first attempt's deadline", ex.Deadline, dl, time.Second)
	// The same request_id in another service is another request.
	if ex, err := c.LogRequest(ctx, &LoggedRequest{ReqID: 12, Deadline: dl, Request: req("other", "k", nil)}); err != nil || ex != nil {
		t.Fatalf("other service: %v %v", ex, err)
	}
	// Requests without request_id are never merged.
	for id := uint64(20); id < 22; id++ {
		if ex, err := c.LogRequest(ctx, &LoggedRequest{ReqID: id, Deadline: dl, Request: req("svc", "", nil)}); err != nil || ex != nil {
			t.Fatalf("unkeyed %d: %v %v", id, ex, err)
		}
	}
}

func TestLogRequestExpiredUnansweredIsReplaced(t *testing.T) {
	c := openT(t, embedded(t))
	ctx := context.Background()
	past := time.Now().Add(-time.Second)
	if _, err := c.LogRequest(ctx, &LoggedRequest{ReqID: 1, Deadline: past, Request: req("svc", "k", nil)}); err != nil {
		t.Fatal(err)
	}
	// Expired and unanswered: a retry executes again.
	ex, err := c.LogRequest(ctx, &LoggedRequest{ReqID: 2, Deadline: time.Now().Add(time.Minute), Request: req("svc", "k", nil)})
	if err != nil || ex != nil {
		t.Fatalf("retry after an unanswered expiry: %v %v", ex, err)
	}
	// Expired but answered: the retry gets the answered attempt.
	if _, err := c.LogRequest(ctx, &LoggedRequest{ReqID: 3, Deadline: past, Request: req("svc", "j", nil)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RecordReply(ctx, &LoggedReply{ReqID: 3, Response: &hamsv1.PredictResponse{ReqId: 3}}); err != nil {
		t.Fatal(err)
	}
	ex, err = c.LogRequest(ctx, &LoggedRequest{ReqID: 4, Deadline: time.Now().Add(time.Minute), Request: req("svc", "j", nil)})
	if err != nil || ex == nil || ex.ReqID != 3 {
		t.Fatalf("retry of an answered request: %v %v", ex, err)
	}
}

func TestRecordReplyFirstWriterWins(t *testing.T) {
	c := openT(t, embedded(t))
	ctx := context.Background()
	if _, err := c.LookupReply(ctx, 5); !errors.Is(err, ErrNoRecord) {
		t.Fatalf("lookup before any record: %v", err)
	}
	a := &hamsv1.PredictResponse{ReqId: 5, Service: "svc", Outputs: []*hamsv1.ModelOutput{{Model: "m"}}}
	if ex, err := c.RecordReply(ctx, &LoggedReply{ReqID: 5, Frontend: "fa", Response: a}); err != nil || ex != nil {
		t.Fatalf("first record: %v %v", ex, err)
	}
	ex, err := c.RecordReply(ctx, &LoggedReply{ReqID: 5, Frontend: "fb", Response: &hamsv1.PredictResponse{ReqId: 5, Service: "other"}})
	if err != nil || ex == nil || ex.Frontend != "fa" || !proto.Equal(ex.Response, a) {
		t.Fatalf("second record: %+v %v", ex, err)
	}
	// An error answer round-trips its status.
	if _, err := c.RecordReply(ctx, &LoggedReply{ReqID: 6, Code: codes.InvalidArgument, Error: "bad input"}); err != nil {
		t.Fatal(err)
	}
	got, err := c.LookupReply(ctx, 6)
	if err != nil || got.Code != codes.InvalidArgument || got.Error != "bad input" || got.Response != nil {
		t.Fatalf("error answer: %+v %v", got, err)
	}
}

// TestLargeRecordsAreChunked: records over the server's max payload are
// split into chunks and reassembled by every reader.
func TestLargeRecordsAreChunked(t *testing.T) {
	nc := embeddedWith(t, func(o *server.Options) { o.MaxPayload = 64 << 10 })
	c := openT(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	big := bytes.Repeat([]byte("0123456789abcdef"), 20<<10) // 320 KiB: 6 chunks
	r := &LoggedRequest{ReqID: 7, Frontend: "fa", Deadline: time.Now().Add(time.Minute), Request: req("svc", "big", big)}
	if _, err := c.LogRequest(ctx, r); err != nil {
		t.Fatal(err)
	}
	ex, err := c.LogRequest(ctx, &LoggedRequest{ReqID: 8, Deadline: time.Now().Add(time.Minute), Request: req("svc", "big", nil)})
	if err != nil || ex == nil || !bytes.Equal(ex.Request.Inputs[0].Data, big) {
		t.Fatalf("chunked request record: %v", err)
	}
	resp := &hamsv1.PredictResponse{ReqId: 7, Outputs: []*hamsv1.ModelOutput{{Model: "m", Tensors: r.Request.Inputs}}}
	got := make(chan *LoggedReply, 1)
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.WatchReplies(wctx, func(r *LoggedReply) {
			select {
			case got <- r:
			default:
			}
		})
	}()
	// The watch sees records written after it subscribed: write probes
	// until it has seen one.
	probe := uint64(1000)
	var first *LoggedReply
	for first == nil {
		probe++
		if _, err := c.RecordReply(ctx, &LoggedReply{ReqID: probe, Response: &hamsv1.PredictResponse{ReqId: probe}}); err != nil {
			t.Fatal(err)
		}
		select {
		case first = <-got:
		case <-time.After(20 * time.Millisecond): // polling interval of the probe
		}
	}
	if _, err := c.RecordReply(ctx, &LoggedReply{ReqID: 7, Response: resp}); err != nil {
		t.Fatal(err)
	}
	for {
		r := <-got
		if r.ReqID == 7 {
			if !proto.Equal(r.Response, resp) {
				t.Fatal("watched chunked reply differs")
			}
			break
		}
	}
	l, err := c.LookupReply(ctx, 7)
	if err != nil || !proto.Equal(l.Response, resp) {
		t.Fatalf("looked-up chunked reply: %v", err)
	}
	wcancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestWatchRequestsMarksBacklog(t *testing.T) {
	c := openT(t, embedded(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now().Add(-time.Second)
	for id := uint64(1); id <= 3; id++ {
		if _, err := c.LogRequest(ctx, &LoggedRequest{ReqID: id, Frontend: "fa", Deadline: time.Now().Add(time.Minute), Request: req("svc", fmt.Sprint("k", id), nil)}); err != nil {
			t.Fatal(err)
		}
	}
	type seen struct {
		id      uint64
		backlog bool
	}
	ch := make(chan seen, 16)
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.WatchRequests(wctx, time.Since(start), func(r *LoggedRequest, backlog bool) { ch <- seen{r.ReqID, backlog} })
	}()
	for id := uint64(1); id <= 3; id++ {
		if s := <-ch; s.id != id || !s.backlog {
			t.Fatalf("backlog record %+v, want %d", s, id)
		}
	}
	if _, err := c.LogRequest(ctx, &LoggedRequest{ReqID: 4, Deadline: time.Now().Add(time.Minute), Request: req("svc", "", nil)}); err != nil {
		t.Fatal(err)
	}
	if s := <-ch; s.id != 4 || s.backlog {
		t.Fatalf("new record %+v", s)
	}
	wcancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// BenchmarkLogRequest measures appending one request record (a 32-row
// Fashion-MNIST batch, 100 KiB, and a 1-row one, 3 KiB) until JetStream
// acknowledges it, with the server's default sync and with SyncAlways
// (fsync before every ack). Run:
// go test -run - -bench LogRequest -benchtime 2000x ./internal/coord/
func BenchmarkLogRequest(b *testing.B) {
	for _, sync := range []bool{false, true} {
		for _, rows := range []int{1, 32} {
			b.Run(fmt.Sprintf("sync_always=%v/rows=%d", sync, rows), func(b *testing.B) {
				nc := embeddedWith(b, func(o *server.Options) { o.SyncAlways = sync })
				c := openT(b, nc)
				ctx := context.Background()
				data := bytes.Repeat([]byte{7}, rows*784*4)
				b.SetBytes(int64(len(data)))
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					r := &LoggedRequest{ReqID: uint64(i + 1), Frontend: "f", Deadline: time.Now().Add(time.Minute), Request: req("svc", fmt.Sprint(i), data)}
					if _, err := c.LogRequest(ctx, r); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkLogRequestParallel: the same with 16 concurrent clients (acks of
// concurrent publishes share fsyncs).
func BenchmarkLogRequestParallel(b *testing.B) {
	for _, sync := range []bool{false, true} {
		b.Run(fmt.Sprintf("sync_always=%v/rows=1", sync), func(b *testing.B) {
			nc := embeddedWith(b, func(o *server.Options) { o.SyncAlways = sync })
			c := openT(b, nc)
			ctx := context.Background()
			data := bytes.Repeat([]byte{7}, 784*4)
			b.SetBytes(int64(len(data)))
			b.SetParallelism(8)
			var n sync2
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					id := n.next()
					r := &LoggedRequest{ReqID: id, Frontend: "f", Deadline: time.Now().Add(time.Minute), Request: req("svc", fmt.Sprint(id), data)}
					if _, err := c.LogRequest(ctx, r); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

type sync2 struct {
	mu sync.Mutex
	n  uint64
}

func (s *sync2) next() uint64 { s.mu.Lock(); defer s.mu.Unlock(); s.n++; return s.n }

func TestMalformedRecordsAreErrors(t *testing.T) {
	nc := embedded(t)
	c := openT(t, nc)
	ctx := context.Background()
	js := c.js
	// A reply record without a valid req_id header, one with a bad code,
	// and one whose chunk list names a missing message.
	for id, h := range map[uint64]nats.Header{
		1: {hdrReqID: []string{"x"}},
		2: {hdrReqID: []string{"2"}, hdrCode: []string{"-3"}},
		3: {hdrReqID: []string{"3"}, hdrChunks: []string{"999999"}},
	} {
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: c.replySubject(id), Header: h, Data: []byte{0xff}}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.LookupReply(ctx, id); err == nil || errors.Is(err, ErrNoRecord) {
			t.Errorf("malformed reply record %d: %v", id, err)
		}
	}
	// A request record with a bad deadline under a claimed key: nobody
	// can read it, so nobody waits on it, and the key is taken over as
	// an expired record's is (it cannot block the key for good).
	subj := c.requestKeySubject("svc", "bad")
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subj, Header: nats.Header{hdrReqID: []string{"5"}, hdrDeadline: []string{"soon"}}}); err != nil {
		t.Fatal(err)
	}
	if ex, err := c.LogRequest(ctx, &LoggedRequest{ReqID: 6, Deadline: time.Now().Add(time.Minute), Request: req("svc", "bad", nil)}); err != nil || ex != nil {
		t.Fatalf("claiming a key whose record is malformed: %v %v", ex, err)
	}
	if ex, err := c.LogRequest(ctx, &LoggedRequest{ReqID: 7, Deadline: time.Now().Add(time.Minute), Request: req("svc", "bad", nil)}); err != nil || ex == nil || ex.ReqID != 6 {
		t.Fatalf("the key after it was taken over: %v %v", ex, err)
	}
	if c.BadRecords() == 0 {
		t.Fatal("the malformed record was not counted")
	}
}
