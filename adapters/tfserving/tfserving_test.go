package tfserving

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
	"github.com/hams-go/hams/refserver"
)

const refYAML = `
name: t
models:
  - {name: fashion, kind: classifier}
services:
  - name: s
    edges: [[frontend, fashion], [fashion, frontend]]
`

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func listen(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// refEnv is a reference model server on loopback serving TF Serving's API.
type refEnv struct {
	srv    *refserver.Server
	cc     *grpc.ClientConn
	cancel context.CancelFunc
	done   chan struct{}
}

func startRef(t testing.TB) *refEnv { return startRefWith(t, refYAML, discard(), "fashion") }

// startRefWith runs a reference model server hosting models of yaml.
func startRefWith(t testing.TB, yaml string, log *slog.Logger, models ...string) *refEnv {
	t.Helper()
	d, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	lis := listen(t)
	srv, err := refserver.New(refserver.Config{Deployment: d, Models: models, GRPCListener: lis, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &refEnv{srv: srv, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(e.done); _ = srv.Run(ctx) }()
	cc, err := grpcx.Dial(lis.Addr().String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	e.cc = cc
	t.Cleanup(func() { _ = cc.Close(); e.stop() })
	return e
}

func (e *refEnv) stop() {
	e.cancel()
	<-e.done
}

func images(rows int, seed float32) *hamsv1.Tensor {
	v := make([]float32, rows*784)
	for i := range v {
		v[i] = float32(math.Mod(float64(seed)+float64(i)*0.37, 1))
	}
	return tensor.FromFloat32("images", []int64{int64(rows), 784}, v)
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, what string, err error, code codes.Code, parts ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: want %v, got %v", what, code, err)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("%s: %q does not mention %q", what, err, p)
		}
	}
}

func closeF32(t *testing.T, what string, got, want *hamsv1.Tensor) {
	t.Helper()
	g, err := tensor.Float32(got)
	if err != nil {
		t.Fatal(err)
	}
	w, err := tensor.Float32(want)
	if err != nil {
		t.Fatal(err)
	}
	if len(g) != len(w) {
		t.Fatalf("%s: %d values, want %d", what, len(g), len(w))
	}
	for i := range g {
		if math.Abs(float64(g[i]-w[i])) > 1e-4 {
			t.Fatalf("%s: value %d is %v, want %v", what, i, g[i], w[i])
		}
	}
}

func TestNewValidates(t *testing.T) {
	e := startRef(t)
	if _, err := New(nil, Config{Model: "m"}); !errors.Is(err, ErrConfig) {
		t.Fatalf("nil conn: %v", err)
	}
	for what, c := range map[string]Config{
		"no model":         {},
		"negative timeout": {Model: "m", Timeout: -1},
		"negative retries": {Model: "m", Retries: -1},
	} {
		if _, err := New(e.cc, c); !errors.Is(err, ErrConfig) {
			t.Fatalf("%s: %v", what, err)
		}
	}
	c := ConfigFrom(config.Backend{Model: "x", Version: "3", Signature: "sig", Timeout: config.Duration(time.Second), TypedInputs: true})
	if c.Model != "x" || c.Version != "3" || c.Signature != "sig" || c.Timeout != time.Second || !c.TypedInputs {
		t.Fatalf("ConfigFrom: %+v", c)
	}
}

func TestRefserverDescribeInferBothEncodings(t *testing.T) {
	e := startRef(t)
	ctx := ctxT(t)
	direct := tfapis.NewPredictionServiceClient(e.cc)
	for _, typed := range []bool{false, true} {
		b, err := New(e.cc, Config{Model: "fashion", Timeout: 5 * time.Second, TypedInputs: typed})
		if err != nil {
			t.Fatal(err)
		}
		d, err := b.Describe(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d.Stateful || d.Kind != Kind || len(d.Inputs) != 1 || d.Inputs[0].Name != "images" || d.Inputs[0].Datatype != "FP32" ||
			len(d.Outputs) != 1 || d.Outputs[0].Name != "scores" || d.Outputs[0].Shape[1] != 10 {
			t.Fatalf("describe: %v", d)
		}
		// Two requests of 2 and 1 rows in one batch.
		in := images(3, 0.1)
		resp, err := b.Infer(ctx, &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{in}, Rows: []uint32{2, 1}, StreamIds: []string{"a", "b"}, BatchId: 7})
		if err != nil {
			t.Fatalf("typed %v: %v", typed, err)
		}
		if len(resp.Outputs) != 1 || resp.Outputs[0].Name != "scores" || resp.Outputs[0].Shape[0] != 3 || resp.BatchId != 7 ||
			len(resp.Rows) != 2 || resp.Rows[0] != 2 || resp.Rows[1] != 1 {
			t.Fatalf("infer: %v", resp)
		}
		tp, _ := wire.ToTensorProto(in)
		dr, err := direct.Predict(ctx, &tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "fashion"}, Inputs: map[string]*tfpb.TensorProto{"images": tp}})
		if err != nil {
			t.Fatal(err)
		}
		want, err := wire.FromTensorProto("scores", dr.Outputs["scores"])
		if err != nil {
			t.Fatal(err)
		}
		closeF32(t, "adapter vs direct", resp.Outputs[0], want)
		if err := b.Health(ctx); err != nil {
			t.Fatalf("health: %v", err)
		}
	}
}

func TestRefserverErrors(t *testing.T) {
	e := startRef(t)
	ctx := ctxT(t)
	newB := func(c Config) *Backend {
		c.Timeout = 5 * time.Second
		b, err := New(e.cc, c)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	req := func(in *hamsv1.Tensor) *hamsv1.BatchRequest {
		return &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{in}, Rows: []uint32{uint32(in.Shape[0])}, StreamIds: []string{"s"}}
	}
	_, err := newB(Config{Model: "nope"}).Describe(ctx)
	wantCode(t, "unknown model describe", err, codes.NotFound, "nope")
	_, err = newB(Config{Model: "nope"}).Infer(ctx, req(images(1, 0)))
	wantCode(t, "unknown model infer", err, codes.NotFound, "nope")
	wantCode(t, "unknown model health", newB(Config{Model: "nope"}).Health(ctx), codes.NotFound)
	_, err = newB(Config{Model: "fashion", Version: "2"}).Describe(ctx)
	wantCode(t, "unknown version", err, codes.NotFound, "fashion:2")
	_, err = newB(Config{Model: "fashion", Signature: "other"}).Describe(ctx)
	wantCode(t, "unknown signature", err, codes.NotFound, "other", "serving_default")

	b := newB(Config{Model: "fashion"})
	bad := tensor.FromFloat32("images", []int64{1, 5}, make([]float32, 5))
	_, err = b.Infer(ctx, req(bad))
	wantCode(t, "bad shape", err, codes.InvalidArgument, "predict")
	_, err = b.Infer(ctx, &hamsv1.BatchRequest{Rows: []uint32{1}})
	wantCode(t, "no inputs", err, codes.InvalidArgument, "no input")
	broken := &hamsv1.Tensor{Name: "images", Datatype: "FP32", Shape: []int64{1, 784}, Data: []byte{1}}
	_, err = b.Infer(ctx, req(broken))
	wantCode(t, "malformed tensor", err, codes.InvalidArgument, "images")
	_, err = b.Infer(ctx, &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{images(1, 0), images(1, 0)}, Rows: []uint32{1}})
	wantCode(t, "duplicate", err, codes.InvalidArgument, "twice")
	reserved := images(1, 0)
	reserved.Name = "state/x"
	_, err = b.Infer(ctx, req(reserved))
	wantCode(t, "reserved", err, codes.InvalidArgument, "reserved")

	if err := e.srv.SetReady("fashion", false); err != nil {
		t.Fatal(err)
	}
	_, err = b.Infer(ctx, req(images(1, 0)))
	wantCode(t, "not ready", err, codes.Unavailable)
	_ = e.srv.SetReady("fashion", true)
	if _, err := b.Infer(ctx, req(images(1, 0))); err != nil {
		t.Fatalf("ready again: %v", err)
	}
	e.stop()
	_, err = b.Infer(ctx, req(images(1, 0)))
	wantCode(t, "server gone", err, codes.Unavailable)
	wantCode(t, "server gone health", b.Health(ctx), codes.Unavailable)
}

// fake is a TF Serving stand-in whose behaviour the test steers.
type fake struct {
	tfapis.UnimplementedPredictionServiceServer
	tfapis.UnimplementedModelServiceServer
	mu          sync.Mutex
	sig         *tfapis.SignatureDef
	states      []*tfapis.ModelVersionStatus
	predict     func(ctx context.Context, req *tfapis.PredictRequest) (*tfapis.PredictResponse, error)
	metaFails   int              // GetModelMetadata answers Unavailable this many times first
	labels      map[string]int64 // version labels GetModelMetadata resolves
	predicts    atomic.Int64
	metas       atomic.Int64
	lastPredict *tfapis.PredictRequest
	lastStatus  *tfapis.GetModelStatusRequest
}

func (f *fake) Predict(ctx context.Context, req *tfapis.PredictRequest) (*tfapis.PredictResponse, error) {
	f.predicts.Add(1)
	f.mu.Lock()
	f.lastPredict = req
	fn := f.predict
	f.mu.Unlock()
	return fn(ctx, req)
}

func (f *fake) GetModelMetadata(ctx context.Context, req *tfapis.GetModelMetadataRequest) (*tfapis.GetModelMetadataResponse, error) {
	f.metas.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.metaFails > 0 {
		f.metaFails--
		return nil, status.Error(codes.Unavailable, "warming up")
	}
	a, err := anypb.New(&tfapis.SignatureDefMap{SignatureDef: map[string]*tfapis.SignatureDef{DefaultSignature: f.sig}})
	if err != nil {
		return nil, err
	}
	spec := req.ModelSpec
	if l, ok := spec.GetVersionChoice().(*tfapis.ModelSpec_VersionLabel); ok {
		// As TF Serving: the answer names the version the label resolved to.
		v, known := f.labels[l.VersionLabel]
		if !known {
			return nil, status.Errorf(codes.InvalidArgument, "Unrecognized servable version label: %s", l.VersionLabel)
		}
		spec = &tfapis.ModelSpec{Name: spec.GetName(), VersionChoice: &tfapis.ModelSpec_Version{Version: wrapperspb.Int64(v)}}
	}
	return &tfapis.GetModelMetadataResponse{ModelSpec: spec, Metadata: map[string]*anypb.Any{"signature_def": a}}, nil
}

func (f *fake) GetModelStatus(ctx context.Context, req *tfapis.GetModelStatusRequest) (*tfapis.GetModelStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastStatus = req
	return &tfapis.GetModelStatusResponse{ModelVersionStatus: f.states}, nil
}

func (f *fake) set(fn func(f *fake)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func ti(dt tfpb.DataType, shape ...int64) *tfapis.TensorInfo {
	return &tfapis.TensorInfo{Dtype: dt, TensorShape: wire.TFShape(shape)}
}

// accSig is a stateful signature: y = x + acc (per row), acc' = acc +
// sum of the rows of x; ids echoes the stream ids.
func accSig() *tfapis.SignatureDef {
	return &tfapis.SignatureDef{
		Inputs: map[string]*tfapis.TensorInfo{
			"x": ti(tfpb.DataType_DT_FLOAT, -1, 2), "state/acc": ti(tfpb.DataType_DT_FLOAT, 2), StreamIDsInput: ti(tfpb.DataType_DT_STRING, -1),
		},
		Outputs: map[string]*tfapis.TensorInfo{"y": ti(tfpb.DataType_DT_FLOAT, -1, 2), "state_next/acc": ti(tfpb.DataType_DT_FLOAT, 2), "ids": ti(tfpb.DataType_DT_STRING, -1)},
	}
}

// accPredict answers y in typed float_val and the state in tensor_content.
func accPredict(_ context.Context, req *tfapis.PredictRequest) (*tfapis.PredictResponse, error) {
	x, err := wire.FromTensorProto("x", req.Inputs["x"])
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	acc, err := wire.FromTensorProto("state/acc", req.Inputs["state/acc"])
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	xv, _ := tensor.Float32(x)
	av, _ := tensor.Float32(acc)
	y := make([]float32, len(xv))
	next := append([]float32(nil), av...)
	for i := range xv {
		y[i] = xv[i] + av[i%2]
		next[i%2] += xv[i]
	}
	yt, _ := wire.ToTensorProtoTyped(tensor.FromFloat32("y", x.Shape, y))
	nt, _ := wire.ToTensorProto(tensor.FromFloat32("acc", []int64{2}, next))
	out := map[string]*tfpb.TensorProto{"y": yt, "state_next/acc": nt}
	if ids := req.Inputs[StreamIDsInput]; ids != nil {
		out["ids"] = ids
	}
	return &tfapis.PredictResponse{Outputs: out}, nil
}

func startFake(t testing.TB, f *fake) *grpc.ClientConn {
	t.Helper()
	lis := listen(t)
	srv := grpc.NewServer()
	tfapis.RegisterPredictionServiceServer(srv, f)
	tfapis.RegisterModelServiceServer(srv, f)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = grpcx.Serve(ctx, srv, lis, time.Second) }()
	cc, err := grpcx.Dial(lis.Addr().String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close(); cancel(); <-done })
	return cc
}

func f32s(t *testing.T, x *hamsv1.Tensor) []float32 {
	t.Helper()
	v, err := tensor.Float32(x)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func eqF(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestStatefulSignatureDoubleBuffer(t *testing.T) {
	f := &fake{sig: accSig(), predict: accPredict, labels: map[string]int64{"canary": 2}}
	cc := startFake(t, f)
	ctx := ctxT(t)
	b, err := New(cc, Config{Model: "acc", Version: "canary", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	d, err := b.Describe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Stateful || d.StateBytes != 8 || len(d.Inputs) != 1 || d.Inputs[0].Name != "x" || len(d.Outputs) != 2 {
		t.Fatalf("describe hides state and stream ids: %v", d)
	}
	batch := func(id uint64, vals ...float32) *hamsv1.BatchRequest {
		rows := uint32(len(vals) / 2)
		return &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{tensor.FromFloat32("x", []int64{int64(rows), 2}, vals)},
			Rows: []uint32{rows}, StreamIds: []string{"st"}, BatchId: id}
	}
	// Compute 1 from zeros; state not installed until Update.
	r1, err := b.Compute(ctx, batch(1, 1, 2))
	if err != nil {
		t.Fatal(err)
	}
	if r1.NextStateVersion != 1 || !eqF(f32s(t, r1.Outputs[1]), []float32{1, 2}) || r1.Outputs[1].Name != "y" {
		t.Fatalf("compute 1: %v", r1)
	}
	if ids := r1.Outputs[0]; ids.Name != "ids" || string(wire.BytesElems(ids.Data)[0]) != "st" {
		t.Fatalf("stream ids: %v", ids)
	}
	st, v, err := b.ReadState(ctx)
	if err != nil || v != 0 || !eqF(f32s(t, st[0]), []float32{0, 0}) || st[0].Name != "acc" {
		t.Fatalf("state before update: %v %d %v", st, v, err)
	}
	wantCode(t, "update of another batch", b.Update(ctx, 2), codes.FailedPrecondition, "batch 1")
	if err := b.Update(ctx, 1); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "update twice", b.Update(ctx, 1), codes.FailedPrecondition, "nothing")
	st1, v, _ := b.ReadState(ctx)
	if v != 1 || !eqF(f32s(t, st1[0]), []float32{1, 2}) {
		t.Fatalf("state after update: %v %d", st1, v)
	}
	// Compute 2 while state 1 is being read: state 1's tensors stay intact.
	if _, err := b.Compute(ctx, batch(2, 10, 10)); err != nil {
		t.Fatal(err)
	}
	if err := b.Update(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if !eqF(f32s(t, st1[0]), []float32{1, 2}) {
		t.Fatal("a read state changed after the next update")
	}
	// Infer = compute + update.
	r3, err := b.Infer(ctx, batch(3, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if !eqF(f32s(t, r3.Outputs[1]), []float32{11, 12}) {
		t.Fatalf("infer from state 2: %v", f32s(t, r3.Outputs[1]))
	}
	if _, v, _ := b.ReadState(ctx); v != 3 {
		t.Fatalf("version %d after infer", v)
	}
	// The request carried the version label and the state.
	f.mu.Lock()
	lp := f.lastPredict
	f.mu.Unlock()
	if lp.ModelSpec.GetVersionLabel() != "canary" || lp.ModelSpec.SignatureName != DefaultSignature || lp.Inputs["state/acc"] == nil {
		t.Fatalf("predict request: %v", lp)
	}
	// WriteState overwrites and drops a staged next.
	if _, err := b.Compute(ctx, batch(4, 1, 1)); err != nil {
		t.Fatal(err)
	}
	if err := b.WriteState(ctx, []*hamsv1.Tensor{tensor.FromFloat32("acc", []int64{2}, []float32{5, 6})}, 40); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "update after write", b.Update(ctx, 4), codes.FailedPrecondition)
	r5, err := b.Compute(ctx, batch(5, 0, 0))
	if err != nil || r5.NextStateVersion != 41 || !eqF(f32s(t, r5.Outputs[1]), []float32{5, 6}) {
		t.Fatalf("compute after write: %v %v", r5, err)
	}
	for what, ts := range map[string][]*hamsv1.Tensor{
		"count": nil,
		"name":  {tensor.FromFloat32("other", []int64{2}, []float32{5, 6})},
		"shape": {tensor.FromFloat32("acc", []int64{3}, []float32{5, 6, 7})},
		"data":  {{Name: "acc", Datatype: "FP32", Shape: []int64{2}, Data: []byte{1}}},
	} {
		wantCode(t, "write state "+what, b.WriteState(ctx, ts, 1), codes.InvalidArgument)
	}
	// The answer must carry the next state, with its declared shape.
	f.set(func(f *fake) {
		f.predict = func(ctx context.Context, req *tfapis.PredictRequest) (*tfapis.PredictResponse, error) {
			r, _ := accPredict(ctx, req)
			delete(r.Outputs, "state_next/acc")
			return r, nil
		}
	})
	_, err = b.Compute(ctx, batch(6, 0, 0))
	wantCode(t, "missing next state", err, codes.Internal, "state_next/acc")
	f.set(func(f *fake) {
		f.predict = func(ctx context.Context, req *tfapis.PredictRequest) (*tfapis.PredictResponse, error) {
			r, _ := accPredict(ctx, req)
			r.Outputs["state_next/acc"], _ = wire.ToTensorProto(tensor.FromFloat32("acc", []int64{1}, []float32{1}))
			return r, nil
		}
	})
	_, err = b.Compute(ctx, batch(6, 0, 0))
	wantCode(t, "next state shape", err, codes.Internal, "acc")
}

func TestBadSignatures(t *testing.T) {
	cases := map[string]*tfapis.SignatureDef{
		"state without output": {Inputs: map[string]*tfapis.TensorInfo{"x": ti(tfpb.DataType_DT_FLOAT, -1), "state/h": ti(tfpb.DataType_DT_FLOAT, 2)},
			Outputs: map[string]*tfapis.TensorInfo{"y": ti(tfpb.DataType_DT_FLOAT, -1)}},
		"output without state": {Inputs: map[string]*tfapis.TensorInfo{"x": ti(tfpb.DataType_DT_FLOAT, -1)},
			Outputs: map[string]*tfapis.TensorInfo{"state_next/h": ti(tfpb.DataType_DT_FLOAT, 2)}},
		"state shape unknown": {Inputs: map[string]*tfapis.TensorInfo{"state/h": ti(tfpb.DataType_DT_FLOAT, -1)},
			Outputs: map[string]*tfapis.TensorInfo{"state_next/h": ti(tfpb.DataType_DT_FLOAT, -1)}},
		"state mismatch": {Inputs: map[string]*tfapis.TensorInfo{"state/h": ti(tfpb.DataType_DT_FLOAT, 2)},
			Outputs: map[string]*tfapis.TensorInfo{"state_next/h": ti(tfpb.DataType_DT_DOUBLE, 2)}},
		"complex dtype":         {Inputs: map[string]*tfapis.TensorInfo{"z": ti(tfpb.DataType_DT_COMPLEX64, 2)}},
		"stream ids not string": {Inputs: map[string]*tfapis.TensorInfo{StreamIDsInput: ti(tfpb.DataType_DT_INT64, -1)}},
	}
	for what, sig := range cases {
		f := &fake{sig: sig}
		b, err := New(startFake(t, f), Config{Model: "m", Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		_, err = b.Describe(ctxT(t))
		wantCode(t, what, err, codes.FailedPrecondition)
	}
}

func TestTimeoutAndRetries(t *testing.T) {
	f := &fake{sig: accSig(), metaFails: 2}
	// The slow server answers only when the test ends: an answer when its
	// side of the deadline fires could reach the client before the
	// client's own deadline does.
	hang := make(chan struct{})
	f.predict = func(context.Context, *tfapis.PredictRequest) (*tfapis.PredictResponse, error) {
		<-hang
		return nil, status.Error(codes.Unavailable, "too late")
	}
	cc := startFake(t, f)
	t.Cleanup(func() { close(hang) }) // before the fake server stops
	ctx := ctxT(t)
	b, err := New(cc, Config{Model: "acc", Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// GetModelMetadata is idempotent: two Unavailable answers are retried.
	if _, err := b.Describe(ctx); err != nil {
		t.Fatalf("describe with retries: %v", err)
	}
	if n := f.metas.Load(); n != 3 {
		t.Fatalf("%d metadata calls, want 3", n)
	}
	x := tensor.FromFloat32("x", []int64{1, 2}, []float32{1, 2})
	start := time.Now()
	_, err = b.Infer(ctx, &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{x}, Rows: []uint32{1}, StreamIds: []string{"s"}, BatchId: 1})
	wantCode(t, "slow predict", err, codes.DeadlineExceeded, "predict")
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("timeout took %v", el)
	}
	// Predict is never retried, not even on Unavailable.
	f.set(func(f *fake) {
		f.predict = func(context.Context, *tfapis.PredictRequest) (*tfapis.PredictResponse, error) {
			return nil, status.Error(codes.Unavailable, "overloaded")
		}
	})
	before := f.predicts.Load()
	_, err = b.Infer(ctx, &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{x}, Rows: []uint32{1}, StreamIds: []string{"s"}, BatchId: 2})
	wantCode(t, "unavailable predict", err, codes.Unavailable, "overloaded")
	if n := f.predicts.Load() - before; n != 1 {
		t.Fatalf("predict attempted %d times", n)
	}
	// Metadata failing more often than the retries allow.
	f.set(func(f *fake) { f.metaFails = 10 })
	b2, _ := New(cc, Config{Model: "acc", Timeout: 5 * time.Second, Retries: 2})
	_, err = b2.Describe(ctx)
	wantCode(t, "metadata exhausted", err, codes.Unavailable, "warming up")
	// Passed-through codes from Predict.
	for _, c := range []codes.Code{codes.InvalidArgument, codes.NotFound, codes.ResourceExhausted} {
		f.set(func(f *fake) {
			f.metaFails = 0
			f.predict = func(context.Context, *tfapis.PredictRequest) (*tfapis.PredictResponse, error) {
				return nil, status.Error(c, "backend says "+c.String())
			}
		})
		_, err = b.Infer(ctx, &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{x}, Rows: []uint32{1}, StreamIds: []string{"s"}, BatchId: 3})
		wantCode(t, c.String(), err, c, "backend says")
	}
}

func TestHealthTransitions(t *testing.T) {
	f := &fake{sig: accSig()}
	cc := startFake(t, f)
	ctx := ctxT(t)
	b, err := New(cc, Config{Model: "acc", Version: "4", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "no versions", b.Health(ctx), codes.Unavailable, "no version")
	for _, st := range []tfapis.ModelVersionStatus_State{tfapis.ModelVersionStatus_START, tfapis.ModelVersionStatus_LOADING,
		tfapis.ModelVersionStatus_UNLOADING, tfapis.ModelVersionStatus_END, tfapis.ModelVersionStatus_UNKNOWN} {
		f.set(func(f *fake) { f.states = []*tfapis.ModelVersionStatus{{Version: 4, State: st}} })
		wantCode(t, st.String(), b.Health(ctx), codes.Unavailable, st.String())
	}
	f.set(func(f *fake) {
		f.states = []*tfapis.ModelVersionStatus{{Version: 4, State: tfapis.ModelVersionStatus_AVAILABLE}}
	})
	if err := b.Health(ctx); err != nil {
		t.Fatalf("available: %v", err)
	}
	f.mu.Lock()
	req := f.lastStatus
	f.mu.Unlock()
	if req.ModelSpec.GetVersion().GetValue() != 4 || req.ModelSpec.Name != "acc" {
		t.Fatalf("status request: %v", req)
	}
	f.set(func(f *fake) {
		f.states = []*tfapis.ModelVersionStatus{{Version: 4, State: tfapis.ModelVersionStatus_END,
			Status: &tfapis.StatusProto{ErrorCode: 3, ErrorMessage: "bad saved model"}}}
	})
	wantCode(t, "failed load", b.Health(ctx), codes.Unavailable, "END", "bad saved model")

	// A version label: only the labelled version's status counts (TF
	// Serving's GetModelStatus ignores the label and lists every version).
	lb, err := New(cc, Config{Model: "acc", Version: "canary", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	f.set(func(f *fake) {
		f.labels = map[string]int64{"canary": 5}
		f.states = []*tfapis.ModelVersionStatus{{Version: 4, State: tfapis.ModelVersionStatus_AVAILABLE}, {Version: 5, State: tfapis.ModelVersionStatus_LOADING}}
	})
	wantCode(t, "labelled version loading", lb.Health(ctx), codes.Unavailable, "version 5 LOADING")
	f.set(func(f *fake) { f.states[1].State = tfapis.ModelVersionStatus_AVAILABLE })
	if err := lb.Health(ctx); err != nil {
		t.Fatalf("labelled version available: %v", err)
	}
	f.set(func(f *fake) { f.states = f.states[:1] })
	wantCode(t, "labelled version gone", lb.Health(ctx), codes.Unavailable, "version 5")
	f.set(func(f *fake) { f.labels = nil })
	wantCode(t, "unknown label", lb.Health(ctx), codes.InvalidArgument, "canary")
}

// TestOutputsNotSplittable: a multi-request batch whose output has no row
// per input row cannot be split.
func TestOutputsNotSplittable(t *testing.T) {
	f := &fake{sig: &tfapis.SignatureDef{Inputs: map[string]*tfapis.TensorInfo{"x": ti(tfpb.DataType_DT_FLOAT, -1)},
		Outputs: map[string]*tfapis.TensorInfo{"total": ti(tfpb.DataType_DT_FLOAT)}}}
	f.predict = func(context.Context, *tfapis.PredictRequest) (*tfapis.PredictResponse, error) {
		tp := &tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, TensorShape: wire.TFShape(nil), FloatVal: []float32{3}}
		return &tfapis.PredictResponse{Outputs: map[string]*tfpb.TensorProto{"total": tp}}, nil
	}
	b, _ := New(startFake(t, f), Config{Model: "m"})
	x := tensor.FromFloat32("x", []int64{2}, []float32{1, 2})
	_, err := b.Infer(ctxT(t), &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{x}, Rows: []uint32{1, 1}, StreamIds: []string{"a", "b"}})
	wantCode(t, "unsplittable", err, codes.Internal, "total")
	resp, err := b.Infer(ctxT(t), &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{x}, Rows: []uint32{2}, StreamIds: []string{"a"}})
	if err != nil || len(resp.Outputs) != 1 {
		t.Fatalf("one request: %v %v", resp, err)
	}
	// A malformed answer tensor is Internal, naming it.
	f.set(func(f *fake) {
		f.predict = func(context.Context, *tfapis.PredictRequest) (*tfapis.PredictResponse, error) {
			tp := &tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, TensorShape: wire.TFShape([]int64{2}), TensorContent: []byte{1, 2, 3}}
			return &tfapis.PredictResponse{Outputs: map[string]*tfpb.TensorProto{"total": tp}}, nil
		}
	})
	_, err = b.Infer(ctxT(t), &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{x}, Rows: []uint32{2}, StreamIds: []string{"a"}})
	wantCode(t, "malformed answer", err, codes.Internal, "total")
}
