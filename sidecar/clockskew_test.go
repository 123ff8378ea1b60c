package sidecar

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/edge"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// gatedBackend holds its first Infer until release is closed.
type gatedBackend struct {
	*fakeBackend
	entered, release chan struct{}
	once             sync.Once
}

func (g *gatedBackend) Infer(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	g.once.Do(func() {
		close(g.entered)
		select {
		case <-g.release:
		case <-ctx.Done():
		}
	})
	return g.fakeBackend.Infer(ctx, req)
}

// A sidecar whose host clock is an hour behind or ahead of the frontend's
// and the sink's (both on the real clock) still serves: requests with a
// deadline seconds away are answered, a request whose time runs out while
// it waits in the sidecar fails with DeadlineExceeded, and the deadline
// that reaches the sink is the frontend's (plus at most the time on the
// wire), not shifted by the hour. With absolute deadlines the sidecar an
// hour ahead failed every request and the one behind let a request run an
// hour past its deadline.
func TestSidecarWithSkewedClock(t *testing.T) {
	for _, skew := range []time.Duration{-time.Hour, time.Hour} {
		t.Run(fmt.Sprint(skew), func(t *testing.T) { testSkewedSidecar(t, skew) })
	}
}

func testSkewedSidecar(t *testing.T, skew time.Duration) {
	dep, err := config.Parse([]byte(chainGraph))
	if err != nil {
		t.Fatal(err)
	}
	// The sidecar's clock: the real one shifted by skew, plus what the
	// test advances it by.
	var extra atomic.Int64
	clock := func() time.Time { return time.Now().Add(skew + time.Duration(extra.Load())) }

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	res := edge.NewStaticResolver(nil)
	type arrival struct {
		it *hamsv1.Item
		at time.Time
	}
	var (
		mu   sync.Mutex
		sink = map[uint64]arrival{}
	)
	flis := listen(t)
	res.Set(config.Frontend, flis.Addr().String(), 0)
	srv := grpc.NewServer()
	hamsv1.RegisterDataplaneServer(srv, edge.NewReceiver(config.Frontend, func(_ string, items []*hamsv1.Item) {
		mu.Lock()
		defer mu.Unlock()
		for _, it := range items {
			sink[it.GetReqId()] = arrival{it, time.Now()}
		}
	}, nil))
	wg.Add(2)
	go func() { defer wg.Done(); _ = srv.Serve(flis) }()
	go func() { defer wg.Done(); <-ctx.Done(); srv.Stop() }()

	be := &gatedBackend{fakeBackend: &fakeBackend{inputs: []string{"x"}}, entered: make(chan struct{}), release: make(chan struct{})}
	lis := listen(t)
	res.Set("a", lis.Addr().String(), 0)
	sc, err := New(Config{Deployment: dep, Model: "a", Backend: be, Resolver: res, GRPCListener: lis, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := sc.Run(ctx); err != nil {
			t.Errorf("sidecar: %v", err)
		}
	}()
	fe, err := edge.NewSender(edge.SenderConfig{From: config.Frontend, To: "a", Resolver: res})
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = fe.Run(ctx) }()

	deadlines := map[uint64]int64{}
	send := func(id uint64, within time.Duration) {
		d := time.Now().Add(within).UnixNano()
		deadlines[id] = d
		fe.Send(&hamsv1.Item{ReqId: id, Service: "s", Tensors: []*hamsv1.Tensor{row(float32(id), 2)}, DeadlineUnixNano: d})
	}
	got := func(n int) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(sink) >= n
		}
	}

	// Request 1 occupies the only executor; 2 (100 ms left) and 3 (10 s
	// left) wait behind it while the sidecar's clock moves on by a second.
	send(1, 10*time.Second)
	select {
	case <-be.entered:
	case <-time.After(15 * time.Second):
		t.Fatal("request 1 never reached the backend")
	}
	send(2, 100*time.Millisecond)
	send(3, 10*time.Second)
	waitFor(t, "requests 2 and 3 received", func() bool { return sc.Receiver().MaxInOrder(config.Frontend) >= 3 })
	extra.Store(int64(time.Second))
	close(be.release)
	waitFor(t, "three replies", got(3))

	// Traffic flows: a run of requests with seconds to spare.
	const n = 50
	for id := uint64(4); id <= n; id++ {
		send(id, 10*time.Second)
	}
	waitFor(t, "all replies", got(n))

	mu.Lock()
	defer mu.Unlock()
	for id := uint64(1); id <= n; id++ {
		a := sink[id]
		want := codes.OK
		if id == 2 {
			want = codes.DeadlineExceeded
		}
		if c := codes.Code(a.it.GetErrorCode()); c != want {
			t.Fatalf("request %d: code %v (%q), want %v", id, c, a.it.GetError(), want)
		}
		if id == 2 {
			continue
		}
		// The deadline at the sink, on the sink's clock, is the
		// frontend's: later only by the time the item spent on the wire
		// (which no hop counts against it), never by the skew; 1 and 3
		// lost the second the sidecar's clock moved on while they were
		// there.
		late := time.Duration(a.it.GetDeadlineUnixNano() - deadlines[id])
		if id <= 3 {
			late += time.Second
		}
		if late < 0 || late > 2*time.Second {
			t.Fatalf("request %d: deadline at the sink off by %v (skew %v)", id, late, skew)
		}
	}
}
