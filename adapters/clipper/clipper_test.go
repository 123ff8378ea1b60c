package clipper

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// fakeClipper speaks the query frontend's REST API for one app "sum":
// the output of a row is the sum of its numbers (as Clipper nests a
// model's JSON-parsable string output), or behaviour the test sets.
type fakeClipper struct {
	mu       sync.Mutex
	mode     string        // "", "default", "status:<code>", "array", "string", "garbage", "short"
	delay    time.Duration // before answering predict
	mdelay   time.Duration // before answering /metrics
	requests []map[string]json.RawMessage
	nextID   int64
}

func (f *fakeClipper) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	mode, delay, mdelay := f.mode, f.delay, f.mdelay
	f.mu.Unlock()
	if r.Method == http.MethodGet && r.URL.Path == "/metrics" {
		if mdelay > 0 {
			select {
			case <-time.After(mdelay):
			case <-r.Context().Done():
				return
			}
		}
		_, _ = w.Write([]byte(`{"counters": []}`))
		return
	}
	if r.Method != http.MethodPost || r.URL.Path != "/sum/predict" {
		http.NotFound(w, r)
		return
	}
	// The body is read first: the server notices a client that went away
	// (and cancels r.Context()) only once the body is consumed.
	var body map[string]json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":"Json error","cause":"bad json"}`))
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
	}
	f.mu.Lock()
	f.requests = append(f.requests, body)
	f.mu.Unlock()
	if c, ok := strings.CutPrefix(mode, "status:"); ok {
		var code int
		fmt.Sscan(c, &code)
		w.WriteHeader(code)
		_, _ = w.Write([]byte(`{"error":"Request error","cause":"something broke"}`))
		return
	}
	if mode == "query-error" {
		// Clipper's answer to a PredictError (a server-side fault in its
		// query processor, e.g. a selection policy's missing state).
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":"Query processing error","cause":"Unable to find selection state"}`))
		return
	}
	var rows [][]float64
	if raw, ok := body["input"]; ok {
		var row []float64
		if err := json.Unmarshal(raw, &row); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":"Json error","cause":"input is not [double]"}`))
			return
		}
		rows = [][]float64{row}
	} else if err := json.Unmarshal(body["input_batch"], &rows); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":"Json error","cause":"input_batch is not [[double]]"}`))
		return
	}
	var answers []string
	for i, row := range rows {
		sum := 0.0
		for _, v := range row {
			sum += v
		}
		f.mu.Lock()
		f.nextID++
		id := f.nextID
		f.mu.Unlock()
		out := fmt.Sprint(sum)
		switch mode {
		case "array":
			out = fmt.Sprintf("[%v, %v]", sum, -sum)
		case "string":
			out = fmt.Sprintf("%q", fmt.Sprintf("label-%v", sum))
		case "garbage":
			out = `{"x": 1}`
		}
		a := fmt.Sprintf(`{"query_id":%d,"output":%s,"default":false}`, id, out)
		if (mode == "default" || mode == "default-unlinked") && i == len(rows)-1 {
			// Clipper's two explanations (query_frontend.hpp).
			expl := "Failed to retrieve a prediction response within the specified latency SLO"
			if mode == "default-unlinked" {
				expl = "No connected models found for query"
			}
			a = fmt.Sprintf(`{"query_id":%d,"output":-1,"default":true,"default_explanation":%q}`, id, expl)
		}
		answers = append(answers, a)
	}
	if mode == "short" {
		answers = answers[:len(answers)-1]
	}
	if len(answers) == 1 {
		_, _ = w.Write([]byte(answers[0]))
		return
	}
	_, _ = w.Write([]byte(`{"batch_predictions":[` + strings.Join(answers, ",") + `]}`))
}

func (f *fakeClipper) set(mode string, delay time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mode, f.delay = mode, delay
}

func (f *fakeClipper) last() map[string]json.RawMessage {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests[len(f.requests)-1]
}

func startFake(t testing.TB) (*fakeClipper, *httptest.Server) {
	f := &fakeClipper{}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

func newB(t testing.TB, addr string, mod func(*Config)) *Backend {
	t.Helper()
	c := Config{Address: addr, App: "sum", Timeout: 2 * time.Second}
	if mod != nil {
		mod(&c)
	}
	b, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
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

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func batch(rows []uint32, vals ...float32) *hamsv1.BatchRequest {
	n := 0
	for _, r := range rows {
		n += int(r)
	}
	return &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{tensor.FromFloat32("input", []int64{int64(n), int64(len(vals) / n)}, vals)}, Rows: rows, BatchId: 9}
}

func f32(t *testing.T, x *hamsv1.Tensor) []float32 {
	t.Helper()
	v, err := tensor.Float32(x)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestNewValidates(t *testing.T) {
	for what, c := range map[string]Config{
		"no address":      {App: "a"},
		"no app":          {Address: "h:1"},
		"slash app":       {Address: "h:1", App: "a/b"},
		"bad scheme":      {Address: "ftp://h:1", App: "a"},
		"negative":        {Address: "h:1", App: "a", Timeout: -1},
		"output datatype": {Address: "h:1", App: "a", OutputDatatype: "FP16"},
		"input datatype":  {Address: "h:1", App: "a", InputDatatype: "NOPE"},
		"probe":           {Address: "h:1", App: "a", HealthProbe: tensor.FromFloat32("input", []int64{2, 1}, []float32{1, 2})},
	} {
		if _, err := New(c); !errors.Is(err, ErrConfig) {
			t.Fatalf("%s: %v", what, err)
		}
	}
	c, err := ConfigFrom(config.Backend{Address: "h:1337", Model: "app", Timeout: config.Duration(time.Second)})
	if err != nil || c.Address != "h:1337" || c.App != "app" || c.Timeout != time.Second || c.HealthProbe != nil {
		t.Fatalf("ConfigFrom %+v %v", c, err)
	}
	b, err := New(Config{Address: "h:1337", App: "app"})
	if err != nil || b.predictURL != "http://h:1337/app/predict" || b.metricsURL != "http://h:1337/metrics" {
		t.Fatalf("urls: %v %v", b, err)
	}
	d, _ := b.Describe(context.Background())
	if d.Kind != Kind || d.Inputs[0].Name != DefaultInput || d.Outputs[0].Name != DefaultOutput || d.Outputs[0].Datatype != "FP32" {
		t.Fatalf("describe %v", d)
	}
}

// backend.clipper of a deployment reaches the adapter: tensor names and
// datatypes, and a health probe as a one-row tensor of the input datatype.
func TestConfigFromClipperTensors(t *testing.T) {
	for _, c := range []struct {
		dt   string
		want *hamsv1.Tensor
	}{
		{"", tensor.FromFloat32("pixels", []int64{1, 2}, []float32{0.5, 2})},
		{"FP32", tensor.FromFloat32("pixels", []int64{1, 2}, []float32{0.5, 2})},
		{"INT64", tensor.FromInt64("pixels", []int64{1, 2}, []int64{3, -4})},
	} {
		vals := []float64{0.5, 2}
		if c.dt == "INT64" {
			vals = []float64{3, -4}
		}
		cfg, err := ConfigFrom(config.Backend{Address: "h:1337", Model: "app", Clipper: config.ClipperTensors{
			Input: "pixels", InputDatatype: c.dt, Output: "label", OutputDatatype: "INT64", HealthProbe: vals}})
		if err != nil {
			t.Fatalf("%q: %v", c.dt, err)
		}
		if cfg.Input != "pixels" || cfg.Output != "label" || cfg.OutputDatatype != "INT64" || cfg.InputDatatype != c.dt {
			t.Fatalf("%q: config %+v", c.dt, cfg)
		}
		if !proto.Equal(cfg.HealthProbe, c.want) {
			t.Fatalf("%q: probe %v, want %v", c.dt, cfg.HealthProbe, c.want)
		}
		if _, err := New(cfg); err != nil {
			t.Fatalf("%q: New: %v", c.dt, err)
		}
	}
	probe := []int32{7, -1}
	cfg, err := ConfigFrom(config.Backend{Address: "h:1337", Model: "app", Clipper: config.ClipperTensors{InputDatatype: "INT32", HealthProbe: []float64{7, -1}}})
	if err != nil || cfg.HealthProbe.GetDatatype() != "INT32" || len(cfg.HealthProbe.GetData()) != 8 || cfg.HealthProbe.GetName() != DefaultInput ||
		int32(binary.LittleEndian.Uint32(cfg.HealthProbe.GetData()[4:])) != probe[1] {
		t.Fatalf("INT32 probe %v %v", cfg.HealthProbe, err)
	}
	for what, c := range map[string]config.ClipperTensors{
		"fraction as INT64": {InputDatatype: "INT64", HealthProbe: []float64{1.5}},
		"INT32 overflow":    {InputDatatype: "INT32", HealthProbe: []float64{1 << 40}},
		"BYTES probe":       {InputDatatype: "BYTES", HealthProbe: []float64{1}},
	} {
		if _, err := ConfigFrom(config.Backend{Address: "h:1337", Model: "app", Clipper: c}); !errors.Is(err, ErrConfig) {
			t.Fatalf("%s: %v", what, err)
		}
	}
}

func TestPredictSingleAndBatch(t *testing.T) {
	f, srv := startFake(t)
	b := newB(t, srv.URL, nil)
	ctx := ctxT(t)
	// One row: {"input": [...]}, a bare answer.
	resp, err := b.Infer(ctx, batch([]uint32{1}, 1, 2, 3.5))
	if err != nil {
		t.Fatal(err)
	}
	if got := f32(t, resp.Outputs[0]); len(got) != 1 || got[0] != 6.5 || resp.Outputs[0].Shape[0] != 1 || resp.BatchId != 9 {
		t.Fatalf("single: %v", resp)
	}
	if _, ok := f.last()["input"]; !ok {
		t.Fatalf("one row must be sent as input: %v", f.last())
	}
	// Three rows from two requests: input_batch, batch_predictions.
	resp, err = b.Infer(ctx, batch([]uint32{2, 1}, 1, 1, 2, 2, 3, 3))
	if err != nil {
		t.Fatal(err)
	}
	if got := f32(t, resp.Outputs[0]); len(got) != 3 || got[0] != 2 || got[1] != 4 || got[2] != 6 {
		t.Fatalf("batch: %v", got)
	}
	if len(resp.Rows) != 2 || resp.Rows[0] != 2 || resp.Rows[1] != 1 {
		t.Fatalf("rows %v", resp.Rows)
	}
	if _, ok := f.last()["input_batch"]; !ok {
		t.Fatalf("several rows must be sent as input_batch: %v", f.last())
	}
	// Array outputs give [N, D]; INT64 and FP64 inputs are numbers too.
	f.set("array", 0)
	in := tensor.FromInt64("input", []int64{2, 2}, []int64{1, 2, 3, 4})
	resp, err = b.Infer(ctx, &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{in}, Rows: []uint32{1, 1}})
	if err != nil {
		t.Fatal(err)
	}
	if o := resp.Outputs[0]; o.Shape[0] != 2 || o.Shape[1] != 2 {
		t.Fatalf("array output shape %v", o.Shape)
	}
	if got := f32(t, resp.Outputs[0]); got[0] != 3 || got[1] != -3 || got[2] != 7 {
		t.Fatalf("array output %v", got)
	}
	// Strings with output datatype BYTES.
	f.set("string", 0)
	bs := newB(t, srv.URL, func(c *Config) { c.OutputDatatype = tensor.Bytes; c.Output = "label" })
	resp, err = bs.Infer(ctx, batch([]uint32{1, 1}, 1, 2))
	if err != nil {
		t.Fatal(err)
	}
	if o := resp.Outputs[0]; o.Name != "label" || o.Datatype != "BYTES" || string(wire.BytesElems(o.Data)[1]) != "label-2" {
		t.Fatalf("bytes output %v", o)
	}
	// FP64 and INT64 outputs.
	f.set("", 0)
	b64 := newB(t, srv.URL, func(c *Config) { c.OutputDatatype = tensor.Int64 })
	resp, err = b64.Infer(ctx, batch([]uint32{1}, 1, 2))
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := tensor.Int64s(resp.Outputs[0]); len(v) != 1 || v[0] != 3 {
		t.Fatalf("int64 output %v", v)
	}
	_, err = b64.Infer(ctx, batch([]uint32{1}, 1, 2.5))
	wantCode(t, "fraction as INT64", err, codes.Internal, "3.5")
}

// A default answer fails the batch with a code of that query's failure,
// never Unavailable: the sidecar reads Unavailable as its model server
// being down (it holds the batch and then stops for a failover).
func TestDefaultFallbackIsAnError(t *testing.T) {
	f, srv := startFake(t)
	b := newB(t, srv.URL, nil)
	for mode, want := range map[string]struct {
		code codes.Code
		text string
	}{
		"default":          {codes.DeadlineExceeded, "latency SLO"},
		"default-unlinked": {codes.FailedPrecondition, "No connected models"},
	} {
		f.set(mode, 0)
		for _, rows := range [][]uint32{{1}, {1, 1}} {
			vals := make([]float32, 2*len(rows))
			_, err := b.Infer(ctxT(t), batch(rows, vals...))
			wantCode(t, mode, err, want.code, "default output", want.text)
		}
	}
}

func TestHTTPErrors(t *testing.T) {
	f, srv := startFake(t)
	ctx := ctxT(t)
	for code, want := range map[int]codes.Code{
		400: codes.InvalidArgument, 404: codes.NotFound, 408: codes.DeadlineExceeded, 413: codes.ResourceExhausted,
		429: codes.ResourceExhausted, 500: codes.Internal, 501: codes.Unimplemented, 502: codes.Unavailable,
		503: codes.Unavailable, 504: codes.DeadlineExceeded, 418: codes.FailedPrecondition,
	} {
		f.set(fmt.Sprintf("status:%d", code), 0)
		_, err := newB(t, srv.URL, nil).Infer(ctx, batch([]uint32{1}, 1))
		wantCode(t, fmt.Sprint(code), err, want, fmt.Sprintf("HTTP %d", code), "something broke")
	}
	// A 400 "Query processing error" is Clipper's own fault, not the
	// request's: Internal, so the sidecar does not re-run the batch request
	// by request and the clients do not read INVALID_ARGUMENT.
	f.set("query-error", 0)
	_, err := newB(t, srv.URL, nil).Infer(ctx, batch([]uint32{1, 1}, 1, 2))
	wantCode(t, "query processing error", err, codes.Internal, "Query processing error", "selection state")
	f.set("", 0)
	// An app Clipper does not know: 404 from the HTTP server.
	_, err = newB(t, srv.URL, func(c *Config) { c.App = "other" }).Infer(ctx, batch([]uint32{1}, 1))
	wantCode(t, "unknown app", err, codes.NotFound, "other")
	// Malformed answers.
	for mode, part := range map[string]string{"garbage": "neither a number", "short": "answers for"} {
		f.set(mode, 0)
		_, err := newB(t, srv.URL, nil).Infer(ctx, batch([]uint32{1, 1, 1}, 1, 2, 3))
		wantCode(t, mode, err, codes.Internal, part)
	}
	// Nobody listening.
	dead := httptest.NewServer(http.NotFoundHandler())
	addr := dead.Listener.Addr().String()
	dead.Close()
	_, err = newB(t, addr, nil).Infer(ctx, batch([]uint32{1}, 1))
	wantCode(t, "connection refused", err, codes.Unavailable)
	wantCode(t, "health refused", newB(t, addr, nil).Health(ctx), codes.Unavailable)
}

func TestBadInputs(t *testing.T) {
	_, srv := startFake(t)
	b := newB(t, srv.URL, nil)
	ctx := ctxT(t)
	nan := float32(math.NaN())
	cases := map[string]struct {
		req  *hamsv1.BatchRequest
		want string
	}{
		"missing":  {&hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{tensor.FromFloat32("x", []int64{1}, []float32{1})}, Rows: []uint32{1}}, `missing input "input"`},
		"twice":    {&hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{tensor.FromFloat32("input", []int64{1}, []float32{1}), tensor.FromFloat32("input", []int64{1}, []float32{1})}, Rows: []uint32{1}}, "twice"},
		"nan":      {batch([]uint32{1}, 1, nan), "NaN"},
		"rows":     {&hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{tensor.FromFloat32("input", []int64{2, 1}, []float32{1, 2})}, Rows: []uint32{1}}, "sum to 1"},
		"scalar":   {&hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{tensor.FromFloat32("input", nil, []float32{1})}}, "no rows"},
		"broken":   {&hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{{Name: "input", Datatype: "FP32", Shape: []int64{1}, Data: []byte{1}}}}, "input"},
		"fp16":     {&hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{{Name: "input", Datatype: "FP16", Shape: []int64{1}, Data: []byte{1, 2}}}, Rows: []uint32{1}}, "FP16"},
		"bytes 2d": {&hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{{Name: "input", Datatype: "BYTES", Shape: []int64{1, 1}, Data: wire.JoinBytes([][]byte{[]byte("a")})}}, Rows: []uint32{1}}, "one string per row"},
	}
	for what, c := range cases {
		_, err := b.Infer(ctx, c.req)
		wantCode(t, what, err, codes.InvalidArgument, c.want)
	}
	typed := newB(t, srv.URL, func(c *Config) { c.InputDatatype = tensor.FP64 })
	_, err := typed.Infer(ctx, batch([]uint32{1}, 1))
	wantCode(t, "datatype", err, codes.InvalidArgument, "FP64")
	// A BYTES input row is a JSON string (Clipper's strings input type);
	// the fake app rejects it with 400, which stays InvalidArgument.
	s := &hamsv1.Tensor{Name: "input", Datatype: "BYTES", Shape: []int64{1}, Data: wire.JoinBytes([][]byte{[]byte("hi")})}
	_, err = b.Infer(ctx, &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{s}, Rows: []uint32{1}})
	wantCode(t, "strings app", err, codes.InvalidArgument, "input is not")
}

func TestTimeouts(t *testing.T) {
	f, srv := startFake(t)
	b := newB(t, srv.URL, func(c *Config) { c.Timeout = 100 * time.Millisecond })
	ctx := ctxT(t)
	f.set("", time.Minute)
	start := time.Now()
	_, err := b.Infer(ctx, batch([]uint32{1}, 1))
	wantCode(t, "slow predict", err, codes.DeadlineExceeded, "predict")
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("timeout took %v", el)
	}
	f.set("", 0)
	if err := b.Health(ctx); err != nil {
		t.Fatalf("health: %v", err)
	}
	f.mu.Lock()
	f.mdelay = time.Minute
	f.mu.Unlock()
	wantCode(t, "slow health", b.Health(ctx), codes.DeadlineExceeded, "metrics")
}

func TestHealthProbe(t *testing.T) {
	f, srv := startFake(t)
	b := newB(t, srv.URL, func(c *Config) { c.HealthProbe = tensor.FromFloat32("input", []int64{1, 2}, []float32{0, 0}) })
	ctx := ctxT(t)
	if err := b.Health(ctx); err != nil {
		t.Fatalf("health: %v", err)
	}
	f.set("default", 0)
	wantCode(t, "probe gets default", b.Health(ctx), codes.Unavailable, "default output")
	f.set("status:503", 0)
	wantCode(t, "probe 503", b.Health(ctx), codes.Unavailable, "HTTP 503")
	f.set("", 0)
	if err := b.Health(ctx); err != nil {
		t.Fatalf("healthy again: %v", err)
	}
}
