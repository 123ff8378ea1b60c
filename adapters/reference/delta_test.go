package reference

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/shm"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	"github.com/hams-go/hams/refserver"
)

const deltaYAML = `
name: t
hosts: [h1, h2]
models:
  - name: seq
    kind: lstm
    stateful: true
    params: {in_dim: 4, hidden: 8, streams: 64}
    placement: {primary: h1, backup: h2}
services:
  - name: s
    edges: [[frontend, seq], [seq, frontend]]
`

// refBackend runs a reference model server hosting seq and returns a
// Backend over it.
func refBackend(t *testing.T) *Backend {
	t.Helper()
	b, _ := refBackendConn(t)
	return b
}

// refBackendConn is refBackend with the connection.
func refBackendConn(t *testing.T) (*Backend, *grpc.ClientConn) {
	t.Helper()
	d, err := config.Parse([]byte(deltaYAML))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := refserver.New(refserver.Config{Deployment: d, Models: []string{"seq"}, GRPCListener: lis, Registry: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	cc, err := grpcx.Dial(lis.Addr().String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		cancel()
		<-done
	})
	return New(cc, "seq", 5*time.Second), cc
}

// Over gRPC: a compute's staged delta, written as a partial WriteState to
// a replica at the same base, leaves both model servers with the same
// state; a partial write on another base is FailedPrecondition.
func TestStateDeltaOverGRPC(t *testing.T) {
	prim, repl := refBackend(t), refBackend(t)
	ctx := context.Background()
	d, err := prim.Describe(ctx)
	if err != nil || !d.GetStateDelta() {
		t.Fatalf("describe: %v %v", d, err)
	}
	x := tensor.FromFloat32("x", []int64{3, 4}, []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	var specs []*hamsv1.TensorSpec
	for i := uint64(1); i <= 3; i++ {
		resp, err := prim.Compute(ctx, &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{x}, Rows: []uint32{1, 2}, StreamIds: []string{"a", "b"}, BatchId: i, StageDelta: true})
		if err != nil || !resp.GetHasStateDelta() || len(resp.GetStateDelta()) == 0 {
			t.Fatalf("compute %d: %v %v", i, resp, err)
		}
		if err := prim.Update(ctx, i); err != nil {
			t.Fatal(err)
		}
		if specs == nil {
			ts, _, err := prim.ReadState(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, ts := range ts {
				specs = append(specs, &hamsv1.TensorSpec{Name: ts.Name, Datatype: ts.Datatype, Shape: ts.Shape})
			}
		}
		if err := repl.WriteStateRanges(ctx, specs, i-1, i, resp.GetStateDelta()); err != nil {
			t.Fatalf("write ranges %d: %v", i, err)
		}
	}
	a, va, _ := prim.ReadState(ctx)
	b, vb, _ := repl.ReadState(ctx)
	if va != vb || tensor.Digest(a...) != tensor.Digest(b...) {
		t.Fatalf("replica at version %d digest %s, primary %d %s", vb, tensor.Digest(b...), va, tensor.Digest(a...))
	}
	err = repl.WriteStateRanges(ctx, specs, 1, 9, []*hamsv1.StateRange{{Offset: 0, Data: make([]byte, 4)}})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("partial write on a stale base: %v", err)
	}
	err = repl.WriteStateRanges(ctx, specs[:1], 3, 4, nil)
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("partial write with the wrong tensors: %v", err)
	}
}

// The delta handoff through a shared-memory region gives the ranges the
// inline path gives, leaves no name in /dev/shm, and survives the model
// server losing the region (a restart): that compute's delta comes inline
// and a new region is registered.
func TestStateDeltaThroughSharedMemory(t *testing.T) {
	viaShm, cc := refBackendConn(t)
	inline := refBackend(t).WithoutDeltaRegion()
	viaShm.delta.retryEvery = 0
	ctx := context.Background()
	for _, b := range []*Backend{viaShm, inline} {
		if _, err := b.Describe(ctx); err != nil {
			t.Fatal(err)
		}
	}
	x := tensor.FromFloat32("x", []int64{3, 4}, []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	var regions []string
	for i := uint64(1); i <= 4; i++ {
		if i == 3 {
			// The server forgets the region, as a restarted one would.
			if _, err := viaShm.ks.SystemSharedMemoryUnregister(ctx, &inference.SystemSharedMemoryUnregisterRequest{Name: viaShm.delta.name}); err != nil {
				t.Fatal(err)
			}
		}
		var got [2]*hamsv1.BatchResponse
		for k, b := range []*Backend{viaShm, inline} {
			resp, err := b.Compute(ctx, &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{x}, Rows: []uint32{1, 2}, StreamIds: []string{"a", "b"}, BatchId: i, StageDelta: true})
			if err != nil || !resp.GetHasStateDelta() || len(resp.GetStateDelta()) == 0 {
				t.Fatalf("compute %d: %v %v", i, resp, err)
			}
			if resp.GetStateDeltaRegion() != "" || len(resp.GetStateDeltaSizes()) != 0 {
				t.Fatalf("compute %d: region fields left on the response: %q %v", i, resp.GetStateDeltaRegion(), resp.GetStateDeltaSizes())
			}
			if err := b.Update(ctx, i); err != nil {
				t.Fatal(err)
			}
			got[k] = resp
		}
		if !proto.Equal(&hamsv1.BatchResponse{StateDelta: got[0].GetStateDelta()}, &hamsv1.BatchResponse{StateDelta: got[1].GetStateDelta()}) {
			t.Fatalf("compute %d: delta through shared memory differs from inline", i)
		}
		switch i {
		case 3:
			if viaShm.delta.m != nil {
				t.Fatal("the region the server lost is still lent")
			}
		default:
			if viaShm.delta.m == nil || !viaShm.delta.inUse {
				t.Fatalf("compute %d: no region in use", i)
			}
			if shm.Exists(viaShm.delta.name) {
				t.Fatalf("region %s left in /dev/shm", viaShm.delta.name)
			}
			regions = append(regions, viaShm.delta.name)
		}
	}
	if regions[0] != regions[1] || regions[2] != regions[1] {
		t.Fatalf("region names by compute: %v (want one name per model)", regions)
	}
	// A second backend of the same model on the same server (a sidecar
	// that replaced a killed one) takes the region name over.
	again := New(cc, "seq", 5*time.Second)
	if _, err := again.Describe(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := again.Compute(ctx, &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{x}, Rows: []uint32{1, 2}, StreamIds: []string{"a", "b"}, BatchId: 5, StageDelta: true}); err != nil || !again.delta.inUse {
		t.Fatalf("second backend: %v, region in use %v", err, again.delta.inUse)
	}
	if st, err := again.ks.SystemSharedMemoryStatus(ctx, &inference.SystemSharedMemoryStatusRequest{}); err != nil || len(st.GetRegions()) != 1 {
		t.Fatalf("regions after the takeover: %v %v", st, err)
	}
	viaShm = again
	if inline.delta.m != nil {
		t.Fatal("WithoutDeltaRegion lent a region")
	}
	a, _, _ := viaShm.ReadState(ctx)
	b, _, _ := inline.ReadState(ctx)
	if tensor.Digest(a...) != tensor.Digest(b...) {
		t.Fatal("states differ")
	}
	if err := viaShm.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := viaShm.ks.SystemSharedMemoryStatus(ctx, &inference.SystemSharedMemoryStatusRequest{})
	if err != nil || len(st.GetRegions()) != 0 {
		t.Fatalf("regions registered after Close: %v %v", st, err)
	}
}

// notSharedKServe answers every registration as a model server on another
// host does: the key does not exist there.
type notSharedKServe struct {
	inference.GRPCInferenceServiceClient
	calls int
}

func (n *notSharedKServe) SystemSharedMemoryRegister(context.Context, *inference.SystemSharedMemoryRegisterRequest, ...grpc.CallOption) (*inference.SystemSharedMemoryRegisterResponse, error) {
	n.calls++
	return nil, status.Error(codes.NotFound, "Unable to open shared memory region")
}

// A model server that shares no /dev/shm (NotFound on registration) gets
// deltas inline from then on, without a registration attempt per batch.
func TestStateDeltaInlineWhenNoSharedMemory(t *testing.T) {
	b := refBackend(t)
	b.delta.retryEvery = 0
	ks := &notSharedKServe{GRPCInferenceServiceClient: b.ks}
	b.ks = ks
	ctx := context.Background()
	if _, err := b.Describe(ctx); err != nil {
		t.Fatal(err)
	}
	x := tensor.FromFloat32("x", []int64{3, 4}, []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	for i := uint64(1); i <= 3; i++ {
		resp, err := b.Compute(ctx, &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{x}, Rows: []uint32{1, 2}, StreamIds: []string{"a", "b"}, BatchId: i, StageDelta: true})
		if err != nil || len(resp.GetStateDelta()) == 0 || len(resp.GetStateDelta()[0].GetData()) == 0 {
			t.Fatalf("compute %d: %v %v", i, resp, err)
		}
		if err := b.Update(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	if ks.calls != 1 || !b.delta.disabled {
		t.Fatalf("%d registration attempts, disabled %v (want 1, true)", ks.calls, b.delta.disabled)
	}
}
