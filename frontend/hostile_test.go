package frontend

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"

	"github.com/hams-go/hams/internal/coord"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/testing/backendtest"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// hostileYAML: "seq" holds a stateful model (non-finite inputs refused by
// default), "free" only a stateless one (accepted by default).
const hostileYAML = `
name: test
mode: bare
hosts: [h1, h2]
limits:
  max_message_bytes: 65536
  request_timeout: 5s
  max_rows_per_request: 64
models:
  - {name: s, kind: lstm, stateful: true, placement: {primary: h1, backup: h2}}
  - {name: c, kind: prep}
services:
  - name: seq
    edges: [[frontend, s], [s, frontend]]
    inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]
  - name: free
    edges: [[frontend, c], [c, frontend]]
    inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]
`

func xRows(rows int, vals ...float32) *hamsv1.Tensor {
	v := make([]float32, rows*4)
	copy(v, vals)
	return tensor.FromFloat32("x", []int64{int64(rows), 4}, v)
}

// TestNonFiniteRefusedOnEveryAPI: NaN and ±Inf in an input of a service
// with a stateful model are refused with InvalidArgument naming the
// tensor on the own gRPC API, TF Serving's Predict, KServe v2's ModelInfer
// and the HTTP JSON API, and never reach the model; a service without a
// stateful model takes them (the default).
func TestNonFiniteRefusedOnEveryAPI(t *testing.T) {
	e := newEnvWith(t, envOpts{yaml: hostileYAML})
	tf, _, ks := e.compatClients()
	ctx := ctxT(t, 20*time.Second)
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, svc := range []string{"seq", "free"} {
		refuse := svc == "seq"
		check := func(api string, err error, what string) {
			t.Helper()
			if !refuse {
				if err != nil {
					t.Fatalf("%s %s: %v", svc, api, err)
				}
				return
			}
			wantStatus(t, svc+" "+api, err, codes.InvalidArgument, `input "x"`, what, "reject_non_finite")
		}
		// own gRPC
		_, err := e.client.Predict(ctx, &hamsv1.PredictRequest{Service: svc, Inputs: []*hamsv1.Tensor{xRows(2, 1, 2, 3, nan)}})
		check("own gRPC", err, "element 3 is NaN")
		// TF Serving, typed float_val and tensor_content
		tp, err := wire.ToTensorProtoTyped(xRows(1, 0, float32(math.Inf(-1))))
		if err != nil {
			t.Fatal(err)
		}
		_, err = tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: tfSpec(svc), Inputs: map[string]*tfpb.TensorProto{"x": tp}})
		check("TF Serving typed", err, "element 1 is -Inf")
		tp, err = wire.ToTensorProto(xRows(1, 0, 0, inf))
		if err != nil {
			t.Fatal(err)
		}
		_, err = tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: tfSpec(svc), Inputs: map[string]*tfpb.TensorProto{"x": tp}})
		check("TF Serving content", err, "element 2 is +Inf")
		// KServe v2 raw contents
		x := xRows(1, nan)
		_, err = ks.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: svc,
			Inputs:           []*inference.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: x.Shape}},
			RawInputContents: [][]byte{x.Data}})
		check("KServe v2", err, "element 0 is NaN")
		// HTTP JSON
		code, body := e.do("POST", "/v1/services/"+svc+":predict", `{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,"NaN",4]}]}`)
		if refuse {
			if code != http.StatusBadRequest || !strings.Contains(string(body), "element 2 is NaN") || !strings.Contains(string(body), `\"x\"`) {
				t.Fatalf("seq HTTP: %d %s", code, body)
			}
		} else if code != http.StatusOK {
			t.Fatalf("free HTTP: %d %s", code, body)
		}
	}
	if n := e.models["s"].executed.Load(); n != 0 {
		t.Fatalf("the stateful model executed %d requests; non-finite ones must not reach it", n)
	}
	if n := e.models["c"].executed.Load(); n != 5 {
		t.Fatalf("the stateless model executed %d requests, want 5", n)
	}
	// Finite values still pass.
	if _, err := e.client.Predict(ctx, &hamsv1.PredictRequest{Service: "seq", Inputs: []*hamsv1.Tensor{xRows(2, math.MaxFloat32, -1)}}); err != nil {
		t.Fatal(err)
	}
}

// TestRowCap: a request with more rows than limits.max_rows_per_request is
// refused with InvalidArgument naming the tensor and the limit, on the
// gRPC and HTTP APIs.
func TestRowCap(t *testing.T) {
	e := newEnvWith(t, envOpts{yaml: hostileYAML})
	ctx := ctxT(t, 10*time.Second)
	if _, err := e.client.Predict(ctx, &hamsv1.PredictRequest{Service: "free", Inputs: []*hamsv1.Tensor{xRows(64)}}); err != nil {
		t.Fatalf("64 rows (the limit): %v", err)
	}
	_, err := e.client.Predict(ctx, &hamsv1.PredictRequest{Service: "free", Inputs: []*hamsv1.Tensor{xRows(65)}})
	wantStatus(t, "65 rows", err, codes.InvalidArgument, `input "x"`, "65 rows", "limit of 64", "max_rows_per_request")
	data := strings.TrimSuffix(strings.Repeat("0,", 65*4), ",")
	code, body := e.do("POST", "/v1/services/free:predict", `{"inputs":[{"name":"x","datatype":"FP32","shape":[65,4],"data":[`+data+`]}]}`)
	if code != http.StatusBadRequest || !strings.Contains(string(body), "max_rows_per_request") {
		t.Fatalf("HTTP 65 rows: %d %s", code, body)
	}
	if n := e.models["c"].executed.Load(); n != 1 {
		t.Fatalf("model executed %d requests, want 1", n)
	}
}

// admissionYAML: one message is at most 64 KiB; two requests of ~60 KB
// do not fit in max_inflight_bytes together, and at most 8 requests are
// in flight.
const admissionYAML = `
name: test
mode: bare
limits:
  max_message_bytes: 65536
  request_timeout: 10s
  max_inflight_bytes: 100000
  max_inflight_requests: 8
models:
  - {name: a, kind: prep}
  - {name: q, kind: prep}
services:
  - name: echo
    edges: [[frontend, a], [a, frontend]]
    inputs:
      - {name: images, datatype: FP32, shape: [-1, 4]}
      - {name: ids, datatype: INT64, shape: [-1]}
  - name: big
    edges: [[frontend, q], [q, frontend]]
`

// TestAdmissionControl: a huge valid request is in flight (its model
// holds it); small requests keep being answered meanwhile; a second huge
// one, over max_inflight_bytes, and any request beyond
// max_inflight_requests are answered ResourceExhausted at once; once the
// huge one is answered its room is free again.
func TestAdmissionControl(t *testing.T) {
	e := newEnvWith(t, envOpts{yaml: admissionYAML})
	ctx := ctxT(t, 30*time.Second)
	huge := func() *hamsv1.PredictRequest {
		// 2500 rows of 24 bytes: 60,000 bytes, under the message limit.
		return &hamsv1.PredictRequest{Service: "big", StreamId: "hold:q", Inputs: echoInputs(2500, 1)}
	}
	var wg sync.WaitGroup
	hugeErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := e.client.Predict(ctx, huge())
		hugeErr <- err
	}()
	eventually(t, "the huge request in flight", func() bool { _, b := e.fe.admit.load(); return b >= 60000 })
	// Small requests keep being answered while it is in flight.
	for i := range 20 {
		e.mustEcho(float32(i))
		if code, body := e.do("POST", "/v1/services/echo:predict", fmt.Sprintf(goodEchoJSON, "")); code != http.StatusOK {
			t.Fatalf("small HTTP request while a huge one is in flight: %d %s", code, body)
		}
	}
	// A second huge one does not fit: refused at once, never executed.
	t0 := time.Now()
	_, err := e.client.Predict(ctx, huge())
	wantStatus(t, "second huge request", err, codes.ResourceExhausted, "max_inflight_bytes", `"big"`)
	if d := time.Since(t0); d > 2*time.Second {
		t.Fatalf("refusal took %v; it must be immediate", d)
	}
	// So does an HTTP body that would not fit (admitted on its size
	// before it is read).
	body := fmt.Sprintf(`{"inputs":[{"name":"v","datatype":"FP32","shape":[4,5000],"data":[%s]}]}`, strings.TrimSuffix(strings.Repeat("1,", 20000), ","))
	if code, b := e.do("POST", "/v1/services/big:predict", body); code != http.StatusTooManyRequests || !strings.Contains(string(b), "max_inflight_bytes") {
		t.Fatalf("huge HTTP body: %d %s", code, b)
	}
	// Requests beyond max_inflight_requests: 7 more held (8 in all).
	held := make(chan error, 7)
	for range 7 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.client.Predict(ctx, &hamsv1.PredictRequest{Service: "big", StreamId: "hold:q", Inputs: echoInputs(1, 1)})
			held <- err
		}()
	}
	eventually(t, "8 requests in flight", func() bool { n, _ := e.fe.admit.load(); return n == 8 })
	_, err = e.client.Predict(ctx, &hamsv1.PredictRequest{Service: "echo", Inputs: echoInputs(1, 1)})
	wantStatus(t, "ninth request", err, codes.ResourceExhausted, "max_inflight_requests")
	if got := counterValue(e.fe.m.refused); got != 3 {
		t.Fatalf("admission refused %v requests, want 3", got)
	}
	close(e.models["q"].gate)
	wg.Wait()
	if err := <-hugeErr; err != nil {
		t.Fatalf("the huge request: %v", err)
	}
	for range 7 {
		if err := <-held; err != nil {
			t.Fatalf("a held request: %v", err)
		}
	}
	if n, b := e.fe.admit.load(); n != 0 || b != 0 {
		t.Fatalf("in flight after every answer: %d requests, %d bytes", n, b)
	}
	if _, err := e.client.Predict(ctx, &hamsv1.PredictRequest{Service: "big", Inputs: echoInputs(2500, 2)}); err != nil {
		t.Fatalf("huge request after the first was answered: %v", err)
	}
}

// TestHostileLogRecordRefused: a request-log record no frontend would have
// accepted (written straight into the log) is checked by the leader as a
// client's request is: it never enters the graph, and its refusal is
// recorded as its answer.
func TestHostileLogRecordRefused(t *testing.T) {
	co := openLog(t)
	e := newEnvWith(t, envOpts{yaml: fmt.Sprintf(testYAML, "5s"), config: func(c *Config) { c.Log = co; c.Name = "lead" }})
	eventually(t, "leading", e.fe.isLeader)
	ctx := ctxT(t, 10*time.Second)
	reqID := uint64(1<<coord.IncarnationBits-2)<<(64-coord.IncarnationBits) | 1
	bad := echoInputs(2, 1)
	bad[0].Shape = []int64{2, 5}
	if _, err := co.LogRequest(ctx, &coord.LoggedRequest{ReqID: reqID, Frontend: "intruder", Deadline: time.Now().Add(5 * time.Second),
		Request: &hamsv1.PredictRequest{Service: "echo", Inputs: bad}}); err != nil {
		t.Fatal(err)
	}
	var rec *coord.LoggedReply
	eventually(t, "the refusal recorded", func() bool {
		r, err := co.LookupReply(ctx, reqID)
		rec = r
		return err == nil
	})
	if rec.Code != codes.InvalidArgument || !strings.Contains(rec.Error, `"images"`) || rec.Frontend != "lead" {
		t.Fatalf("recorded answer %+v", rec)
	}
	if n := e.models["a"].executed.Load(); n != 0 {
		t.Fatalf("model a executed %d requests", n)
	}
	e.mustEcho(1)
}

// rawCodec puts a *[]byte on the wire as is: a client that can send
// anything.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

// TestUndecodableRequestsAtTheFrontend: malformed protobuf and invalid
// UTF-8 in names are answered InvalidArgument on every gRPC API of the
// frontend (own, TF Serving, KServe v2, the raw pass-through's methods),
// not Internal; an invalid UTF-8 service name on the HTTP API is NotFound.
func TestUndecodableRequestsAtTheFrontend(t *testing.T) {
	e := newEnv(t, "5s")
	addr := e.grpcAddr
	cc, err := grpcx.Dial(addr, 0, grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	ctx := ctxT(t, 10*time.Second)
	badName := []byte{0x0a, 0x02, 0xff, 0xfe}             // field 1 (a name) = "\xff\xfe"
	badSpec := []byte{0x0a, 0x04, 0x0a, 0x02, 0xff, 0xfe} // model_spec{name: "\xff\xfe"}
	truncated := []byte{0x0a, 0x7f, 0x01}
	for _, c := range []struct {
		method string
		msg    []byte
	}{
		{"/hams.v1.Frontend/Predict", badName},
		{"/hams.v1.Frontend/Predict", truncated},
		{"/tensorflow.serving.PredictionService/Predict", badSpec},
		{"/tensorflow.serving.PredictionService/GetModelMetadata", badSpec},
		{"/tensorflow.serving.ModelService/GetModelStatus", truncated},
		{"/inference.GRPCInferenceService/ModelInfer", badName},
		{"/inference.GRPCInferenceService/ModelReady", truncated},
		{"/tensorflow.serving.PredictionService/Classify", truncated},
	} {
		var out []byte
		err := cc.Invoke(ctx, c.method, &c.msg, &out)
		wantStatus(t, c.method, err, codes.InvalidArgument, c.method, "malformed request message")
	}
	code, body := e.do("POST", "/v1/services/%FF%FE:predict", `{"inputs":[]}`)
	if code != http.StatusNotFound {
		t.Fatalf("HTTP, invalid UTF-8 service name: %d %s", code, body)
	}
	e.mustEcho(1)
}

// TestPassThroughNonFinite: a pass-through model (ha: off, never
// replicated) with reject_non_finite set gets its Predict and ModelInfer
// inputs checked as the HAMS path's are; the backend sees none of the
// refused calls.
func TestPassThroughNonFinite(t *testing.T) {
	bt, err := backendtest.Start("tf_model", "ks_model")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bt.Stop)
	y := strings.NewReplacer("signature: sig_x}}", "signature: sig_x}, reject_non_finite: true}",
		`version: "3"}}`, `version: "3"}, reject_non_finite: true}`).Replace(passYAML)
	e := newEnvWith(t, envOpts{yaml: fmt.Sprintf(y, bt.Addr(), "127.0.0.1:1")})
	tf, _, ks := e.compatClients()
	ctx := ctxT(t, 10*time.Second)
	x := &tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, TensorShape: &tfpb.TensorShapeProto{Dim: []*tfpb.TensorShapeProto_Dim{{Size: 1}, {Size: 2}}}, FloatVal: []float32{1, float32(math.NaN())}}
	_, err = tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: tfSpec("tfm"), Inputs: map[string]*tfpb.TensorProto{"x": x}})
	wantStatus(t, "TF Serving pass-through", err, codes.InvalidArgument, `model "tfm"`, `input "x"`, "element 1 is NaN")
	_, err = ks.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "ksm",
		Inputs:           []*inference.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{1, 1}}},
		RawInputContents: [][]byte{{0, 0, 0x80, 0xff}}}) // -Inf
	wantStatus(t, "KServe pass-through", err, codes.InvalidArgument, `model "ksm"`, "element 0 is -Inf")
	for _, m := range []string{"Predict", "ModelInfer"} {
		if c, ok := bt.Last(m); ok {
			t.Fatalf("the backend got a refused %s: %v", m, c.Req)
		}
	}
	x.FloatVal[1] = 2
	if _, err := tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: tfSpec("tfm"), Inputs: map[string]*tfpb.TensorProto{"x": x}}); err != nil {
		t.Fatalf("finite pass-through Predict: %v", err)
	}
}
