package overhead

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/hams-go/hams/adapters/clipper"
	"github.com/hams-go/hams/adapters/clipper/clipperstub"
	"github.com/hams-go/hams/adapters/reference"
	"github.com/hams-go/hams/adapters/tfserving"
	"github.com/hams-go/hams/adapters/triton"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/edge"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/hamsmd"
	"github.com/hams-go/hams/internal/pki"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
	"github.com/hams-go/hams/refserver"
	"github.com/hams-go/hams/refserver/models"
	"github.com/hams-go/hams/sidecar"
)

// dep: the Fashion-MNIST classifier (input images [1,784] FP32, output
// scores [1,10]) as a one-model service, batch 1, bare mode (no
// replication: the adapters' stateless path).
const dep = `
name: overhead
mode: bare
models:
  - {name: fashion, kind: classifier, batch: {size: 1}}
services:
  - name: fashion
    inputs: [{name: images, datatype: FP32, shape: [-1, 784]}]
    edges: [[frontend, fashion], [fashion, frontend]]
`

func listen(b testing.TB) net.Listener {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	return l
}

func image() []float32 {
	v := make([]float32, 784)
	for i := range v {
		v[i] = float32(i%255) / 255
	}
	return v
}

// setup is one adapter's benchmark: direct makes one call of the
// backend's own API as a client would (encode, call, decode the scores);
// backend is the adapter over the same server, for the sidecar.
type setup struct {
	direct  func(ctx context.Context) error
	backend sidecar.Backend
}

// dialBackend dials a backend as `hams sidecar` does (message limit, the
// identity interceptor).
func dialBackend(b testing.TB, addr string) *grpc.ClientConn {
	cc, err := grpcx.Dial(addr, 0, grpc.WithChainUnaryInterceptor(hamsmd.UnaryClientInterceptor()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	return cc
}

func scoresOK(v []float32, err error) error {
	if err != nil {
		return err
	}
	if len(v) != 10 {
		return fmt.Errorf("%d scores", len(v))
	}
	return nil
}

// refSetups builds the gRPC adapters' setups over one reference model
// server (it speaks ModelRuntime, TF Serving and KServe v2).
func refSetups(b testing.TB, ctx context.Context, d *config.Deployment, wg *sync.WaitGroup) map[string]setup {
	lis := listen(b)
	srv, err := refserver.New(refserver.Config{Deployment: d, Models: []string{"fashion"}, GRPCListener: lis, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = srv.Run(ctx) }()
	addr := lis.Addr().String()
	// The direct clients have a connection of their own (no interceptor).
	dc, err := grpcx.Dial(addr, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { dc.Close() })
	img := image()
	out := map[string]setup{}

	rt := hamsv1.NewModelRuntimeClient(dc)
	out["reference"] = setup{
		direct: func(ctx context.Context) error {
			resp, err := rt.Infer(ctx, &hamsv1.BatchRequest{Model: "fashion", Rows: []uint32{1}, StreamIds: []string{""},
				Inputs: []*hamsv1.Tensor{tensor.FromFloat32("images", []int64{1, 784}, img)}})
			if err != nil {
				return err
			}
			return scoresOK(tensor.Float32(resp.GetOutputs()[0]))
		},
		backend: reference.New(dialBackend(b, addr), "fashion", 5*time.Second),
	}

	pc := tfapis.NewPredictionServiceClient(dc)
	tb, err := tfserving.New(dialBackend(b, addr), tfserving.Config{Model: "fashion", Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	out["tfserving"] = setup{
		direct: func(ctx context.Context) error {
			tp, err := wire.ToTensorProto(tensor.FromFloat32("images", []int64{1, 784}, img))
			if err != nil {
				return err
			}
			resp, err := pc.Predict(ctx, &tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "fashion", SignatureName: "serving_default"},
				Inputs: map[string]*tfpb.TensorProto{"images": tp}})
			if err != nil {
				return err
			}
			t, err := wire.FromTensorProto("scores", resp.GetOutputs()["scores"])
			if err != nil {
				return err
			}
			return scoresOK(tensor.Float32(t))
		},
		backend: tb,
	}

	kc := inference.NewGRPCInferenceServiceClient(dc)
	kb, err := triton.New(triton.Config{Conn: dialBackend(b, addr), Model: "fashion", Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	out["triton"] = setup{
		direct: func(ctx context.Context) error {
			resp, err := kc.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "fashion",
				Inputs:           []*inference.ModelInferRequest_InferInputTensor{{Name: "images", Datatype: "FP32", Shape: []int64{1, 784}}},
				RawInputContents: [][]byte{tensor.FromFloat32("images", []int64{1, 784}, img).Data}})
			if err != nil {
				return err
			}
			o := resp.GetOutputs()[0]
			return scoresOK(tensor.Float32(&hamsv1.Tensor{Name: o.GetName(), Datatype: o.GetDatatype(), Shape: o.GetShape(), Data: resp.GetRawOutputContents()[0]}))
		},
		backend: kb,
	}
	return out
}

// clipperSetup serves the classifier as a Clipper application (the
// query-frontend stub) over HTTP.
func clipperSetup(b testing.TB, ctx context.Context, d *config.Deployment, wg *sync.WaitGroup) setup {
	m, err := models.New(d.Model("fashion"))
	if err != nil {
		b.Fatal(err)
	}
	app, err := clipperstub.NewApp(m)
	if err != nil {
		b.Fatal(err)
	}
	lis := listen(b)
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = grpcx.ServeHTTP(ctx, clipperstub.Handler(map[string]*clipperstub.App{"fashion": app}), lis)
	}()
	url := "http://" + lis.Addr().String() + "/fashion/predict"
	be, err := clipper.New(clipper.Config{Address: lis.Addr().String(), App: "fashion", Input: "images", Output: "scores", Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	hc := &http.Client{}
	img := image()
	return setup{
		direct: func(ctx context.Context) error {
			body, err := json.Marshal(map[string][]float32{"input": img})
			if err != nil {
				return err
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := hc.Do(req)
			if err != nil {
				return err
			}
			data, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				return err
			}
			var a struct {
				Output  []float32 `json:"output"`
				Default bool      `json:"default"`
			}
			if err := json.Unmarshal(data, &a); err != nil || a.Default {
				return fmt.Errorf("answer %s: %v", data, err)
			}
			return scoresOK(a.Output, nil)
		},
		backend: be,
	}
}

// timed is the adapter under the sidecar, stamping when each Infer starts
// and ends (monotonic ns since base), to split a sidecar round trip into
// its way in (the entry hop and the sidecar up to the adapter), the
// adapter's call, and its way out.
type timed struct {
	sidecar.Backend
	base       time.Time
	start, end atomic.Int64
}

func (t *timed) Infer(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	t.start.Store(int64(time.Since(t.base)))
	resp, err := t.Backend.Infer(ctx, req)
	t.end.Store(int64(time.Since(t.base)))
	return resp, err
}

// split is one sidecar round trip's parts.
type split struct{ in, call, out time.Duration }

type sink chan *hamsv1.Item

func (s sink) deliver(_ string, items []*hamsv1.Item) {
	for _, it := range items {
		s <- it
	}
}

// viaSidecar starts a sidecar over be and a frontend stand-in (an entry
// edge sender and a sink edge receiver, as the frontend has) and returns
// one round trip: an item with the image in, the sink item out; last
// splits the latest round trip.
func viaSidecar(b testing.TB, ctx context.Context, d *config.Deployment, be sidecar.Backend, wg *sync.WaitGroup) (round func() error, last func() split) {
	return viaSidecarSec(b, ctx, d, be, wg, nil)
}

// hopCerts are the certificates of a mutual-TLS data path: the frontend
// stand-in's and the sidecar's (nil: plaintext).
type hopCerts struct{ frontend, sidecar *pki.Source }

func viaSidecarSec(b testing.TB, ctx context.Context, d *config.Deployment, be sidecar.Backend, wg *sync.WaitGroup, sec *hopCerts) (round func() error, last func() split) {
	tb := &timed{Backend: be, base: time.Now()}
	be = tb
	var lastSplit split
	res := edge.NewStaticResolver(nil)
	out := make(sink, 16)
	flis := listen(b)
	res.Set(config.Frontend, flis.Addr().String(), 0)
	fopts := grpcx.ServerOptions(slog.New(slog.DiscardHandler), nil, 0)
	var scTLS *pki.Source
	var feDial []grpc.DialOption
	if sec != nil {
		fopts = append(fopts, grpcx.ServerTLS(sec.frontend))
		feDial = append(feDial, grpcx.DialTLS(sec.frontend))
		scTLS = sec.sidecar
	}
	fsrv := grpc.NewServer(fopts...)
	hamsv1.RegisterDataplaneServer(fsrv, edge.NewReceiver(config.Frontend, out.deliver, nil))
	wg.Add(1)
	go func() { defer wg.Done(); _ = grpcx.Serve(ctx, fsrv, flis, 0) }()
	slis := listen(b)
	res.Set("fashion", slis.Addr().String(), 0)
	sc, err := sidecar.New(sidecar.Config{Deployment: d, Model: "fashion", Backend: be, Resolver: res, GRPCListener: slis, TLS: scTLS})
	if err != nil {
		b.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = sc.Run(ctx) }()
	in, err := edge.NewSender(edge.SenderConfig{From: config.Frontend, To: "fashion", Resolver: res, DialOptions: feDial})
	if err != nil {
		b.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = in.Run(ctx) }()
	x := tensor.FromFloat32("images", []int64{1, 784}, image())
	var id uint64
	round = func() error {
		id++
		t0 := time.Since(tb.base)
		in.Send(&hamsv1.Item{ReqId: id, Service: "fashion", StreamId: "s", Tensors: []*hamsv1.Tensor{x}})
		got := <-out
		t3 := time.Since(tb.base)
		if got.GetReqId() != id || got.GetError() != "" {
			return fmt.Errorf("item %d: got %d %q", id, got.GetReqId(), got.GetError())
		}
		t1, t2 := time.Duration(tb.start.Load()), time.Duration(tb.end.Load())
		lastSplit = split{in: t1 - t0, call: t2 - t1, out: t3 - t2}
		in.Complete(id)
		return scoresOK(tensor.Float32(got.GetTensors()[0]))
	}
	return round, func() split { return lastSplit }
}

// cpuTime is the CPU time (user and system) this process used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func p(sorted []time.Duration, q float64) time.Duration {
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// BenchmarkSidecarAdded measures, per adapter at batch 1, the latency the
// HAMS data path adds over a client calling the backend directly: every
// iteration makes one direct call (the backend's own API, encoded and
// decoded as a client does) and one round trip frontend stand-in ->
// sidecar (adapter -> the same backend) -> frontend stand-in, in
// alternating order. Reported: p50 of each (µs), the added p50 and p99
// (µs: differences of the percentiles) and the ratio of the p50s. The
// added time is the sidecar (batching, lineage, identity metadata, the
// adapter's conversions) plus the two Dataplane hops it brings.
func BenchmarkSidecarAdded(b *testing.B) {
	for _, name := range []string{"reference", "tfserving", "triton", "clipper"} {
		b.Run(name, func(b *testing.B) {
			d, err := config.Parse([]byte(dep))
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer func() { cancel(); wg.Wait() }()
			var s setup
			if name == "clipper" {
				s = clipperSetup(b, ctx, d, &wg)
			} else {
				s = refSetups(b, ctx, d, &wg)[name]
			}
			round, last := viaSidecar(b, ctx, d, s.backend, &wg)
			direct := func() error { return s.direct(ctx) }
			sidecarSlot := true
			// HAMS_OVERHEAD_ONLY=direct|sidecar runs one path in both
			// slots (to profile it alone).
			switch os.Getenv("HAMS_OVERHEAD_ONLY") {
			case "direct":
				round = direct
				sidecarSlot = false
			case "sidecar":
				direct = round
			}
			for range 300 { // warm up both paths (connections, caches)
				if err := direct(); err != nil {
					b.Fatal(err)
				}
				if err := round(); err != nil {
					b.Fatal(err)
				}
			}
			dd := make([]time.Duration, 0, b.N)
			sd := make([]time.Duration, 0, b.N)
			var ins, calls, outs []time.Duration
			cpu0 := cpuTime()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				first, second, fs, ss := direct, round, &dd, &sd
				if i%2 == 1 {
					first, second, fs, ss = round, direct, &sd, &dd
				}
				t0 := time.Now()
				if err := first(); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := second(); err != nil {
					b.Fatal(err)
				}
				*fs = append(*fs, t1.Sub(t0))
				*ss = append(*ss, time.Since(t1))
				if sidecarSlot {
					sp := last()
					ins, calls, outs = append(ins, sp.in), append(calls, sp.call), append(outs, sp.out)
				}
			}
			b.StopTimer()
			cpu := cpuTime() - cpu0
			slices.Sort(dd)
			slices.Sort(sd)
			us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
			b.ReportMetric(us(p(dd, 0.5)), "direct-p50-µs")
			b.ReportMetric(us(p(sd, 0.5)), "sidecar-p50-µs")
			b.ReportMetric(us(p(sd, 0.5)-p(dd, 0.5)), "added-p50-µs")
			b.ReportMetric(us(p(sd, 0.99)-p(dd, 0.99)), "added-p99-µs")
			b.ReportMetric(float64(p(sd, 0.5))/float64(p(dd, 0.5)), "p50-ratio")
			b.ReportMetric(us(cpu)/float64(b.N), "cpu-µs/op")
			if sidecarSlot {
				// The sidecar round trip's parts (p50 of each): the way
				// in (entry hop, sidecar up to the adapter), the
				// adapter's call, the way out (sidecar after the
				// adapter, exit hop). in + out is the hops' share of the
				// added time; call - direct the adapter's.
				for _, x := range []struct {
					d    []time.Duration
					name string
				}{{ins, "in-p50-µs"}, {calls, "call-p50-µs"}, {outs, "out-p50-µs"}} {
					slices.Sort(x.d)
					b.ReportMetric(us(p(x.d, 0.5)), x.name)
				}
			}
		})
	}
}

// BenchmarkMutualTLSAdded measures what mutual TLS adds to the HAMS data
// path at batch 1: two identical paths (frontend stand-in -> sidecar ->
// reference model server -> sidecar -> frontend stand-in), one in
// plaintext, one with every hop over mutual TLS with per-component
// certificates and the authorizer on each server, run alternately in
// one process. Reported: the p50 and p99 of each, and the added p50 per
// hop (three hops: the entry edge, the backend call, the exit edge).
func BenchmarkMutualTLSAdded(b *testing.B) {
	d, err := config.Parse([]byte(dep))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()

	dir := b.TempDir()
	ca, err := pki.NewCA(d.Name, time.Now(), 0)
	if err != nil {
		b.Fatal(err)
	}
	issue := func(name string, id pki.Identity) *pki.Source {
		id.Deployment = d.Name
		f, err := ca.IssueFiles(dir, name, id, nil, time.Now())
		if err != nil {
			b.Fatal(err)
		}
		src, err := pki.Load(f)
		if err != nil {
			b.Fatal(err)
		}
		return src
	}
	sec := &hopCerts{frontend: issue("frontend", pki.Identity{Role: pki.RoleFrontend}), sidecar: issue("sidecar", pki.Identity{Role: pki.RoleSidecar, Model: "fashion"})}
	msTLS := issue("modelserver", pki.Identity{Role: pki.RoleModelServer, Model: "fashion"})

	path := func(tlsOn bool) func() error {
		lis := listen(b)
		cfg := refserver.Config{Deployment: d, Models: []string{"fashion"}, GRPCListener: lis, Logger: slog.New(slog.DiscardHandler)}
		opts := []grpc.DialOption{grpc.WithChainUnaryInterceptor(hamsmd.UnaryClientInterceptor())}
		var hs *hopCerts
		if tlsOn {
			cfg.TLS = msTLS
			opts = append(opts, grpcx.DialTLS(sec.sidecar))
			hs = sec
		}
		srv, err := refserver.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = srv.Run(ctx) }()
		cc, err := grpcx.Dial(lis.Addr().String(), 0, opts...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cc.Close() })
		round, _ := viaSidecarSec(b, ctx, d, reference.New(cc, "fashion", 5*time.Second), &wg, hs)
		return round
	}
	plain, secure := path(false), path(true)
	for range 300 {
		if err := plain(); err != nil {
			b.Fatal(err)
		}
		if err := secure(); err != nil {
			b.Fatal(err)
		}
	}
	pd := make([]time.Duration, 0, b.N)
	td := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		first, second, fs, ss := plain, secure, &pd, &td
		if i%2 == 1 {
			first, second, fs, ss = secure, plain, &td, &pd
		}
		t0 := time.Now()
		if err := first(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := second(); err != nil {
			b.Fatal(err)
		}
		*fs = append(*fs, t1.Sub(t0))
		*ss = append(*ss, time.Since(t1))
	}
	b.StopTimer()
	slices.Sort(pd)
	slices.Sort(td)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	b.ReportMetric(us(p(pd, 0.5)), "plain-p50-µs")
	b.ReportMetric(us(p(td, 0.5)), "mtls-p50-µs")
	b.ReportMetric(us(p(td, 0.99)-p(pd, 0.99)), "added-p99-µs")
	b.ReportMetric(us(p(td, 0.5)-p(pd, 0.5))/3, "added-p50-µs/hop")
	b.ReportMetric(float64(p(td, 0.5))/float64(p(pd, 0.5)), "p50-ratio")
}
