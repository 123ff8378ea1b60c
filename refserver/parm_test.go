package refserver

import (
	"context"
	"log/slog"
	"math"
	"net"
	"slices"
	"testing"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver/models"
	"github.com/hams-go/hams/refserver/nn"
)

// The ParM models of refserver/models served through the
// server: the linear kind is additive end to end (its own parity model),
// and the classifier with parity weights answers the raw parity outputs.
func TestServeParityModels(t *testing.T) {
	const yaml = `
name: p
hosts: [h1]
models:
  - {name: lin, kind: linear}
  - {name: par2, kind: classifier, params: {weights: fashion-parity-sum-k2, deterministic: 1}}
services:
  - {name: s, edges: [[frontend, lin], [lin, par2], [par2, frontend]]}
`
	d, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Deployment: d, Models: []string{"lin", "par2"}, GRPCListener: lis, Logger: slog.New(slog.DiscardHandler)})
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
	t.Cleanup(func() { cc.Close(); cancel(); <-done })
	rt := hamsv1.NewModelRuntimeClient(cc)
	infer := func(model string, x []float32, rows int) []float32 {
		t.Helper()
		r, err := rt.Infer(ctxT(t), &hamsv1.BatchRequest{Model: model, Inputs: []*hamsv1.Tensor{tensor.FromFloat32("images", []int64{int64(rows), 784}, x)}, BatchId: 1})
		if err != nil {
			t.Fatal(err)
		}
		v, err := tensor.Float32(r.Outputs[0])
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	a, b := make([]float32, 2*784), make([]float32, 2*784)
	for i := range a {
		a[i], b[i] = float32(i%13)/12, float32(i%29)/28
	}
	sum := make([]float32, len(a))
	for i := range sum {
		sum[i] = a[i] + b[i]
	}
	fa, fb, fs := infer("lin", a, 2), infer("lin", b, 2), infer("lin", sum, 2)
	for i := range fs {
		if diff := math.Abs(float64(fs[i] - fa[i] - fb[i])); diff > 1e-4*(1+math.Abs(float64(fs[i]))) {
			t.Fatalf("lin(a+b)[%d] = %v, lin(a)+lin(b) = %v", i, fs[i], fa[i]+fb[i])
		}
	}
	pm, err := models.FashionParityMLP(2)
	if err != nil {
		t.Fatal(err)
	}
	want := pm.Forward(nn.Deterministic, sum, 2)
	if got := infer("par2", sum, 2); !slices.Equal(got, want) {
		t.Fatalf("served parity scores %v, want %v", got[:10], want[:10])
	}
}
