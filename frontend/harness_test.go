package frontend

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/edge"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// testYAML: "echo" is frontend -> a -> frontend with declared inputs;
// "fan" has two entries (p, q), p fans out to x and y, and q, x, y are
// sinks; it declares no inputs.
const testYAML = `
name: test
mode: bare
limits:
  max_message_bytes: 65536
  request_timeout: %s
models:
  - {name: a, kind: prep}
  - {name: p, kind: prep}
  - {name: q, kind: prep}
  - {name: x, kind: prep}
  - {name: y, kind: prep}
services:
  - name: echo
    edges: [[frontend, a], [a, frontend]]
    inputs:
      - {name: images, datatype: FP32, shape: [-1, 4]}
      - {name: ids, datatype: INT64, shape: [-1]}
  - name: fan
    edges: [[frontend, p], [frontend, q], [p, x], [p, y], [x, frontend], [y, frontend], [q, frontend]]
`

// staticResolver is a Resolver over a map the test edits.
type staticResolver struct {
	mu      sync.Mutex
	addrs   map[string]string
	changed chan struct{}
}

func newStaticResolver() *staticResolver {
	return &staticResolver{addrs: map[string]string{}, changed: make(chan struct{})}
}

func (r *staticResolver) Resolve(model string) (string, uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, ok := r.addrs[model]
	return a, 1, ok
}

func (r *staticResolver) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

func (r *staticResolver) set(model, addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if addr == "" {
		delete(r.addrs, model)
	} else {
		r.addrs[model] = addr
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

// fakeModel is a fake sidecar: it receives items on an edge.Receiver and
// sends its "output" to every successor through edge.Senders, appending a
// lineage entry. Its behaviour is steered by the item's stream_id:
// "fail:<model>" makes <model> fail the request with InvalidArgument,
// "drop:<model>" makes <model> never forward it, "hold:<model>" makes
// <model> wait for the test to release its gate. As a sidecar does, it
// marks its output Approximate when its input item was (a reconstruction
// taints everything computed from it), and when approx says it
// reconstructed the output itself (a ParM pool).
type fakeModel struct {
	name     string
	in       chan inItem
	senders  map[string]*edge.Sender
	seq      uint64
	executed atomic.Int64
	gate     chan struct{}
	// infer, when set, computes the model's output tensors (a real model
	// behind the fake sidecar); else the inputs are echoed.
	infer func(ctx context.Context, in []*hamsv1.Tensor) ([]*hamsv1.Tensor, error)
	// approx, when set, says whether the model's output for an input item
	// is a reconstruction (envOpts.approx).
	approx func(it *hamsv1.Item) bool
	// repl answers Replication.Resend (a leading frontend's takeover asks
	// the sinks) and counts the calls; the rest is Unimplemented.
	repl fakeResend
}

// fakeResend is a sidecar's Replication service as a frontend's takeover
// uses it: Resend is answered (nothing resent) and recorded.
type fakeResend struct {
	hamsv1.UnimplementedReplicationServer
	mu    sync.Mutex
	calls []*hamsv1.ResendRequest
}

func (r *fakeResend) Resend(_ context.Context, req *hamsv1.ResendRequest) (*hamsv1.ResendResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, req)
	return &hamsv1.ResendResponse{}, nil
}

// resendsTo counts the Resend calls that named addr as the frontend.
func (r *fakeResend) resendsTo(addr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		if c.GetToAddress() == addr {
			n++
		}
	}
	return n
}

type inItem struct {
	from string
	it   *hamsv1.Item
}

func (m *fakeModel) process(ctx context.Context) {
	for {
		var in inItem
		select {
		case <-ctx.Done():
			return
		case in = <-m.in:
		}
		it := in.it
		out := &hamsv1.Item{ReqId: it.ReqId, Service: it.Service, StreamId: it.StreamId,
			DeadlineUnixNano: it.DeadlineUnixNano, Lineage: it.Lineage, Error: it.Error, ErrorCode: it.ErrorCode,
			Approximate: it.Approximate}
		if it.Error == "" {
			switch it.StreamId {
			case "drop:" + m.name:
				continue
			case "hold:" + m.name:
				select {
				case <-m.gate:
				case <-ctx.Done():
					return
				}
			}
			m.seq++
			m.executed.Add(1)
			if it.StreamId == "fail:"+m.name {
				out.Error = fmt.Sprintf("model %s: input %q is not acceptable", m.name, "images")
				out.ErrorCode = int32(codes.InvalidArgument)
			} else if m.infer != nil {
				ts, err := m.infer(ctx, it.Tensors)
				if err != nil {
					st, _ := status.FromError(err)
					out.Error, out.ErrorCode = st.Message(), int32(st.Code())
				}
				out.Tensors = ts
			} else {
				out.Tensors = it.Tensors
			}
			if out.Error == "" && m.approx != nil && m.approx(it) {
				out.Approximate = true
			}
			if out.Error == "" {
				predSeq := it.EdgeSeq
				if in.from != config.Frontend {
					for _, l := range it.Lineage {
						if l.Model == in.from {
							predSeq = l.Seq
						}
					}
				}
				out.Lineage = append(append([]*hamsv1.LineageEntry(nil), it.Lineage...), &hamsv1.LineageEntry{
					PredModel: in.from, PredSeq: predSeq, Model: m.name, Seq: m.seq, OutputDigest: tensor.Digest(out.Tensors...)})
			}
		}
		for _, s := range m.senders {
			s.Send(proto.CloneOf(out))
		}
	}
}

// env is a frontend with its fake sidecars on loopback.
type env struct {
	t        *testing.T
	fe       *Frontend
	res      *staticResolver
	models   map[string]*fakeModel
	client   hamsv1.FrontendClient
	grpcAddr string // the client gRPC address (the resolver has the internal one)
	httpURL  string
	reg      *prometheus.Registry
	cancel   context.CancelFunc
	runErr   chan error
	wg       sync.WaitGroup
	feCancel context.CancelFunc
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	return l
}

func newEnv(t *testing.T, requestTimeout string) *env {
	t.Helper()
	return newEnvWith(t, envOpts{yaml: fmt.Sprintf(testYAML, requestTimeout)})
}

// envOpts varies the environment: the deployment, extra frontend Config
// fields, and the seq each fake model starts from (its first request gets
// seqStart+1).
type envOpts struct {
	yaml     string
	config   func(*Config)
	seqStart map[string]uint64
	// beforeRun adjusts the frontend after New, before Run.
	beforeRun func(*Frontend)
	// infer gives models a real computation (fakeModel.infer) by name.
	infer map[string]func(ctx context.Context, in []*hamsv1.Tensor) ([]*hamsv1.Tensor, error)
	// approx makes models reconstruct (mark Approximate) the outputs of
	// the input items the function picks, by name (fakeModel.approx).
	approx map[string]func(it *hamsv1.Item) bool
}

func newEnvWith(t *testing.T, o envOpts) *env {
	t.Helper()
	dep, err := config.Parse([]byte(o.yaml))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &env{t: t, res: newStaticResolver(), models: map[string]*fakeModel{}, cancel: cancel, reg: prometheus.NewRegistry()}

	gl, hl, il := listen(t), listen(t), listen(t)
	e.grpcAddr = gl.Addr().String()
	e.res.set(config.Frontend, il.Addr().String())
	cfg := Config{Deployment: dep, Resolver: e.res, GRPCListener: gl, InternalListener: il, HTTPListener: hl, Registry: e.reg}
	if o.config != nil {
		o.config(&cfg)
	}
	fe, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e.fe = fe
	e.httpURL = "http://" + hl.Addr().String()

	for _, svc := range dep.Services {
		g := svc.Graph()
		for _, name := range g.Models() {
			m := &fakeModel{name: name, in: make(chan inItem, 1024), senders: map[string]*edge.Sender{}, gate: make(chan struct{}), seq: o.seqStart[name], infer: o.infer[name], approx: o.approx[name]}
			for _, succ := range g.Succ(name) {
				s, err := edge.NewSender(edge.SenderConfig{From: name, To: succ, Resolver: e.res, MaxMessageBytes: dep.Limits.MaxMessageBytes})
				if err != nil {
					t.Fatalf("sender: %v", err)
				}
				m.senders[succ] = s
				e.goRun(func() { _ = s.Run(ctx) })
			}
			recv := edge.NewReceiver(name, func(from string, items []*hamsv1.Item) {
				for _, it := range items {
					m.in <- inItem{from: from, it: it}
				}
			}, nil)
			srv := grpc.NewServer(grpcx.ServerOptions(discardLog(), nil, dep.Limits.MaxMessageBytes)...)
			hamsv1.RegisterDataplaneServer(srv, recv)
			hamsv1.RegisterReplicationServer(srv, &m.repl)
			l := listen(t)
			e.res.set(name, l.Addr().String())
			e.goRun(func() { _ = grpcx.Serve(ctx, srv, l, time.Second) })
			e.goRun(func() { m.process(ctx) })
			e.models[name] = m
		}
	}
	if o.beforeRun != nil {
		o.beforeRun(fe)
	}
	feCtx, feCancel := context.WithCancel(ctx)
	e.feCancel = feCancel
	e.runErr = make(chan error, 1)
	go func() { e.runErr <- fe.Run(feCtx) }()

	cc, err := grpcx.Dial(e.grpcAddr, 0)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	e.client = hamsv1.NewFrontendClient(cc)
	t.Cleanup(func() {
		_ = cc.Close()
		e.stop()
		cancel()
		e.wg.Wait()
	})
	return e
}

func (e *env) goRun(fn func()) {
	e.wg.Add(1)
	go func() { defer e.wg.Done(); fn() }()
}

// stop ends the frontend's Run and checks it returned cleanly.
func (e *env) stop() {
	if e.feCancel == nil {
		return
	}
	e.feCancel()
	e.feCancel = nil
	select {
	case err := <-e.runErr:
		if err != nil {
			e.t.Errorf("Run returned %v", err)
		}
	case <-time.After(10 * time.Second):
		e.t.Error("Run did not return after cancel")
	}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond) // polling interval, not a wait for an event
	}
}

func (e *env) pending() int {
	e.fe.mu.Lock()
	defer e.fe.mu.Unlock()
	return e.fe.table.len() + len(e.fe.calls) + len(e.fe.inflight)
}

func echoInputs(rows int, base float32) []*hamsv1.Tensor {
	img := make([]float32, rows*4)
	ids := make([]int64, rows)
	for i := range img {
		img[i] = base + float32(i)
	}
	for i := range ids {
		ids[i] = int64(base) + int64(i)
	}
	return []*hamsv1.Tensor{
		tensor.FromFloat32("images", []int64{int64(rows), 4}, img),
		tensor.FromInt64("ids", []int64{int64(rows)}, ids),
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// mustEcho sends a good request to "echo" and checks the reply carries its
// inputs back.
func (e *env) mustEcho(base float32) *hamsv1.PredictResponse {
	e.t.Helper()
	in := echoInputs(2, base)
	resp, err := e.client.Predict(ctxT(e.t, 5*time.Second), &hamsv1.PredictRequest{Service: "echo", Inputs: in})
	if err != nil {
		e.t.Fatalf("good request after the previous one: %v", err)
	}
	if len(resp.Outputs) != 1 || resp.Outputs[0].Model != "a" || len(resp.Outputs[0].Tensors) != 2 {
		e.t.Fatalf("reply outputs %v", resp.Outputs)
	}
	if got, want := tensor.Digest(resp.Outputs[0].Tensors...), tensor.Digest(in...); got != want {
		e.t.Fatalf("reply data digest %s, want %s", got, want)
	}
	return resp
}

func msgHas(msg string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(msg, p) {
			return false
		}
	}
	return true
}
