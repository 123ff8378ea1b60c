package sidecar

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/edge"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// fakeBackend adds its inputs element-wise plus bias and returns one FP32
// output "out" of the same shape. A row whose first element is -1 makes the
// whole batch fail with InvalidArgument (like a model rejecting a value);
// failAll makes every call fail with that code.
type fakeBackend struct {
	inputs  []string
	bias    float32
	mu      sync.Mutex
	calls   int
	sizes   []int
	failAll codes.Code
}

func (f *fakeBackend) Describe(context.Context) (*hamsv1.ModelDescription, error) {
	d := &hamsv1.ModelDescription{Name: "fake", Kind: "fake"}
	for _, n := range f.inputs {
		d.Inputs = append(d.Inputs, &hamsv1.TensorSpec{Name: n, Datatype: tensor.FP32, Shape: []int64{-1, -1}})
	}
	return d, nil
}

func (f *fakeBackend) Infer(_ context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	f.mu.Lock()
	f.calls++
	f.sizes = append(f.sizes, len(req.Rows))
	fail := f.failAll
	f.mu.Unlock()
	if fail != codes.OK {
		return nil, status.Error(fail, "injected backend failure")
	}
	var sum []float32
	for _, in := range req.Inputs {
		v, err := tensor.Float32(in)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		if sum == nil {
			sum = make([]float32, len(v))
		}
		if len(v) != len(sum) {
			return nil, status.Error(codes.InvalidArgument, "inputs differ in size")
		}
		for i := range v {
			sum[i] += v[i]
		}
	}
	cols := len(sum) / int(req.Inputs[0].Shape[0])
	for r := 0; r < int(req.Inputs[0].Shape[0]); r++ {
		if sum[r*cols] == -1 {
			return nil, status.Errorf(codes.InvalidArgument, "row %d: value -1 rejected", r)
		}
	}
	for i := range sum {
		sum[i] += f.bias
	}
	return &hamsv1.BatchResponse{Outputs: []*hamsv1.Tensor{tensor.FromFloat32("out", req.Inputs[0].Shape, sum)}, Rows: req.Rows, BatchId: req.BatchId}, nil
}

func (f *fakeBackend) Health(context.Context) error { return nil }
func (f *fakeBackend) Close() error                 { return nil }

// collector is the frontend stand-in's sink receiver.
type collector struct {
	mu    sync.Mutex
	items map[uint64][]*hamsv1.Item
	n     int
	// check, when set before traffic starts, sees every item on arrival.
	check func(*hamsv1.Item)
}

func (c *collector) deliver(_ string, items []*hamsv1.Item) {
	if c.check != nil {
		for _, it := range items {
			c.check(it)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, it := range items {
		c.items[it.ReqId] = append(c.items[it.ReqId], it)
		c.n++
	}
}

func (c *collector) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// distinct counts the requests with at least one reply: after a
// promotion the new primary resends its output log under a new sender
// incarnation, and this bare sink (unlike a frontend) keeps duplicates.
func (c *collector) distinct() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.items)
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

type harness struct {
	t        testing.TB
	res      *edge.StaticResolver
	sink     *collector
	senders  map[string]*edge.Sender
	sidecars map[string]*Sidecar
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// startGraph runs one sidecar per backend, a frontend sink receiver and
// one frontend sender per entry model.
func startGraph(t testing.TB, yaml string, backends map[string]Backend) *harness {
	t.Helper()
	dep, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, res: edge.NewStaticResolver(nil), sink: &collector{items: map[uint64][]*hamsv1.Item{}},
		senders: map[string]*edge.Sender{}, sidecars: map[string]*Sidecar{}, cancel: cancel}
	flis := listen(t)
	h.res.Set(config.Frontend, flis.Addr().String(), 0)
	srv := grpc.NewServer()
	hamsv1.RegisterDataplaneServer(srv, edge.NewReceiver(config.Frontend, h.sink.deliver, nil))
	h.wg.Add(1)
	go func() { defer h.wg.Done(); _ = srv.Serve(flis) }()
	h.wg.Add(1)
	go func() { defer h.wg.Done(); <-ctx.Done(); srv.Stop() }()
	for name, be := range backends {
		lis := listen(t)
		h.res.Set(name, lis.Addr().String(), 0)
		sc, err := New(Config{Deployment: dep, Model: name, Backend: be, Resolver: h.res, GRPCListener: lis})
		if err != nil {
			t.Fatal(err)
		}
		h.sidecars[name] = sc
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			if err := sc.Run(ctx); err != nil {
				t.Errorf("sidecar %s: %v", name, err)
			}
		}()
	}
	for _, entry := range dep.Services[0].Graph().Entries() {
		s, err := edge.NewSender(edge.SenderConfig{From: config.Frontend, To: entry, Resolver: h.res})
		if err != nil {
			t.Fatal(err)
		}
		h.senders[entry] = s
		h.wg.Add(1)
		go func() { defer h.wg.Done(); _ = s.Run(ctx) }()
	}
	return h
}

func (h *harness) stop() {
	h.cancel()
	h.wg.Wait()
}

const joinGraph = `
name: t
mode: bare
models:
  - {name: a, kind: fake, batch: {size: 8, max_wait: 1ms}}
  - {name: b, kind: fake, batch: {size: 4}}
services:
  - name: s
    edges: [[frontend, a], [frontend, b], [a, b], [b, frontend]]
`

func row(v float32, cols int) *hamsv1.Tensor {
	d := make([]float32, cols)
	for i := range d {
		d[i] = v
	}
	return tensor.FromFloat32("x", []int64{1, int64(cols)}, d)
}

// Frontend -> a -> b (join of frontend and a) -> frontend. Every request
// arrives once with complete lineage; a malformed tensor and a value the
// backend rejects fail only their own requests.
func TestEndToEndJoinGraph(t *testing.T) {
	fa := &fakeBackend{inputs: []string{"x"}, bias: 1}
	fb := &fakeBackend{inputs: []string{"x", "out"}, bias: 0}
	h := startGraph(t, joinGraph, map[string]Backend{"a": fa, "b": fb})
	defer h.stop()

	const n = 300
	badTensor := map[uint64]bool{17: true, 150: true}
	rejected := map[uint64]bool{33: true, 34: true, 200: true}
	edgeSeq := map[string]map[uint64]uint64{"a": {}, "b": {}}
	for id := uint64(1); id <= n; id++ {
		for _, to := range []string{"a", "b"} {
			x := row(float32(id), 4)
			switch {
			case badTensor[id]:
				x.Data = x.Data[:5]
			case rejected[id]:
				x = row(-1, 4) // a's backend rejects the batch; a re-runs it per request
			}
			it := &hamsv1.Item{ReqId: id, Service: "s", StreamId: fmt.Sprint(id), Tensors: []*hamsv1.Tensor{x}}
			h.senders[to].Send(it)
			edgeSeq[to][id] = it.EdgeSeq
		}
	}
	waitFor(t, "all replies", func() bool { return h.sink.count() >= n })

	h.sink.mu.Lock()
	defer h.sink.mu.Unlock()
	if h.sink.n != n {
		t.Fatalf("%d items reached the frontend, want %d", h.sink.n, n)
	}
	seqA, seqB := map[uint64]bool{}, map[uint64]bool{}
	for id := uint64(1); id <= n; id++ {
		got := h.sink.items[id]
		if len(got) != 1 {
			t.Fatalf("req %d arrived %d times", id, len(got))
		}
		it := got[0]
		if it.FromModel != "b" || it.Service != "s" || it.StreamId != fmt.Sprint(id) {
			t.Fatalf("req %d: from %q service %q stream %q", id, it.FromModel, it.Service, it.StreamId)
		}
		if badTensor[id] || rejected[id] {
			if codes.Code(it.ErrorCode) != codes.InvalidArgument || it.Error == "" {
				t.Fatalf("req %d: want InvalidArgument error item, got code %d %q", id, it.ErrorCode, it.Error)
			}
			if len(it.Tensors) != 0 {
				t.Fatalf("req %d: error item with tensors", id)
			}
			continue
		}
		if it.Error != "" {
			t.Fatalf("req %d failed: %s", id, it.Error)
		}
		// out_b = x + out_a = x + (x + 1)
		v, err := tensor.Float32(it.Tensors[0])
		if err != nil || len(v) != 4 || v[0] != 2*float32(id)+1 {
			t.Fatalf("req %d: output %v %v", id, v, err)
		}
		lin := it.Lineage
		if len(lin) != 3 {
			t.Fatalf("req %d: lineage %v", id, lin)
		}
		ea, ebf, eba := lin[0], lin[1], lin[2]
		if ea.PredModel != "frontend" || ea.Model != "a" || ea.PredSeq != edgeSeq["a"][id] {
			t.Fatalf("req %d: entry a %v (edge seq %d)", id, ea, edgeSeq["a"][id])
		}
		// b's pred order is [frontend, a] (edge order in the config).
		if ebf.PredModel != "frontend" || ebf.Model != "b" || ebf.PredSeq != edgeSeq["b"][id] {
			t.Fatalf("req %d: entry frontend->b %v", id, ebf)
		}
		if eba.PredModel != "a" || eba.PredSeq != ea.Seq || eba.Model != "b" || eba.Seq != ebf.Seq {
			t.Fatalf("req %d: entry a->b %v", id, eba)
		}
		if eba.OutputDigest != tensor.Digest(it.Tensors...) || ea.OutputDigest == "" {
			t.Fatalf("req %d: digests %q %q", id, ea.OutputDigest, eba.OutputDigest)
		}
		if seqA[ea.Seq] || seqB[eba.Seq] {
			t.Fatalf("req %d: seq reused", id)
		}
		seqA[ea.Seq], seqB[eba.Seq] = true, true
	}
	// Seqs are dense from 1 over executed requests.
	for _, m := range []map[uint64]bool{seqA, seqB} {
		for s := uint64(1); s <= uint64(len(m)); s++ {
			if !m[s] {
				t.Fatalf("seq %d missing from %v", s, len(m))
			}
		}
	}
	fa.mu.Lock()
	batched := false
	for _, s := range fa.sizes {
		batched = batched || s > 1
	}
	fa.mu.Unlock()
	if !batched {
		t.Log("note: model a never formed a batch > 1")
	}
}

const chainGraph = `
name: t
mode: bare
models:
  - {name: a, kind: fake, batch: {size: 4}}
services:
  - name: s
    edges: [[frontend, a], [a, frontend]]
`

func TestBackendErrorsBecomeErrorItems(t *testing.T) {
	fa := &fakeBackend{inputs: []string{"x"}, failAll: codes.Unavailable}
	h := startGraph(t, chainGraph, map[string]Backend{"a": fa})
	defer h.stop()
	for id := uint64(1); id <= 20; id++ {
		h.senders["a"].Send(&hamsv1.Item{ReqId: id, Tensors: []*hamsv1.Tensor{row(1, 2)}})
	}
	waitFor(t, "error items", func() bool { return h.sink.count() >= 20 })
	h.sink.mu.Lock()
	for id := uint64(1); id <= 20; id++ {
		it := h.sink.items[id][0]
		if codes.Code(it.ErrorCode) != codes.Unavailable || it.Error == "" {
			t.Fatalf("req %d: code %d %q", id, it.ErrorCode, it.Error)
		}
	}
	h.sink.mu.Unlock()
	// The sidecar keeps serving once the backend recovers.
	fa.mu.Lock()
	fa.failAll = codes.OK
	fa.mu.Unlock()
	h.senders["a"].Send(&hamsv1.Item{ReqId: 21, Tensors: []*hamsv1.Tensor{row(1, 2)}})
	waitFor(t, "recovered reply", func() bool { return h.sink.count() >= 21 })
	h.sink.mu.Lock()
	defer h.sink.mu.Unlock()
	if it := h.sink.items[21][0]; it.Error != "" || len(it.Lineage) != 1 || it.Lineage[0].Seq != 1 {
		t.Fatalf("after recovery: %v", it)
	}
}

func TestPerRequestFailures(t *testing.T) {
	fa := &fakeBackend{inputs: []string{"x"}}
	h := startGraph(t, chainGraph, map[string]Backend{"a": fa})
	defer h.stop()
	past := time.Now().Add(-time.Second).UnixNano()
	cases := []struct {
		it   *hamsv1.Item
		code codes.Code
	}{
		{&hamsv1.Item{ReqId: 1, Tensors: []*hamsv1.Tensor{row(1, 2)}, DeadlineUnixNano: past}, codes.DeadlineExceeded},
		{&hamsv1.Item{ReqId: 2, Tensors: []*hamsv1.Tensor{{Name: "y", Datatype: "FP32", Shape: []int64{1}, Data: make([]byte, 4)}}}, codes.InvalidArgument},
		{&hamsv1.Item{ReqId: 3, Tensors: []*hamsv1.Tensor{{Name: "x", Datatype: "FP32", Shape: []int64{}, Data: make([]byte, 4)}}}, codes.InvalidArgument},
		{&hamsv1.Item{ReqId: 4, Tensors: []*hamsv1.Tensor{{Name: "x", Datatype: "INT64", Shape: []int64{1}, Data: make([]byte, 8)}}}, codes.InvalidArgument},
		{&hamsv1.Item{ReqId: 5, Tensors: []*hamsv1.Tensor{{Name: "x", Datatype: "WAT", Shape: []int64{1}, Data: make([]byte, 8)}}}, codes.InvalidArgument},
		{&hamsv1.Item{ReqId: 6, Error: "upstream broke", ErrorCode: int32(codes.Aborted)}, codes.Aborted},
		{&hamsv1.Item{ReqId: 7, Tensors: []*hamsv1.Tensor{row(1, 2)}}, codes.OK},
	}
	for _, c := range cases {
		h.senders["a"].Send(c.it)
	}
	waitFor(t, "replies", func() bool { return h.sink.count() >= len(cases) })
	h.sink.mu.Lock()
	defer h.sink.mu.Unlock()
	for _, c := range cases {
		got := h.sink.items[c.it.ReqId]
		if len(got) != 1 || codes.Code(got[0].ErrorCode) != c.code {
			t.Fatalf("req %d: got %v, want code %v", c.it.ReqId, got, c.code)
		}
	}
	if h.sink.items[6][0].Error != "upstream broke" {
		t.Fatalf("pass-through changed the error: %q", h.sink.items[6][0].Error)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	dep, err := config.Parse([]byte(chainGraph))
	if err != nil {
		t.Fatal(err)
	}
	lis := listen(t)
	defer lis.Close()
	good := Config{Deployment: dep, Model: "a", Backend: &fakeBackend{}, Resolver: edge.NewStaticResolver(nil), GRPCListener: lis}
	if _, err := New(good); err != nil {
		t.Fatalf("good config: %v", err)
	}
	mods := map[string]func(*Config){
		"no deployment": func(c *Config) { c.Deployment = nil },
		"no model":      func(c *Config) { c.Model = "" },
		"unknown model": func(c *Config) { c.Model = "zz" },
		"no backend":    func(c *Config) { c.Backend = nil },
		"no resolver":   func(c *Config) { c.Resolver = nil },
		"no listener":   func(c *Config) { c.GRPCListener = nil },
	}
	for name, mod := range mods {
		c := good
		mod(&c)
		if _, err := New(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
