package frontend

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/adapters/reference"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
	"github.com/hams-go/hams/refserver"
)

// compatClients dials the frontend's gRPC port with the generated TF
// Serving and KServe stubs, as an existing client would.
func (e *env) compatClients() (tfapis.PredictionServiceClient, tfapis.ModelServiceClient, inference.GRPCInferenceServiceClient) {
	e.t.Helper()
	addr := e.grpcAddr
	cc, err := grpcx.Dial(addr, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = cc.Close() })
	return tfapis.NewPredictionServiceClient(cc), tfapis.NewModelServiceClient(cc), inference.NewGRPCInferenceServiceClient(cc)
}

func wantStatus(t *testing.T, what string, err error, code codes.Code, parts ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: want %v, got %v", what, code, err)
	}
	for _, p := range parts {
		if !strings.Contains(status.Convert(err).Message(), p) {
			t.Fatalf("%s: %q does not mention %q", what, err, p)
		}
	}
}

func tfSpec(name string) *tfapis.ModelSpec { return &tfapis.ModelSpec{Name: name} }

func sameTensor(t *testing.T, what string, got *hamsv1.Tensor, want *hamsv1.Tensor) {
	t.Helper()
	if got.GetDatatype() != want.GetDatatype() || !bytes.Equal(got.GetData(), want.GetData()) || len(got.GetShape()) != len(want.GetShape()) {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
	for i := range got.GetShape() {
		if got.GetShape()[i] != want.GetShape()[i] {
			t.Fatalf("%s: shape %v, want %v", what, got.GetShape(), want.GetShape())
		}
	}
}

func TestCompatTFServingPredict(t *testing.T) {
	e := newEnv(t, "5s")
	tf, ms, _ := e.compatClients()
	ctx := ctxT(t, 10*time.Second)
	in := echoInputs(3, 1)
	typed, err := wire.ToTensorProtoTyped(in[0]) // images in float_val
	if err != nil {
		t.Fatal(err)
	}
	content, err := wire.ToTensorProto(in[1]) // ids in tensor_content
	if err != nil {
		t.Fatal(err)
	}
	// By service name and by the name of the one model of the service.
	for _, name := range []string{"echo", "a"} {
		resp, err := tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: name, SignatureName: CompatSignature},
			Inputs: map[string]*tfpb.TensorProto{"images": typed, "ids": content}})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(resp.Outputs) != 2 || resp.ModelSpec.GetName() != name || resp.ModelSpec.GetVersion().GetValue() != 1 {
			t.Fatalf("%s: reply %v", name, resp)
		}
		// Answered in the typed fields, TF Serving's default encoding:
		// a client reading outputs["images"].float_val finds the values.
		if img := resp.Outputs["images"]; len(img.GetFloatVal()) != 12 || len(img.GetTensorContent()) != 0 || len(resp.Outputs["ids"].GetInt64Val()) != 3 {
			t.Fatalf("%s: outputs not in the typed fields: %v", name, resp.Outputs)
		}
		for _, want := range in {
			got, err := wire.FromTensorProto(want.Name, resp.Outputs[want.Name])
			if err != nil {
				t.Fatal(err)
			}
			sameTensor(t, name+" "+want.Name, got, want)
		}
	}
	// output_filter.
	resp, err := tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: tfSpec("echo"), Inputs: map[string]*tfpb.TensorProto{"images": typed, "ids": content}, OutputFilter: []string{"ids"}})
	if err != nil || len(resp.Outputs) != 1 || resp.Outputs["ids"] == nil {
		t.Fatalf("output filter: %v %v", resp, err)
	}
	// Several sinks: outputs named <model>/<tensor>.
	x := tensor.FromFloat32("x", []int64{1, 2}, []float32{1, 2})
	xp, _ := wire.ToTensorProto(x)
	resp, err = tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: tfSpec("fan"), Inputs: map[string]*tfpb.TensorProto{"x": xp}})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for k := range resp.Outputs {
		names = append(names, k)
	}
	sort.Strings(names)
	if strings.Join(names, ",") != "q/x,x/x,y/x" {
		t.Fatalf("multi-sink outputs %v", names)
	}
	got, _ := wire.FromTensorProto("x", resp.Outputs["y/x"])
	sameTensor(t, "fan y/x", got, x)

	// Errors, as a TF Serving client expects them.
	imgs := func(tp *tfpb.TensorProto) map[string]*tfpb.TensorProto {
		return map[string]*tfpb.TensorProto{"images": tp, "ids": content}
	}
	bad := func(what string, req *tfapis.PredictRequest, code codes.Code, parts ...string) {
		t.Helper()
		_, err := tf.Predict(ctx, req)
		wantStatus(t, what, err, code, parts...)
	}
	bad("unknown model", &tfapis.PredictRequest{ModelSpec: tfSpec("nope"), Inputs: imgs(typed)}, codes.NotFound, "nope")
	bad("model of a multi-model service", &tfapis.PredictRequest{ModelSpec: tfSpec("p"), Inputs: imgs(typed)}, codes.NotFound, `"p"`)
	bad("no spec", &tfapis.PredictRequest{Inputs: imgs(typed)}, codes.InvalidArgument, "model_spec")
	bad("no name", &tfapis.PredictRequest{ModelSpec: tfSpec(""), Inputs: imgs(typed)}, codes.InvalidArgument, "no model")
	bad("signature", &tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "echo", SignatureName: "classify"}, Inputs: imgs(typed)}, codes.FailedPrecondition, "classify", CompatSignature)
	bad("duplicate filter", &tfapis.PredictRequest{ModelSpec: tfSpec("echo"), Inputs: imgs(typed), OutputFilter: []string{"ids", "ids"}}, codes.InvalidArgument, "duplicate", "ids")
	undeclared := map[string]*tfpb.TensorProto{"images": typed, "ids": content}
	for i := range 6 {
		// 176 bytes of request that would decode to 384 MiB: an
		// undeclared name is refused before anything is decoded.
		undeclared[fmt.Sprintf("x%d", i)] = &tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, TensorShape: wire.TFShape([]int64{16 << 20}), FloatVal: []float32{1}}
	}
	bad("undeclared inputs", &tfapis.PredictRequest{ModelSpec: tfSpec("echo"), Inputs: undeclared}, codes.InvalidArgument, "unknown input", `"x0"`)
	// The same broadcasts to a service that declares no inputs: refused
	// against the request's byte budget as a whole.
	manyBC := map[string]*tfpb.TensorProto{}
	for i := range 6 {
		manyBC[fmt.Sprintf("x%d", i)] = &tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, TensorShape: wire.TFShape([]int64{4096}), FloatVal: []float32{1}}
	}
	bad("broadcast budget", &tfapis.PredictRequest{ModelSpec: tfSpec("fan"), Inputs: manyBC}, codes.ResourceExhausted, "left of the request's limit")
	short := &tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, TensorShape: wire.TFShape([]int64{3, 4}), FloatVal: []float32{1, 2}}
	bad("value count", &tfapis.PredictRequest{ModelSpec: tfSpec("echo"), Inputs: imgs(short)}, codes.InvalidArgument, "images")
	cplx := &tfpb.TensorProto{Dtype: tfpb.DataType_DT_COMPLEX64, TensorShape: wire.TFShape([]int64{3, 4})}
	bad("unsupported dtype", &tfapis.PredictRequest{ModelSpec: tfSpec("echo"), Inputs: imgs(cplx)}, codes.InvalidArgument, "images", "dtype")
	wrong := &tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, TensorShape: wire.TFShape([]int64{1, 5}), FloatVal: []float32{1}}
	bad("declared shape", &tfapis.PredictRequest{ModelSpec: tfSpec("echo"), Inputs: imgs(wrong)}, codes.InvalidArgument, "images", "shape")
	asDouble := &tfpb.TensorProto{Dtype: tfpb.DataType_DT_DOUBLE, TensorShape: wire.TFShape([]int64{3, 4}), DoubleVal: []float64{1}}
	bad("declared datatype", &tfapis.PredictRequest{ModelSpec: tfSpec("echo"), Inputs: imgs(asDouble)}, codes.InvalidArgument, "images", "FP64")
	bad("missing input", &tfapis.PredictRequest{ModelSpec: tfSpec("echo"), Inputs: map[string]*tfpb.TensorProto{"images": typed}}, codes.InvalidArgument, "ids")
	bad("no inputs", &tfapis.PredictRequest{ModelSpec: tfSpec("echo")}, codes.InvalidArgument, "no input")
	bad("filter", &tfapis.PredictRequest{ModelSpec: tfSpec("echo"), Inputs: imgs(typed), OutputFilter: []string{"scores"}}, codes.InvalidArgument, "scores")

	// Metadata: the service's declared inputs as the signature.
	md, err := tf.GetModelMetadata(ctx, &tfapis.GetModelMetadataRequest{ModelSpec: tfSpec("a"), MetadataField: []string{"signature_def"}})
	if err != nil {
		t.Fatal(err)
	}
	sigs := &tfapis.SignatureDefMap{}
	if err := md.Metadata["signature_def"].UnmarshalTo(sigs); err != nil {
		t.Fatal(err)
	}
	def := sigs.SignatureDef[CompatSignature]
	if def == nil || def.Inputs["images"].GetDtype() != tfpb.DataType_DT_FLOAT || def.Inputs["ids"].GetDtype() != tfpb.DataType_DT_INT64 ||
		def.Inputs["images"].GetTensorShape().GetDim()[1].GetSize() != 4 {
		t.Fatalf("signature %v", sigs)
	}
	_, err = tf.GetModelMetadata(ctx, &tfapis.GetModelMetadataRequest{ModelSpec: tfSpec("echo"), MetadataField: []string{"graph"}})
	wantStatus(t, "metadata field", err, codes.InvalidArgument, "graph")
	_, err = tf.GetModelMetadata(ctx, &tfapis.GetModelMetadataRequest{ModelSpec: tfSpec("echo")})
	wantStatus(t, "no metadata field", err, codes.InvalidArgument, "metadata_field")
	_, err = tf.GetModelMetadata(ctx, &tfapis.GetModelMetadataRequest{ModelSpec: tfSpec("nope"), MetadataField: []string{"signature_def"}})
	wantStatus(t, "metadata unknown", err, codes.NotFound)

	// Status follows whether the entry models resolve.
	st, err := ms.GetModelStatus(ctx, &tfapis.GetModelStatusRequest{ModelSpec: tfSpec("echo")})
	if err != nil || len(st.ModelVersionStatus) != 1 || st.ModelVersionStatus[0].State != tfapis.ModelVersionStatus_AVAILABLE {
		t.Fatalf("status %v %v", st, err)
	}
	addr, _, _ := e.res.Resolve("a")
	e.res.set("a", "")
	st, err = ms.GetModelStatus(ctx, &tfapis.GetModelStatusRequest{ModelSpec: tfSpec("echo")})
	if err != nil || st.ModelVersionStatus[0].State == tfapis.ModelVersionStatus_AVAILABLE || !strings.Contains(st.ModelVersionStatus[0].Status.GetErrorMessage(), `a`) {
		t.Fatalf("status without a: %v %v", st, err)
	}
	bad("entry gone", &tfapis.PredictRequest{ModelSpec: tfSpec("echo"), Inputs: imgs(typed)}, codes.Unavailable, "a")
	e.res.set("a", addr)
	_, err = ms.GetModelStatus(ctx, &tfapis.GetModelStatusRequest{})
	wantStatus(t, "status no spec", err, codes.InvalidArgument)
	_, err = ms.GetModelStatus(ctx, &tfapis.GetModelStatusRequest{ModelSpec: tfSpec("nope")})
	wantStatus(t, "status unknown", err, codes.NotFound)
}

func TestCompatKServeInfer(t *testing.T) {
	e := newEnv(t, "5s")
	_, _, ks := e.compatClients()
	ctx := ctxT(t, 10*time.Second)
	in := echoInputs(2, 3)
	rawReq := func(model string) *inference.ModelInferRequest {
		return &inference.ModelInferRequest{ModelName: model, Id: "req-7",
			Inputs: []*inference.ModelInferRequest_InferInputTensor{wire.InferInput(in[0]), wire.InferInput(in[1])}, RawInputContents: [][]byte{in[0].Data, in[1].Data}}
	}
	check := func(what string, resp *inference.ModelInferResponse, model string) {
		t.Helper()
		if resp.ModelName != model || resp.Id != "req-7" || len(resp.Outputs) != 2 || len(resp.RawOutputContents) != 2 {
			t.Fatalf("%s: reply %v", what, resp)
		}
		for i, o := range resp.Outputs {
			got, err := wire.FromInferOutput(o, resp.RawOutputContents[i], true)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range in {
				if want.Name == got.Name {
					sameTensor(t, what+" "+got.Name, got, want)
				}
			}
		}
	}
	for _, model := range []string{"echo", "a"} {
		resp, err := ks.ModelInfer(ctx, rawReq(model))
		if err != nil {
			t.Fatalf("raw %s: %v", model, err)
		}
		check("raw "+model, resp, model)
	}
	// Typed contents.
	treq := &inference.ModelInferRequest{ModelName: "echo", Id: "req-7"}
	for _, x := range in {
		md := wire.InferInput(x)
		c, err := wire.Contents(x)
		if err != nil {
			t.Fatal(err)
		}
		md.Contents = c
		treq.Inputs = append(treq.Inputs, md)
	}
	resp, err := ks.ModelInfer(ctx, treq)
	if err != nil {
		t.Fatal(err)
	}
	check("typed", resp, "echo")
	// Requested outputs, in the order asked.
	req := rawReq("echo")
	req.Outputs = []*inference.ModelInferRequest_InferRequestedOutputTensor{{Name: "ids"}}
	resp, err = ks.ModelInfer(ctx, req)
	if err != nil || len(resp.Outputs) != 1 || resp.Outputs[0].Name != "ids" {
		t.Fatalf("requested outputs: %v %v", resp, err)
	}
	// sequence_id is the stream id: the harness's "fail:a" stream makes
	// model a fail the request with InvalidArgument.
	req = rawReq("echo")
	req.Parameters = map[string]*inference.InferParameter{wire.ParamSequenceID: wire.StrParam("fail:a")}
	_, err = ks.ModelInfer(ctx, req)
	wantStatus(t, "sequence id as stream", err, codes.InvalidArgument, "not acceptable")
	// request_id joins an answered request (idempotent retry).
	req = rawReq("echo")
	req.Parameters = map[string]*inference.InferParameter{ParamRequestID: wire.StrParam("k1")}
	if _, err := ks.ModelInfer(ctx, req); err != nil {
		t.Fatal(err)
	}
	before := e.models["a"].executed.Load()
	if _, err := ks.ModelInfer(ctx, req); err != nil {
		t.Fatal(err)
	}
	if e.models["a"].executed.Load() != before {
		t.Fatal("a retried request_id executed again")
	}
	// Several sinks.
	x := tensor.FromFloat32("x", []int64{1, 2}, []float32{1, 2})
	resp, err = ks.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "fan", Inputs: []*inference.ModelInferRequest_InferInputTensor{wire.InferInput(x)}, RawInputContents: [][]byte{x.Data}})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range resp.Outputs {
		names = append(names, o.Name)
	}
	if strings.Join(names, ",") != "q/x,x/x,y/x" {
		t.Fatalf("multi-sink outputs %v", names)
	}

	bad := func(what string, req *inference.ModelInferRequest, code codes.Code, parts ...string) {
		t.Helper()
		_, err := ks.ModelInfer(ctx, req)
		wantStatus(t, what, err, code, parts...)
	}
	bad("unknown model", rawReq("nope"), codes.NotFound, "nope")
	bad("no model", rawReq(""), codes.InvalidArgument)
	r := rawReq("echo")
	r.RawInputContents = r.RawInputContents[:1]
	bad("raw count", r, codes.InvalidArgument, "raw_input_contents")
	r = rawReq("echo")
	r.RawInputContents[0] = r.RawInputContents[0][:5]
	bad("raw size", r, codes.InvalidArgument, "images")
	r = rawReq("echo")
	r.Inputs[0].Datatype = "COMPLEX64"
	bad("unsupported datatype", r, codes.InvalidArgument, "images", "COMPLEX64")
	r = rawReq("echo")
	r.Inputs[0].Datatype = "FP64"
	r.RawInputContents[0] = make([]byte, 2*4*8)
	bad("declared datatype", r, codes.InvalidArgument, "images", "FP64")
	tr := &inference.ModelInferRequest{ModelName: "echo", Inputs: []*inference.ModelInferRequest_InferInputTensor{
		{Name: "images", Datatype: "FP32", Shape: []int64{1, 4}, Contents: &inference.InferTensorContents{Fp32Contents: []float32{1}}}}}
	bad("typed count", tr, codes.InvalidArgument, "images")
	r = rawReq("echo")
	r.Inputs[0].Parameters = wire.ShmParams("region", 0, 32)
	bad("shared memory input", r, codes.InvalidArgument, "shared-memory")
	r = rawReq("echo")
	r.Outputs = []*inference.ModelInferRequest_InferRequestedOutputTensor{{Name: "ids", Parameters: wire.ShmParams("region", 0, 16)}}
	bad("shared memory output", r, codes.InvalidArgument, "shared-memory")
	r = rawReq("echo")
	r.Outputs = []*inference.ModelInferRequest_InferRequestedOutputTensor{{Name: "scores"}}
	bad("unknown output", r, codes.InvalidArgument, "scores")
	r = rawReq("echo")
	r.Parameters = map[string]*inference.InferParameter{wire.ParamSequenceID: {ParameterChoice: &inference.InferParameter_BoolParam{BoolParam: true}}}
	bad("bad sequence id", r, codes.InvalidArgument, "sequence_id")

	// Health and metadata.
	live, err := ks.ServerLive(ctx, &inference.ServerLiveRequest{})
	if err != nil || !live.Live {
		t.Fatalf("live %v %v", live, err)
	}
	ready, err := ks.ServerReady(ctx, &inference.ServerReadyRequest{})
	if err != nil || !ready.Ready {
		t.Fatalf("ready %v %v", ready, err)
	}
	mr, err := ks.ModelReady(ctx, &inference.ModelReadyRequest{Name: "a"})
	if err != nil || !mr.Ready {
		t.Fatalf("model ready %v %v", mr, err)
	}
	addr, _, _ := e.res.Resolve("a")
	e.res.set("a", "")
	if mr, err := ks.ModelReady(ctx, &inference.ModelReadyRequest{Name: "echo"}); err != nil || mr.Ready {
		t.Fatalf("model ready without a: %v %v", mr, err)
	}
	if ready, err := ks.ServerReady(ctx, &inference.ServerReadyRequest{}); err != nil || ready.Ready {
		t.Fatalf("server ready without a: %v %v", ready, err)
	}
	if mr, err := ks.ModelReady(ctx, &inference.ModelReadyRequest{Name: "fan"}); err != nil || !mr.Ready {
		t.Fatalf("other service stays ready: %v %v", mr, err)
	}
	e.res.set("a", addr)
	// As Triton answers: an unknown model is not ready, not an error.
	if mr, err := ks.ModelReady(ctx, &inference.ModelReadyRequest{Name: "nope"}); err != nil || mr.Ready {
		t.Fatalf("ready unknown: %v %v", mr, err)
	}
	sm, err := ks.ServerMetadata(ctx, &inference.ServerMetadataRequest{})
	if err != nil || sm.Name == "" {
		t.Fatalf("server metadata %v %v", sm, err)
	}
	mm, err := ks.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: "echo"})
	if err != nil || len(mm.Inputs) != 2 || mm.Inputs[0].Name != "images" || mm.Inputs[0].Datatype != "FP32" || mm.Inputs[0].Shape[1] != 4 {
		t.Fatalf("model metadata %v %v", mm, err)
	}
	_, err = ks.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: "nope"})
	wantStatus(t, "metadata unknown", err, codes.NotFound)
}

const retrofitYAML = `
name: retrofit
mode: bare
models:
  - {name: fashion, kind: classifier}
services:
  - name: fashion
    inputs:
      - {name: images, datatype: FP32, shape: [-1, 784]}
    edges: [[frontend, fashion], [fashion, frontend]]
`

// TestCompatRefserverSamePredictions: the fake sidecar of "fashion" calls
// a real reference model server in-process, and a TF Serving and a KServe
// client get through the frontend what they get from the model server
// directly (within the low-bit drift of the parallel reductions).
func TestCompatRefserverSamePredictions(t *testing.T) {
	dep, err := config.Parse([]byte(retrofitYAML))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := refserver.New(refserver.Config{Deployment: dep, Models: []string{"fashion"}, GRPCListener: lis, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	rdone := make(chan struct{})
	go func() { defer close(rdone); _ = rs.Run(rctx) }()
	t.Cleanup(func() { rcancel(); <-rdone })
	rcc, err := grpcx.Dial(lis.Addr().String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rcc.Close() })
	be := reference.New(rcc, "fashion", 5*time.Second)
	infer := func(ctx context.Context, ins []*hamsv1.Tensor) ([]*hamsv1.Tensor, error) {
		resp, err := be.Infer(ctx, &hamsv1.BatchRequest{Inputs: ins, Rows: []uint32{uint32(tensor.Rows(ins[0]))}, StreamIds: []string{"s"}})
		return resp.GetOutputs(), err
	}
	e := newEnvWith(t, envOpts{yaml: retrofitYAML, infer: map[string]func(context.Context, []*hamsv1.Tensor) ([]*hamsv1.Tensor, error){"fashion": infer}})
	tf, _, ks := e.compatClients()
	directTF := tfapis.NewPredictionServiceClient(rcc)
	directKS := inference.NewGRPCInferenceServiceClient(rcc)
	ctx := ctxT(t, 20*time.Second)

	img := make([]float32, 2*784)
	for i := range img {
		img[i] = float32(math.Mod(float64(i)*0.013, 1))
	}
	images := tensor.FromFloat32("images", []int64{2, 784}, img)
	tp, _ := wire.ToTensorProto(images)
	treq := &tfapis.PredictRequest{ModelSpec: tfSpec("fashion"), Inputs: map[string]*tfpb.TensorProto{"images": tp}}
	viaHAMS, err := tf.Predict(ctx, treq)
	if err != nil {
		t.Fatal(err)
	}
	direct, err := directTF.Predict(ctx, treq)
	if err != nil {
		t.Fatal(err)
	}
	closeTo(t, "tf serving", tpF32(t, viaHAMS.Outputs["scores"]), tpF32(t, direct.Outputs["scores"]))

	kreq := &inference.ModelInferRequest{ModelName: "fashion", Inputs: []*inference.ModelInferRequest_InferInputTensor{wire.InferInput(images)}, RawInputContents: [][]byte{images.Data}}
	kvia, err := ks.ModelInfer(ctx, kreq)
	if err != nil {
		t.Fatal(err)
	}
	kdirect, err := directKS.ModelInfer(ctx, kreq)
	if err != nil {
		t.Fatal(err)
	}
	closeTo(t, "kserve", ksF32(t, kvia, "scores"), ksF32(t, kdirect, "scores"))
	// A tensor that does not match the service's declared input is refused
	// at the frontend, naming it.
	bad := tensor.FromFloat32("images", []int64{1, 783}, make([]float32, 783))
	bp, _ := wire.ToTensorProto(bad)
	_, err = tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: tfSpec("fashion"), Inputs: map[string]*tfpb.TensorProto{"images": bp}})
	wantStatus(t, "bad shape", err, codes.InvalidArgument, "images")
	// The model server gone: the sidecar's Unavailable reaches the client.
	rcancel()
	<-rdone
	_, err = tf.Predict(ctx, treq)
	wantStatus(t, "model server gone", err, codes.Unavailable)
}

func tpF32(t *testing.T, tp *tfpb.TensorProto) []float32 {
	t.Helper()
	x, err := wire.FromTensorProto("scores", tp)
	if err != nil {
		t.Fatal(err)
	}
	v, err := tensor.Float32(x)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func ksF32(t *testing.T, r *inference.ModelInferResponse, name string) []float32 {
	t.Helper()
	for i, o := range r.Outputs {
		if o.Name == name {
			x, err := wire.FromInferOutput(o, r.RawOutputContents[i], true)
			if err != nil {
				t.Fatal(err)
			}
			v, _ := tensor.Float32(x)
			return v
		}
	}
	t.Fatalf("no output %q in %v", name, r)
	return nil
}

func closeTo(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) || len(got) == 0 {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Abs(float64(got[i]-want[i])) > 1e-4 {
			t.Fatalf("%s: value %d is %v, want %v", what, i, got[i], want[i])
		}
	}
}

// TestCompatHostileShapes sends the few-dozen-byte requests whose declared
// shape once made the frontend allocate from it (4 TiB for [1<<40] with one
// value: fatal error: out of memory) or panic in make ([1<<61]: Internal):
// each must come back InvalidArgument naming the tensor, and the frontend
// must keep serving.
func TestCompatHostileShapes(t *testing.T) {
	e := newEnv(t, "5s")
	tf, _, ks := e.compatClients()
	ctx := ctxT(t, 10*time.Second)
	in := echoInputs(1, 1)
	ids, err := wire.ToTensorProto(in[1])
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what  string
		shape []int64
		vals  []float32
		says  string
	}{
		{"one value for 4 TiB", []int64{1 << 40}, []float32{1}, "limit"},
		{"byte size overflow", []int64{1 << 61}, []float32{1}, "int64"},
		{"element count overflow", []int64{1 << 32, 1 << 32}, []float32{1}, "overflows"},
		{"negative dim", []int64{1, -4}, []float32{1}, "dimension 1 is -4"},
		{"count mismatch", []int64{1, 4}, []float32{1, 2, 3}, "float_val holds 3"},
	} {
		images := &tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, TensorShape: wire.TFShape(c.shape), FloatVal: c.vals}
		_, err := tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: tfSpec("echo"), Inputs: map[string]*tfpb.TensorProto{"images": images, "ids": ids}})
		code := codes.InvalidArgument
		if c.says == "limit" {
			// Decodes to more than the request's byte budget.
			code = codes.ResourceExhausted
		}
		wantStatus(t, "Predict "+c.what, err, code, `"images"`, c.says)

		says := c.says
		if says == "limit" || says == "float_val holds 3" {
			says = "fp32_contents" // KServe has no broadcast: the count is wrong
		}
		_, err = ks.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "echo", Inputs: []*inference.ModelInferRequest_InferInputTensor{
			{Name: "images", Datatype: "FP32", Shape: c.shape, Contents: &inference.InferTensorContents{Fp32Contents: c.vals}},
			{Name: "ids", Datatype: "INT64", Shape: in[1].Shape, Contents: &inference.InferTensorContents{Int64Contents: []int64{1}}},
		}})
		wantStatus(t, "ModelInfer "+c.what, err, codes.InvalidArgument, `"images"`, says)
	}
	// still serving
	if _, err := ks.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "echo", Inputs: []*inference.ModelInferRequest_InferInputTensor{wire.InferInput(in[0]), wire.InferInput(in[1])},
		RawInputContents: [][]byte{in[0].Data, in[1].Data}}); err != nil {
		t.Fatal(err)
	}
}
