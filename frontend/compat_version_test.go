package frontend

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hams-go/hams/internal/wire"
	"github.com/hams-go/hams/protos/inference"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// versionYAML: service echo's one model declares backend version 3 and
// signature predict_images, lab's a version label, fan (several models)
// has none (version 1).
const versionYAML = `
name: test
mode: bare
limits: {max_message_bytes: 65536, request_timeout: 5s}
models:
  - {name: a, kind: prep, backend: {version: "3", signature: predict_images}}
  - {name: b, kind: prep, backend: {version: stable}}
services:
  - name: echo
    edges: [[frontend, a], [a, frontend]]
    inputs: [{name: images, datatype: FP32, shape: [-1, 4]}]
    outputs: [{name: images, datatype: FP32, shape: [-1, 4]}]
  - name: lab
    edges: [[frontend, b], [b, frontend]]
`

// The compatibility APIs serve one version per service and answer any
// other version NotFound, as TF Serving and Triton do (an unknown TF
// label is InvalidArgument, as TF Serving answers it).
func TestCompatVersions(t *testing.T) {
	e := newEnvWith(t, envOpts{yaml: versionYAML})
	tf, ms, ks := e.compatClients()
	ctx := ctxT(t, 10*time.Second)
	in := echoInputs(2, 1)
	tp, err := wire.ToTensorProto(in[0])
	if err != nil {
		t.Fatal(err)
	}
	inputs := map[string]*tfpb.TensorProto{"images": tp}
	version := func(name string, v int64) *tfapis.ModelSpec {
		return &tfapis.ModelSpec{Name: name, VersionChoice: &tfapis.ModelSpec_Version{Version: wrapperspb.Int64(v)}}
	}
	label := func(name, l string) *tfapis.ModelSpec {
		return &tfapis.ModelSpec{Name: name, VersionChoice: &tfapis.ModelSpec_VersionLabel{VersionLabel: l}}
	}

	// TF Serving: the served version, its label, or none.
	for what, spec := range map[string]*tfapis.ModelSpec{
		"echo v3": version("echo", 3), "a v3": version("a", 3), "echo unversioned": tfSpec("echo"),
		"lab label": label("lab", "stable"), "lab v1": version("lab", 1),
	} {
		resp, err := tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: spec, Inputs: inputs})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		want := int64(3)
		if spec.GetName() == "lab" {
			want = 1
		}
		if got := resp.GetModelSpec().GetVersion().GetValue(); got != want {
			t.Fatalf("%s: reply names version %d, want %d", what, got, want)
		}
	}
	// TF Serving: an unknown version is NotFound, an unknown label
	// InvalidArgument ("Unrecognized servable version label"); its
	// GetModelStatus ignores version_label and answers every version.
	for what, c := range map[string]struct {
		spec  *tfapis.ModelSpec
		code  codes.Code
		parts []string
	}{
		"echo v2":         {version("echo", 2), codes.NotFound, []string{"version 2", "serves version 3"}},
		"lab v3":          {version("lab", 3), codes.NotFound, []string{"version 3"}},
		"echo label":      {label("echo", "stable"), codes.InvalidArgument, []string{`"stable"`, "no version labels"}},
		"lab wrong label": {label("lab", "canary"), codes.InvalidArgument, []string{`"canary"`, `"stable"`}},
	} {
		_, err := tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: c.spec, Inputs: inputs})
		wantStatus(t, "predict "+what, err, c.code, c.parts...)
		_, err = tf.GetModelMetadata(ctx, &tfapis.GetModelMetadataRequest{ModelSpec: c.spec, MetadataField: []string{"signature_def"}})
		wantStatus(t, "metadata "+what, err, c.code, c.parts...)
		st, err := ms.GetModelStatus(ctx, &tfapis.GetModelStatusRequest{ModelSpec: c.spec})
		if c.code == codes.NotFound {
			wantStatus(t, "status "+what, err, codes.NotFound, c.parts...)
		} else if err != nil || len(st.GetModelVersionStatus()) != 1 {
			t.Fatalf("status %s: the label is ignored, as TF Serving does: %v %v", what, st, err)
		}
	}
	// A client naming the signature it used against TF Serving itself
	// (backend.signature) is served; the reply names that signature, and
	// the metadata lists it beside serving_default.
	sig := &tfapis.ModelSpec{Name: "echo", SignatureName: "predict_images"}
	resp, err := tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: sig, Inputs: inputs})
	if err != nil || resp.GetModelSpec().GetSignatureName() != "predict_images" {
		t.Fatalf("predict with backend.signature: %v %v", resp, err)
	}
	tmd, err := tf.GetModelMetadata(ctx, &tfapis.GetModelMetadataRequest{ModelSpec: sig, MetadataField: []string{"signature_def"}})
	if err != nil {
		t.Fatal(err)
	}
	sigs := &tfapis.SignatureDefMap{}
	if err := tmd.GetMetadata()["signature_def"].UnmarshalTo(sigs); err != nil || sigs.SignatureDef["predict_images"] == nil || sigs.SignatureDef[CompatSignature] == nil {
		t.Fatalf("signatures %v %v", sigs, err)
	}
	_, err = tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "lab", SignatureName: "predict_images"}, Inputs: inputs})
	wantStatus(t, "another service's signature", err, codes.FailedPrecondition, "predict_images")

	st, err := ms.GetModelStatus(ctx, &tfapis.GetModelStatusRequest{ModelSpec: version("echo", 3)})
	if err != nil || len(st.GetModelVersionStatus()) != 1 || st.GetModelVersionStatus()[0].GetVersion() != 3 ||
		st.GetModelVersionStatus()[0].GetState() != tfapis.ModelVersionStatus_AVAILABLE {
		t.Fatalf("status of version 3: %v %v", st, err)
	}

	// KServe v2: model_version is the number or the label.
	req := func(model, v string) *inference.ModelInferRequest {
		return &inference.ModelInferRequest{ModelName: model, ModelVersion: v,
			Inputs: []*inference.ModelInferRequest_InferInputTensor{wire.InferInput(in[0])}, RawInputContents: [][]byte{in[0].Data}}
	}
	for _, c := range []struct{ model, v, want string }{{"echo", "3", "3"}, {"echo", "", "3"}, {"lab", "stable", "1"}, {"lab", "1", "1"}} {
		resp, err := ks.ModelInfer(ctx, req(c.model, c.v))
		if err != nil {
			t.Fatalf("infer %s version %q: %v", c.model, c.v, err)
		}
		if resp.GetModelVersion() != c.want {
			t.Fatalf("infer %s version %q: reply names version %q, want %q", c.model, c.v, resp.GetModelVersion(), c.want)
		}
		if r, err := ks.ModelReady(ctx, &inference.ModelReadyRequest{Name: c.model, Version: c.v}); err != nil || !r.GetReady() {
			t.Fatalf("ready %s version %q: %v %v", c.model, c.v, r, err)
		}
	}
	md, err := ks.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: "echo"})
	if err != nil || len(md.GetVersions()) != 1 || md.GetVersions()[0] != "3" {
		t.Fatalf("metadata versions: %v %v", md, err)
	}
	for _, c := range []struct{ model, v string }{{"echo", "2"}, {"echo", "stable"}, {"lab", "canary"}, {"lab", "3"}} {
		_, err := ks.ModelInfer(ctx, req(c.model, c.v))
		wantStatus(t, "infer "+c.model+" "+c.v, err, codes.NotFound, c.v)
		if mr, err := ks.ModelReady(ctx, &inference.ModelReadyRequest{Name: c.model, Version: c.v}); err != nil || mr.GetReady() {
			t.Fatalf("ready %s %s: not ready, no error, as Triton answers: %v %v", c.model, c.v, mr, err)
		}
		_, err = ks.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: c.model, Version: c.v})
		wantStatus(t, "metadata "+c.model+" "+c.v, err, codes.NotFound, c.v)
	}
}

// Metadata answers list the service's declared outputs, so clients that
// discover output names from metadata find them.
func TestCompatMetadataListsDeclaredOutputs(t *testing.T) {
	e := newEnvWith(t, envOpts{yaml: versionYAML})
	tf, _, ks := e.compatClients()
	ctx := ctxT(t, 10*time.Second)
	md, err := tf.GetModelMetadata(ctx, &tfapis.GetModelMetadataRequest{ModelSpec: tfSpec("echo"), MetadataField: []string{"signature_def"}})
	if err != nil {
		t.Fatal(err)
	}
	sigs := &tfapis.SignatureDefMap{}
	if err := md.Metadata["signature_def"].UnmarshalTo(sigs); err != nil {
		t.Fatal(err)
	}
	out := sigs.SignatureDef[CompatSignature].GetOutputs()["images"]
	if out.GetDtype() != tfpb.DataType_DT_FLOAT || len(out.GetTensorShape().GetDim()) != 2 || out.GetTensorShape().GetDim()[1].GetSize() != 4 {
		t.Fatalf("signature_def outputs %v", sigs.SignatureDef[CompatSignature].GetOutputs())
	}
	km, err := ks.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: "echo"})
	if err != nil {
		t.Fatal(err)
	}
	if len(km.GetOutputs()) != 1 || km.GetOutputs()[0].GetName() != "images" || km.GetOutputs()[0].GetDatatype() != "FP32" || len(km.GetOutputs()[0].GetShape()) != 2 {
		t.Fatalf("ModelMetadata outputs %v", km.GetOutputs())
	}
	// None declared: none listed.
	if km, err := ks.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: "lab"}); err != nil || len(km.GetOutputs()) != 0 {
		t.Fatalf("lab's metadata: %v %v", km, err)
	}
}
