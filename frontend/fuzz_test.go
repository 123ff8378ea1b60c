package frontend

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/protos/inference"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// fuzzMaxBytes is the message limit the HTTP fuzz target decodes under.
const fuzzMaxBytes = 1 << 16

// FuzzHTTPPredictJSON decodes an HTTP JSON predict body as the frontend
// does: no panic; an error is InvalidArgument or ResourceExhausted; the
// tensors decoded are valid, within the message limit and at most 8 bytes
// per body byte (no allocation from a declared shape alone); and they
// round-trip through the JSON the frontend answers with
// (decode(encode(x)) == x, NaN and ±Inf included).
func FuzzHTTPPredictJSON(f *testing.F) {
	for _, s := range []string{
		`{"inputs":[{"name":"x","datatype":"FP32","shape":[2,2],"data":[1,-2.5,"NaN","-Inf"]}]}`,
		`{"request_id":"r","stream_id":"s","inputs":[{"name":"i","datatype":"INT64","shape":[3],"data":[[1],[2],[-9007199254740993]]}]}`,
		`{"inputs":[{"name":"b","datatype":"BOOL","shape":[2],"data":[true,0]},{"name":"u","datatype":"UINT8","shape":[1],"data":[255]}]}`,
		`{"inputs":[{"name":"d","datatype":"FP64","shape":[],"data":[1e308]}]}`,
		`{"inputs":[{"name":"big","datatype":"FP32","shape":[1099511627776],"data":[1]}]}`,
		`{"inputs":[{"name":"q","datatype":"BYTES","shape":[1],"data":["a"]}]}`,
		`{"inputs":[]} trailing`,
	} {
		f.Add([]byte(s))
	}
	api := &httpAPI{maxBytes: fuzzMaxBytes, maxDecoded: fuzzMaxBytes}
	decode := func(t *testing.T, body []byte) (*httptest.ResponseRecorder, error) {
		r := httptest.NewRequest(http.MethodPost, "/v1/services/s:predict", bytes.NewReader(body))
		w := httptest.NewRecorder()
		req, err := api.decodePredict(w, r, "s")
		if err != nil {
			return w, err
		}
		total := 0
		for _, in := range req.GetInputs() {
			if err := tensor.Validate(in); err != nil {
				t.Fatalf("decoded an invalid tensor %q: %v", in.GetName(), err)
			}
			total += len(in.GetData())
		}
		if total > fuzzMaxBytes || total > 8*len(body) {
			t.Fatalf("decoded %d bytes from a body of %d (limit %d)", total, len(body), fuzzMaxBytes)
		}
		// decode(encode(x)) == x
		jr := jsonPredictRequest{RequestID: req.GetRequestId(), StreamID: req.GetStreamId()}
		for _, in := range req.GetInputs() {
			jt, err := encodeTensor(in)
			if err != nil {
				t.Fatalf("encode of decoded tensor %q: %v", in.GetName(), err)
			}
			jr.Inputs = append(jr.Inputs, jt)
		}
		again, err := json.Marshal(jr)
		if err != nil {
			t.Fatal(err)
		}
		req2, err := api.decodePredict(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(again)), "s")
		if err != nil {
			t.Fatalf("decode(encode(x)): %v\n%s", err, again)
		}
		if len(req2.GetInputs()) != len(req.GetInputs()) || req2.GetRequestId() != req.GetRequestId() || req2.GetStreamId() != req.GetStreamId() {
			t.Fatalf("decode(encode(x)) = %v, want %v", req2, req)
		}
		for i, in := range req.GetInputs() {
			b := req2.GetInputs()[i]
			if b.GetName() != in.GetName() || b.GetDatatype() != in.GetDatatype() || !bytes.Equal(b.GetData(), in.GetData()) || len(b.GetShape()) != len(in.GetShape()) {
				t.Fatalf("decode(encode(x)) input %d = %v, want %v", i, b, in)
			}
		}
		return w, nil
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) > 2*fuzzMaxBytes {
			return
		}
		_, err := decode(t, body)
		if err == nil {
			return
		}
		st, ok := status.FromError(err)
		if !ok || (st.Code() != codes.InvalidArgument && st.Code() != codes.ResourceExhausted) {
			t.Fatalf("error %v is not InvalidArgument or ResourceExhausted", err)
		}
	})
}

// FuzzPassRaw walks arbitrary request and answer bytes as the raw
// pass-through does, for every route: no panic; an error wraps
// errRawMessage; a request rewritten for the backend is well-formed,
// names the backend's model at every place the client's named one, and
// keeps every other field; an answer rewritten for the client is
// well-formed.
func FuzzPassRaw(f *testing.F) {
	spec := func(name string) []byte {
		b, _ := proto.Marshal(&tfapis.ModelSpec{Name: name, SignatureName: "sig"})
		return b
	}
	msg := func(num protowire.Number, payload []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), payload)
	}
	ks, _ := proto.Marshal(&inference.ModelInferRequest{ModelName: "m", ModelVersion: "", Id: "x"})
	for _, seed := range [][]byte{
		msg(1, spec("m")),                             // Classify / Regress
		msg(1, msg(1, spec("m"))),                     // MultiInference
		append(msg(1, msg(1, spec("m"))), 0x10, 0x01), // plus a varint field
		ks,                         // KServe
		{0x0a, 0x7f},               // truncated
		msg(1, []byte{0x0a, 0x7f}), // a nested message truncated
	} {
		for r := range byte(6) {
			f.Add(r, seed)
		}
	}
	routes := make([]rawRoute, 0, len(rawRoutes))
	for _, m := range []string{"/tensorflow.serving.PredictionService/Classify", "/tensorflow.serving.PredictionService/Regress",
		"/tensorflow.serving.PredictionService/MultiInference", "/inference.GRPCInferenceService/ModelConfig",
		"/inference.GRPCInferenceService/ModelStatistics", "/inference.GRPCInferenceService/ModelStreamInfer"} {
		routes = append(routes, rawRoutes[m])
	}
	p := &passThrough{model: "m", backend: config.Backend{Model: "backend-m", Version: "3", Signature: "sig"}}
	f.Fuzz(func(t *testing.T, ri byte, b []byte) {
		r := routes[int(ri)%len(routes)]
		clean := func(what string, err error) {
			t.Helper()
			if err != nil && !errors.Is(err, errRawMessage) {
				t.Fatalf("%s: error %v does not wrap errRawMessage", what, err)
			}
		}
		names, err := r.requestNames(b)
		clean("requestNames", err)
		if err == nil {
			out, err := r.toBackend(b, p)
			clean("toBackend", err)
			if err == nil {
				if _, err := rawFields(out); err != nil {
					t.Fatalf("toBackend made a malformed message: %v", err)
				}
				got, err := r.requestNames(out)
				if err != nil || len(got) != len(names) {
					t.Fatalf("names after toBackend: %v %v, before %v", got, err, names)
				}
				for _, n := range got {
					if n != p.backend.Model {
						t.Fatalf("toBackend left model name %q", n)
					}
				}
			}
		}
		// The same bytes as an answer.
		out, err := r.toClient(b, p, "client-m")
		clean("toClient", err)
		if err == nil {
			if _, err := rawFields(out); err != nil && len(r.respPath) > 0 {
				t.Fatalf("toClient made a malformed message: %v", err)
			}
		}
	})
}
