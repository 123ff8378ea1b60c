package frontend

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
)

// KServe v2 HTTP/REST (the open inference protocol), answered as Triton's
// HTTP server answers:
//
//	GET  /v2/health/live                          200, or 400 (ServerLive)
//	GET  /v2/health/ready                         200, or 400 (ServerReady)
//	GET  /v2                                      server metadata
//	GET  /v2/models/NAME[/versions/V]             model metadata
//	GET  /v2/models/NAME[/versions/V]/ready       200, or 400 (ModelReady)
//	POST /v2/models/NAME[/versions/V]/infer       ModelInfer
//
// An infer body is {"id", "parameters", "inputs": [{"name", "shape",
// "datatype", "parameters", "data"}], "outputs": [{"name",
// "parameters"}]}; data is flat or nested in row-major order (BYTES
// elements are strings). The binary tensor data extension: with the
// header Inference-Header-Content-Length: N the first N bytes of the body
// are the JSON and the rest the inputs whose parameter binary_data_size
// gives their byte size, in order (BYTES elements with 4-byte
// little-endian lengths); an output whose parameter binary_data is true,
// or every output when the request parameter binary_data_output is, is
// answered after the JSON with its binary_data_size, the reply's
// Inference-Header-Content-Length giving the JSON's length (FP16 and BF16
// outputs, which JSON cannot carry, always so). An approximate reply
// carries the parameter hams_approximate = true, as over gRPC. Errors are
// {"error": "..."}; Triton's unknown-model message.

// Binary tensor data extension names (Triton's HTTP protocol).
const (
	headerInferenceHeaderLength = "Inference-Header-Content-Length"
	paramBinaryDataSize         = "binary_data_size"
	paramBinaryData             = "binary_data"
	paramBinaryDataOutput       = "binary_data_output"
	extBinaryTensorData         = "binary_tensor_data"
)

// ksRESTMaxDepth bounds the nesting of a KServe JSON tensor.
const ksRESTMaxDepth = 64

func (a *httpAPI) kserveRESTRoutes(mux *http.ServeMux) {
	model := func(r *http.Request) (string, bool) { return r.PathValue("name"), true }
	none := func(*http.Request) (string, bool) { return "", false }
	mux.HandleFunc("GET /v2/health/live", a.handleKSLive)
	mux.HandleFunc("GET /v2/health/ready", a.handleKSReady)
	mux.HandleFunc("GET /v2", a.restAuth(dialectKServe, a.handleKSServerMetadata, none))
	mux.HandleFunc("GET /v2/{$}", a.restAuth(dialectKServe, a.handleKSServerMetadata, none))
	for _, base := range []string{"/v2/models/{name}", "/v2/models/{name}/versions/{version}"} {
		mux.HandleFunc("GET "+base, a.restAuth(dialectKServe, a.handleKSModelMetadata, model))
		mux.HandleFunc("GET "+base+"/ready", a.restAuth(dialectKServe, a.handleKSModelReady, model))
		mux.HandleFunc("POST "+base+"/infer", a.restAuth(dialectKServe, a.handleKSInfer, model))
	}
}

// boolStatus answers a health boolean as Triton does: 200 or 400, no
// body.
func boolStatus(w http.ResponseWriter, ok bool) {
	code := http.StatusOK
	if !ok {
		code = http.StatusBadRequest
	}
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(code)
}

func (a *httpAPI) handleKSLive(w http.ResponseWriter, r *http.Request) {
	resp, err := a.kserve.ServerLive(r.Context(), &inference.ServerLiveRequest{})
	boolStatus(w, err == nil && resp.GetLive())
}

func (a *httpAPI) handleKSReady(w http.ResponseWriter, r *http.Request) {
	resp, err := a.kserve.ServerReady(r.Context(), &inference.ServerReadyRequest{})
	boolStatus(w, err == nil && resp.GetReady())
}

func (a *httpAPI) handleKSModelReady(w http.ResponseWriter, r *http.Request) {
	ctx, _ := inProcess(r.Context(), inference.GRPCInferenceService_ModelReady_FullMethodName)
	resp, err := a.kserve.ModelReady(ctx, &inference.ModelReadyRequest{Name: r.PathValue("name"), Version: r.PathValue("version")})
	if err != nil && status.Code(err) != codes.NotFound {
		a.writeRESTError(w, r, dialectKServe, err)
		return
	}
	boolStatus(w, err == nil && resp.GetReady())
}

// ksServerMetadataJSON is the server metadata response.
type ksServerMetadataJSON struct {
	Name       string   `json:"name"`
	Version    string   `json:"version"`
	Extensions []string `json:"extensions"`
}

func (a *httpAPI) handleKSServerMetadata(w http.ResponseWriter, r *http.Request) {
	resp, err := a.kserve.ServerMetadata(r.Context(), &inference.ServerMetadataRequest{})
	if err != nil {
		a.writeRESTError(w, r, dialectKServe, err)
		return
	}
	ext := append([]string{}, resp.GetExtensions()...)
	if !slices.Contains(ext, extBinaryTensorData) {
		ext = append(ext, extBinaryTensorData)
	}
	writeRESTJSON(w, http.StatusOK, ksServerMetadataJSON{Name: resp.GetName(), Version: resp.GetVersion(), Extensions: ext})
}

// ksTensorMetaJSON and ksModelMetadataJSON are the model metadata
// response.
type ksTensorMetaJSON struct {
	Name     string  `json:"name"`
	Datatype string  `json:"datatype"`
	Shape    []int64 `json:"shape"`
}

type ksModelMetadataJSON struct {
	Name     string             `json:"name"`
	Versions []string           `json:"versions,omitempty"`
	Platform string             `json:"platform"`
	Inputs   []ksTensorMetaJSON `json:"inputs"`
	Outputs  []ksTensorMetaJSON `json:"outputs"`
}

// ksUnknown checks the model (and version) a call names as Triton does
// before anything else: "Request for unknown model". A pass-through
// model is its backend's to answer.
func (a *httpAPI) ksUnknown(name, version string) error {
	if a.fe.passFor(name) != nil {
		return nil
	}
	svc, err := a.fe.modelService(name)
	if err != nil {
		if status.Code(err) == codes.NotFound {
			return status.Errorf(codes.NotFound, "Request for unknown model: '%s' is not found", name)
		}
		return err
	}
	if svc.kserveVersion(name, version) != nil {
		return status.Errorf(codes.NotFound, "Request for unknown model: '%s' version %s is not found", name, version)
	}
	return nil
}

func (a *httpAPI) handleKSModelMetadata(w http.ResponseWriter, r *http.Request) {
	name, version := r.PathValue("name"), r.PathValue("version")
	if err := a.ksUnknown(name, version); err != nil {
		a.writeRESTError(w, r, dialectKServe, err)
		return
	}
	ctx, _ := inProcess(r.Context(), inference.GRPCInferenceService_ModelMetadata_FullMethodName)
	resp, err := a.kserve.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: name, Version: version})
	if err != nil {
		a.writeRESTError(w, r, dialectKServe, err)
		return
	}
	out := ksModelMetadataJSON{Name: resp.GetName(), Versions: resp.GetVersions(), Platform: resp.GetPlatform(),
		Inputs: []ksTensorMetaJSON{}, Outputs: []ksTensorMetaJSON{}}
	for _, t := range resp.GetInputs() {
		out.Inputs = append(out.Inputs, ksTensorMetaJSON{Name: t.GetName(), Datatype: t.GetDatatype(), Shape: nonNil(t.GetShape())})
	}
	for _, t := range resp.GetOutputs() {
		out.Outputs = append(out.Outputs, ksTensorMetaJSON{Name: t.GetName(), Datatype: t.GetDatatype(), Shape: nonNil(t.GetShape())})
	}
	writeRESTJSON(w, http.StatusOK, out)
}

func nonNil(s []int64) []int64 {
	if s == nil {
		return []int64{}
	}
	return s
}

// ksInferRequestJSON is an infer request's JSON; tensor data and
// parameters stay raw until their types are known.
type ksInferRequestJSON struct {
	ID         string                     `json:"id"`
	Parameters map[string]json.RawMessage `json:"parameters"`
	Inputs     []ksInputJSON              `json:"inputs"`
	Outputs    []ksOutputRequestJSON      `json:"outputs"`
}

type ksInputJSON struct {
	Name       string                     `json:"name"`
	Shape      []int64                    `json:"shape"`
	Datatype   string                     `json:"datatype"`
	Parameters map[string]json.RawMessage `json:"parameters"`
	Data       json.RawMessage            `json:"data"`
}

type ksOutputRequestJSON struct {
	Name       string                     `json:"name"`
	Parameters map[string]json.RawMessage `json:"parameters"`
}

// ksDecoded is a decoded infer request: the ModelInferRequest (every
// input's data in raw_input_contents) and how each output is answered.
type ksDecoded struct {
	req *inference.ModelInferRequest
	// binaryAll: binary_data_output; binary: per requested output.
	binaryAll bool
	binary    map[string]bool
}

// decodeKServeInfer decodes an infer body: jsonLen < 0 means all JSON,
// else the first jsonLen bytes are JSON and the rest binary tensor data.
// Decoded tensor data takes at most room bytes (wire.ErrTooLarge beyond),
// checked before it is allocated.
func decodeKServeInfer(body []byte, jsonLen int64, room int64) (*ksDecoded, error) {
	js, bin := body, []byte(nil)
	if jsonLen >= 0 {
		if jsonLen > int64(len(body)) {
			return nil, status.Errorf(codes.InvalidArgument, "%s %d is larger than the request body (%d bytes)", headerInferenceHeaderLength, jsonLen, len(body))
		}
		js, bin = body[:jsonLen], body[jsonLen:]
	}
	var jr ksInferRequestJSON
	if err := json.Unmarshal(js, &jr); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "failed to parse the request JSON buffer: %v", err)
	}
	out := &ksDecoded{req: &inference.ModelInferRequest{Id: jr.ID}, binary: map[string]bool{}}
	params, err := ksParams(jr.Parameters, "request")
	if err != nil {
		return nil, err
	}
	if p, ok := params[paramBinaryDataOutput]; ok {
		b, isBool := p.GetParameterChoice().(*inference.InferParameter_BoolParam)
		if !isBool {
			return nil, status.Errorf(codes.InvalidArgument, "parameter '%s' must be a boolean", paramBinaryDataOutput)
		}
		out.binaryAll = b.BoolParam
		delete(params, paramBinaryDataOutput)
	}
	if len(params) > 0 {
		out.req.Parameters = params
	}
	if len(jr.Inputs) == 0 {
		return nil, status.Error(codes.InvalidArgument, "request JSON has no 'inputs'")
	}
	for i, in := range jr.Inputs {
		if in.Name == "" {
			return nil, status.Errorf(codes.InvalidArgument, "input %d has no 'name'", i)
		}
		if !slices.Contains(wire.Datatypes, in.Datatype) {
			return nil, status.Errorf(codes.InvalidArgument, "input '%s': invalid datatype '%s'", in.Name, in.Datatype)
		}
		if in.Shape == nil {
			return nil, status.Errorf(codes.InvalidArgument, "input '%s' has no 'shape'", in.Name)
		}
		n, err := tensor.NumElements(in.Shape)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "input '%s': shape %v: %v", in.Name, in.Shape, err)
		}
		ps, err := ksParams(in.Parameters, "input '"+in.Name+"'")
		if err != nil {
			return nil, err
		}
		var data []byte
		if p, ok := ps[paramBinaryDataSize]; ok {
			size, isInt := p.GetParameterChoice().(*inference.InferParameter_Int64Param)
			if !isInt || size.Int64Param < 0 {
				return nil, status.Errorf(codes.InvalidArgument, "input '%s': parameter '%s' must be a non-negative integer", in.Name, paramBinaryDataSize)
			}
			delete(ps, paramBinaryDataSize)
			if len(in.Data) > 0 {
				return nil, status.Errorf(codes.InvalidArgument, "input '%s' has both 'data' and binary data (parameter '%s')", in.Name, paramBinaryDataSize)
			}
			if size.Int64Param > int64(len(bin)) {
				return nil, status.Errorf(codes.InvalidArgument, "unexpected additional input data for input '%s': %d bytes of binary data wanted, %d left", in.Name, size.Int64Param, len(bin))
			}
			if err := take(&room, size.Int64Param); err != nil {
				return nil, fmt.Errorf("input '%s': %w", in.Name, err)
			}
			data, bin = bin[:size.Int64Param], bin[size.Int64Param:]
		} else if _, shm := ps[wire.ParamShmRegion]; !shm {
			if len(in.Data) == 0 {
				return nil, status.Errorf(codes.InvalidArgument, "input '%s' has no 'data' (and no binary data)", in.Name)
			}
			if data, err = ksData(in.Name, in.Datatype, n, in.Data, &room); err != nil {
				return nil, err
			}
		}
		if len(ps) == 0 {
			ps = nil
		}
		out.req.Inputs = append(out.req.Inputs, &inference.ModelInferRequest_InferInputTensor{Name: in.Name, Datatype: in.Datatype, Shape: in.Shape, Parameters: ps})
		if data == nil {
			data = []byte{}
		}
		out.req.RawInputContents = append(out.req.RawInputContents, data)
	}
	if len(bin) > 0 {
		return nil, status.Errorf(codes.InvalidArgument, "unexpected additional input data: %d bytes of binary data belong to no input", len(bin))
	}
	for _, o := range jr.Outputs {
		ps, err := ksParams(o.Parameters, "output '"+o.Name+"'")
		if err != nil {
			return nil, err
		}
		if p, ok := ps[paramBinaryData]; ok {
			b, isBool := p.GetParameterChoice().(*inference.InferParameter_BoolParam)
			if !isBool {
				return nil, status.Errorf(codes.InvalidArgument, "output '%s': parameter '%s' must be a boolean", o.Name, paramBinaryData)
			}
			out.binary[o.Name] = b.BoolParam
			delete(ps, paramBinaryData)
		}
		if len(ps) == 0 {
			ps = nil
		}
		out.req.Outputs = append(out.req.Outputs, &inference.ModelInferRequest_InferRequestedOutputTensor{Name: o.Name, Parameters: ps})
	}
	return out, nil
}

// ksParams decodes a parameters object: booleans, strings, integers
// (int64, or uint64 beyond) and other numbers (double).
func ksParams(raw map[string]json.RawMessage, what string) (map[string]*inference.InferParameter, error) {
	out := make(map[string]*inference.InferParameter, len(raw))
	for k, v := range raw {
		dec := json.NewDecoder(bytes.NewReader(v))
		dec.UseNumber()
		var x any
		if err := dec.Decode(&x); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "%s: parameter '%s': %v", what, k, err)
		}
		p := &inference.InferParameter{}
		switch val := x.(type) {
		case bool:
			p.ParameterChoice = &inference.InferParameter_BoolParam{BoolParam: val}
		case string:
			p.ParameterChoice = &inference.InferParameter_StringParam{StringParam: val}
		case json.Number:
			if i, err := strconv.ParseInt(string(val), 10, 64); err == nil {
				p.ParameterChoice = &inference.InferParameter_Int64Param{Int64Param: i}
			} else if u, err := strconv.ParseUint(string(val), 10, 64); err == nil {
				p.ParameterChoice = &inference.InferParameter_Uint64Param{Uint64Param: u}
			} else if d, err := strconv.ParseFloat(string(val), 64); err == nil {
				p.ParameterChoice = &inference.InferParameter_DoubleParam{DoubleParam: d}
			} else {
				return nil, status.Errorf(codes.InvalidArgument, "%s: parameter '%s': %s is out of range", what, k, val)
			}
		default:
			return nil, status.Errorf(codes.InvalidArgument, "%s: parameter '%s' must be a boolean, a number or a string", what, k)
		}
		out[k] = p
	}
	return out, nil
}

// ksData converts a JSON tensor (flat or nested, row-major) of n elements
// of datatype dt to raw little-endian data (BYTES: 4-byte lengths). The
// fixed-size data is sized from n only after the budget allows it.
func ksData(name, dt string, n int64, raw json.RawMessage, room *int64) ([]byte, error) {
	es := tensor.ElemSize(dt)
	if dt == tensor.FP16 || dt == wire.BF16 {
		return nil, status.Errorf(codes.InvalidArgument, "input '%s': datatype %s cannot be given in JSON; send it as binary data (parameter '%s')", name, dt, paramBinaryDataSize)
	}
	var b []byte
	if es > 0 {
		if n > math.MaxInt64/int64(es) {
			return nil, fmt.Errorf("input '%s': %w", name, wire.ErrTooLarge)
		}
		if err := take(room, n*int64(es)); err != nil {
			return nil, fmt.Errorf("input '%s': %w", name, err)
		}
		b = make([]byte, 0, n*int64(es))
	}
	count := int64(0)
	_, err := walkTensor(raw, walkOpts{maxDepth: ksRESTMaxDepth}, func(v any) error {
		count++
		if count > n {
			return status.Errorf(codes.InvalidArgument, "input '%s': shape wants %d elements, 'data' holds more", name, n)
		}
		var err error
		b, err = ksAppend(b, dt, v, room)
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "input '%s': element %d: %v", name, count-1, err)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, wire.ErrTooLarge) {
			return nil, fmt.Errorf("input '%s': %w", name, err)
		}
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Errorf(codes.InvalidArgument, "input '%s': 'data': %s", name, strings.TrimPrefix(err.Error(), errRESTJSON.Error()+": "))
	}
	if count != n {
		return nil, status.Errorf(codes.InvalidArgument, "input '%s': shape wants %d elements, 'data' holds %d", name, n, count)
	}
	if b == nil {
		b = []byte{}
	}
	return b, nil
}

// ksAppend appends one JSON scalar as an element of datatype dt.
func ksAppend(b []byte, dt string, v any, room *int64) ([]byte, error) {
	bad := func() ([]byte, error) { return nil, fmt.Errorf("%s is not a %s value", jsonText(v), dt) }
	num, isNum := v.(json.Number)
	switch dt {
	case tensor.Bool:
		x, ok := v.(bool)
		if !ok {
			return bad()
		}
		if x {
			return append(b, 1), nil
		}
		return append(b, 0), nil
	case tensor.Int8, tensor.Int16, tensor.Int32, tensor.Int64:
		if !isNum {
			return bad()
		}
		i, err := strconv.ParseInt(string(num), 10, 8*tensor.ElemSize(dt))
		if err != nil {
			return bad()
		}
		return appendLE(b, uint64(i), tensor.ElemSize(dt)), nil
	case tensor.Uint8, wire.Uint16, wire.Uint32, wire.Uint64:
		if !isNum {
			return bad()
		}
		u, err := strconv.ParseUint(string(num), 10, 8*tensor.ElemSize(dt))
		if err != nil {
			return bad()
		}
		return appendLE(b, u, tensor.ElemSize(dt)), nil
	case tensor.FP32, tensor.FP64:
		if !isNum {
			return bad()
		}
		bits := 64
		if dt == tensor.FP32 {
			bits = 32
		}
		x, err := strconv.ParseFloat(string(num), bits)
		if err != nil {
			return bad()
		}
		if bits == 32 {
			return binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(x))), nil
		}
		return binary.LittleEndian.AppendUint64(b, math.Float64bits(x)), nil
	case tensor.Bytes:
		s, ok := v.(string)
		if !ok {
			return bad()
		}
		if err := take(room, int64(4+len(s))); err != nil {
			return nil, err
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
		return append(b, s...), nil
	}
	return bad()
}

func appendLE(b []byte, v uint64, size int) []byte { return wire.AppendLE(b, v, size) }

func (a *httpAPI) handleKSInfer(w http.ResponseWriter, r *http.Request) {
	name, version := r.PathValue("name"), r.PathValue("version")
	if err := a.ksUnknown(name, version); err != nil {
		a.writeRESTError(w, r, dialectKServe, err)
		return
	}
	jsonLen := int64(-1)
	if h := r.Header.Get(headerInferenceHeaderLength); h != "" {
		v, err := strconv.ParseInt(h, 10, 64)
		if err != nil || v < 0 {
			a.writeRESTError(w, r, dialectKServe, status.Errorf(codes.InvalidArgument, "%s header value %q is not a byte count", headerInferenceHeaderLength, h))
			return
		}
		jsonLen = v
	}
	body, release, err := a.readRESTBody(w, r, name)
	if err != nil {
		a.writeRESTError(w, r, dialectKServe, err)
		return
	}
	d, err := decodeKServeInfer(body, jsonLen, int64(a.maxDecoded))
	// The decoded request is admitted again by ModelInfer, as any gRPC
	// request; the body's admission ends here.
	body = nil
	release()
	if err != nil {
		if errors.Is(err, wire.ErrTooLarge) {
			err = status.Errorf(codes.ResourceExhausted, "model '%s': %v: request tensors exceed %d bytes (limits.max_decoded_bytes)", name, strings.TrimSuffix(err.Error(), ": "+wire.ErrTooLarge.Error()), a.maxDecoded)
		}
		a.writeRESTError(w, r, dialectKServe, err)
		return
	}
	d.req.ModelName, d.req.ModelVersion = name, version
	ctx, _ := inProcess(r.Context(), inference.GRPCInferenceService_ModelInfer_FullMethodName)
	resp, err := a.kserve.ModelInfer(ctx, d.req)
	if err != nil {
		a.writeRESTError(w, r, dialectKServe, err)
		return
	}
	out, jsonLenOut, err := ksInferResponseJSON(resp, d)
	if err != nil {
		a.writeRESTError(w, r, dialectKServe, err)
		return
	}
	if jsonLenOut >= 0 {
		w.Header().Set(headerInferenceHeaderLength, strconv.Itoa(jsonLenOut))
		writeRESTBody(w, http.StatusOK, "application/octet-stream", out)
		return
	}
	writeRESTBody(w, http.StatusOK, "application/json", out)
}

// ksOutputMetaJSON is an output's JSON without its data.
type ksOutputMetaJSON struct {
	Name       string         `json:"name"`
	Datatype   string         `json:"datatype"`
	Shape      []int64        `json:"shape"`
	Parameters map[string]any `json:"parameters,omitempty"`
}

type ksInferResponseHeadJSON struct {
	ModelName    string         `json:"model_name"`
	ModelVersion string         `json:"model_version,omitempty"`
	ID           string         `json:"id,omitempty"`
	Parameters   map[string]any `json:"parameters,omitempty"`
}

// paramValue is an InferParameter as a JSON value.
func paramValue(p *inference.InferParameter) any {
	switch v := p.GetParameterChoice().(type) {
	case *inference.InferParameter_BoolParam:
		return v.BoolParam
	case *inference.InferParameter_Int64Param:
		return v.Int64Param
	case *inference.InferParameter_StringParam:
		return v.StringParam
	case *inference.InferParameter_DoubleParam:
		return v.DoubleParam
	case *inference.InferParameter_Uint64Param:
		return v.Uint64Param
	}
	return nil
}

func paramsJSON(ps map[string]*inference.InferParameter) map[string]any {
	if len(ps) == 0 {
		return nil
	}
	out := make(map[string]any, len(ps))
	for k, p := range ps {
		out[k] = paramValue(p)
	}
	return out
}

// marshalJSON encodes v without HTML escaping and without the newline.
func marshalJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

// ksInferResponseJSON writes a ModelInferResponse as Triton's HTTP API
// does. jsonLen is the JSON's length when binary outputs follow it, else
// -1.
func ksInferResponseJSON(resp *inference.ModelInferResponse, d *ksDecoded) (out []byte, jsonLen int, err error) {
	head, err := marshalJSON(ksInferResponseHeadJSON{ModelName: resp.GetModelName(), ModelVersion: resp.GetModelVersion(),
		ID: resp.GetId(), Parameters: paramsJSON(resp.GetParameters())})
	if err != nil {
		return nil, 0, status.Errorf(codes.Internal, "encode the reply: %v", err)
	}
	out = append(head[:len(head)-1], `,"outputs":[`...)
	var bin [][]byte
	hasRaw := len(resp.GetRawOutputContents()) > 0
	for i, o := range resp.GetOutputs() {
		var raw []byte
		if i < len(resp.GetRawOutputContents()) {
			raw = resp.GetRawOutputContents()[i]
		}
		t, err := wire.FromInferOutput(o, raw, hasRaw)
		if err != nil {
			return nil, 0, status.Errorf(codes.Internal, "output '%s': %v", o.GetName(), err)
		}
		asBinary := d.binaryAll
		if b, ok := d.binary[o.GetName()]; ok {
			asBinary = b
		}
		if t.GetDatatype() == tensor.FP16 || t.GetDatatype() == wire.BF16 {
			asBinary = true // JSON cannot carry them
		}
		meta := ksOutputMetaJSON{Name: t.GetName(), Datatype: t.GetDatatype(), Shape: nonNil(t.GetShape()), Parameters: paramsJSON(o.GetParameters())}
		if asBinary {
			if meta.Parameters == nil {
				meta.Parameters = map[string]any{}
			}
			meta.Parameters[paramBinaryDataSize] = len(t.GetData())
			bin = append(bin, t.GetData())
		}
		mb, err := marshalJSON(meta)
		if err != nil {
			return nil, 0, status.Errorf(codes.Internal, "encode output '%s': %v", o.GetName(), err)
		}
		if i > 0 {
			out = append(out, ',')
		}
		if asBinary {
			out = append(out, mb...)
			continue
		}
		out = append(out, mb[:len(mb)-1]...)
		out = append(out, `,"data":`...)
		out = appendKSData(out, t)
		out = append(out, '}')
	}
	out = append(out, "]}"...)
	if len(bin) == 0 {
		return append(out, '\n'), -1, nil
	}
	jsonLen = len(out)
	for _, b := range bin {
		out = append(out, b...)
	}
	return out, jsonLen, nil
}

// appendKSData writes a tensor's elements as a flat JSON array.
func appendKSData(out []byte, t *hamsv1.Tensor) []byte {
	out = append(out, '[')
	d := t.GetData()
	switch dt := t.GetDatatype(); dt {
	case tensor.Bytes:
		for i, e := range wire.BytesElems(d) {
			if i > 0 {
				out = append(out, ',')
			}
			out = appendJSONString(out, string(e))
		}
	case tensor.FP32:
		for i := 0; i+4 <= len(d); i += 4 {
			if i > 0 {
				out = append(out, ',')
			}
			out = appendShortFloat(out, float64(math.Float32frombits(binary.LittleEndian.Uint32(d[i:]))), 32)
		}
	case tensor.FP64:
		for i := 0; i+8 <= len(d); i += 8 {
			if i > 0 {
				out = append(out, ',')
			}
			out = appendShortFloat(out, math.Float64frombits(binary.LittleEndian.Uint64(d[i:])), 64)
		}
	default:
		es := tensor.ElemSize(dt)
		for i := 0; es > 0 && i+es <= len(d); i += es {
			if i > 0 {
				out = append(out, ',')
			}
			out = appendElem(out, d[i:i+es], dt)
		}
	}
	return append(out, ']')
}
