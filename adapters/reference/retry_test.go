package reference

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// flakyRuntime answers the first fails calls of every method Unavailable;
// Infer, Compute and Update always.
type flakyRuntime struct {
	hamsv1.UnimplementedModelRuntimeServer
	fails int
	mu    sync.Mutex
	calls map[string]int
}

func (f *flakyRuntime) call(method string, always bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[method]++
	if always || f.calls[method] <= f.fails {
		return status.Errorf(codes.Unavailable, "%s attempt %d: restarting", method, f.calls[method])
	}
	return nil
}

func (f *flakyRuntime) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

func (f *flakyRuntime) Describe(context.Context, *hamsv1.DescribeRequest) (*hamsv1.ModelDescription, error) {
	if err := f.call("Describe", false); err != nil {
		return nil, err
	}
	return &hamsv1.ModelDescription{Name: "m", Kind: "classifier"}, nil
}

func (f *flakyRuntime) Health(context.Context, *hamsv1.HealthRequest) (*hamsv1.HealthResponse, error) {
	if err := f.call("Health", false); err != nil {
		return nil, err
	}
	return &hamsv1.HealthResponse{Live: true, Ready: true}, nil
}

func (f *flakyRuntime) Infer(context.Context, *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	return nil, f.call("Infer", true)
}

func (f *flakyRuntime) Compute(context.Context, *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	return nil, f.call("Compute", true)
}

func (f *flakyRuntime) Update(context.Context, *hamsv1.UpdateRequest) (*hamsv1.UpdateResponse, error) {
	return nil, f.call("Update", true)
}

// TestIdempotentCallsRetried: Describe and Health answering Unavailable
// twice succeed on the third attempt; Infer, Compute and Update answering
// Unavailable are attempted once and fail with it.
func TestIdempotentCallsRetried(t *testing.T) {
	f := &flakyRuntime{fails: 2, calls: map[string]int{}}
	b := New(startRuntime(t, f), "m", 5*time.Second).WithoutDeltaRegion()
	defer b.Close()
	ctx := context.Background()
	if _, err := b.Describe(ctx); err != nil {
		t.Fatalf("describe: %v", err)
	}
	if err := b.Health(ctx); err != nil {
		t.Fatalf("health: %v", err)
	}
	for _, m := range []string{"Describe", "Health"} {
		if n := f.count(m); n != 3 {
			t.Errorf("%s called %d times, want 3", m, n)
		}
	}
	_, err := b.Infer(ctx, &hamsv1.BatchRequest{BatchId: 1})
	wantUnavailable(t, "infer", err)
	_, err = b.Compute(ctx, &hamsv1.BatchRequest{BatchId: 1})
	wantUnavailable(t, "compute", err)
	_, err = b.Compute(ctx, &hamsv1.BatchRequest{BatchId: 2, StageDelta: true})
	wantUnavailable(t, "compute with delta", err)
	wantUnavailable(t, "update", b.Update(ctx, 1))
	for m, want := range map[string]int{"Infer": 1, "Compute": 2, "Update": 1} {
		if n := f.count(m); n != want {
			t.Errorf("%s called %d times, want %d (never retried)", m, n, want)
		}
	}
	// More failures than attempts: the last Unavailable comes back.
	g := &flakyRuntime{fails: 10, calls: map[string]int{}}
	_, err = New(startRuntime(t, g), "m", 5*time.Second).Describe(ctx)
	wantUnavailable(t, "describe exhausted", err)
	if n := g.count("Describe"); n != 3 {
		t.Errorf("describe exhausted after %d calls, want 3", n)
	}
}

func wantUnavailable(t *testing.T, what string, err error) {
	t.Helper()
	if status.Code(err) != codes.Unavailable {
		t.Errorf("%s: %v, want Unavailable", what, err)
	}
}
