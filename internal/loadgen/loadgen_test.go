package loadgen

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func svc() *config.Service {
	return &config.Service{Name: "s", Inputs: []config.TensorSpec{
		{Name: "images", Datatype: "FP32", Shape: []int64{-1, 784}},
		{Name: "labels", Datatype: "INT64", Shape: []int64{-1}},
		{Name: "x", Datatype: "FP32", Shape: []int64{-1, -1, 3}},
	}}
}

func TestGeneratorSeededShapesAndRanges(t *testing.T) {
	g1, err := NewGenerator(svc(), 7, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	g2, _ := NewGenerator(svc(), 7, 4, nil)
	a, b := g1.Inputs(), g2.Inputs()
	if len(a) != 3 {
		t.Fatalf("%d tensors", len(a))
	}
	for i := range a {
		if tensor.Digest(a[i]) != tensor.Digest(b[i]) {
			t.Fatalf("same seed, different %s", a[i].Name)
		}
		if err := tensor.Validate(a[i]); err != nil {
			t.Fatal(err)
		}
	}
	if got := a[0].Shape; got[0] != 4 || got[1] != 784 {
		t.Fatalf("images shape %v", got)
	}
	if got := a[2].Shape; len(got) != 3 || got[0] != 4 || got[1] != 1 || got[2] != 3 {
		t.Fatalf("x shape %v", got)
	}
	v, _ := tensor.Float32(a[0])
	for _, x := range v {
		if x < 0 || x > 1 {
			t.Fatalf("pixel %v out of [0,1]", x)
		}
	}
	g3, _ := NewGenerator(svc(), 8, 4, nil)
	if tensor.Digest(g3.Inputs()[0]) == tensor.Digest(a[0]) {
		t.Fatal("different seeds, same inputs")
	}
}

func TestLabelsFraction(t *testing.T) {
	g, _ := NewGenerator(svc(), 1, 1000, nil)
	l, err := tensor.Int64s(g.Inputs()[1])
	if err != nil {
		t.Fatal(err)
	}
	labeled := 0
	for _, x := range l {
		if x >= 0 {
			if x > 9 {
				t.Fatalf("label %d", x)
			}
			labeled++
		}
	}
	if labeled < 200 || labeled > 400 {
		t.Fatalf("%d of 1000 rows labeled, want about %v", labeled, LabelFraction)
	}
}

func writeGz(t *testing.T, path string, b []byte) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadIDXAndRealImages(t *testing.T) {
	dir := t.TempDir()
	img := make([]byte, 16+2*784)
	binary.BigEndian.PutUint32(img, 2051)
	binary.BigEndian.PutUint32(img[4:], 2)
	binary.BigEndian.PutUint32(img[8:], 28)
	binary.BigEndian.PutUint32(img[12:], 28)
	for i := range 784 {
		img[16+i] = 255
	}
	lab := []byte{0, 0, 8, 1, 0, 0, 0, 2, 7, 3}
	writeGz(t, filepath.Join(dir, "i.gz"), img)
	writeGz(t, filepath.Join(dir, "l.gz"), lab)
	d, err := LoadIDX(filepath.Join(dir, "i.gz"), filepath.Join(dir, "l.gz"))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Images) != 2 || d.Images[0][0] != 1 || d.Images[1][0] != 0 || d.Labels[1] != 3 {
		t.Fatalf("dataset %v", d.Labels)
	}
	g, _ := NewGenerator(svc(), 3, 50, d)
	in := g.Inputs()
	px, _ := tensor.Float32(in[0])
	lb, _ := tensor.Int64s(in[1])
	for r := range 50 {
		want := int64(7)
		if px[r*784] == 0 {
			want = 3
		}
		if lb[r] != -1 && lb[r] != want {
			t.Fatalf("row %d: label %d does not match its image", r, lb[r])
		}
	}
	// Bad files.
	if _, err := LoadIDX(filepath.Join(dir, "l.gz"), filepath.Join(dir, "l.gz")); err == nil {
		t.Fatal("label file accepted as images")
	}
	if _, err := LoadIDX(filepath.Join(dir, "missing"), filepath.Join(dir, "l.gz")); err == nil {
		t.Fatal("missing file accepted")
	}
	os.WriteFile(filepath.Join(dir, "plain"), []byte("not gzip"), 0o644)
	if _, err := LoadIDX(filepath.Join(dir, "plain"), filepath.Join(dir, "l.gz")); err == nil {
		t.Fatal("non-gzip accepted")
	}
	if f := Fashion(); f != nil && (len(f.Images) != 10000 || len(f.Images[0]) != 784) {
		t.Fatalf("installed Fashion-MNIST: %d images", len(f.Images))
	}
}

func TestGeneratorBadConfig(t *testing.T) {
	if _, err := NewGenerator(nil, 1, 1, nil); err == nil {
		t.Fatal("nil service")
	}
	if _, err := NewGenerator(&config.Service{Name: "e"}, 1, 1, nil); err == nil {
		t.Fatal("no inputs")
	}
	if _, err := NewGenerator(svc(), 1, 0, nil); err == nil {
		t.Fatal("zero rows")
	}
	bad := &config.Service{Name: "b", Inputs: []config.TensorSpec{{Name: "s", Datatype: "BYTES", Shape: []int64{-1}}}}
	if _, err := NewGenerator(bad, 1, 1, nil); err == nil {
		t.Fatal("BYTES input accepted")
	}
}

func TestPercentileAndStats(t *testing.T) {
	var lat []time.Duration
	for i := 1; i <= 100; i++ {
		lat = append(lat, time.Duration(101-i)*time.Millisecond)
	}
	s := Stats{Replies: 100, ElapsedS: 2}
	Summarize(lat, &s)
	if s.P50Ms != 50 || s.P99Ms != 99 || s.MeanMs != 50.5 || s.ThroughputRPS != 50 {
		t.Fatalf("stats %+v", s)
	}
	if Percentile(nil, 50) != 0 {
		t.Fatal("empty percentile")
	}
	var empty Stats
	Summarize(nil, &empty)
	if empty.P50Ms != 0 {
		t.Fatal("empty stats")
	}
}

// Percentile (gonum's empirical quantile) is the nearest-rank percentile
// the reports have always used: the sample of 1-based rank ceil(p/100*n).
func TestPercentileNearestRank(t *testing.T) {
	nearestRank := func(sorted []time.Duration, p float64) time.Duration {
		k := int(math.Ceil(p/100*float64(len(sorted)))) - 1
		return sorted[min(max(k, 0), len(sorted)-1)]
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 3, 7, 10, 99, 100, 101, 1000, 4567} {
		lat := make([]time.Duration, n)
		for i := range lat {
			lat[i] = time.Duration(rng.Int64N(int64(50 * time.Millisecond)))
		}
		slices.Sort(lat)
		for _, p := range []float64{0, 1, 25, 50, 90, 99, 99.9, 100} {
			if got, want := Percentile(lat, p), nearestRank(lat, p); got != want {
				t.Fatalf("n %d p%v: %v, nearest rank %v", n, p, got, want)
			}
		}
	}
	if got := Percentile([]time.Duration{1, 2, 3, 4}, 50); got != 2 {
		t.Fatalf("p50 of 1..4: %v, want 2 (rank ceil(0.5*4) = 2)", got)
	}
}

type fakeFrontend struct {
	calls atomic.Int64
	fail  func(n int64) bool
}

func (f *fakeFrontend) Predict(ctx context.Context, in *hamsv1.PredictRequest, _ ...grpc.CallOption) (*hamsv1.PredictResponse, error) {
	n := f.calls.Add(1)
	if _, ok := ctx.Deadline(); !ok {
		return nil, errors.New("no deadline")
	}
	if f.fail != nil && f.fail(n) {
		return nil, errors.New("boom")
	}
	return &hamsv1.PredictResponse{Service: in.Service, RequestId: in.RequestId}, nil
}

func (f *fakeFrontend) ListServices(context.Context, *hamsv1.ListServicesRequest, ...grpc.CallOption) (*hamsv1.ListServicesResponse, error) {
	return &hamsv1.ListServicesResponse{}, nil
}

func TestRunRequestsBudgetAndErrors(t *testing.T) {
	ff := &fakeFrontend{fail: func(n int64) bool { return n%10 == 0 }}
	var results atomic.Int64
	st, err := Run(context.Background(), RunConfig{
		Client:      ff,
		Concurrency: 4,
		Requests:    100,
		NewRequest: func(c int, n uint64) *hamsv1.PredictRequest {
			return &hamsv1.PredictRequest{Service: "s"}
		},
		OnResult: func(r Result) {
			results.Add(1)
			if (r.Err == nil) == (r.Reply == nil) {
				t.Errorf("result with reply %v and err %v", r.Reply, r.Err)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if ff.calls.Load() != 100 || results.Load() != 100 || st.Requests != 100 || st.Replies != 90 || st.Errors != 10 {
		t.Fatalf("calls %d results %d stats %+v", ff.calls.Load(), results.Load(), st)
	}
	if st.ThroughputRPS <= 0 {
		t.Fatalf("throughput %v", st.ThroughputRPS)
	}
}

func TestRunDurationAndBadConfig(t *testing.T) {
	ff := &fakeFrontend{}
	st, err := Run(context.Background(), RunConfig{Client: ff, Duration: 50 * time.Millisecond, Concurrency: 2,
		NewRequest: func(int, uint64) *hamsv1.PredictRequest { return &hamsv1.PredictRequest{} }})
	if err != nil || st.Replies == 0 || st.ElapsedS < 0.05 {
		t.Fatalf("stats %+v err %v", st, err)
	}
	if _, err := Run(context.Background(), RunConfig{}); err == nil {
		t.Fatal("empty config accepted")
	}
	if _, err := Run(context.Background(), RunConfig{Client: ff, Requests: -1,
		NewRequest: func(int, uint64) *hamsv1.PredictRequest { return nil }}); err == nil {
		t.Fatal("negative budget accepted")
	}
}

func TestRunErrorBackoff(t *testing.T) {
	ff := &fakeFrontend{fail: func(int64) bool { return true }}
	st, err := Run(context.Background(), RunConfig{Client: ff, Duration: 100 * time.Millisecond, Concurrency: 2, ErrorBackoff: 25 * time.Millisecond,
		NewRequest: func(int, uint64) *hamsv1.PredictRequest { return &hamsv1.PredictRequest{} }})
	if err != nil {
		t.Fatal(err)
	}
	// At most one request per client per backoff period (plus the first).
	if st.Errors == 0 || st.Errors > 2*(100/25+1) {
		t.Fatalf("%d errors in 100ms with a 25ms error backoff", st.Errors)
	}
}

// fixedFrontend answers every call with err (nil: a reply carrying its
// name in req_id) and counts the request_ids it saw.
type fixedFrontend struct {
	hamsv1.FrontendClient
	id  uint64
	err error
	mu  sync.Mutex
	ids []string
}

func (f *fixedFrontend) Predict(_ context.Context, req *hamsv1.PredictRequest, _ ...grpc.CallOption) (*hamsv1.PredictResponse, error) {
	f.mu.Lock()
	f.ids = append(f.ids, req.GetRequestId())
	f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	return &hamsv1.PredictResponse{ReqId: f.id}, nil
}

// Clients spread over the frontends; a request that finds its frontend
// Unavailable is sent again, with the same request_id, to the next one;
// other errors are not retried.
func TestRunRetriesUnavailableOnAnotherFrontend(t *testing.T) {
	dead := &fixedFrontend{id: 0, err: status.Error(codes.Unavailable, "connection refused")}
	live := &fixedFrontend{id: 1}
	var mu sync.Mutex
	var results []Result
	st, err := Run(context.Background(), RunConfig{
		Frontends:   []hamsv1.FrontendClient{dead, live},
		Concurrency: 2,
		Waves:       true, // 5 requests per client
		Requests:    10,
		NewRequest: func(c int, n uint64) *hamsv1.PredictRequest {
			return &hamsv1.PredictRequest{Service: "s", RequestId: fmt.Sprintf("c%d-%d", c, n)}
		},
		OnResult: func(r Result) {
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Errors != 0 || st.Replies != 10 {
		t.Fatalf("stats %+v: want every request answered by the live frontend", st)
	}
	for _, r := range results {
		want := []int{1}
		if r.Client == 0 {
			want = []int{0, 1} // home is the dead frontend
		}
		if !slices.Equal(r.Frontends, want) || r.Reply.GetReqId() != 1 {
			t.Fatalf("client %d request %s: frontends %v reply %v; want %v", r.Client, r.Request.GetRequestId(), r.Frontends, r.Reply, want)
		}
	}
	// The retry carried the same request_id.
	if len(dead.ids) != 5 {
		t.Fatalf("dead frontend saw %v; want client 0's 5 requests", dead.ids)
	}
	for _, id := range dead.ids {
		if !slices.Contains(live.ids, id) {
			t.Fatalf("request %s was not retried on the live frontend", id)
		}
	}

	// Not Unavailable: no retry. All Unavailable: Retries bounds it.
	bad := &fixedFrontend{err: status.Error(codes.InvalidArgument, "bad")}
	st, err = Run(context.Background(), RunConfig{Frontends: []hamsv1.FrontendClient{bad, live}, Requests: 3,
		NewRequest: func(int, uint64) *hamsv1.PredictRequest { return &hamsv1.PredictRequest{} }})
	if err != nil || st.Errors != 3 || len(live.ids) != 10 {
		t.Fatalf("InvalidArgument retried: stats %+v, live saw %d", st, len(live.ids))
	}
	// All down: retried until the deadline (or Retries).
	d2 := &fixedFrontend{err: status.Error(codes.Unavailable, "down")}
	st, err = Run(context.Background(), RunConfig{Frontends: []hamsv1.FrontendClient{dead, d2}, Requests: 1, Retries: 3,
		NewRequest: func(int, uint64) *hamsv1.PredictRequest { return &hamsv1.PredictRequest{} }})
	if err != nil || st.Errors != 1 || len(d2.ids) != 2 {
		t.Fatalf("all down, 3 retries: stats %+v, second frontend tried %d times; want 2", st, len(d2.ids))
	}
	var results2 []Result
	st, err = Run(context.Background(), RunConfig{Frontends: []hamsv1.FrontendClient{dead, d2}, Requests: 1, Timeout: 100 * time.Millisecond,
		NewRequest: func(int, uint64) *hamsv1.PredictRequest { return &hamsv1.PredictRequest{} },
		OnResult:   func(r Result) { results2 = append(results2, r) }})
	if err != nil || st.Errors != 1 || len(d2.ids) < 5 || len(results2) != 1 || results2[0].Latency < 100*time.Millisecond {
		t.Fatalf("all down until the deadline: stats %+v, second frontend tried %d times, results %+v", st, len(d2.ids), results2)
	}
}
