package frontend

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func (e *env) do(method, path, body string) (int, []byte) {
	e.t.Helper()
	req, err := http.NewRequestWithContext(ctxT(e.t, 10*time.Second), method, e.httpURL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

const goodEchoJSON = `{"request_id":"%s","inputs":[
 {"name":"images","datatype":"FP32","shape":[2,4],"data":[0,0.5,1,1.5,2,2.5,3,3.5]},
 {"name":"ids","datatype":"INT64","shape":[2],"data":[7,-9007199254740993]}]}`

// mustHTTPEcho posts a good request and checks the JSON reply.
func (e *env) mustHTTPEcho(requestID string) jsonPredictResponse {
	e.t.Helper()
	code, b := e.do("POST", "/v1/services/echo:predict", fmt.Sprintf(goodEchoJSON, requestID))
	if code != http.StatusOK {
		e.t.Fatalf("good HTTP request: %d %s", code, b)
	}
	var r jsonPredictResponse
	if err := json.Unmarshal(b, &r); err != nil {
		e.t.Fatalf("reply %s: %v", b, err)
	}
	if r.Service != "echo" || r.RequestID != requestID || len(r.Outputs) != 1 || r.Outputs[0].Model != "a" || len(r.Outputs[0].Tensors) != 2 {
		e.t.Fatalf("reply %s", b)
	}
	img, ids := r.Outputs[0].Tensors[0], r.Outputs[0].Tensors[1]
	if img.Name != "images" || img.Datatype != "FP32" || fmt.Sprint(img.Shape) != "[2 4]" || rawJoin(img.Data) != "0,0.5,1,1.5,2,2.5,3,3.5" {
		e.t.Fatalf("images %+v", img)
	}
	if ids.Name != "ids" || rawJoin(ids.Data) != "7,-9007199254740993" {
		e.t.Fatalf("ids %+v", ids)
	}
	if len(r.Lineage) != 1 || r.Lineage[0].Model != "a" || r.Lineage[0].PredModel != "frontend" || r.Lineage[0].OutputDigest == "" {
		e.t.Fatalf("lineage %+v", r.Lineage)
	}
	return r
}

// rawJoin is the array's elements as compact JSON text without brackets.
func rawJoin(d json.RawMessage) string { return strings.Trim(string(d), "[]") }

func TestHTTPPredictAndIdempotency(t *testing.T) {
	e := newEnv(t, "5s")
	r1 := e.mustHTTPEcho("h1")
	r2 := e.mustHTTPEcho("h1")
	if r1.ReqID != r2.ReqID {
		t.Fatalf("HTTP retry executed again: %d vs %d", r1.ReqID, r2.ReqID)
	}
	if n := e.models["a"].executed.Load(); n != 1 {
		t.Fatalf("executed %d times", n)
	}
	// Fan-out over HTTP, with BOOL and non-finite floats.
	code, b := e.do("POST", "/v1/services/fan:predict", `{"inputs":[
	  {"name":"f","datatype":"FP64","shape":[3],"data":[1e300,"NaN","-Inf"]},
	  {"name":"b","datatype":"BOOL","shape":[1,2],"data":[true,false]}]}`)
	if code != http.StatusOK {
		t.Fatalf("fan: %d %s", code, b)
	}
	var r jsonPredictResponse
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Outputs) != 3 || r.Outputs[0].Model != "q" || r.Outputs[2].Model != "y" || len(r.Lineage) != 4 {
		t.Fatalf("fan reply %s", b)
	}
	if got := rawJoin(r.Outputs[1].Tensors[0].Data); got != `1e+300,"NaN","-Inf"` {
		t.Fatalf("FP64 data %s", got)
	}
	if got := rawJoin(r.Outputs[1].Tensors[1].Data); got != "true,false" {
		t.Fatalf("BOOL data %s", got)
	}
}

func TestHTTPListHealthMetrics(t *testing.T) {
	e := newEnv(t, "5s")
	code, b := e.do("GET", "/v1/services", "")
	var list struct{ Services []jsonService }
	if code != 200 || json.Unmarshal(b, &list) != nil || len(list.Services) != 2 || list.Services[0].Inputs[0].Name != "images" ||
		fmt.Sprint(list.Services[1].SinkModels) != "[q x y]" {
		t.Fatalf("list: %d %s", code, b)
	}
	if code, b := e.do("GET", "/healthz", ""); code != 200 {
		t.Fatalf("healthz: %d %s", code, b)
	}
	addr, _, _ := e.res.Resolve("q")
	e.res.set("q", "")
	if code, b := e.do("GET", "/healthz", ""); code != 503 || !strings.Contains(string(b), `"q"`) {
		t.Fatalf("healthz with q unresolved: %d %s", code, b)
	}
	code, b = e.do("POST", "/v1/services/fan:predict", `{"inputs":[{"name":"v","datatype":"INT32","shape":[1],"data":[1]}]}`)
	assertHTTPError(t, code, b, 503, codes.Unavailable, `"q"`)
	e.res.set("q", addr)
	if code, _ := e.do("GET", "/healthz", ""); code != 200 {
		t.Fatalf("healthz after q is back: %d", code)
	}
	e.mustHTTPEcho("")
	_, _ = e.do("POST", "/v1/services/nope:predict", `{}`)
	code, b = e.do("GET", "/metrics", "")
	text := string(b)
	for _, want := range []string{
		`hams_frontend_requests_total{code="OK",service="echo"} 1`,
		`hams_frontend_requests_total{code="NotFound",service="_unknown"} 1`,
		`hams_frontend_requests_total{code="Unavailable",service="fan"} 1`,
		`hams_frontend_request_duration_seconds_count{service="echo"} 1`,
		`hams_frontend_in_flight_requests 0`,
		`grpc_server_started_total`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if code != 200 || t.Failed() {
		t.Fatalf("metrics: %d\n%s", code, text)
	}
}

func assertHTTPError(t *testing.T, code int, body []byte, wantHTTP int, wantCode codes.Code, msg ...string) {
	t.Helper()
	var je jsonError
	if err := json.Unmarshal(body, &je); err != nil {
		t.Fatalf("error body %q is not JSON: %v", body, err)
	}
	if code != wantHTTP || je.Code != wantCode.String() || !msgHas(je.Error, msg...) {
		t.Fatalf("got %d %+v; want %d %v naming %q", code, je, wantHTTP, wantCode, msg)
	}
}

func TestHTTPBadInputs(t *testing.T) {
	e := newEnv(t, "5s")
	big := `{"inputs":[{"name":"huge","datatype":"FP64","shape":[20000],"data":[` + strings.TrimSuffix(strings.Repeat("0,", 20000), ",") + `]}]}`
	tooLong := `{"inputs":[{"name":"v","datatype":"FP32","shape":[1],"data":[` + strings.Repeat(" ", 70000) + `1]}]}`
	cases := []struct {
		name, path, body string
		http             int
		code             codes.Code
		msg              []string
	}{
		{"unknown service", "/v1/services/nope:predict", `{"inputs":[]}`, 404, codes.NotFound, []string{`"nope"`}},
		{"no verb", "/v1/services/echo", `{}`, 404, codes.NotFound, []string{":predict"}},
		{"malformed JSON", "/v1/services/echo:predict", `{"inputs":[`, 400, codes.InvalidArgument, []string{"malformed JSON"}},
		{"trailing data", "/v1/services/echo:predict", fmt.Sprintf(goodEchoJSON, "") + `{}`, 400, codes.InvalidArgument, []string{"trailing"}},
		{"element count", "/v1/services/echo:predict", `{"inputs":[{"name":"images","datatype":"FP32","shape":[1,4],"data":[1,2,3]},{"name":"ids","datatype":"INT64","shape":[1],"data":[1]}]}`,
			400, codes.InvalidArgument, []string{`"images"`, "4 elements"}},
		{"bad number", "/v1/services/echo:predict", `{"inputs":[{"name":"images","datatype":"FP32","shape":[1,4],"data":[1,2,true,4]},{"name":"ids","datatype":"INT64","shape":[1],"data":[1]}]}`,
			400, codes.InvalidArgument, []string{`"images"`, "element 2"}},
		{"int overflow", "/v1/services/fan:predict", `{"inputs":[{"name":"small","datatype":"INT8","shape":[1],"data":[300]}]}`,
			400, codes.InvalidArgument, []string{`"small"`, "INT8"}},
		{"unsupported datatype", "/v1/services/fan:predict", `{"inputs":[{"name":"s","datatype":"BYTES","shape":[1],"data":["x"]}]}`,
			400, codes.InvalidArgument, []string{`"s"`, "BYTES"}},
		{"wrong datatype", "/v1/services/echo:predict", `{"inputs":[{"name":"images","datatype":"FP64","shape":[1,4],"data":[1,2,3,4]},{"name":"ids","datatype":"INT64","shape":[1],"data":[1]}]}`,
			400, codes.InvalidArgument, []string{`"images"`, "FP64"}},
		{"wrong shape", "/v1/services/echo:predict", `{"inputs":[{"name":"images","datatype":"FP32","shape":[2,2],"data":[1,2,3,4]},{"name":"ids","datatype":"INT64","shape":[1],"data":[1]}]}`,
			400, codes.InvalidArgument, []string{`"images"`, "dimension 1"}},
		{"missing input", "/v1/services/echo:predict", `{"inputs":[{"name":"images","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}`,
			400, codes.InvalidArgument, []string{`"ids"`}},
		{"unknown input", "/v1/services/echo:predict", `{"inputs":[{"name":"images","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]},{"name":"ids","datatype":"INT64","shape":[1],"data":[1]},{"name":"extra","datatype":"INT64","shape":[1],"data":[1]}]}`,
			400, codes.InvalidArgument, []string{`"extra"`}},
		{"body over the cap", "/v1/services/fan:predict", tooLong, 413, codes.ResourceExhausted, []string{"65536 bytes"}},
		{"tensors over the cap", "/v1/services/fan:predict", big, 413, codes.ResourceExhausted, []string{`"huge"`, "65536 bytes"}},
		{"model error", "/v1/services/echo:predict", strings.Replace(fmt.Sprintf(goodEchoJSON, ""), `"request_id":""`, `"stream_id":"fail:a"`, 1),
			400, codes.InvalidArgument, []string{"model a", "images"}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, b := e.do("POST", c.path, c.body)
			assertHTTPError(t, code, b, c.http, c.code, c.msg...)
			e.mustHTTPEcho(fmt.Sprintf("after-%d", i))
		})
	}
	if code, _ := e.do("GET", "/v1/services/echo:predict", ""); code != http.StatusMethodNotAllowed {
		t.Fatalf("GET on predict: %d", code)
	}
}

func TestHTTPDeadline(t *testing.T) {
	e := newEnv(t, "200ms")
	body := strings.Replace(fmt.Sprintf(goodEchoJSON, ""), `"request_id":""`, `"stream_id":"drop:a"`, 1)
	code, b := e.do("POST", "/v1/services/echo:predict", body)
	assertHTTPError(t, code, b, 504, codes.DeadlineExceeded, "deadline")
	eventually(t, "expired request leaves the table", func() bool { return e.pending() == 0 })
	e.mustHTTPEcho("after")
}

func TestHTTPJSONRoundTripTypes(t *testing.T) {
	// Every JSON-capable datatype survives decode -> encode unchanged.
	for _, c := range []struct{ dt, data string }{
		{"BOOL", "true,false"}, {"UINT8", "0,255"}, {"INT8", "-128,127"}, {"INT16", "-32768,32767"},
		{"UINT16", "0,65535"}, {"INT32", "-2147483648,2147483647"}, {"UINT32", "0,4294967295"},
		{"INT64", "-9223372036854775808,9223372036854775807"}, {"UINT64", "0,18446744073709551615"},
		{"FP32", `0.1,"Inf"`}, {"FP64", `0.1,-2.5e-300`},
	} {
		var jt jsonTensor
		if err := json.Unmarshal([]byte(`{"name":"t","datatype":"`+c.dt+`","shape":[2],"data":[`+c.data+`]}`), &jt); err != nil {
			t.Fatal(err)
		}
		raw, err := decodeTensor(jt, 1<<20)
		if err != nil {
			t.Fatalf("%s: decode: %v", c.dt, err)
		}
		if err := tensor.Validate(raw); err != nil {
			t.Fatalf("%s: %v", c.dt, err)
		}
		back, err := encodeTensor(raw)
		if err != nil || rawJoin(back.Data) != c.data {
			t.Fatalf("%s: round trip %q, want %q (%v)", c.dt, rawJoin(back.Data), c.data, err)
		}
	}
	if _, err := encodeTensor(&hamsv1.Tensor{Name: "h", Datatype: "FP16", Shape: []int64{1}, Data: []byte{0, 0}}); err == nil {
		t.Fatal("FP16 output should not encode")
	}
}

func TestHTTPJSONDecodeEdgeCases(t *testing.T) {
	dec := func(s string, room int) (*hamsv1.Tensor, error) {
		var jt jsonTensor
		if err := json.Unmarshal([]byte(s), &jt); err != nil {
			t.Fatal(err)
		}
		return decodeTensor(jt, room)
	}
	// Nested arrays are flattened row-major.
	tt, err := dec(`{"name":"m","datatype":"INT32","shape":[2,2],"data":[[1, 2], [3,4]]}`, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	back, _ := encodeTensor(tt)
	if rawJoin(back.Data) != "1,2,3,4" {
		t.Fatalf("nested: %s", back.Data)
	}
	for _, c := range []struct{ body, want string }{
		{`{"name":"o","datatype":"FP32","shape":[1],"data":[{"a":1}]}`, "numbers or booleans"},
		{`{"name":"o","datatype":"FP32","shape":[1],"data":7}`, "must be an array"},
		{`{"name":"o","datatype":"FP32","shape":[1],"data":["x,y"]}`, "not a number"},
		{`{"name":"o","datatype":"FP32","shape":[2],"data":["a\"b", 1]}`, "element 0"},
		{`{"name":"o","datatype":"BOOL","shape":[1],"data":[2]}`, "not a boolean"},
		{`{"name":"o","datatype":"FP32","shape":[-1],"data":[]}`, "dimension 0"},
	} {
		if _, err := dec(c.body, 1<<20); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.body, err, c.want)
		}
	}
	// The cap is checked from the element count, before any allocation.
	if _, err := dec(`{"name":"big","datatype":"FP64","shape":[3],"data":[1,2,3]}`, 23); !errors.Is(err, errTooLarge) {
		t.Fatalf("cap: %v", err)
	}
}
