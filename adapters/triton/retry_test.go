package triton

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
)

// flakyKServe answers the first fails calls of every method Unavailable;
// ModelInfer and the shared memory Register always.
type flakyKServe struct {
	inference.UnimplementedGRPCInferenceServiceServer
	fails int
	mu    sync.Mutex
	calls map[string]int
}

func (f *flakyKServe) call(method string, always bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[method]++
	if always || f.calls[method] <= f.fails {
		return status.Errorf(codes.Unavailable, "%s attempt %d: restarting", method, f.calls[method])
	}
	return nil
}

func (f *flakyKServe) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

func (f *flakyKServe) ServerLive(context.Context, *inference.ServerLiveRequest) (*inference.ServerLiveResponse, error) {
	if err := f.call("ServerLive", false); err != nil {
		return nil, err
	}
	return &inference.ServerLiveResponse{Live: true}, nil
}

func (f *flakyKServe) ServerReady(context.Context, *inference.ServerReadyRequest) (*inference.ServerReadyResponse, error) {
	if err := f.call("ServerReady", false); err != nil {
		return nil, err
	}
	return &inference.ServerReadyResponse{Ready: true}, nil
}

func (f *flakyKServe) ModelReady(context.Context, *inference.ModelReadyRequest) (*inference.ModelReadyResponse, error) {
	if err := f.call("ModelReady", false); err != nil {
		return nil, err
	}
	return &inference.ModelReadyResponse{Ready: true}, nil
}

// ModelMetadata: one explicit state tensor h (h_in, h_out).
func (f *flakyKServe) ModelMetadata(_ context.Context, r *inference.ModelMetadataRequest) (*inference.ModelMetadataResponse, error) {
	if err := f.call("ModelMetadata", false); err != nil {
		return nil, err
	}
	tm := func(n string, shape ...int64) *inference.ModelMetadataResponse_TensorMetadata {
		return &inference.ModelMetadataResponse_TensorMetadata{Name: n, Datatype: "FP32", Shape: shape}
	}
	return &inference.ModelMetadataResponse{Name: r.Name, Platform: "fake",
		Inputs:  []*inference.ModelMetadataResponse_TensorMetadata{tm("x", -1, 2), tm("h_in", 2)},
		Outputs: []*inference.ModelMetadataResponse_TensorMetadata{tm("y", -1, 2), tm("h_out", 2)}}, nil
}

func (f *flakyKServe) SystemSharedMemoryStatus(context.Context, *inference.SystemSharedMemoryStatusRequest) (*inference.SystemSharedMemoryStatusResponse, error) {
	if err := f.call("SystemSharedMemoryStatus", false); err != nil {
		return nil, err
	}
	return &inference.SystemSharedMemoryStatusResponse{}, nil
}

func (f *flakyKServe) SystemSharedMemoryRegister(context.Context, *inference.SystemSharedMemoryRegisterRequest) (*inference.SystemSharedMemoryRegisterResponse, error) {
	return nil, f.call("SystemSharedMemoryRegister", true)
}

func (f *flakyKServe) ModelInfer(context.Context, *inference.ModelInferRequest) (*inference.ModelInferResponse, error) {
	return nil, f.call("ModelInfer", true)
}

func startFlaky(t *testing.T, f *flakyKServe) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	inference.RegisterGRPCInferenceServiceServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// TestIdempotentCallsRetried: ModelMetadata, the three health calls and
// SystemSharedMemoryStatus answering Unavailable twice succeed on the
// third attempt; ModelInfer and SystemSharedMemoryRegister answering
// Unavailable are attempted once and fail with it; Retries: 1 attempts
// everything once.
func TestIdempotentCallsRetried(t *testing.T) {
	f := &flakyKServe{fails: 2, calls: map[string]int{}}
	cc := dial(t, startFlaky(t, f))
	ctx := ctxT(t)
	b, err := New(Config{Conn: cc, Model: "m", Timeout: 5 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Describe(ctx); err != nil {
		t.Fatalf("describe: %v", err)
	}
	if err := b.Health(ctx); err != nil {
		t.Fatalf("health: %v", err)
	}
	if _, err := b.Infer(ctx, &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{tensor.FromFloat32("x", []int64{1, 2}, []float32{1, 2})}, Rows: []uint32{1}, BatchId: 1}); status.Code(err) != codes.Unavailable {
		t.Fatalf("infer: %v, want Unavailable", err)
	}
	s, err := NewStateful(Config{Conn: cc, Model: "m", Timeout: 5 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.mem.registered(ctx); err != nil {
		t.Fatalf("shared memory status: %v", err)
	}
	if err := s.Setup(ctx); status.Code(err) != codes.Unavailable {
		t.Fatalf("setup with register failing: %v, want Unavailable", err)
	}
	// ModelMetadata: three attempts for b, one for s (the server fails
	// only the first two calls of a method).
	for m, want := range map[string]int{"ModelMetadata": 4, "ServerLive": 3, "ServerReady": 3, "ModelReady": 3,
		"SystemSharedMemoryStatus": 3, "ModelInfer": 1, "SystemSharedMemoryRegister": 1} {
		if n := f.count(m); n != want {
			t.Errorf("%s called %d times, want %d", m, n, want)
		}
	}

	g := &flakyKServe{fails: 2, calls: map[string]int{}}
	once, err := New(Config{Conn: dial(t, startFlaky(t, g)), Model: "m", Timeout: 5 * time.Second, Retries: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := once.Health(ctx); status.Code(err) != codes.Unavailable || g.count("ServerLive") != 1 {
		t.Fatalf("health with Retries 1: %v after %d calls", err, g.count("ServerLive"))
	}
	if _, err := New(Config{Conn: cc, Model: "m", Retries: -1}); err == nil {
		t.Fatal("negative retries accepted")
	}
}
