package triton

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/shm"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	"github.com/hams-go/hams/refserver"
	"github.com/hams-go/hams/refserver/models"
)

const deployYAML = `
name: t
hosts: [h1, h2]
models:
  - name: fashion
    kind: classifier
    params: {deterministic: 1}
  - name: seqx
    kind: lstm
    stateful: true
    params: {in_dim: 4, hidden: 8, streams: 16, deterministic: 1, state: explicit}
    placement: {primary: h1, backup: h2}
  - name: olx
    kind: olearn
    stateful: true
    params: {in_dim: 8, classes: 3, state_mb: 1, expert_width: 4, deterministic: 1, state: explicit}
    placement: {primary: h1, backup: h2}
services:
  - name: s
    edges: [[frontend, fashion], [fashion, seqx], [seqx, olx], [olx, frontend]]
`

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func deployment(t *testing.T) *config.Deployment {
	t.Helper()
	d, err := config.Parse([]byte(deployYAML))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

type server struct {
	srv  *refserver.Server
	addr string
	stop func()
}

// startServer runs a reference model server on loopback.
func startServer(t *testing.T) *server {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, lis)
}

// serveOn runs a reference model server on lis until the test ends (or
// stop).
func serveOn(t *testing.T, lis net.Listener) *server {
	t.Helper()
	srv, err := refserver.New(refserver.Config{Deployment: deployment(t), Models: []string{"fashion", "seqx", "olx"}, GRPCListener: lis, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(stop)
	return &server{srv: srv, addr: lis.Addr().String(), stop: stop}
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpcx.Dial(addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, what string, err error, code codes.Code, want string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: got %v, want %v", what, err, code)
	}
	if want != "" && !strings.Contains(err.Error(), want) {
		t.Fatalf("%s: %q does not say %q", what, err, want)
	}
}

func images(rows int, seed float32) *hamsv1.Tensor {
	v := make([]float32, rows*784)
	for i := range v {
		v[i] = float32((i*7+int(seed*13))%255) / 255
	}
	return tensor.FromFloat32("images", []int64{int64(rows), 784}, v)
}

// proxy forwards KServe calls to a real server; tests hook ModelInfer.
type proxy struct {
	inference.UnimplementedGRPCInferenceServiceServer
	up inference.GRPCInferenceServiceClient
	// before runs before a ModelInfer is forwarded (nil: none).
	before func(ctx context.Context, req *inference.ModelInferRequest) error
	// typed re-encodes responses as typed contents.
	typed atomic.Bool
	// noStatus answers SystemSharedMemoryStatus Unimplemented.
	noStatus atomic.Bool
}

func (p *proxy) ServerLive(ctx context.Context, r *inference.ServerLiveRequest) (*inference.ServerLiveResponse, error) {
	return p.up.ServerLive(ctx, r)
}
func (p *proxy) ServerReady(ctx context.Context, r *inference.ServerReadyRequest) (*inference.ServerReadyResponse, error) {
	return p.up.ServerReady(ctx, r)
}
func (p *proxy) ModelReady(ctx context.Context, r *inference.ModelReadyRequest) (*inference.ModelReadyResponse, error) {
	return p.up.ModelReady(ctx, r)
}
func (p *proxy) ModelMetadata(ctx context.Context, r *inference.ModelMetadataRequest) (*inference.ModelMetadataResponse, error) {
	return p.up.ModelMetadata(ctx, r)
}
func (p *proxy) SystemSharedMemoryRegister(ctx context.Context, r *inference.SystemSharedMemoryRegisterRequest) (*inference.SystemSharedMemoryRegisterResponse, error) {
	return p.up.SystemSharedMemoryRegister(ctx, r)
}
func (p *proxy) SystemSharedMemoryStatus(ctx context.Context, r *inference.SystemSharedMemoryStatusRequest) (*inference.SystemSharedMemoryStatusResponse, error) {
	if p.noStatus.Load() {
		return nil, status.Error(codes.Unimplemented, "no status here")
	}
	return p.up.SystemSharedMemoryStatus(ctx, r)
}
func (p *proxy) SystemSharedMemoryUnregister(ctx context.Context, r *inference.SystemSharedMemoryUnregisterRequest) (*inference.SystemSharedMemoryUnregisterResponse, error) {
	return p.up.SystemSharedMemoryUnregister(ctx, r)
}
func (p *proxy) ModelInfer(ctx context.Context, r *inference.ModelInferRequest) (*inference.ModelInferResponse, error) {
	if p.before != nil {
		if err := p.before(ctx, r); err != nil {
			return nil, err
		}
	}
	resp, err := p.up.ModelInfer(ctx, r)
	if err != nil || !p.typed.Load() {
		return resp, err
	}
	for i, o := range resp.Outputs {
		if _, inShm := o.Parameters[wire.ParamShmRegion]; inShm {
			continue
		}
		t, err := wire.FromInferOutput(o, resp.RawOutputContents[i], true)
		if err != nil {
			return nil, err
		}
		if o.Contents, err = wire.Contents(t); err != nil {
			return nil, err
		}
	}
	resp.RawOutputContents = nil
	return resp, nil
}

func startProxy(t *testing.T, upstream string) (*proxy, string) {
	t.Helper()
	p := &proxy{up: inference.NewGRPCInferenceServiceClient(dial(t, upstream))}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	inference.RegisterGRPCInferenceServiceServer(srv, p)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return p, lis.Addr().String()
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Config{}); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "connection") || !strings.Contains(err.Error(), "model") {
		t.Fatalf("empty config: %v", err)
	}
	cc := dial(t, "127.0.0.1:1")
	if _, err := New(Config{Conn: cc, Model: "m", Timeout: -1}); !errors.Is(err, ErrConfig) {
		t.Fatalf("negative timeout: %v", err)
	}
	bad := &hamsv1.Tensor{Name: "h", Datatype: "FP32", Shape: []int64{2}, Data: []byte{1}}
	if _, err := NewStateful(Config{Conn: cc, Model: "m", InitialState: []*hamsv1.Tensor{bad}}); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), `"h"`) {
		t.Fatalf("bad initial state: %v", err)
	}
}

func TestStatelessRawAndTyped(t *testing.T) {
	s := startServer(t)
	p, addr := startProxy(t, s.addr)
	ctx := ctxT(t)
	b, err := New(Config{Conn: dial(t, addr), Model: "fashion", Timeout: 5 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	d, err := b.Describe(ctx)
	if err != nil || d.Kind != "classifier" || d.Stateful || d.Inputs[0].Name != "images" || d.Outputs[0].Name != "scores" {
		t.Fatalf("describe: %v %v", d, err)
	}
	in := images(3, 1)
	want, err := s.srv.Model("fashion").Infer(&models.Batch{Inputs: []*hamsv1.Tensor{in}})
	if err != nil {
		t.Fatal(err)
	}
	req := &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{in}, Rows: []uint32{1, 2}, BatchId: 9}
	raw, err := b.Infer(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if raw.BatchId != 9 || len(raw.Rows) != 2 || len(raw.Outputs) != 1 || !bytes.Equal(raw.Outputs[0].Data, want.Outputs[0].Data) {
		t.Fatalf("raw response %v", raw)
	}
	p.typed.Store(true)
	typed, err := b.Infer(ctx, req)
	if err != nil || !bytes.Equal(typed.Outputs[0].Data, raw.Outputs[0].Data) || typed.Outputs[0].Name != "scores" {
		t.Fatalf("typed response %v %v", typed, err)
	}
	// backend errors keep their gRPC codes
	_, err = b.Infer(ctx, &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{tensor.FromFloat32("images", []int64{1, 3}, []float32{1, 2, 3})}, Rows: []uint32{1}})
	wantCode(t, "bad width", err, codes.InvalidArgument, "images")
	ghost, _ := New(Config{Conn: dial(t, addr), Model: "ghost"})
	_, err = ghost.Describe(ctx)
	wantCode(t, "ghost describe", err, codes.NotFound, "ghost")
	_, err = ghost.Infer(ctx, req)
	wantCode(t, "ghost infer", err, codes.NotFound, "ghost")
	// a batch of several streams to a model without hams_stream_ids is one
	// batch with no stream identity: a stateless model never needs ids
	var sent *inference.ModelInferRequest
	p.before = func(_ context.Context, r *inference.ModelInferRequest) error { sent = r; return nil }
	mixed, err := b.Infer(ctx, &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{in}, Rows: []uint32{1, 2}, StreamIds: []string{"a", "b"}})
	p.before = nil
	if err != nil || !bytes.Equal(mixed.Outputs[0].Data, raw.Outputs[0].Data) {
		t.Fatalf("mixed streams: %v %v", mixed, err)
	}
	if sent == nil || sent.GetParameters()[wire.ParamSequenceID] != nil || len(sent.GetInputs()) != 1 {
		t.Fatalf("mixed streams sent %v", sent)
	}
	_, err = b.Infer(ctx, &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{in}, Rows: []uint32{1, 2}, StreamIds: []string{"a"}})
	wantCode(t, "stream id count", err, codes.InvalidArgument, "stream ids")
	if _, err := b.Infer(ctx, &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{in}, Rows: []uint32{1, 2}, StreamIds: []string{"a", "a"}}); err != nil {
		t.Fatalf("one stream as sequence_id: %v", err)
	}
}

func TestTimeoutAndCancel(t *testing.T) {
	s := startServer(t)
	p, addr := startProxy(t, s.addr)
	p.before = func(ctx context.Context, _ *inference.ModelInferRequest) error {
		<-ctx.Done()
		return ctx.Err()
	}
	b, _ := New(Config{Conn: dial(t, addr), Model: "fashion", Timeout: 50 * time.Millisecond})
	req := &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{images(1, 0)}, Rows: []uint32{1}}
	_, err := b.Infer(context.Background(), req)
	wantCode(t, "timeout", err, codes.DeadlineExceeded, "fashion")
	b0, _ := New(Config{Conn: dial(t, addr), Model: "fashion"})
	if _, err := b0.Describe(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = b0.Infer(ctx, req)
	wantCode(t, "canceled", err, codes.Canceled, "")
}

func TestHealthTransitions(t *testing.T) {
	s := startServer(t)
	ctx := ctxT(t)
	b, _ := New(Config{Conn: dial(t, s.addr), Model: "fashion", Timeout: time.Second})
	if err := b.Health(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.srv.SetReady("fashion", false); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "not ready", b.Health(ctx), codes.Unavailable, "not ready")
	_, err := b.Infer(ctx, &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{images(1, 0)}, Rows: []uint32{1}})
	wantCode(t, "infer while not ready", err, codes.Unavailable, "not ready")
	if err := s.srv.SetReady("fashion", true); err != nil {
		t.Fatal(err)
	}
	if err := b.Health(ctx); err != nil {
		t.Fatalf("ready again: %v", err)
	}
	ghost, _ := New(Config{Conn: dial(t, s.addr), Model: "ghost", Timeout: time.Second})
	wantCode(t, "ghost health", ghost.Health(ctx), codes.NotFound, "ghost")
	s.stop()
	wantCode(t, "server gone", b.Health(ctx), codes.Unavailable, "")
}

// internalTwin builds the internal-state model of the same kind and params.
func internalTwin(t *testing.T, name string) models.Model {
	t.Helper()
	m := *deployment(t).Model(name)
	params := map[string]any{}
	for k, v := range m.Params {
		if k != models.ParamState {
			params[k] = v
		}
	}
	m.Params = params
	mm, err := models.New(&m)
	if err != nil {
		t.Fatal(err)
	}
	return mm
}

// lstmBatch is batch i: 3 items of streams a, b, a (rows 2, 1, 1).
func lstmBatch(i int) *hamsv1.BatchRequest {
	x := make([]float32, 4*4)
	for j := range x {
		x[j] = float32((i*31+j*7)%19)/19 - 0.5
	}
	return &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{tensor.FromFloat32("x", []int64{4, 4}, x)},
		Rows: []uint32{2, 1, 1}, StreamIds: []string{"a", "b", "a"}, BatchId: uint64(i + 1)}
}

func olearnBatch(i int) *hamsv1.BatchRequest {
	x := make([]float32, 5*8)
	for j := range x {
		x[j] = float32((i*17+j*5)%23)/23 - 0.3
	}
	labels := []int64{int64(i % 3), -1, 2, int64((i + 1) % 3), 0}
	return &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{tensor.FromFloat32("x", []int64{5, 8}, x), tensor.FromInt64("labels", []int64{5}, labels)},
		Rows: []uint32{5}, BatchId: uint64(i + 1)}
}

func stateful(t *testing.T, addr, model string, init []*hamsv1.Tensor) *Stateful {
	t.Helper()
	s, err := NewStateful(Config{Conn: dial(t, addr), Model: model, Timeout: 5 * time.Second, InitialState: init, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func digest(ts []*hamsv1.Tensor) string { return tensor.Digest(ts...) }

// TestExplicitStateMatchesInternal feeds the same batches to the explicit
// model through the adapter and to the internal-state model in process.
func TestExplicitStateMatchesInternal(t *testing.T) {
	srv := startServer(t)
	ctx := ctxT(t)
	for _, tc := range []struct {
		model string
		batch func(int) *hamsv1.BatchRequest
	}{{"seqx", lstmBatch}, {"olx", olearnBatch}} {
		twin := internalTwin(t, tc.model)
		var init []*hamsv1.Tensor
		if tc.model == "olx" {
			var err error
			if init, err = models.InitialState(deployment(t).Model(tc.model)); err != nil {
				t.Fatal(err)
			}
		}
		a := stateful(t, srv.addr, tc.model, init)
		d, err := a.Describe(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Stateful || d.StateBytes != twin.Describe().StateBytes || len(d.Inputs) != len(twin.Describe().Inputs) || len(d.Outputs) != 1 {
			t.Fatalf("%s describe %v, twin %v", tc.model, d, twin.Describe())
		}
		for i := range 6 {
			req := tc.batch(i)
			got, err := a.Compute(ctx, req)
			if err != nil {
				t.Fatalf("%s compute %d: %v", tc.model, i, err)
			}
			want, err := twin.Compute(&models.Batch{Inputs: req.Inputs, Rows: req.Rows, StreamIDs: req.StreamIds, BatchID: req.BatchId})
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Outputs) != 1 || !bytes.Equal(got.Outputs[0].Data, want.Outputs[0].Data) || got.NextStateVersion != uint64(i+1) {
				t.Fatalf("%s batch %d: outputs differ (version %d)", tc.model, i, got.NextStateVersion)
			}
			if err := a.Update(ctx, req.BatchId); err != nil {
				t.Fatal(err)
			}
			if _, err := twin.Update(req.BatchId); err != nil {
				t.Fatal(err)
			}
			st, v, err := a.ReadState(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_, wst, err := models.StateTensors(twin)
			if err != nil {
				t.Fatal(err)
			}
			if v != uint64(i+1) || digest(st) != digest(wst) {
				t.Fatalf("%s batch %d: state differs from the internal model (version %d)", tc.model, i, v)
			}
		}
		// Infer is compute + update
		req := tc.batch(6)
		if _, err := a.Infer(ctx, req); err != nil {
			t.Fatal(err)
		}
		if _, err := twin.Infer(&models.Batch{Inputs: req.Inputs, Rows: req.Rows, StreamIDs: req.StreamIds, BatchID: req.BatchId}); err != nil {
			t.Fatal(err)
		}
		st, v, _ := a.ReadState(ctx)
		_, wst, _ := models.StateTensors(twin)
		if v != 7 || digest(st) != digest(wst) {
			t.Fatalf("%s infer: state differs", tc.model)
		}
	}
}

func TestUpdateRules(t *testing.T) {
	srv := startServer(t)
	ctx := ctxT(t)
	a := stateful(t, srv.addr, "seqx", nil)
	err := a.Update(ctx, 1)
	wantCode(t, "nothing staged", err, codes.FailedPrecondition, "nothing staged")
	if _, err := a.Compute(ctx, lstmBatch(0)); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "wrong batch", a.Update(ctx, 5), codes.FailedPrecondition, "staged batch is 1")
	if err := a.Update(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := a.Update(ctx, 1); err != nil {
		t.Fatalf("repeated update: %v", err)
	}
	before, _, _ := a.ReadState(ctx)
	// a failed compute stages nothing and leaves the state alone
	bad := lstmBatch(1)
	bad.Inputs[0] = tensor.FromFloat32("x", []int64{1, 3}, []float32{1, 2, 3})
	bad.Rows, bad.StreamIds = []uint32{1}, []string{"a"}
	_, err = a.Compute(ctx, bad)
	wantCode(t, "bad compute", err, codes.InvalidArgument, "x")
	wantCode(t, "update after failed compute", a.Update(ctx, 2), codes.FailedPrecondition, "")
	after, v, _ := a.ReadState(ctx)
	if digest(after) != digest(before) || v != 1 {
		t.Fatal("failed compute changed the state")
	}
	// WriteState checks the tensors
	wrong := []*hamsv1.Tensor{after[1], after[0], after[2]}
	wantCode(t, "swapped", a.WriteState(ctx, wrong, 3), codes.InvalidArgument, "state tensor 0")
	wantCode(t, "short", a.WriteState(ctx, after[:1], 3), codes.InvalidArgument, "1 state tensors")
}

func TestNoExplicitState(t *testing.T) {
	srv := startServer(t)
	a := stateful(t, srv.addr, "fashion", nil)
	_, err := a.Describe(ctxT(t))
	wantCode(t, "stateless model", err, codes.FailedPrecondition, "triton#7119")
	b := stateful(t, srv.addr, "seqx", nil)
	b.cfg.StateTensors = []string{"h", "nope"}
	_, err = b.Compute(ctxT(t), lstmBatch(0))
	wantCode(t, "unknown state name", err, codes.FailedPrecondition, "nope")
	c := stateful(t, srv.addr, "seqx", []*hamsv1.Tensor{tensor.FromFloat32("h", []int64{1}, []float32{1})})
	err = c.Setup(ctxT(t))
	wantCode(t, "initial state shape", err, codes.FailedPrecondition, "initial state")
	if len(srv.srv.SharedMemoryRegions()) != 0 {
		t.Fatalf("failed setups left regions: %v", srv.srv.SharedMemoryRegions())
	}
}

// TestReadStateDuringSlowCompute: while a compute is in flight (and its
// output region is being scribbled on), ReadState returns the installed
// state, never the region being written; Update waits for nothing else.
func TestReadStateDuringSlowCompute(t *testing.T) {
	srv := startServer(t)
	p, addr := startProxy(t, srv.addr)
	ctx := ctxT(t)
	a := stateful(t, addr, "seqx", nil)
	for i := range 2 {
		if _, err := a.Infer(ctx, lstmBatch(i)); err != nil {
			t.Fatal(err)
		}
	}
	installed, v0, err := a.ReadState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	computing, gate := make(chan struct{}), make(chan struct{})
	p.before = func(_ context.Context, r *inference.ModelInferRequest) error {
		// the in-flight write: garbage into every output region first
		for _, o := range r.Outputs {
			if reg, ok := o.Parameters[wire.ParamShmRegion]; ok {
				m, err := shm.Open("/" + reg.GetStringParam())
				if err != nil {
					return err
				}
				for i := range m.Bytes() {
					m.Bytes()[i] = 0xff
				}
				_ = m.Close()
			}
		}
		close(computing)
		<-gate
		return nil
	}
	done := make(chan error, 1)
	go func() {
		_, err := a.Compute(ctx, lstmBatch(2))
		done <- err
	}()
	<-computing
	for range 20 {
		st, v, err := a.ReadState(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if v != v0 || digest(st) != digest(installed) {
			t.Fatal("ReadState during compute saw something other than the installed state")
		}
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	p.before = nil
	st, _, _ := a.ReadState(ctx)
	if digest(st) != digest(installed) {
		t.Fatal("compute changed the installed state before Update")
	}
	if err := a.Update(ctx, 3); err != nil {
		t.Fatal(err)
	}
	st, v, _ := a.ReadState(ctx)
	if v != v0+1 || digest(st) == digest(installed) || bytes.Contains(st[0].Data, []byte{0xff, 0xff, 0xff, 0xff}) {
		t.Fatal("after Update the state is not the computed one")
	}
}

// TestReadStateHoldsUpdate: a copy in flight holds the flip (the adapter
// enforces the ordering obligation itself).
func TestReadStateHoldsUpdate(t *testing.T) {
	srv := startServer(t)
	ctx := ctxT(t)
	a := stateful(t, srv.addr, "seqx", nil)
	if _, err := a.Compute(ctx, lstmBatch(0)); err != nil {
		t.Fatal(err)
	}
	a.flipMu.RLock() // a copy in flight
	flipped := make(chan error, 1)
	go func() { flipped <- a.Update(ctx, 1) }()
	select {
	case err := <-flipped:
		t.Fatalf("Update ran during a copy: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	a.flipMu.RUnlock()
	if err := <-flipped; err != nil {
		t.Fatal(err)
	}
}

// TestBackupWriteStateBitIdentical: a second adapter instance given the
// primary's state with WriteState evolves bit-identically.
func TestBackupWriteStateBitIdentical(t *testing.T) {
	s1, s2 := startServer(t), startServer(t)
	ctx := ctxT(t)
	for _, tc := range []struct {
		model string
		batch func(int) *hamsv1.BatchRequest
	}{{"seqx", lstmBatch}, {"olx", olearnBatch}} {
		init, err := models.InitialState(deployment(t).Model(tc.model))
		if err != nil {
			t.Fatal(err)
		}
		primary := stateful(t, s1.addr, tc.model, init)
		backup := stateful(t, s2.addr, tc.model, nil) // zeros until written
		for i := range 3 {
			if _, err := primary.Infer(ctx, tc.batch(i)); err != nil {
				t.Fatal(err)
			}
		}
		st, v, err := primary.ReadState(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := backup.WriteState(ctx, st, v); err != nil {
			t.Fatal(err)
		}
		bst, bv, _ := backup.ReadState(ctx)
		if bv != v || digest(bst) != digest(st) {
			t.Fatal("backup state differs right after WriteState")
		}
		for i := 3; i < 7; i++ {
			pr, err := primary.Infer(ctx, tc.batch(i))
			if err != nil {
				t.Fatal(err)
			}
			br, err := backup.Infer(ctx, tc.batch(i))
			if err != nil {
				t.Fatal(err)
			}
			if digest(pr.Outputs) != digest(br.Outputs) {
				t.Fatalf("%s batch %d: outputs differ", tc.model, i)
			}
			ps, pv, _ := primary.ReadState(ctx)
			bs, bv, _ := backup.ReadState(ctx)
			if pv != bv || digest(ps) != digest(bs) {
				t.Fatalf("%s batch %d: state digests differ", tc.model, i)
			}
		}
	}
}

func TestCloseCleansUp(t *testing.T) {
	srv := startServer(t)
	ctx := ctxT(t)
	a := stateful(t, srv.addr, "olx", nil)
	if err := a.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	regions := a.Regions()
	if len(regions) != 8 || len(srv.srv.SharedMemoryRegions()) != 8 {
		t.Fatalf("regions %v, server has %v", regions, srv.srv.SharedMemoryRegions())
	}
	for _, r := range regions {
		if !shm.Exists("/" + r) {
			t.Fatalf("no shm object for %s", r)
		}
		if !strings.HasPrefix(r, fmt.Sprintf("hams_olx_")) {
			t.Fatalf("region name %q", r)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if n := srv.srv.SharedMemoryRegions(); len(n) != 0 {
		t.Fatalf("still registered: %v", n)
	}
	for _, r := range regions {
		if shm.Exists("/" + r) {
			t.Fatalf("%s not unlinked", r)
		}
	}
	_, _, err := a.ReadState(ctx)
	wantCode(t, "read after close", err, codes.FailedPrecondition, "closed")
}

// statefulBackend mirrors sidecar.StatefulBackend (not imported, so this
// package's tests do not depend on the sidecar building).
type statefulBackend interface {
	Describe(ctx context.Context) (*hamsv1.ModelDescription, error)
	Infer(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error)
	Health(ctx context.Context) error
	Close() error
	Compute(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error)
	Update(ctx context.Context, batchID uint64) error
	ReadState(ctx context.Context) (tensors []*hamsv1.Tensor, version uint64, err error)
	WriteState(ctx context.Context, tensors []*hamsv1.Tensor, version uint64) error
}

var _ statefulBackend = (*Stateful)(nil)
