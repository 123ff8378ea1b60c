package tracing_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/hams-go/hams/adapters/reference"
	"github.com/hams-go/hams/frontend"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/coord"
	"github.com/hams-go/hams/internal/edge"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/testing/natstest"
	"github.com/hams-go/hams/internal/tracing"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver"
	"github.com/hams-go/hams/sidecar"
)

// traceYAML: frontend -> feat (stateless CNN) -> seq (stateful LSTM,
// primary + backup) -> frontend, in nspb mode: the reply waits for seq's
// backup.
const traceYAML = `
name: tr
mode: nspb
hosts: [h1, h2]
models:
  - name: feat
    kind: cnn
    params: {input: image, output: features, in_dim: 16, channels: 2, kernel: 3, out_dim: 8, seed: 1}
    placement: {primary: h1}
  - name: seq
    kind: lstm
    stateful: true
    params: {input: features, output: hidden, in_dim: 8, hidden: 8, streams: 16, seed: 2}
    placement: {primary: h1, backup: h2}
services:
  - name: s
    inputs:
      - {name: image, datatype: FP32, shape: [-1, 16]}
    edges: [[frontend, feat], [feat, seq], [seq, frontend]]
`

type backupMap map[string]string

func (b backupMap) ResolveBackup(model string) (string, uint64, bool) {
	a, ok := b[model]
	return a, 1, ok
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestOneRequestOneTrace runs a frontend, the sidecars of a stateless and
// of a replicated stateful model (primary and backup) and their reference
// model servers in one process with an in-memory exporter, sends one
// request under a client span, and checks that every span of it is in one
// trace, forming a tree rooted at the client's span: the frontend, each
// sidecar hop and its backend call (down to the model server's side of
// the RPC), the snapshot shipped to the backup and its apply there, and
// the reply gate.
func TestOneRequestOneTrace(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(tracing.NewSampler(1)))
	restore := tracing.Install(tp)
	defer restore()

	dep, err := config.Parse([]byte(traceYAML))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	nc := natstest.Connect(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	goRun := func(what string, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil && ctx.Err() == nil {
				t.Errorf("%s: %v", what, err)
			}
		}()
	}
	co, err := coord.Open(ctx, nc, dep.Name, 1)
	if err != nil {
		t.Fatal(err)
	}
	modelServer := func(models ...string) string {
		lis := listen(t)
		srv, err := refserver.New(refserver.Config{Deployment: dep, Models: models, GRPCListener: lis, Registry: prometheus.NewRegistry(), Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		goRun("model server", srv.Run)
		return lis.Addr().String()
	}
	backend := func(addr, model string) sidecar.Backend {
		cc, err := grpcx.Dial(addr, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return reference.New(cc, model, 5*time.Second)
	}
	primaryMS, backupMS := modelServer("feat", "seq"), modelServer("seq")
	res := edge.NewStaticResolver(nil)
	bres := backupMap{}

	blis := listen(t)
	bres["seq"] = blis.Addr().String()
	bk, err := sidecar.New(sidecar.Config{Deployment: dep, Model: "seq", ID: "seq-b", Backend: backend(backupMS, "seq"), GRPCListener: blis,
		Role: config.RoleBackup, Coord: co, Epoch: 1, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	goRun("backup sidecar", bk.Run)
	for _, m := range []string{"feat", "seq"} {
		lis := listen(t)
		res.Set(m, lis.Addr().String(), 1)
		cfg := sidecar.Config{Deployment: dep, Model: m, ID: m + "-a", Backend: backend(primaryMS, m), Resolver: res, GRPCListener: lis, Epoch: 1, Logger: log}
		if m == "seq" {
			cfg.Coord, cfg.BackupResolver = co, bres
		}
		sc, err := sidecar.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		goRun("sidecar "+m, sc.Run)
	}
	flis, ilis := listen(t), listen(t)
	res.Set(config.Frontend, ilis.Addr().String(), 0)
	fe, err := frontend.New(frontend.Config{Deployment: dep, Resolver: res, GRPCListener: flis, InternalListener: ilis, Coord: co, Logger: log,
		Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	goRun("frontend", fe.Run)

	cc, err := grpcx.Dial(flis.Addr().String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := hamsv1.NewFrontendClient(cc)
	img := make([]float32, 16)
	for i := range img {
		img[i] = float32(i) / 16
	}
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	defer rcancel()
	// The first request finds the backends described and the backup
	// synced; it is the traced one.
	cctx, root := tracing.Tracer().Start(rctx, "client") // a client of its own (the sampler drops parentless RPC client spans: internal traffic)
	_, err = client.Predict(cctx, &hamsv1.PredictRequest{Service: "s", StreamId: "st1",
		Inputs: []*hamsv1.Tensor{tensor.FromFloat32("image", []int64{1, 16}, img)}})
	root.End()
	if err != nil {
		t.Fatalf("predict: %v", err)
	}
	tid := root.SpanContext().TraceID()

	want := []string{"client", "hams.v1.Frontend/Predict", tracing.SpanFrontendPredict, tracing.SpanSidecarBatch, tracing.SpanBackendCall,
		"hams.v1.ModelRuntime/Infer", tracing.SpanSnapshotShip, "hams.v1.Replication/ShipSnapshot", tracing.SpanBackupApply, tracing.SpanFrontendGate}
	var spans tracetest.SpanStubs
	deadline := time.Now().Add(15 * time.Second)
	for {
		spans = ofTrace(exp.GetSpans(), tid)
		if missing := missingNames(spans, want); len(missing) == 0 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("trace %s lacks %v; has:\n%s", tid, missing, render(spans))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("trace %s:\n%s", tid, render(spans))

	// One tree: every span's parent is in the trace, but the client's.
	byID := map[trace.SpanID]tracetest.SpanStub{}
	for _, s := range spans {
		byID[s.SpanContext.SpanID()] = s
	}
	for _, s := range spans {
		if s.SpanContext.SpanID() == root.SpanContext().SpanID() {
			continue
		}
		if _, ok := byID[s.Parent.SpanID()]; !ok {
			t.Errorf("span %s has parent %s outside the trace", s.Name, s.Parent.SpanID())
		}
	}
	// The path down: the client's span, its Predict RPC (client and
	// server side), the frontend, both sidecar hops, the gate under the
	// last hop; the apply under the ship's RPC.
	pathOf := func(s tracetest.SpanStub) []string {
		var p []string
		for {
			p = append([]string{s.Name}, p...)
			par, ok := byID[s.Parent.SpanID()]
			if !ok {
				return p
			}
			s = par
		}
	}
	gate := find(spans, tracing.SpanFrontendGate)
	gp := strings.Join(pathOf(gate), " > ")
	if gp != "client > hams.v1.Frontend/Predict > hams.v1.Frontend/Predict > frontend.predict > sidecar.batch > sidecar.batch > frontend.gate" {
		t.Errorf("gate's path: %s", gp)
	}
	ap := strings.Join(pathOf(find(spans, tracing.SpanBackupApply)), " > ")
	if !strings.HasSuffix(ap, "sidecar.batch > sidecar.batch > snapshot.ship > hams.v1.Replication/ShipSnapshot > hams.v1.Replication/ShipSnapshot > backup.apply") {
		t.Errorf("apply's path: %s", ap)
	}
	models := map[string]bool{}
	for _, s := range spans {
		if s.Name == tracing.SpanSidecarBatch {
			for _, a := range s.Attributes {
				if a.Key == tracing.AttrModel {
					models[a.Value.AsString()] = true
				}
			}
		}
	}
	if !models["feat"] || !models["seq"] {
		t.Errorf("sidecar.batch spans of models %v, want feat and seq", models)
	}
}

func ofTrace(all tracetest.SpanStubs, tid trace.TraceID) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range all {
		if s.SpanContext.TraceID() == tid {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].StartTime.Before(out[j].StartTime) })
	return out
}

func missingNames(spans tracetest.SpanStubs, want []string) []string {
	have := map[string]bool{}
	for _, s := range spans {
		have[s.Name] = true
	}
	var out []string
	for _, w := range want {
		if !have[w] {
			out = append(out, w)
		}
	}
	return out
}

func find(spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	for _, s := range spans {
		if s.Name == name {
			return s
		}
	}
	return tracetest.SpanStub{}
}

// render lists spans in start order, indented by depth, with durations.
func render(spans tracetest.SpanStubs) string {
	depth := map[trace.SpanID]int{}
	var b strings.Builder
	if len(spans) == 0 {
		return ""
	}
	t0 := spans[0].StartTime
	for _, s := range spans {
		d := 0
		if pd, ok := depth[s.Parent.SpanID()]; ok {
			d = pd + 1
		}
		depth[s.SpanContext.SpanID()] = d
		fmt.Fprintf(&b, "%8.3fms %8.3fms %s%s\n", float64(s.StartTime.Sub(t0).Microseconds())/1000,
			float64(s.EndTime.Sub(s.StartTime).Microseconds())/1000, strings.Repeat("  ", d), s.Name)
	}
	return b.String()
}
