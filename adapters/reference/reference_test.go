package reference

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/grpcx"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

type fakeRuntime struct {
	hamsv1.UnimplementedModelRuntimeServer
	inferErr error
	ready    bool
	block    chan struct{}
	gotModel string
}

func (f *fakeRuntime) Describe(_ context.Context, r *hamsv1.DescribeRequest) (*hamsv1.ModelDescription, error) {
	if r.Model != "m" {
		return nil, status.Errorf(codes.NotFound, "no model %q", r.Model)
	}
	return &hamsv1.ModelDescription{Name: "m", Kind: "classifier", Inputs: []*hamsv1.TensorSpec{{Name: "images"}}}, nil
}

func (f *fakeRuntime) Infer(ctx context.Context, r *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	f.gotModel = r.Model
	if f.block != nil {
		select {
		case <-f.block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if f.inferErr != nil {
		return nil, f.inferErr
	}
	return &hamsv1.BatchResponse{Outputs: r.Inputs, Rows: r.Rows, BatchId: r.BatchId}, nil
}

func (f *fakeRuntime) Health(context.Context, *hamsv1.HealthRequest) (*hamsv1.HealthResponse, error) {
	return &hamsv1.HealthResponse{Live: true, Ready: f.ready, Detail: "warming up"}, nil
}

func start(t *testing.T, f *fakeRuntime) *grpc.ClientConn {
	t.Helper()
	return startRuntime(t, f)
}

func startRuntime(t *testing.T, f hamsv1.ModelRuntimeServer) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hamsv1.RegisterModelRuntimeServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	cc, err := grpcx.Dial(lis.Addr().String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func TestBackend(t *testing.T) {
	f := &fakeRuntime{ready: true}
	b := New(start(t, f), "m", 2*time.Second)
	defer b.Close()
	ctx := context.Background()
	d, err := b.Describe(ctx)
	if err != nil || d.Kind != "classifier" {
		t.Fatalf("describe: %v %v", d, err)
	}
	resp, err := b.Infer(ctx, &hamsv1.BatchRequest{Rows: []uint32{1}, BatchId: 4})
	if err != nil || resp.BatchId != 4 || f.gotModel != "m" {
		t.Fatalf("infer: %v %v (model %q)", resp, err, f.gotModel)
	}
	if err := b.Health(ctx); err != nil {
		t.Fatalf("health: %v", err)
	}
	f.ready = false
	if err := b.Health(ctx); status.Code(err) != codes.Unavailable {
		t.Fatalf("not-ready health: %v", err)
	}
	if _, err := New(start(t, f), "nope", 0).Describe(ctx); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown model: %v", err)
	}
}

func TestBackendErrorCodesPassThrough(t *testing.T) {
	for _, c := range []codes.Code{codes.InvalidArgument, codes.ResourceExhausted, codes.Internal, codes.Unavailable} {
		f := &fakeRuntime{inferErr: status.Error(c, "boom")}
		_, err := New(start(t, f), "m", time.Second).Infer(context.Background(), &hamsv1.BatchRequest{})
		if status.Code(err) != c {
			t.Fatalf("code %v became %v (%v)", c, status.Code(err), err)
		}
	}
}

func TestBackendTimeout(t *testing.T) {
	f := &fakeRuntime{block: make(chan struct{})}
	defer close(f.block)
	_, err := New(start(t, f), "m", 20*time.Millisecond).Infer(context.Background(), &hamsv1.BatchRequest{})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("timeout: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = New(start(t, f), "m", 0).Infer(ctx, &hamsv1.BatchRequest{})
	if status.Code(err) != codes.Canceled {
		t.Fatalf("canceled: %v", err)
	}
}
