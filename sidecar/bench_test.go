package sidecar

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"google.golang.org/grpc"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/edge"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// lineageBatch builds n requests that went through 4 models before this
// one (frontend -> m1 -> m2 -> m3 -> m4 -> me), each with a [1,10] FP32
// output, plus the same for a join of two such branches.
func lineageBatch(n, joinParts int) ([][]*hamsv1.Item, [][]*hamsv1.Tensor) {
	parts := make([][]*hamsv1.Item, n)
	outs := make([][]*hamsv1.Tensor, n)
	for i := range parts {
		for p := 0; p < joinParts; p++ {
			var lin []*hamsv1.LineageEntry
			prev, prevSeq := config.Frontend, uint64(i+1)
			for d := 1; d <= 4; d++ {
				m := fmt.Sprintf("m%d", d)
				if p > 0 && d >= 3 {
					m = fmt.Sprintf("m%d_%d", d, p) // branches split after m2
				}
				lin = append(lin, &hamsv1.LineageEntry{PredModel: prev, PredSeq: prevSeq, Model: m, Seq: uint64(1000 + i), OutputDigest: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"})
				prev, prevSeq = m, uint64(1000+i)
			}
			parts[i] = append(parts[i], &hamsv1.Item{FromModel: prev, ReqId: uint64(i), Lineage: lin})
		}
		outs[i] = []*hamsv1.Tensor{tensor.FromFloat32("scores", []int64{1, 10}, make([]float32, 10))}
	}
	return parts, outs
}

// BenchmarkLineageBatch64 is the lineage bookkeeping of one batch of 64
// requests (seqs, merge, entries, output digests). Target: <= 0.1 ms.
func BenchmarkLineageBatch64(b *testing.B) {
	for _, jp := range []int{1, 2} {
		b.Run(fmt.Sprintf("preds=%d", jp), func(b *testing.B) {
			parts, outs := lineageBatch(64, jp)
			l := NewLineage("me", 0, 0)
			b.ReportAllocs()
			for b.Loop() {
				l.RecordBatch(parts, outs)
			}
		})
	}
}

type echoBackend struct{}

func (echoBackend) Describe(context.Context) (*hamsv1.ModelDescription, error) {
	return &hamsv1.ModelDescription{Inputs: []*hamsv1.TensorSpec{{Name: "*"}}}, nil
}
func (echoBackend) Infer(_ context.Context, r *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	return &hamsv1.BatchResponse{Outputs: r.Inputs, Rows: r.Rows, BatchId: r.BatchId}, nil
}
func (echoBackend) Health(context.Context) error { return nil }
func (echoBackend) Close() error                 { return nil }

type chanSink chan uint64

func (c chanSink) deliver(_ string, items []*hamsv1.Item) {
	for _, it := range items {
		c <- it.ReqId
	}
}

// BenchmarkHop measures one request at a time, frontend stand-in ->
// sidecar (echo backend, batch 1) -> frontend stand-in, over loopback gRPC
// ("sidecar"), against the same two edges with a bare edge relay in place
// of the sidecar ("relay": transport only). The difference is what the
// sidecar adds per hop.
func BenchmarkHop(b *testing.B) {
	for _, mode := range []string{"relay", "sidecar"} {
		b.Run(mode, func(b *testing.B) {
			dep, err := config.Parse([]byte(chainGraph))
			if err != nil {
				b.Fatal(err)
			}
			dep.Models[0].Batch.Size = 1
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer func() { cancel(); wg.Wait() }()
			res := edge.NewStaticResolver(nil)
			sink := make(chanSink, 16)
			flis := listen(b)
			res.Set(config.Frontend, flis.Addr().String(), 0)
			fsrv := grpc.NewServer()
			hamsv1.RegisterDataplaneServer(fsrv, edge.NewReceiver(config.Frontend, sink.deliver, nil))
			wg.Add(2)
			go func() { defer wg.Done(); _ = fsrv.Serve(flis) }()
			go func() { defer wg.Done(); <-ctx.Done(); fsrv.Stop() }()
			alis := listen(b)
			res.Set("a", alis.Addr().String(), 0)
			switch mode {
			case "sidecar":
				sc, err := New(Config{Deployment: dep, Model: "a", Backend: echoBackend{}, Resolver: res, GRPCListener: alis})
				if err != nil {
					b.Fatal(err)
				}
				wg.Add(1)
				go func() { defer wg.Done(); _ = sc.Run(ctx) }()
			case "relay":
				out, _ := edge.NewSender(edge.SenderConfig{From: "a", To: config.Frontend, Resolver: res})
				asrv := grpc.NewServer()
				hamsv1.RegisterDataplaneServer(asrv, edge.NewReceiver("a", func(_ string, items []*hamsv1.Item) {
					for _, it := range items {
						out.Send(&hamsv1.Item{ReqId: it.ReqId, Tensors: it.Tensors, Lineage: it.Lineage})
					}
				}, nil))
				wg.Add(3)
				go func() { defer wg.Done(); _ = out.Run(ctx) }()
				go func() { defer wg.Done(); _ = asrv.Serve(alis) }()
				go func() { defer wg.Done(); <-ctx.Done(); asrv.Stop() }()
			}
			in, _ := edge.NewSender(edge.SenderConfig{From: config.Frontend, To: "a", Resolver: res})
			wg.Add(1)
			go func() { defer wg.Done(); _ = in.Run(ctx) }()
			x := tensor.FromFloat32("images", []int64{1, 784}, make([]float32, 784))
			id := uint64(0)
			roundTrip := func() {
				id++
				in.Send(&hamsv1.Item{ReqId: id, Service: "s", Tensors: []*hamsv1.Tensor{x}})
				if got := <-sink; got != id {
					b.Fatalf("got req %d, want %d", got, id)
				}
			}
			for i := 0; i < 200; i++ {
				roundTrip()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				roundTrip()
			}
		})
	}
}
