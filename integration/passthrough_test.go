package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/hamsmd"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/testing/backendtest"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// passThroughYAML (for `hams up`, nspb): three pass-through models, a TF
// Serving (pt-tf) and a Triton (pt-ks) backend that are the test's
// recording server, and the Fashion-MNIST classifier on a reference model
// server the deployment starts (pt-ref, no address); next to them a model
// on the HAMS path (echo-tf, a sidecar with a standby) whose TF Serving
// backend is the recording server too.
const passThroughYAML = `
name: pass
hosts: [h1, h2]
limits: {request_timeout: 10s}
models:
  - {name: pt-tf, ha: off, backend: {type: tfserving, address: "%[1]s", model: tf_model}}
  - {name: pt-ks, ha: off, backend: {type: triton, address: "%[1]s", model: ks_model}}
  - {name: pt-ref, kind: classifier, ha: off}
  - name: echo-tf
    backend: {type: tfserving, address: "%[1]s", model: echo_model}
    placement: {primary: h1, standby: h2}
services:
  - {name: pt-tf, edges: [[frontend, pt-tf], [pt-tf, frontend]]}
  - {name: pt-ks, edges: [[frontend, pt-ks], [pt-ks, frontend]]}
  - name: pt-ref
    inputs: [{name: images, datatype: FP32, shape: [-1, 784]}]
    edges: [[frontend, pt-ref], [pt-ref, frontend]]
  - name: echo
    inputs: [{name: x, datatype: FP32, shape: [-1, 2]}]
    edges: [[frontend, echo-tf], [echo-tf, frontend]]
`

// passIdentity decodes the one-request identity of a pass-through call.
func passIdentity(t *testing.T, c backendtest.Call, model string) *hamsv1.CallLineage {
	t.Helper()
	id, err := hamsmd.FromMD(c.MD)
	if err != nil || id == nil || len(id.ReqIDs) != 1 || len(id.Lineages) != 1 {
		t.Fatalf("%s call without a one-request HAMS identity: %+v (%v); metadata %v", c.Method, id, err, c.MD)
	}
	l := id.Lineages[0]
	if l.GetModel() != model || l.GetReqId() != id.ReqIDs[0] || len(l.GetLineage()) != 1 || l.GetLineage()[0].GetPredModel() != config.Frontend {
		t.Fatalf("%s: identity %v", c.Method, l)
	}
	return l
}

// TestPassThroughUp: through `hams up`, ha: off one-model services are
// served pass-through by the frontend's TF Serving and KServe v2
// endpoints: no sidecar, standby or backup is started for them (the
// topology has none), the recording backends receive the client's call
// with the client's metadata and HAMS's identity, a real model answers as
// it does when called directly, and errors keep the codes a TF Serving or
// Triton client expects (the backend's own, NotFound for an unknown
// model, Unavailable for a backend that is down, Unimplemented for an API
// the backend does not speak). On the HAMS path next to them, the
// sidecar's backend calls carry the reply's req_id and lineage.
func TestPassThroughUp(t *testing.T) {
	bt, err := backendtest.Start("tf_model", "ks_model", "echo_model")
	if err != nil {
		t.Fatal(err)
	}
	defer bt.Stop()
	cfgPath := filepath.Join(t.TempDir(), "pass.yaml")
	if err := os.WriteFile(cfgPath, []byte(fmt.Sprintf(passThroughYAML, bt.Addr())), 0o644); err != nil {
		t.Fatal(err)
	}
	runDir := t.TempDir()
	up := startHams(t, 90*time.Second, "up", "--config", cfgPath, "--run-dir", runDir, "--suspicion-timeout", suspicion)
	tfAddr, ksAddr := up.str(t, "tfserving_grpc"), up.str(t, "kserve_grpc")
	cc, err := grpcx.Dial(tfAddr, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	kc, err := grpcx.Dial(ksAddr, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	tf, ks, fe := tfapis.NewPredictionServiceClient(cc), inference.NewGRPCInferenceServiceClient(kc), hamsv1.NewFrontendClient(cc)
	ctx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 10*time.Second)
	}

	// No instance of a pass-through model; the HAMS-path model has its
	// sidecar and standby.
	mc := dialInternal(t, up.str(t, "manager"), operator)
	defer mc.Close()
	c, cancel := ctx()
	topo, err := hamsv1.NewManagerClient(mc).GetTopology(c, &hamsv1.GetTopologyRequest{})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string][]hamsv1.Role{}
	for _, p := range topo.GetPlacements() {
		if p.GetSidecarAddress() != "" {
			roles[p.GetModel()] = append(roles[p.GetModel()], p.GetRole())
		}
	}
	for _, m := range []string{"pt-tf", "pt-ks", "pt-ref"} {
		if len(roles[m]) != 0 {
			t.Fatalf("pass-through model %s has sidecars %v", m, roles[m])
		}
	}
	if len(roles["echo-tf"]) != 2 {
		t.Fatalf("echo-tf: sidecars %v, want active and standby", roles["echo-tf"])
	}

	// TF Serving client -> pt-tf: the call reaches the recording backend
	// unchanged but for the backend's model name, with the client's
	// metadata and HAMS's identity.
	x := &tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, TensorShape: &tfpb.TensorShapeProto{Dim: []*tfpb.TensorShapeProto_Dim{{Size: 1}, {Size: 2}}}, FloatVal: []float32{3, 4}}
	c, cancel = ctx()
	c = metadata.AppendToOutgoingContext(c, "x-client-trace", "abc", "hams-req-id", "77")
	resp, err := tf.Predict(c, &tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "pt-tf"}, Inputs: map[string]*tfpb.TensorProto{"x": x}})
	cancel()
	if err != nil {
		t.Fatalf("TF Serving Predict pt-tf: %v", err)
	}
	if resp.GetModelSpec().GetName() != "pt-tf" || resp.GetOutputs()["y"].GetFloatVal()[1] != 4 {
		t.Fatalf("pt-tf answer %v", resp)
	}
	call, ok := bt.Last("Predict")
	if !ok || call.Req.(*tfapis.PredictRequest).GetModelSpec().GetName() != "tf_model" {
		t.Fatalf("pt-tf call at the backend: %+v", call)
	}
	if v := call.MD.Get("x-client-trace"); len(v) != 1 || v[0] != "abc" {
		t.Fatalf("client metadata at the backend: %v", call.MD)
	}
	if l := passIdentity(t, call, "pt-tf"); l.GetReqId() == 77 {
		t.Fatalf("the client's hams-req-id reached the backend: %v", l)
	}

	// KServe client -> pt-ks.
	c, cancel = ctx()
	kr, err := ks.ModelInfer(c, &inference.ModelInferRequest{ModelName: "pt-ks", Id: "k1",
		Inputs:           []*inference.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{1, 1}}},
		RawInputContents: [][]byte{{0, 0, 64, 64}}})
	cancel()
	if err != nil || kr.GetModelName() != "pt-ks" || kr.GetId() != "k1" {
		t.Fatalf("KServe ModelInfer pt-ks: %v %v", kr, err)
	}
	call, _ = bt.Last("ModelInfer")
	if call.Req.(*inference.ModelInferRequest).GetModelName() != "ks_model" {
		t.Fatalf("pt-ks call at the backend: %v", call.Req)
	}
	passIdentity(t, call, "pt-ks")

	// pt-ref: a real model on a server the deployment started; the
	// pass-through answers what the server answers directly.
	eff, err := config.Load(filepath.Join(runDir, "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	refAddr := eff.Model("pt-ref").Backend.Address
	if refAddr == "" {
		t.Fatal("the effective deployment has no address for pt-ref's backend")
	}
	dc := dialInternal(t, refAddr, operator)
	defer dc.Close()
	direct := tfapis.NewPredictionServiceClient(dc)
	images := retrofitImages(t, 4)
	spec := &tfapis.ModelSpec{Name: "pt-ref"}
	for i := range images {
		rows := images[i : i+1]
		c, cancel = ctx()
		want, err := direct.Predict(c, &tfapis.PredictRequest{ModelSpec: spec, Inputs: map[string]*tfpb.TensorProto{"images": tfImages(rows, false)}})
		if err != nil {
			cancel()
			t.Fatalf("direct Predict: %v", err)
		}
		got, err := tf.Predict(c, &tfapis.PredictRequest{ModelSpec: spec, Inputs: map[string]*tfpb.TensorProto{"images": tfImages(rows, i%2 == 0)}})
		if err != nil {
			cancel()
			t.Fatalf("Predict pt-ref via HAMS: %v", err)
		}
		kg, err := ks.ModelInfer(c, ksRequest("pt-ref", rows, i%2 == 1))
		cancel()
		if err != nil {
			t.Fatalf("ModelInfer pt-ref via HAMS: %v", err)
		}
		for what, scores := range map[string][]float32{"TF Serving": tfScores(t, got), "KServe": ksScores(t, kg)} {
			if ok, why := sameScores(scores, tfScores(t, want), 1, 1e-4); !ok {
				t.Fatalf("image %d via %s: %s", i, what, why)
			}
		}
	}

	// Errors.
	expect := func(what string, err error, code codes.Code, mention string) {
		t.Helper()
		if status.Code(err) != code || (mention != "" && !containsMsg(err, mention)) {
			t.Fatalf("%s: %v, want %v naming %q", what, err, code, mention)
		}
	}
	tfCall := func(req *tfapis.PredictRequest) error {
		c, cancel := ctx()
		defer cancel()
		_, err := tf.Predict(c, req)
		return err
	}
	ksCall := func(req *inference.ModelInferRequest) error {
		c, cancel := ctx()
		defer cancel()
		_, err := ks.ModelInfer(c, req)
		return err
	}
	dbl := &tfpb.TensorProto{Dtype: tfpb.DataType_DT_DOUBLE, TensorShape: tfImages(images[:1], true).TensorShape, DoubleVal: make([]float64, 784)}
	expect("TF: wrong dtype (the model server's answer)", tfCall(&tfapis.PredictRequest{ModelSpec: spec, Inputs: map[string]*tfpb.TensorProto{"images": dbl}}), codes.InvalidArgument, "images")
	short := ksRequest("pt-ref", images[:1], true)
	short.RawInputContents[0] = short.RawInputContents[0][:100]
	expect("KServe: short raw contents (the model server's answer)", ksCall(short), codes.InvalidArgument, "images")
	expect("TF: unknown model", tfCall(&tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "no-such"}, Inputs: map[string]*tfpb.TensorProto{"x": x}}), codes.NotFound, "no-such")
	expect("KServe: unknown model", ksCall(&inference.ModelInferRequest{ModelName: "no-such"}), codes.NotFound, "no-such")
	expect("KServe call for a TF Serving backend", ksCall(&inference.ModelInferRequest{ModelName: "pt-tf"}), codes.Unimplemented, "TF Serving")
	c, cancel = ctx()
	_, err = fe.Predict(c, &hamsv1.PredictRequest{Service: "pt-ref", Inputs: []*hamsv1.Tensor{tensor.FromFloat32("images", []int64{1, 784}, images[0])}})
	cancel()
	expect("HAMS API for a pass-through service", err, codes.Unimplemented, "pass-through")

	// The HAMS path: the sidecar's Predict at the backend carries the
	// reply's req_id and lineage.
	c, cancel = ctx()
	rep, err := fe.Predict(c, &hamsv1.PredictRequest{Service: "echo", StreamId: "st-1", Inputs: []*hamsv1.Tensor{tensor.FromFloat32("x", []int64{1, 2}, []float32{5, 6})}})
	cancel()
	if err != nil {
		t.Fatalf("HAMS path: %v", err)
	}
	var found bool
	for _, call := range bt.Calls() {
		if call.Method != "Predict" || call.Req.(*tfapis.PredictRequest).GetModelSpec().GetName() != "echo_model" {
			continue
		}
		id, err := hamsmd.FromMD(call.MD)
		if err != nil || id == nil {
			t.Fatalf("sidecar's Predict without identity: %v %v", call.MD, err)
		}
		for i, r := range id.ReqIDs {
			if r == rep.GetReqId() {
				l := id.Lineages[i]
				if l.GetModel() != "echo-tf" || l.GetService() != "echo" || l.GetStreamId() != "st-1" {
					t.Fatalf("sidecar's identity %v", l)
				}
				found = true
			}
		}
	}
	if !found {
		t.Fatalf("no Predict at the backend carried the reply's req_id %d", rep.GetReqId())
	}

	// Backend down: what a TF Serving / Triton client sees when the
	// server is gone.
	bt.Stop()
	expect("TF: backend down", tfCall(&tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "pt-tf"}, Inputs: map[string]*tfpb.TensorProto{"x": x}}), codes.Unavailable, "")
	expect("KServe: backend down", ksCall(&inference.ModelInferRequest{ModelName: "pt-ks", Inputs: []*inference.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{1}, Contents: &inference.InferTensorContents{Fp32Contents: []float32{1}}}}}), codes.Unavailable, "")
	t.Logf("pass-through: TF Serving and KServe calls forwarded with identity (last req_id %s); pt-ref answers match the model server's", strconv.FormatUint(rep.GetReqId(), 10))
	up.stop(t, 20*time.Second)
}

func containsMsg(err error, s string) bool {
	return err != nil && strings.Contains(status.Convert(err).Message(), s)
}
