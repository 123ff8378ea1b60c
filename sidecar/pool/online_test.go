package pool

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/paritytrain"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/protocol/parity"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver/nn"
	"github.com/hams-go/hams/sidecar"
)

// trainable is a parity instance serving whatever weights it was last
// given (LoadWeights); before that it answers zeros (an untrained model).
type trainable struct {
	net   atomic.Pointer[nn.Net]
	loads atomic.Int64
	// firstLoad is when the first weights were stored (unix ns).
	firstLoad atomic.Int64
}

func (p *trainable) Describe(context.Context) (*hamsv1.ModelDescription, error) {
	return &hamsv1.ModelDescription{Kind: "parity"}, nil
}
func (p *trainable) Health(context.Context) error { return nil }
func (p *trainable) Close() error                 { return nil }

func (p *trainable) Infer(_ context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	x, err := tensor.Float32(req.GetInputs()[0])
	if err != nil {
		return nil, err
	}
	n := len(x) / inW
	y := make([]float32, n*outW)
	if net := p.net.Load(); net != nil {
		y = paritytrain.ForwardRows(net, x, n, 1)
	}
	return &hamsv1.BatchResponse{Outputs: []*hamsv1.Tensor{tensor.FromFloat32("y", []int64{int64(n), outW}, y)}, Rows: req.GetRows()}, nil
}

func (p *trainable) LoadWeights(_ context.Context, _ string, b []byte, _ uint64) error {
	net, err := nn.DecodeNet(b)
	if err != nil {
		return err
	}
	if net.InSize() != inW || net.OutSize() != outW {
		return errors.New("wrong shape")
	}
	p.net.Store(net)
	p.firstLoad.CompareAndSwap(0, time.Now().UnixNano())
	p.loads.Add(1)
	return nil
}

// freezable is a data instance that can be frozen while it serves.
type freezable struct {
	linear
	frozen  atomic.Bool
	release chan struct{}
}

func (f *freezable) Infer(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	if f.frozen.Load() {
		select {
		case <-f.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return f.linear.Infer(ctx, req)
}

// Online training on a simulated live stream: no reconstruction is
// released before the first swap; the parity model trained from served
// traffic reaches the agreement threshold and is swapped into the running
// parity instance without failing a request; afterwards a frozen replica's
// batches are reconstructed.
func TestOnlineTrainingSwapsIntoRunningParity(t *testing.T) {
	w := newWeights(12)
	data, _ := instances(w, 3)
	fz := &freezable{linear: linear{w: w}, release: make(chan struct{})}
	data[0] = fz
	pt := &trainable{}
	p, stop := runPool(t, Config{Model: "m", Data: data, Parity: []sidecar.Backend{pt}, ParityModel: "m-parity",
		Redundancy: parity.RedundancyParM, Code: parity.Code{K: 2, R: 1}, Encoder: parity.EncoderSum, FillAfter: 5 * time.Millisecond,
		Online: &OnlineConfig{Arch: "mlp:32", Buffer: 4000, Holdout: 400, MinSamples: 1500, Every: 20 * time.Millisecond, Epochs: 20, MinAgreement: 0.7, Seed: 1}})
	defer stop()
	defer close(fz.release)
	var approxBefore atomic.Int64 // approximate replies received before the first swap
	var errs atomic.Int64
	var served atomic.Int64
	load := func(ctx context.Context, approx *atomic.Int64) {
		var wg sync.WaitGroup
		for c := range 4 {
			wg.Go(func() {
				for i := 0; ctx.Err() == nil; i++ {
					rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					resp, err := p.Infer(rctx, batchOf(1+i%2, uint64(c*1_000_000+i+int(served.Load()))))
					cancel()
					served.Add(1)
					switch {
					case err != nil:
						errs.Add(1)
					case isApprox(resp):
						if first := pt.firstLoad.Load(); approx != &approxBefore || first == 0 || time.Now().UnixNano() < first {
							approx.Add(1)
						}
					}
				}
			})
		}
		wg.Wait()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go func() {
		for pt.loads.Load() == 0 && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	load(ctx, &approxBefore)
	if pt.loads.Load() == 0 {
		t.Fatalf("no swap after %d requests", served.Load())
	}
	if n := approxBefore.Load(); n > 0 {
		t.Errorf("%d approximate replies before the first swap (untrained parity model)", n)
	}
	if errs.Load() > 0 {
		t.Fatalf("%d requests failed around the swap", errs.Load())
	}
	agreement, _ := p.OnlineAgreement()
	t.Logf("first swap after %d requests; agreement %.3f", served.Load(), agreement)
	// A frozen replica now: its batches are reconstructed by the trained model.
	fz.frozen.Store(true)
	var approxAfter atomic.Int64
	ctx2, cancel2 := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel2()
	load(ctx2, &approxAfter)
	if approxAfter.Load() == 0 {
		t.Fatal("no reconstruction with a frozen replica after the swap")
	}
	if errs.Load() > 0 {
		t.Fatalf("%d requests failed", errs.Load())
	}
}
