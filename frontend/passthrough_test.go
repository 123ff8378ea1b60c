package frontend

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/hamsmd"
	"github.com/hams-go/hams/internal/testing/backendtest"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// passYAML: a HAMS-path service (echo) next to pass-through models: tfm
// (TF Serving backend, its own backend name and signature), ksm (Triton
// backend, a pinned version), gone (a backend model the server does not
// know) and dead (no server at its address).
const passYAML = `
name: pt
mode: bare
limits: {request_timeout: 5s}
models:
  - {name: a, kind: prep}
  - {name: tfm, ha: off, backend: {type: tfserving, address: "%[1]s", model: tf_model, signature: sig_x}}
  - {name: ksm, ha: off, backend: {type: triton, address: "%[1]s", model: ks_model, version: "3"}}
  - {name: gone, ha: off, backend: {type: triton, address: "%[1]s", model: not_loaded}}
  - {name: dead, ha: off, backend: {type: tfserving, address: "%[2]s"}}
services:
  - name: echo
    inputs: [{name: images, datatype: FP32, shape: [-1, 4]}, {name: ids, datatype: INT64, shape: [-1]}]
    edges: [[frontend, a], [a, frontend]]
  - {name: tfs, edges: [[frontend, tfm], [tfm, frontend]]}
  - {name: kss, edges: [[frontend, ksm], [ksm, frontend]]}
  - {name: gones, edges: [[frontend, gone], [gone, frontend]]}
  - {name: deads, edges: [[frontend, dead], [dead, frontend]]}
`

func passEnv(t *testing.T) (*env, *backendtest.Server) {
	t.Helper()
	bt, err := backendtest.Start("tf_model", "ks_model")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bt.Stop)
	l := listen(t) // a port nobody serves
	deadAddr := l.Addr().String()
	l.Close()
	e := newEnvWith(t, envOpts{yaml: fmt.Sprintf(passYAML, bt.Addr(), deadAddr)})
	return e, bt
}

// identityOf decodes the hams- metadata a backend call carried.
func identityOf(t *testing.T, c backendtest.Call) *hamsmd.Call {
	t.Helper()
	id, err := hamsmd.FromMD(c.MD)
	if err != nil || id == nil {
		t.Fatalf("%s: no HAMS identity in the backend's metadata %v (%v)", c.Method, c.MD, err)
	}
	if len(id.ReqIDs) != 1 || len(id.Lineages) != 1 || id.Truncated != 0 {
		t.Fatalf("%s: identity %+v, want one request", c.Method, id)
	}
	return id
}

// withUnknown appends field 99 (varint 7) to m's unknown fields: a field
// of a newer upstream release the frontend's proto subset does not know.
func withUnknown(m proto.Message) {
	r := m.ProtoReflect()
	r.SetUnknown(protowire.AppendVarint(protowire.AppendTag(r.GetUnknown(), 99, protowire.VarintType), 7))
}

// TestPassThroughTFServing: a TF Serving client's calls for a pass-through
// model reach its backend unchanged (same message, unknown fields
// included, client metadata but the hams- keys, the backend's model name
// and the deployment's signature filled in), carrying HAMS's identity; the
// answer, its header and trailer come back with the client's model name.
func TestPassThroughTFServing(t *testing.T) {
	e, bt := passEnv(t)
	tf, ms, _ := e.compatClients()
	x := &tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, TensorShape: &tfpb.TensorShapeProto{Dim: []*tfpb.TensorShapeProto_Dim{{Size: 1}, {Size: 2}}}, FloatVal: []float32{1, 2}}
	req := &tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "tfm"}, Inputs: map[string]*tfpb.TensorProto{"x": x}, OutputFilter: []string{"y"}}
	withUnknown(req)
	ctx := metadata.AppendToOutgoingContext(ctxT(t, 5*time.Second), "authorization", "Bearer t0k", "hams-req-id", "999", "x-trace-bin", "\x00\x01")
	var header, trailer metadata.MD
	resp, err := tf.Predict(ctx, req, grpc.Header(&header), grpc.Trailer(&trailer))
	if err != nil {
		t.Fatalf("Predict: %v", err)
	}
	if resp.GetModelSpec().GetName() != "tfm" || !proto.Equal(resp.GetOutputs()["y"], x) {
		t.Fatalf("answer %v", resp)
	}
	if header.Get(backendtest.HeaderKey)[0] != "Predict" || trailer.Get(backendtest.TrailerKey)[0] != "Predict" {
		t.Fatalf("backend header %v / trailer %v not forwarded", header, trailer)
	}
	c, _ := bt.Last("Predict")
	got := c.Req.(*tfapis.PredictRequest)
	want := proto.Clone(req).(*tfapis.PredictRequest)
	want.ModelSpec.Name, want.ModelSpec.SignatureName = "tf_model", "sig_x"
	if !proto.Equal(got, want) {
		t.Fatalf("backend got %v, want %v", got, want)
	}
	if u := got.ProtoReflect().GetUnknown(); len(u) == 0 {
		t.Fatal("the unknown field did not reach the backend")
	}
	if c.MD.Get("authorization")[0] != "Bearer t0k" || c.MD.Get("x-trace-bin")[0] != "\x00\x01" {
		t.Fatalf("client metadata not forwarded: %v", c.MD)
	}
	id := identityOf(t, c)
	l := id.Lineages[0]
	if id.ReqIDs[0] == 999 || l.GetReqId() != id.ReqIDs[0] || l.GetModel() != "tfm" || l.GetService() != "tfs" || len(l.GetLineage()) != 1 {
		t.Fatalf("identity %+v (lineage %v): the client's hams-req-id must not pass", id, l)
	}
	if en := l.GetLineage()[0]; en.GetPredModel() != config.Frontend || en.GetPredSeq() != l.GetReqId() || en.GetModel() != "tfm" || en.GetSeq() != 1 {
		t.Fatalf("lineage entry %v", en)
	}

	// The service name works too; the client's own signature and version
	// are kept; a second call gets the next seq.
	req2 := &tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "tfs", SignatureName: "other", VersionChoice: &tfapis.ModelSpec_VersionLabel{VersionLabel: "canary"}}, Inputs: map[string]*tfpb.TensorProto{"x": x}}
	if _, err := tf.Predict(ctxT(t, 5*time.Second), req2); err != nil {
		t.Fatal(err)
	}
	c, _ = bt.Last("Predict")
	if s := c.Req.(*tfapis.PredictRequest).GetModelSpec(); s.GetName() != "tf_model" || s.GetSignatureName() != "other" || s.GetVersionLabel() != "canary" {
		t.Fatalf("spec at the backend %v", s)
	}
	if id2 := identityOf(t, c); id2.ReqIDs[0] == id.ReqIDs[0] || id2.Lineages[0].GetLineage()[0].GetSeq() != 2 {
		t.Fatalf("second call identity %+v", id2.Lineages[0])
	}

	md, err := tf.GetModelMetadata(ctxT(t, 5*time.Second), &tfapis.GetModelMetadataRequest{ModelSpec: tfSpec("tfm"), MetadataField: []string{"signature_def"}})
	if err != nil || md.GetModelSpec().GetName() != "tfm" || md.GetMetadata()["signature_def"] == nil {
		t.Fatalf("GetModelMetadata: %v %v", md, err)
	}
	st, err := ms.GetModelStatus(ctxT(t, 5*time.Second), &tfapis.GetModelStatusRequest{ModelSpec: tfSpec("tfm")})
	if err != nil || st.GetModelVersionStatus()[0].GetState() != tfapis.ModelVersionStatus_AVAILABLE {
		t.Fatalf("GetModelStatus: %v %v", st, err)
	}
	for _, m := range []string{"GetModelMetadata", "GetModelStatus"} {
		c, ok := bt.Last(m)
		if !ok {
			t.Fatalf("%s not forwarded", m)
		}
		identityOf(t, c)
	}
	// The HAMS path is unaffected.
	e.mustEcho(1)
}

// TestPassThroughKServe: the same through KServe v2 (parameters such as
// sequence_id pass untouched; the pinned version is filled in).
func TestPassThroughKServe(t *testing.T) {
	e, bt := passEnv(t)
	_, _, ks := e.compatClients()
	req := &inference.ModelInferRequest{ModelName: "ksm", Id: "r-1",
		Parameters:       map[string]*inference.InferParameter{"sequence_id": {ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: 42}}},
		Inputs:           []*inference.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{1, 1}}},
		RawInputContents: [][]byte{{0, 0, 128, 63}}}
	withUnknown(req)
	resp, err := ks.ModelInfer(ctxT(t, 5*time.Second), req)
	if err != nil {
		t.Fatalf("ModelInfer: %v", err)
	}
	if resp.GetModelName() != "ksm" || resp.GetId() != "r-1" || string(resp.GetRawOutputContents()[0]) != string([]byte{0, 0, 128, 63}) {
		t.Fatalf("answer %v", resp)
	}
	c, _ := bt.Last("ModelInfer")
	want := proto.Clone(req).(*inference.ModelInferRequest)
	want.ModelName, want.ModelVersion = "ks_model", "3"
	if !proto.Equal(c.Req, want) {
		t.Fatalf("backend got %v, want %v", c.Req, want)
	}
	if l := identityOf(t, c).Lineages[0]; l.GetModel() != "ksm" || l.GetService() != "kss" {
		t.Fatalf("identity %v", l)
	}
	rd, err := ks.ModelReady(ctxT(t, 5*time.Second), &inference.ModelReadyRequest{Name: "ksm"})
	if err != nil || !rd.GetReady() {
		t.Fatalf("ModelReady: %v %v", rd, err)
	}
	mm, err := ks.ModelMetadata(ctxT(t, 5*time.Second), &inference.ModelMetadataRequest{Name: "kss"})
	if err != nil || mm.GetName() != "kss" || mm.GetPlatform() != "backendtest" {
		t.Fatalf("ModelMetadata: %v %v", mm, err)
	}
	if c, _ := bt.Last("ModelReady"); c.Req.(*inference.ModelReadyRequest).GetName() != "ks_model" {
		t.Fatalf("ModelReady at the backend: %v", c.Req)
	}
	// Server-wide calls stay the frontend's: ready although the
	// pass-through models have no sidecar.
	sr, err := ks.ServerReady(ctxT(t, 5*time.Second), &inference.ServerReadyRequest{})
	if err != nil || !sr.GetReady() {
		t.Fatalf("ServerReady: %v %v", sr, err)
	}
}

// TestPassThroughErrors: the backend's status (code, message, details)
// reaches the client unchanged; a dead backend is Unavailable and an
// unknown model NotFound, as a TF Serving or Triton client expects; the
// wrong API and the HAMS API are Unimplemented.
func TestPassThroughErrors(t *testing.T) {
	e, bt := passEnv(t)
	tf, _, ks := e.compatClients()
	x := &tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, TensorShape: &tfpb.TensorShapeProto{Dim: []*tfpb.TensorShapeProto_Dim{{Size: 1}}}, FloatVal: []float32{1}}
	predict := func(model string) error {
		_, err := tf.Predict(ctxT(t, 5*time.Second), &tfapis.PredictRequest{ModelSpec: tfSpec(model), Inputs: map[string]*tfpb.TensorProto{"x": x}})
		return err
	}
	infer := func(model string) error {
		_, err := ks.ModelInfer(ctxT(t, 5*time.Second), &inference.ModelInferRequest{ModelName: model,
			Inputs: []*inference.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{1}, Contents: &inference.InferTensorContents{Fp32Contents: []float32{1}}}}})
		return err
	}
	// Bad input, as the backend judges it.
	_, err := tf.Predict(ctxT(t, 5*time.Second), &tfapis.PredictRequest{ModelSpec: tfSpec("tfm")})
	wantStatus(t, "TF: no inputs", err, codes.InvalidArgument, "input size must be non-zero")
	_, err = ks.ModelInfer(ctxT(t, 5*time.Second), &inference.ModelInferRequest{ModelName: "ksm"})
	wantStatus(t, "KServe: no inputs", err, codes.InvalidArgument, "expected 1 inputs")
	// A programmed failure with details.
	st, _ := status.New(codes.ResourceExhausted, "queue full").WithDetails(wrapperspb.String("retry later"))
	bt.FailWith(st.Err())
	err = predict("tfm")
	wantStatus(t, "TF: backend failure", err, codes.ResourceExhausted, "queue full")
	if d := status.Convert(err).Details(); len(d) != 1 || d[0].(*wrapperspb.StringValue).GetValue() != "retry later" {
		t.Fatalf("details %v", d)
	}
	wantStatus(t, "KServe: backend failure", infer("ksm"), codes.ResourceExhausted, "queue full")
	bt.FailWith(nil)
	// Unknown models: at the backend, and at the frontend.
	wantStatus(t, "KServe: model the backend does not know", infer("gone"), codes.NotFound, "not_loaded")
	wantStatus(t, "TF: unknown model", predict("nope"), codes.NotFound, "nope")
	wantStatus(t, "KServe: unknown model", infer("nope"), codes.NotFound, "nope")
	// Backend down.
	wantStatus(t, "TF: backend down", predict("dead"), codes.Unavailable)
	// The other API, and the HAMS API.
	wantStatus(t, "KServe call for a TF Serving backend", infer("tfm"), codes.Unimplemented, "TF Serving")
	wantStatus(t, "TF call for a Triton backend", predict("ksm"), codes.Unimplemented, "KServe")
	_, err = e.client.Predict(ctxT(t, 5*time.Second), &hamsv1.PredictRequest{Service: "tfs", Inputs: echoInputs(1, 0)})
	wantStatus(t, "HAMS API", err, codes.Unimplemented, "pass-through")
	r, err := http.Post(e.httpURL+"/v1/services/tfs:predict", "application/json", strings.NewReader(`{"inputs":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusNotImplemented {
		t.Fatalf("HTTP API: status %d, want 501", r.StatusCode)
	}
	// A client deadline is the backend call's.
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	_, err = tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: tfSpec("tfm"), Inputs: map[string]*tfpb.TensorProto{"x": x}})
	wantStatus(t, "expired deadline", err, codes.DeadlineExceeded)
	e.mustEcho(2)
}
