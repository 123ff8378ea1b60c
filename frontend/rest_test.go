package frontend

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

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

// restYAML serves the upstream documentation's example models:
// half_plus_three and half_plus_two (TF Serving's test models, version
// 123, input x of any shape) and mymodel (the KServe v2 and Triton
// examples: input0 UINT32 [2,2], input1 BOOL [3]; output0 FP32 [3,2],
// output1 UINT32 [2,2]).
const restYAML = `
name: rest
mode: bare
limits:
  max_message_bytes: 65536
  request_timeout: 5s
models:
  - {name: half_plus_three, kind: prep, backend: {version: "123"}}
  - {name: half_plus_two, kind: prep, backend: {version: "123", signature: predict_x}}
  - {name: mymodel, kind: prep}
services:
  - name: half_plus_three
    inputs: [{name: x, datatype: FP32}]
    outputs: [{name: y, datatype: FP32}]
    edges: [[frontend, half_plus_three], [half_plus_three, frontend]]
  - name: half_plus_two
    inputs: [{name: x, datatype: FP32}]
    outputs: [{name: y, datatype: FP32}]
    edges: [[frontend, half_plus_two], [half_plus_two, frontend]]
  - name: mymodel
    inputs:
      - {name: input0, datatype: UINT32, shape: [2, 2]}
      - {name: input1, datatype: BOOL, shape: [3]}
    outputs:
      - {name: output0, datatype: FP32, shape: [3, 2]}
      - {name: output1, datatype: UINT32, shape: [2, 2]}
    edges: [[frontend, mymodel], [mymodel, frontend]]
`

// halfPlus is y = 0.5 x + b over FP32 x.
func halfPlus(b float32) func(context.Context, []*hamsv1.Tensor) ([]*hamsv1.Tensor, error) {
	return func(_ context.Context, in []*hamsv1.Tensor) ([]*hamsv1.Tensor, error) {
		x, err := tensor.Float32(in[0])
		if err != nil {
			return nil, err
		}
		y := make([]float32, len(x))
		for i, v := range x {
			y[i] = 0.5*v + b
		}
		return []*hamsv1.Tensor{tensor.FromFloat32("y", in[0].GetShape(), y)}, nil
	}
}

// myModel answers the outputs of the KServe and Triton examples.
func myModel(context.Context, []*hamsv1.Tensor) ([]*hamsv1.Tensor, error) {
	out1 := &hamsv1.Tensor{Name: "output1", Datatype: wire.Uint32, Shape: []int64{2, 2}}
	for _, v := range []uint32{10, 11, 12, 13} {
		out1.Data = append(out1.Data, byte(v), 0, 0, 0)
	}
	return []*hamsv1.Tensor{tensor.FromFloat32("output0", []int64{3, 2}, []float32{1.0, 1.1, 2.0, 2.1, 3.0, 3.1}), out1}, nil
}

func newRESTEnv(t *testing.T, yaml string, more func(*Config)) *env {
	t.Helper()
	return newEnvWith(t, envOpts{yaml: yaml, config: more, infer: map[string]func(context.Context, []*hamsv1.Tensor) ([]*hamsv1.Tensor, error){
		"half_plus_three": halfPlus(3), "half_plus_two": halfPlus(2), "mymodel": myModel,
	}})
}

// restCall is one HTTP exchange.
type restCall struct {
	code   int
	header http.Header
	body   []byte
}

func (e *env) rest(method, path string, header map[string]string, body []byte) restCall {
	e.t.Helper()
	req, err := http.NewRequestWithContext(ctxT(e.t, 10*time.Second), method, e.httpURL+path, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("%s %s: read: %v", method, path, err)
	}
	return restCall{resp.StatusCode, resp.Header, b}
}

// jsonValue decodes JSON for a comparison by value.
func jsonValue(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("not JSON: %v: %s", err, b)
	}
	return v
}

func sameJSON(t *testing.T, what string, got []byte, want json.RawMessage) {
	t.Helper()
	if g, w := jsonValue(t, got), jsonValue(t, want); !reflect.DeepEqual(g, w) {
		t.Fatalf("%s:\n got %s\nwant %s", what, got, want)
	}
}

type docCase struct {
	Name          string          `json:"name"`
	Method        string          `json:"method"`
	Path          string          `json:"path"`
	Request       json.RawMessage `json:"request"`
	Status        int             `json:"status"`
	Response      json.RawMessage `json:"response"`
	BinaryInputs  []string        `json:"binary_inputs"`
	BinaryOutputs []string        `json:"binary_outputs"`
}

func loadDocCases(t *testing.T, file string) []docCase {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Cases []docCase `json:"cases"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return d.Cases
}

// TestRESTTFServingDocs: the TF Serving REST API answers the requests of
// TF Serving's documentation and tests with their documented bodies.
func TestRESTTFServingDocs(t *testing.T) {
	e := newRESTEnv(t, restYAML, nil)
	for _, c := range loadDocCases(t, "testdata/rest/tfserving_docs.json") {
		r := e.rest(c.Method, c.Path, nil, c.Request)
		if r.code != c.Status {
			t.Fatalf("%s: %s %s: HTTP %d, want %d: %s", c.Name, c.Method, c.Path, r.code, c.Status, r.body)
		}
		if ct := r.header.Get("Content-Type"); ct != "application/json" {
			t.Fatalf("%s: Content-Type %q", c.Name, ct)
		}
		sameJSON(t, c.Name, r.body, c.Response)
	}
}

// TestRESTKServeDocs: KServe v2 HTTP answers the specification's and
// Triton's binary-data examples with their documented bodies.
func TestRESTKServeDocs(t *testing.T) {
	e := newRESTEnv(t, restYAML, nil)
	for _, c := range loadDocCases(t, "testdata/rest/kserve_docs.json") {
		body := append([]byte(nil), c.Request...)
		hdr := map[string]string{}
		if c.BinaryInputs != nil {
			hdr[headerInferenceHeaderLength] = strconv.Itoa(len(body))
			for _, s := range c.BinaryInputs {
				b, _ := base64.StdEncoding.DecodeString(s)
				body = append(body, b...)
			}
		}
		r := e.rest("POST", c.Path, hdr, body)
		if r.code != c.Status {
			t.Fatalf("%s: HTTP %d, want %d: %s", c.Name, r.code, c.Status, r.body)
		}
		js := r.body
		if c.BinaryOutputs != nil {
			n, err := strconv.Atoi(r.header.Get(headerInferenceHeaderLength))
			if err != nil || n > len(r.body) {
				t.Fatalf("%s: %s %q (body %d bytes)", c.Name, headerInferenceHeaderLength, r.header.Get(headerInferenceHeaderLength), len(r.body))
			}
			js = r.body[:n]
			var want []byte
			for _, s := range c.BinaryOutputs {
				b, _ := base64.StdEncoding.DecodeString(s)
				want = append(want, b...)
			}
			if !bytes.Equal(r.body[n:], want) {
				t.Fatalf("%s: binary outputs %x, want %x", c.Name, r.body[n:], want)
			}
		}
		sameJSON(t, c.Name, js, c.Response)
	}
}

// TestRESTSameAsGRPC: the same inputs through gRPC Predict / ModelInfer
// and through both REST dialects (row, columnar, JSON, binary) give the
// same outputs.
func TestRESTSameAsGRPC(t *testing.T) {
	e := newRESTEnv(t, restYAML, nil)
	tf, _, ks := e.compatClients()
	ctx := ctxT(t, 10*time.Second)
	x := []float32{0.25, -1.5, 3, 1e-3, 123456.78, 7}
	tp := &tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, TensorShape: wire.TFShape([]int64{2, 3}), FloatVal: x}
	g, err := tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: tfSpec("half_plus_three"), Inputs: map[string]*tfpb.TensorProto{"x": tp}})
	if err != nil {
		t.Fatal(err)
	}
	want := g.GetOutputs()["y"].GetFloatVal()
	rows := fmt.Sprintf(`{"instances": [[%v, %v, %v], [%v, %v, %v]]}`, x[0], x[1], x[2], x[3], x[4], x[5])
	cols := fmt.Sprintf(`{"inputs": {"x": [[%v, %v, %v], [%v, %v, %v]]}}`, x[0], x[1], x[2], x[3], x[4], x[5])
	for _, tc := range []struct{ body, key string }{{rows, "predictions"}, {cols, "outputs"}} {
		r := e.rest("POST", "/v1/models/half_plus_three:predict", nil, []byte(tc.body))
		if r.code != http.StatusOK {
			t.Fatalf("%s: %d %s", tc.body, r.code, r.body)
		}
		var got map[string][][]float32
		if err := json.Unmarshal(r.body, &got); err != nil {
			t.Fatalf("%s: %v", r.body, err)
		}
		flat := append(append([]float32(nil), got[tc.key][0]...), got[tc.key][1]...)
		if !reflect.DeepEqual(flat, want) {
			t.Fatalf("%s: REST %v, gRPC %v", tc.key, flat, want)
		}
	}

	in0 := &hamsv1.Tensor{Name: "input0", Datatype: wire.Uint32, Shape: []int64{2, 2}, Data: []byte{5, 0, 0, 0, 6, 0, 0, 0, 7, 0, 0, 0, 8, 0, 0, 0}}
	in1 := &hamsv1.Tensor{Name: "input1", Datatype: tensor.Bool, Shape: []int64{3}, Data: []byte{0, 1, 1}}
	kr, err := ks.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "mymodel",
		Inputs: []*inference.ModelInferRequest_InferInputTensor{wire.InferInput(in0), wire.InferInput(in1)}, RawInputContents: [][]byte{in0.Data, in1.Data}})
	if err != nil {
		t.Fatal(err)
	}
	jsonBody := `{"inputs":[{"name":"input0","shape":[2,2],"datatype":"UINT32","data":[[5,6],[7,8]]},{"name":"input1","shape":[3],"datatype":"BOOL","data":[false,true,true]}]}`
	r := e.rest("POST", "/v2/models/mymodel/infer", nil, []byte(jsonBody))
	if r.code != http.StatusOK {
		t.Fatalf("infer: %d %s", r.code, r.body)
	}
	var jr struct {
		Outputs []struct {
			Name  string          `json:"name"`
			Shape []int64         `json:"shape"`
			Data  json.RawMessage `json:"data"`
		} `json:"outputs"`
	}
	if err := json.Unmarshal(r.body, &jr); err != nil || len(jr.Outputs) != len(kr.GetOutputs()) {
		t.Fatalf("infer reply %s: %v", r.body, err)
	}
	for i, o := range kr.GetOutputs() {
		gt, _ := wire.FromInferOutput(o, kr.GetRawOutputContents()[i], true)
		var vals []float64
		if err := json.Unmarshal(jr.Outputs[i].Data, &vals); err != nil {
			t.Fatal(err)
		}
		rt := &hamsv1.Tensor{Name: o.GetName(), Datatype: o.GetDatatype(), Shape: jr.Outputs[i].Shape}
		for _, v := range vals {
			if o.GetDatatype() == tensor.FP32 {
				rt.Data = append(rt.Data, tensor.FromFloat32("", []int64{1}, []float32{float32(v)}).Data...)
			} else {
				rt.Data = append(rt.Data, byte(v), 0, 0, 0)
			}
		}
		sameTensor(t, "KServe JSON "+o.GetName(), rt, gt)
	}
	// Binary in and out: byte for byte the gRPC raw contents.
	head := `{"inputs":[{"name":"input0","shape":[2,2],"datatype":"UINT32","parameters":{"binary_data_size":16}},{"name":"input1","shape":[3],"datatype":"BOOL","parameters":{"binary_data_size":3}}],"parameters":{"binary_data_output":true}}`
	r = e.rest("POST", "/v2/models/mymodel/infer", map[string]string{headerInferenceHeaderLength: strconv.Itoa(len(head))}, append(append([]byte(head), in0.Data...), in1.Data...))
	if r.code != http.StatusOK || r.header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("binary infer: %d %v %q", r.code, r.header, r.body)
	}
	n, _ := strconv.Atoi(r.header.Get(headerInferenceHeaderLength))
	if want := bytes.Join(kr.GetRawOutputContents(), nil); !bytes.Equal(r.body[n:], want) {
		t.Fatalf("binary outputs %x, gRPC %x", r.body[n:], want)
	}
}

// TestRESTErrors: upstream's status codes and {"error": ...} bodies for
// malformed JSON, wrong types and shapes, unknown models, versions,
// labels and signatures, and requests over the limits.
func TestRESTErrors(t *testing.T) {
	e := newRESTEnv(t, restYAML, nil)
	big := `{"instances": [` + strings.Repeat("1.0,", 20000) + `1.0]}`
	for _, tc := range []struct {
		method, path, body string
		header             map[string]string
		code               int
		msg                string
	}{
		// TF Serving.
		{"POST", "/v1/models/half_plus_three:predict", ``, nil, 400, "JSON Parse error: The document is empty"},
		{"POST", "/v1/models/half_plus_three:predict", `instances = [1, 2]`, nil, 400, "JSON Parse error"},
		{"POST", "/v1/models/half_plus_three:predict", `[1]`, nil, 400, "Is not object"},
		{"POST", "/v1/models/half_plus_three:predict", `{"instances": ["x", "y"]}`, nil, 400, "not of expected type: float"},
		{"POST", "/v1/models/half_plus_three:predict", `{"signature_name": 100, "instances": [1]}`, nil, 400, "'signature_name' key must be a string value."},
		{"POST", "/v1/models/half_plus_three:predict", `{"signature_name": "nope", "instances": [1]}`, nil, 400, `Serving signature name: "nope" not found in signature def`},
		{"POST", "/v1/models/half_plus_three:predict", `{"instances": [1], "inputs": [1]}`, nil, 400, "only one of 'inputs' or 'instances'"},
		{"POST", "/v1/models/half_plus_three:predict", `{"foo": 1}`, nil, 400, "Missing 'inputs' or 'instances' key"},
		{"POST", "/v1/models/half_plus_three:predict", `{"instances": []}`, nil, 400, "No values in 'instances' array"},
		{"POST", "/v1/models/half_plus_three:predict", `{"instances": [[1, 2], [3]]}`, nil, 400, "Encountered list at unexpected size"},
		{"POST", "/v1/models/half_plus_three:predict", `{"instances": [[1, 2], 3]}`, nil, 400, "found at incorrect level"},
		{"POST", "/v1/models/half_plus_three:predict", `{"instances": [16777217]}`, nil, 400, "without loss of precision"},
		{"POST", "/v1/models/half_plus_three:predict", `{"instances": [{"x": 1, "z": 2}]}`, nil, 400, "does not have named input: z"},
		{"POST", "/v1/models/half_plus_three:predict", big, nil, 413, "exceeds 65536 bytes"},
		{"POST", "/v1/models/half_plus_three/versions/7:predict", `{"instances": [1]}`, nil, 404, "Servable not found for request: Specific(half_plus_three, 7)"},
		{"POST", "/v1/models/half_plus_three/labels/canary:predict", `{"instances": [1]}`, nil, 400, "unrecognized servable version label"},
		{"POST", "/v1/models/half_plus_three/versions/99999999999999999999:predict", `{"instances": [1]}`, nil, 400, "Failed to convert version"},
		{"POST", "/v1/models/half_plus_three", `{"instances": [1]}`, nil, 400, "Malformed request: POST /v1/models/half_plus_three"},
		{"POST", "/v1/models/half_plus_three:regress", `{"examples": [{"x": 1.0}]}`, nil, 400, "Expected regression signature method_name to be tensorflow/serving/regress. Was: tensorflow/serving/predict"},
		{"POST", "/v1/models/half_plus_three:classify", `{"examples": [{"x": 1.0}]}`, nil, 400, "Expected classification signature"},
		{"GET", "/v1/models/nope", ``, nil, 404, "Could not find any versions of model nope"},
		{"GET", "/v1/models/half_plus_three/versions/4", ``, nil, 404, "Could not find version 4 of model half_plus_three"},
		{"GET", "/v1/models/nope/metadata", ``, nil, 404, "Servable not found for request: Latest(nope)"},
		{"GET", "/v1/models", ``, nil, 400, "Missing model name in request."},
		// KServe v2.
		{"POST", "/v2/models/mymodel/infer", `{"inputs": [`, nil, 400, "failed to parse the request JSON buffer"},
		{"POST", "/v2/models/mymodel/infer", `{"inputs":[{"name":"input0","shape":[2,2],"datatype":"UINT32","data":[1,2,3,-4]},{"name":"input1","shape":[3],"datatype":"BOOL","data":[true,true,true]}]}`, nil, 400, "-4 is not a UINT32 value"},
		{"POST", "/v2/models/mymodel/infer", `{"inputs":[{"name":"input0","shape":[2,2],"datatype":"UINT32","data":[1,2,3]},{"name":"input1","shape":[3],"datatype":"BOOL","data":[true,true,true]}]}`, nil, 400, "shape wants 4 elements, 'data' holds 3"},
		{"POST", "/v2/models/mymodel/infer", `{"inputs":[{"name":"input0","shape":[1,4],"datatype":"UINT32","data":[1,2,3,4]},{"name":"input1","shape":[3],"datatype":"BOOL","data":[true,true,true]}]}`, nil, 400, "input0"},
		{"POST", "/v2/models/mymodel/infer", `{"inputs":[{"name":"input0","shape":[2,2],"datatype":"FP32","data":[1,2,3,4]},{"name":"input1","shape":[3],"datatype":"BOOL","data":[true,true,true]}]}`, nil, 400, "datatype FP32, want UINT32"},
		{"POST", "/v2/models/mymodel/infer", `{"inputs":[{"name":"input0","shape":[2,2],"datatype":"UINT32","parameters":{"binary_data_size":16}}]}`, map[string]string{headerInferenceHeaderLength: "101"}, 400, "16 bytes of binary data wanted, 0 left"},
		{"POST", "/v2/models/mymodel/infer", `{"inputs":[]}`, map[string]string{headerInferenceHeaderLength: "900"}, 400, "larger than the request body"},
		{"POST", "/v2/models/mymodel/versions/9/infer", `{"inputs":[]}`, nil, 404, "Request for unknown model: 'mymodel' version 9 is not found"},
		{"GET", "/v2/models/nomodel", ``, nil, 404, "Request for unknown model: 'nomodel' is not found"},
		{"POST", "/v2/models/mymodel/infer", `{"inputs":[{"name":"input1","shape":[30000],"datatype":"BYTES","data":["` + strings.Repeat("x", 70000) + `"]}]}`, nil, 413, "exceeds 65536 bytes"},
	} {
		r := e.rest(tc.method, tc.path, tc.header, []byte(tc.body))
		var eb struct {
			Error string `json:"error"`
		}
		if err := json.Unmarshal(r.body, &eb); err != nil {
			t.Fatalf("%s %s %.60s: body %s: %v", tc.method, tc.path, tc.body, r.body, err)
		}
		if r.code != tc.code || !strings.Contains(eb.Error, tc.msg) {
			t.Fatalf("%s %s %.60s: HTTP %d %q, want %d with %q", tc.method, tc.path, tc.body, r.code, eb.Error, tc.code, tc.msg)
		}
	}
}

// TestRESTDecodedLimit: tensors that decode to more than the request's
// byte budget (config.Limits.MaxDecodedBytes, the message limit) are
// refused 413 before they are stored, on both dialects: a 40 KB body of
// 20000 ones is 80000 bytes of FP32.
func TestRESTDecodedLimit(t *testing.T) {
	e := newRESTEnv(t, restYAML, nil)
	vals := strings.TrimSuffix(strings.Repeat("1,", 20000), ",")
	r := e.rest("POST", "/v1/models/half_plus_three:predict", nil, []byte(`{"instances": [`+vals+`]}`))
	if r.code != http.StatusRequestEntityTooLarge || !bytes.Contains(r.body, []byte("max_decoded_bytes")) {
		t.Fatalf("TF: %d %s", r.code, r.body)
	}
	r = e.rest("POST", "/v2/models/half_plus_three/infer", nil, []byte(`{"inputs":[{"name":"x","shape":[20000],"datatype":"FP32","data":[`+vals+`]}]}`))
	if r.code != http.StatusRequestEntityTooLarge || !bytes.Contains(r.body, []byte("max_decoded_bytes")) {
		t.Fatalf("KServe: %d %s", r.code, r.body)
	}
}

// TestRESTMetadataAndHealth: TF Serving's metadata and KServe's server
// and model metadata, liveness and readiness.
func TestRESTMetadataAndHealth(t *testing.T) {
	e := newRESTEnv(t, restYAML, nil)
	r := e.rest("GET", "/v1/models/half_plus_two/metadata", nil, nil)
	if r.code != http.StatusOK {
		t.Fatalf("metadata: %d %s", r.code, r.body)
	}
	var md struct {
		ModelSpec struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		} `json:"model_spec"`
		Metadata struct {
			SignatureDef struct {
				SignatureDef map[string]struct {
					Inputs map[string]struct {
						Dtype string `json:"dtype"`
						Name  string `json:"name"`
					} `json:"inputs"`
					MethodName string `json:"method_name"`
				} `json:"signature_def"`
			} `json:"signature_def"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(r.body, &md); err != nil {
		t.Fatalf("%s: %v", r.body, err)
	}
	defs := md.Metadata.SignatureDef.SignatureDef
	if md.ModelSpec.Name != "half_plus_two" || md.ModelSpec.Version != "123" || defs["serving_default"].Inputs["x"].Dtype != "DT_FLOAT" ||
		defs["predict_x"].MethodName != "tensorflow/serving/predict" || defs["serving_default"].Inputs["x"].Name != "x:0" {
		t.Fatalf("metadata %s", r.body)
	}
	// The backend signature answers too.
	r = e.rest("POST", "/v1/models/half_plus_two:predict", nil, []byte(`{"signature_name": "predict_x", "inputs": {"x": [2.0]}}`))
	sameJSON(t, "signature predict_x", r.body, json.RawMessage(`{"outputs": [3.0]}`))

	for _, p := range []string{"/v2/health/live", "/v2/health/ready", "/v2/models/mymodel/ready", "/v2/models/mymodel/versions/1/ready"} {
		if r := e.rest("GET", p, nil, nil); r.code != http.StatusOK || len(r.body) != 0 {
			t.Fatalf("%s: %d %q", p, r.code, r.body)
		}
	}
	for _, p := range []string{"/v2/models/nomodel/ready", "/v2/models/mymodel/versions/3/ready"} {
		if r := e.rest("GET", p, nil, nil); r.code != http.StatusBadRequest {
			t.Fatalf("%s: %d %q, want 400", p, r.code, r.body)
		}
	}
	r = e.rest("GET", "/v2", nil, nil)
	sameJSON(t, "server metadata", r.body, json.RawMessage(`{"name":"hams-go","version":"1","extensions":["sequence","binary_tensor_data"]}`))
	r = e.rest("GET", "/v2/models/mymodel", nil, nil)
	sameJSON(t, "model metadata", r.body, json.RawMessage(`{"name":"mymodel","versions":["1"],"platform":"hams-go",
		"inputs":[{"name":"input0","datatype":"UINT32","shape":[2,2]},{"name":"input1","datatype":"BOOL","shape":[3]}],
		"outputs":[{"name":"output0","datatype":"FP32","shape":[3,2]},{"name":"output1","datatype":"UINT32","shape":[2,2]}]}`))
	// Not ready: the entry model has no live instance.
	e.res.set("mymodel", "")
	if r := e.rest("GET", "/v2/health/ready", nil, nil); r.code != http.StatusBadRequest {
		t.Fatalf("ready with an entry model down: %d", r.code)
	}
	if r := e.rest("GET", "/v2/models/mymodel/ready", nil, nil); r.code != http.StatusBadRequest {
		t.Fatalf("model ready with its model down: %d", r.code)
	}
	r = e.rest("GET", "/v1/models/mymodel", nil, nil)
	if r.code != http.StatusOK || !bytes.Contains(r.body, []byte(`"state": "LOADING"`)) || !bytes.Contains(r.body, []byte(`"error_code": "UNAVAILABLE"`)) {
		t.Fatalf("status with its model down: %d %s", r.code, r.body)
	}
}

// TestRESTClientAuth: the REST dialects go through client
// authentication: 401 with WWW-Authenticate without a valid token, 403
// for a model outside the token's list; liveness and readiness stay open.
func TestRESTClientAuth(t *testing.T) {
	sum := sha256.Sum256([]byte(aliceToken))
	auth := fmt.Sprintf("client_auth:\n  tokens:\n    - {name: alice, sha256: %s, models: [half_plus_two]}\n", hex.EncodeToString(sum[:]))
	e := newRESTEnv(t, restYAML+auth, withClientAuth(t, nil))
	alice := "Bearer " + aliceToken // allowed half_plus_two only
	c := http.DefaultClient
	for _, tc := range []struct {
		method, path, body, authz string
		code                      int
	}{
		{"POST", "/v1/models/half_plus_three:predict", `{"instances": [1]}`, "", 401},
		{"POST", "/v1/models/half_plus_three:predict", `{"instances": [1]}`, "Bearer wrong", 401},
		{"POST", "/v1/models/half_plus_three:predict", `{"instances": [1]}`, alice, 403},
		{"GET", "/v1/models/half_plus_three", ``, "", 401},
		{"GET", "/v1/models/half_plus_three/metadata", ``, alice, 403},
		{"POST", "/v2/models/mymodel/infer", `{}`, "", 401},
		{"POST", "/v2/models/mymodel/infer", `{}`, alice, 403},
		{"GET", "/v2/models/mymodel", ``, alice, 403},
		{"GET", "/v2/models/mymodel/ready", ``, "", 401},
		{"GET", "/v2", ``, "", 401},
		{"GET", "/v2", ``, alice, 200},
		{"GET", "/v2/health/live", ``, "", 200},
		{"GET", "/v2/health/ready", ``, "", 200},
		{"POST", "/v1/models/half_plus_two:predict", `{"instances": [1]}`, alice, 200},
		{"GET", "/v2/models/half_plus_two/ready", ``, alice, 200},
	} {
		code, hdr, body := httpDo(t, c, tc.method, e.httpURL+tc.path, tc.body, tc.authz)
		if code != tc.code {
			t.Fatalf("%s %s (%q): %d %s, want %d", tc.method, tc.path, tc.authz, code, body, tc.code)
		}
		if code == 401 && !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
			t.Fatalf("%s %s: 401 without WWW-Authenticate", tc.method, tc.path)
		}
		if code >= 400 && tc.method != "GET" || code == 401 || code == 403 {
			var eb map[string]any
			if err := json.Unmarshal([]byte(body), &eb); err != nil || eb["error"] == nil || len(eb) != 1 {
				t.Fatalf("%s %s: error body %s", tc.method, tc.path, body)
			}
		}
		if strings.Contains(body, aliceToken) {
			t.Fatal("the token is quoted back")
		}
	}
}

// TestRESTApproximate: an approximate reply carries the mark as the gRPC
// APIs do: TF Serving REST the response header Hams-Approximate: true,
// KServe REST the parameter hams_approximate: true; an exact one neither.
func TestRESTApproximate(t *testing.T) {
	e := newApproxEnv(t, nil)
	for _, marked := range []bool{true, false} {
		first := 1.0
		if marked {
			first = approxMarker
		}
		r := e.rest("POST", "/v1/models/echo:predict", nil, fmt.Appendf(nil, `{"instances": [{"images": [%v, 1, 2, 3], "ids": 4}]}`, first))
		if r.code != http.StatusOK {
			t.Fatalf("TF: %d %s", r.code, r.body)
		}
		if got := r.header.Get(HeaderApproximate); (got == "true") != marked {
			t.Fatalf("TF (marked %v): header %q", marked, got)
		}
		r = e.rest("POST", "/v2/models/echo/infer", nil, fmt.Appendf(nil,
			`{"inputs":[{"name":"images","shape":[1,4],"datatype":"FP32","data":[%v,1,2,3]},{"name":"ids","shape":[1],"datatype":"INT64","data":[4]}]}`, first))
		if r.code != http.StatusOK {
			t.Fatalf("KServe: %d %s", r.code, r.body)
		}
		var kr struct {
			Parameters map[string]any `json:"parameters"`
		}
		if err := json.Unmarshal(r.body, &kr); err != nil {
			t.Fatal(err)
		}
		if v, ok := kr.Parameters[ParamApproximate]; ok != marked || (ok && v != true) {
			t.Fatalf("KServe (marked %v): %s", marked, r.body)
		}
	}
}

// TestRESTOutputFormats: TF Serving's JSON writing of several outputs
// (row objects, columnar object), integers, strings and _bytes outputs,
// and its float formatting.
func TestRESTOutputFormats(t *testing.T) {
	strs := &hamsv1.Tensor{Name: "label", Datatype: tensor.Bytes, Shape: []int64{2}, Data: wire.JoinBytes([][]byte{[]byte("a<b"), []byte("c")})}
	raw := &hamsv1.Tensor{Name: "img_bytes", Datatype: tensor.Bytes, Shape: []int64{2}, Data: wire.JoinBytes([][]byte{{0xff, 0}, {1}})}
	f := tensor.FromFloat32("score", []int64{2, 2}, []float32{0.1, 1, 9000000, float32(math.NaN())})
	outs := map[string]*tfpb.TensorProto{}
	for _, x := range []*hamsv1.Tensor{strs, raw, f} {
		tp, err := wire.ToTensorProtoTyped(x)
		if err != nil {
			t.Fatal(err)
		}
		outs[x.Name] = tp
	}
	row, err := tfOutputsJSON(outs, true)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"predictions": [{"img_bytes": {"b64": "/wA="}, "label": "a<b", "score": [0.1, 1.0]}, {"img_bytes": {"b64": "AQ=="}, "label": "c", "score": [9e+06, NaN]}]}` + "\n"
	if string(row) != want {
		t.Fatalf("row:\n got %s\nwant %s", row, want)
	}
	col, err := tfOutputsJSON(outs, false)
	if err != nil {
		t.Fatal(err)
	}
	want = `{"outputs": {"img_bytes": [{"b64": "/wA="}, {"b64": "AQ=="}], "label": ["a<b", "c"], "score": [[0.1, 1.0], [9e+06, NaN]]}}` + "\n"
	if string(col) != want {
		t.Fatalf("columnar:\n got %s\nwant %s", col, want)
	}
	for _, tc := range []struct {
		v    float64
		bits int
		want string
	}{{float64(float32(0.1)), 32, "0.1"}, {0.1, 64, "0.1"}, {float64(float32(0.123456789)), 32, "0.123456791"}, {3, 64, "3.0"}, {1e-5, 64, "1e-05"}, {math.Inf(-1), 32, "-Infinity"}, {100000, 32, "100000.0"}} {
		if got := string(appendTFDecimal(nil, tc.v, tc.bits)); got != tc.want {
			t.Fatalf("%v: %s, want %s", tc.v, got, tc.want)
		}
	}
}

// TestRESTRefserverSamePredictions: the retrofit's Fashion-MNIST
// classifier, a real reference model server behind the fake sidecar,
// answers two images the same through gRPC Predict and ModelInfer and
// through TF Serving REST (row and columnar) and KServe REST (JSON and
// binary), within the low-bit drift of its parallel reductions.
func TestRESTRefserverSamePredictions(t *testing.T) {
	e, _, _ := refserverEnv(t)
	tf, _, ks := e.compatClients()
	ctx := ctxT(t, 20*time.Second)
	img := make([]float32, 2*784)
	for i := range img {
		img[i] = float32(math.Mod(float64(i)*0.013, 1))
	}
	images := tensor.FromFloat32("images", []int64{2, 784}, img)
	tp, _ := wire.ToTensorProto(images)
	g, err := tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: tfSpec("fashion"), Inputs: map[string]*tfpb.TensorProto{"images": tp}})
	if err != nil {
		t.Fatal(err)
	}
	want := tpF32(t, g.GetOutputs()["scores"])
	kg, err := ks.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "fashion", Inputs: []*inference.ModelInferRequest_InferInputTensor{wire.InferInput(images)}, RawInputContents: [][]byte{images.Data}})
	if err != nil {
		t.Fatal(err)
	}
	closeTo(t, "gRPC ModelInfer", ksF32(t, kg, "scores"), want)

	rows, _ := json.Marshal([][]float32{img[:784], img[784:]})
	for _, tc := range []struct{ body, key string }{
		{`{"instances": ` + string(rows) + `}`, "predictions"},
		{`{"signature_name": "serving_default", "inputs": {"images": ` + string(rows) + `}}`, "outputs"},
	} {
		r := e.rest("POST", "/v1/models/fashion:predict", nil, []byte(tc.body))
		if r.code != http.StatusOK {
			t.Fatalf("TF REST %s: %d %s", tc.key, r.code, r.body)
		}
		var got map[string][][]float32
		if err := json.Unmarshal(r.body, &got); err != nil || len(got[tc.key]) != 2 {
			t.Fatalf("TF REST %s: %s: %v", tc.key, r.body, err)
		}
		closeTo(t, "TF REST "+tc.key, append(got[tc.key][0], got[tc.key][1]...), want)
	}
	flat, _ := json.Marshal(img)
	r := e.rest("POST", "/v2/models/fashion/infer", nil, []byte(`{"inputs":[{"name":"images","shape":[2,784],"datatype":"FP32","data":`+string(flat)+`}],"outputs":[{"name":"scores"}]}`))
	var kr struct {
		Outputs []struct {
			Name  string    `json:"name"`
			Shape []int64   `json:"shape"`
			Data  []float32 `json:"data"`
		} `json:"outputs"`
	}
	if err := json.Unmarshal(r.body, &kr); r.code != http.StatusOK || err != nil || len(kr.Outputs) != 1 || !reflect.DeepEqual(kr.Outputs[0].Shape, []int64{2, 10}) {
		t.Fatalf("KServe REST: %d %s %v", r.code, r.body, err)
	}
	closeTo(t, "KServe REST JSON", kr.Outputs[0].Data, want)
	head := `{"inputs":[{"name":"images","shape":[2,784],"datatype":"FP32","parameters":{"binary_data_size":6272}}],"outputs":[{"name":"scores","parameters":{"binary_data":true}}]}`
	r = e.rest("POST", "/v2/models/fashion/infer", map[string]string{headerInferenceHeaderLength: strconv.Itoa(len(head))}, append([]byte(head), images.Data...))
	n, _ := strconv.Atoi(r.header.Get(headerInferenceHeaderLength))
	if r.code != http.StatusOK || n <= 0 || len(r.body)-n != 2*10*4 {
		t.Fatalf("KServe REST binary: %d %q", r.code, r.body)
	}
	got, _ := tensor.Float32(&hamsv1.Tensor{Datatype: tensor.FP32, Shape: []int64{2, 10}, Data: r.body[n:]})
	closeTo(t, "KServe REST binary", got, want)
}

// refserverEnv is the retrofit deployment whose fake sidecar of
// "fashion" calls a real reference model server in-process (as
// TestCompatRefserverSamePredictions sets it up).
func refserverEnv(t *testing.T) (*env, *refserver.Server, *grpc.ClientConn) {
	t.Helper()
	dep, err := config.Parse([]byte(retrofitYAML))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := refserver.New(refserver.Config{Deployment: dep, Models: []string{"fashion"}, GRPCListener: lis, Logger: slog.New(slog.DiscardHandler)})
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
	return e, rs, rcc
}

// TestRESTPassThrough: a pass-through model's REST calls go to its
// backend as the gRPC calls they decode to (model name rewritten, REST
// parameters left out), and its answers come back in REST form.
func TestRESTPassThrough(t *testing.T) {
	e, bt := passEnv(t)
	r := e.rest("GET", "/v1/models/tfm", nil, nil)
	sameJSON(t, "status", r.body, json.RawMessage(`{"model_version_status":[{"version":"1","state":"AVAILABLE","status":{"error_code":"OK","error_message":""}}]}`))
	if c, ok := bt.Last("GetModelStatus"); !ok || c.Req.(*tfapis.GetModelStatusRequest).GetModelSpec().GetName() != "tf_model" {
		t.Fatalf("GetModelStatus reached the backend as %+v", c)
	}
	r = e.rest("GET", "/v1/models/tfm/metadata", nil, nil)
	if r.code != http.StatusOK || !bytes.Contains(r.body, []byte(`"name": "tfm"`)) || !bytes.Contains(r.body, []byte("tensorflow/serving/predict")) {
		t.Fatalf("metadata: %d %s", r.code, r.body)
	}
	// The backend's signature lists no inputs: nothing to type the JSON by.
	r = e.rest("POST", "/v1/models/tfm:predict", nil, []byte(`{"instances": [1.0]}`))
	if r.code != http.StatusBadRequest || !bytes.Contains(r.body, []byte("Failed to get input map for signature: DEFAULT")) {
		t.Fatalf("predict: %d %s", r.code, r.body)
	}
	r = e.rest("POST", "/v2/models/ksm/infer", nil, []byte(`{"id":"7","inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1.5,2]}],"outputs":[{"name":"y","parameters":{"binary_data":false}}]}`))
	if r.code != http.StatusOK {
		t.Fatalf("infer: %d %s", r.code, r.body)
	}
	sameJSON(t, "infer", r.body, json.RawMessage(`{"model_name":"ksm","model_version":"1","id":"7","outputs":[{"name":"y","datatype":"FP32","shape":[1,2],"data":[1.5,2]}]}`))
	c, ok := bt.Last("ModelInfer")
	req, _ := c.Req.(*inference.ModelInferRequest)
	if !ok || req.GetModelName() != "ks_model" || req.GetModelVersion() != "3" || len(req.GetOutputs()) != 1 || req.GetOutputs()[0].GetParameters() != nil {
		t.Fatalf("ModelInfer reached the backend as %+v", c)
	}
	if r := e.rest("GET", "/v2/models/ksm/ready", nil, nil); r.code != http.StatusOK {
		t.Fatalf("ready: %d %s", r.code, r.body)
	}
}
