package reference

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/adapters/refserver"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
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
	return New(cc, "seq", 5*time.Second)
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
