package frontend

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// TF Serving's REST API (https://www.tensorflow.org/tfx/serving/api_rest),
// answered as tensorflow_model_server's HttpRestApiHandler answers:
//
//	POST /v1/models/NAME[/versions/V|/labels/L]:predict     Predict
//	POST /v1/models/NAME[/versions/V|/labels/L]:classify    400 (no classification signature) or 501
//	POST /v1/models/NAME[/versions/V|/labels/L]:regress     likewise
//	GET  /v1/models/NAME[/versions/V|/labels/L]             GetModelStatus
//	GET  /v1/models/NAME[/versions/V|/labels/L]/metadata    GetModelMetadata (signature_def)
//
// A predict body is {"signature_name", "instances"} (row format, answered
// {"predictions"}) or {"signature_name", "inputs"} (columnar format,
// answered {"outputs"}); values are typed by the signature's inputs
// (GetModelMetadata); DT_STRING values may be {"b64": "..."}, and outputs
// whose name ends in "_bytes" are answered so. Floats are written as TF
// Serving writes them (six significant digits when they round-trip, a
// whole number with ".0", NaN and Infinity bare). Beyond upstream: a float
// input may also be the string "NaN", "Infinity" or "-Infinity" (Go's and
// most strict JSON encoders cannot write the bare tokens). An approximate
// reply carries the response header Hams-Approximate: true, as the gRPC
// API's header metadata.

// The paths, as upstream matches them (http_rest_api_util.cc).
var (
	tfPredictPath = regexp.MustCompile(`^(?i)/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)$`)
	tfStatusPath  = regexp.MustCompile(`^(?i)/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?$`)
)

// tfRESTMaxDepth bounds the nesting of a TF Serving JSON tensor.
const tfRESTMaxDepth = 64

func (a *httpAPI) tfRESTRoutes(mux *http.ServeMux) {
	model := func(re *regexp.Regexp) func(*http.Request) (string, bool) {
		return func(r *http.Request) (string, bool) {
			m := re.FindStringSubmatch(r.URL.Path)
			if m == nil || m[1] == "" {
				return "", false
			}
			return m[1], true
		}
	}
	mux.HandleFunc("POST /v1/models/{rest...}", a.restAuth(dialectTF, a.handleTFPost, model(tfPredictPath)))
	mux.HandleFunc("GET /v1/models/{rest...}", a.restAuth(dialectTF, a.handleTFGet, model(tfStatusPath)))
	mux.HandleFunc("GET /v1/models", a.restAuth(dialectTF, a.handleTFGet, model(tfStatusPath)))
}

// tfRESTSpec is the ModelSpec of a path's name, version and label.
func tfRESTSpec(name, version, label string) (*tfapis.ModelSpec, error) {
	spec := &tfapis.ModelSpec{Name: name}
	if version != "" {
		v, err := strconv.ParseInt(version, 10, 64)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "Failed to convert version: %s to numeric.", version)
		}
		spec.VersionChoice = &tfapis.ModelSpec_Version{Version: wrapperspb.Int64(v)}
	}
	if label != "" {
		spec.VersionChoice = &tfapis.ModelSpec_VersionLabel{VersionLabel: label}
	}
	return spec, nil
}

// tfUnknown rewrites "no such model" as TF Serving words it; other errors
// are returned as they are.
func (a *httpAPI) tfUnknown(spec *tfapis.ModelSpec, err error, statusAPI bool) error {
	if status.Code(err) != codes.NotFound {
		return err
	}
	name := spec.GetName()
	_, lookErr := a.fe.modelService(name)
	known := lookErr == nil || a.fe.passFor(name) != nil
	v, hasV := spec.GetVersionChoice().(*tfapis.ModelSpec_Version)
	switch {
	case known && a.fe.passFor(name) != nil:
		return err // the backend's own answer
	case statusAPI && !known:
		return status.Errorf(codes.NotFound, "Could not find any versions of model %s", name)
	case statusAPI && hasV:
		return status.Errorf(codes.NotFound, "Could not find version %d of model %s", v.Version.GetValue(), name)
	case hasV:
		return status.Errorf(codes.NotFound, "Servable not found for request: Specific(%s, %d)", name, v.Version.GetValue())
	case !known:
		return status.Errorf(codes.NotFound, "Servable not found for request: Latest(%s)", name)
	}
	return err
}

func (a *httpAPI) handleTFPost(w http.ResponseWriter, r *http.Request) {
	m := tfPredictPath.FindStringSubmatch(r.URL.Path)
	if m == nil {
		a.writeRESTError(w, r, dialectTF, status.Errorf(codes.InvalidArgument, "Malformed request: %s %s", r.Method, r.URL.Path))
		return
	}
	spec, err := tfRESTSpec(m[1], m[2], m[3])
	if err != nil {
		a.writeRESTError(w, r, dialectTF, err)
		return
	}
	body, release, err := a.readRESTBody(w, r, spec.GetName())
	if err != nil {
		a.writeRESTError(w, r, dialectTF, err)
		return
	}
	switch strings.ToLower(m[4]) {
	case "predict":
		a.tfRESTPredict(w, r, spec, body, release)
	default:
		release()
		a.writeRESTError(w, r, dialectTF, a.tfClassifyRegress(r, spec, strings.ToLower(m[4]), body))
	}
}

// tfPredictBody is a predict request's body; the tensors stay raw until
// the signature's dtypes are known.
type tfPredictBody struct {
	SignatureName json.RawMessage `json:"signature_name"`
	Instances     json.RawMessage `json:"instances"`
	Inputs        json.RawMessage `json:"inputs"`
}

// parseTFBody decodes a predict, classify or regress body: a JSON object
// (as ParseJson and FillSignature check it).
func parseTFBody(body []byte, out any) (signature string, err error) {
	if len(strings.TrimSpace(string(body))) == 0 {
		return "", status.Error(codes.InvalidArgument, "JSON Parse error: The document is empty")
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return "", status.Errorf(codes.InvalidArgument, "JSON Value: %s Is not object", abbreviate(body))
		}
		return "", status.Errorf(codes.InvalidArgument, "JSON Parse error: %v", err)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return "", status.Errorf(codes.InvalidArgument, "JSON Parse error: %v", err)
	}
	if raw, ok := obj["signature_name"]; ok {
		if err := json.Unmarshal(raw, &signature); err != nil {
			return "", status.Errorf(codes.InvalidArgument, "JSON Value: %s not formatted correctly. 'signature_name' key must be a string value.", abbreviate(raw))
		}
	}
	return signature, nil
}

// abbreviate is a JSON text for an error message, cut to 200 bytes.
func abbreviate(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// tfSignatureInputs asks GetModelMetadata for the inputs of signature sig
// (empty: serving_default), as TF Serving's GetInfoMap.
func (a *httpAPI) tfSignatureInputs(r *http.Request, spec *tfapis.ModelSpec, sig string) (map[string]*tfapis.TensorInfo, error) {
	defs, err := a.tfSignatureDefs(r, spec)
	if err != nil {
		return nil, err
	}
	name := sig
	if name == "" {
		name = CompatSignature
	}
	def, ok := defs.GetSignatureDef()[name]
	if !ok {
		return nil, status.Errorf(codes.InvalidArgument, "Serving signature name: %q not found in signature def", name)
	}
	if len(def.GetInputs()) == 0 {
		label := sig
		if label == "" {
			label = "DEFAULT"
		}
		return nil, status.Errorf(codes.InvalidArgument, "Failed to get input map for signature: %s", label)
	}
	return def.GetInputs(), nil
}

// tfSignatureDefs is the model's SignatureDefMap (GetModelMetadata).
func (a *httpAPI) tfSignatureDefs(r *http.Request, spec *tfapis.ModelSpec) (*tfapis.SignatureDefMap, error) {
	resp, err := a.tfMetadata(r, spec)
	if err != nil {
		return nil, err
	}
	return unpackSignatureDefs(resp)
}

// unpackSignatureDefs is the SignatureDefMap of a metadata response.
func unpackSignatureDefs(resp *tfapis.GetModelMetadataResponse) (*tfapis.SignatureDefMap, error) {
	defs := &tfapis.SignatureDefMap{}
	anyv := resp.GetMetadata()["signature_def"]
	if anyv == nil {
		return nil, status.Error(codes.Internal, "Failed to find 'signature_def' key in the GetModelMetadataResponse metadata map.")
	}
	if err := anyv.UnmarshalTo(defs); err != nil {
		return nil, status.Errorf(codes.Internal, "Failed to unpack 'Any' object to 'SignatureDefMap': %v", err)
	}
	return defs, nil
}

func (a *httpAPI) tfMetadata(r *http.Request, spec *tfapis.ModelSpec) (*tfapis.GetModelMetadataResponse, error) {
	ctx, _ := inProcess(r.Context(), tfapis.PredictionService_GetModelMetadata_FullMethodName)
	req := &tfapis.GetModelMetadataRequest{ModelSpec: cloneSpec(spec), MetadataField: []string{"signature_def"}}
	resp, err := a.tfPredict.GetModelMetadata(ctx, req)
	if err != nil {
		return nil, a.tfUnknown(spec, err, false)
	}
	return resp, nil
}

// cloneSpec copies a spec (a pass-through call rewrites the one it gets).
func cloneSpec(s *tfapis.ModelSpec) *tfapis.ModelSpec {
	out := &tfapis.ModelSpec{Name: s.GetName(), SignatureName: s.GetSignatureName()}
	switch v := s.GetVersionChoice().(type) {
	case *tfapis.ModelSpec_Version:
		out.VersionChoice = &tfapis.ModelSpec_Version{Version: wrapperspb.Int64(v.Version.GetValue())}
	case *tfapis.ModelSpec_VersionLabel:
		out.VersionChoice = &tfapis.ModelSpec_VersionLabel{VersionLabel: v.VersionLabel}
	}
	return out
}

func (a *httpAPI) tfRESTPredict(w http.ResponseWriter, r *http.Request, spec *tfapis.ModelSpec, body []byte, release func()) {
	released := false
	free := func() {
		if !released {
			released = true
			release()
		}
	}
	defer free()
	var pb tfPredictBody
	sig, err := parseTFBody(body, &pb)
	if err != nil {
		a.writeRESTError(w, r, dialectTF, err)
		return
	}
	spec.SignatureName = sig
	infos, err := a.tfSignatureInputs(r, spec, sig)
	if err != nil {
		a.writeRESTError(w, r, dialectTF, err)
		return
	}
	inputs, row, err := decodeTFInputs(&pb, infos, int64(a.maxDecoded))
	if err != nil {
		a.writeRESTError(w, r, dialectTF, tfDecodeErr(spec.GetName(), err, a.maxDecoded))
		return
	}
	// The decoded request is admitted again by Predict, as any gRPC
	// request; the body's admission ends here.
	body, pb = nil, tfPredictBody{}
	free()
	ctx, hdr := inProcess(r.Context(), tfapis.PredictionService_Predict_FullMethodName)
	resp, err := a.tfPredict.Predict(ctx, &tfapis.PredictRequest{ModelSpec: spec, Inputs: inputs})
	if err != nil {
		a.writeRESTError(w, r, dialectTF, a.tfUnknown(spec, err, false))
		return
	}
	out, err := tfOutputsJSON(resp.GetOutputs(), row)
	if err != nil {
		a.writeRESTError(w, r, dialectTF, err)
		return
	}
	if hdr.approximate() {
		w.Header().Set(HeaderApproximate, "true")
	}
	writeRESTBody(w, http.StatusOK, "application/json", out)
}

// tfDecodeErr turns a decode error into the status the client gets.
func tfDecodeErr(model string, err error, limit int) error {
	if errors.Is(err, wire.ErrTooLarge) {
		return status.Errorf(codes.ResourceExhausted, "model %q: request tensors exceed %d bytes (limits.max_decoded_bytes)", model, limit)
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.InvalidArgument, strings.TrimPrefix(err.Error(), errRESTJSON.Error()+": "))
}

// decodeTFInputs converts a predict body's tensors to TensorProtos typed
// by infos (the signature's inputs); row says the body used the row
// format. The values take at most room bytes (ErrTooLarge beyond),
// checked before each is stored.
func decodeTFInputs(pb *tfPredictBody, infos map[string]*tfapis.TensorInfo, room int64) (map[string]*tfpb.TensorProto, bool, error) {
	names := make([]string, 0, len(infos))
	for n := range infos {
		names = append(names, n)
	}
	sort.Strings(names)
	out := map[string]*tfpb.TensorProto{}
	newTP := func(name string) *tfpb.TensorProto {
		tp := &tfpb.TensorProto{Dtype: infos[name].GetDtype(), TensorShape: &tfpb.TensorShapeProto{}}
		out[name] = tp
		return tp
	}
	left := &room
	switch {
	case len(pb.Instances) > 0 && len(pb.Inputs) > 0:
		return nil, false, status.Error(codes.InvalidArgument, "JSON Value: {...} Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist ")
	case len(pb.Instances) > 0:
		var items []json.RawMessage
		if err := json.Unmarshal(pb.Instances, &items); err != nil {
			return nil, false, status.Error(codes.InvalidArgument, "JSON Value: {...} Excepting 'instances' to be an list/array")
		}
		if len(items) == 0 {
			return nil, false, status.Error(codes.InvalidArgument, "JSON Value: {...} No values in 'instances' array")
		}
		objects := isJSONObject(items[0]) && !isB64Object(items[0])
		if !objects && len(infos) > 1 {
			return nil, false, status.Error(codes.InvalidArgument, "instances is a plain list, but expecting list of objects as multiple input tensors required as per tensorinfo_map")
		}
		if !objects {
			// One input: the instances array is the batched tensor.
			for i, it := range items {
				if isJSONObject(it) && !isB64Object(it) {
					return nil, false, status.Errorf(codes.InvalidArgument, "Expecting value/list but got object at item %d of input list", i)
				}
			}
			tp := newTP(names[0])
			shape, err := fillTFTensor(pb.Instances, tp, left)
			if err != nil {
				return nil, false, err
			}
			tp.TensorShape = wire.TFShape(shape)
			return out, true, nil
		}
		shapes := map[string][]int64{}
		for i, it := range items {
			if !isJSONObject(it) || isB64Object(it) {
				return nil, false, status.Errorf(codes.InvalidArgument, "Expecting object but got list at item %d of input list", i)
			}
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(it, &obj); err != nil {
				return nil, false, status.Errorf(codes.InvalidArgument, "Failed to process element: %d of 'instances' list. Error: %v", i, err)
			}
			keys := make([]string, 0, len(obj))
			for k := range obj {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				if infos[k] == nil {
					return nil, false, status.Errorf(codes.InvalidArgument, "Failed to process element: %d key: %s of 'instances' list. Error: JSON object: does not have named input: %s", i, k, k)
				}
				tp := out[k]
				if tp == nil {
					tp = newTP(k)
				}
				shape, err := fillTFTensor(obj[k], tp, left)
				if err != nil {
					if errors.Is(err, wire.ErrTooLarge) {
						return nil, false, err
					}
					return nil, false, status.Errorf(codes.InvalidArgument, "Failed to process element: %d key: %s of 'instances' list. Error: %s", i, k, status.Convert(tfDecodeErr("", err, 0)).Message())
				}
				if prev, ok := shapes[k]; ok && !sameShape(prev, shape) {
					return nil, false, status.Errorf(codes.InvalidArgument, "Failed to process element: %d key: %s of 'instances' list. Error: Expecting shape %s but got: %s", i, k, shapeText(prev), shapeText(shape))
				}
				shapes[k] = shape
			}
			if !slicesEqual(keys, names) {
				return nil, false, status.Errorf(codes.InvalidArgument, "Failed to process element: %d of 'instances' list. JSON object: %s must only have keys: %s", i, abbreviate(it), strings.Join(names, ","))
			}
		}
		for k, tp := range out {
			tp.TensorShape = wire.TFShape(append([]int64{int64(len(items))}, shapes[k]...))
		}
		return out, true, nil
	case len(pb.Inputs) > 0:
		if !isJSONObject(pb.Inputs) || isB64Object(pb.Inputs) {
			if len(infos) > 1 {
				return nil, false, status.Error(codes.InvalidArgument, "inputs is a plain value/list, but expecting an object as multiple input tensors required as per tensorinfo_map")
			}
			tp := newTP(names[0])
			shape, err := fillTFTensor(pb.Inputs, tp, left)
			if err != nil {
				return nil, false, err
			}
			tp.TensorShape = wire.TFShape(shape)
			return out, false, nil
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(pb.Inputs, &obj); err != nil {
			return nil, false, status.Errorf(codes.InvalidArgument, "JSON Parse error: %v", err)
		}
		for _, n := range names {
			raw, ok := obj[n]
			if !ok {
				return nil, false, status.Errorf(codes.InvalidArgument, "Missing named input: %s in 'inputs' object.", n)
			}
			tp := newTP(n)
			shape, err := fillTFTensor(raw, tp, left)
			if err != nil {
				return nil, false, err
			}
			tp.TensorShape = wire.TFShape(shape)
		}
		return out, false, nil
	}
	return nil, false, status.Error(codes.InvalidArgument, "Missing 'inputs' or 'instances' key")
}

func sameShape(a, b []int64) bool { return slicesEqual(a, b) }

func slicesEqual[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func shapeText(s []int64) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = strconv.FormatInt(d, 10)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// fillTFTensor appends the values of the dense JSON tensor raw to tp (of
// tp.Dtype) and returns its shape; left is the byte budget.
func fillTFTensor(raw json.RawMessage, tp *tfpb.TensorProto, left *int64) ([]int64, error) {
	shape, err := walkTensor(raw, walkOpts{dense: true, b64: tp.Dtype == tfpb.DataType_DT_STRING, maxDepth: tfRESTMaxDepth},
		func(v any) error { return tfAppend(tp, v, left) })
	if errors.Is(err, errRESTJSON) {
		return nil, status.Error(codes.InvalidArgument, strings.TrimPrefix(err.Error(), errRESTJSON.Error()+": "))
	}
	return shape, err
}

// tfDTypeName is DataTypeString of TF.
func tfDTypeName(dt tfpb.DataType) string {
	s := strings.ToLower(strings.TrimPrefix(dt.String(), "DT_"))
	switch s {
	case "half":
		return "half"
	case "bfloat16":
		return "bfloat16"
	}
	return s
}

func tfTypeError(v any, dt tfpb.DataType) error {
	return status.Errorf(codes.InvalidArgument, "JSON Value: %s Type: %s is not of expected type: %s", jsonText(v), jsonType(v), tfDTypeName(dt))
}

// take spends n bytes of the budget, or says it is spent.
func take(left *int64, n int64) error {
	if n > *left {
		return wire.ErrTooLarge
	}
	*left -= n
	return nil
}

// tfAppend adds one JSON scalar to tp's typed field (AddValueToTensor).
func tfAppend(tp *tfpb.TensorProto, v any, left *int64) error {
	dt := tp.Dtype
	if b, ok := v.(b64Value); ok {
		if dt != tfpb.DataType_DT_STRING {
			return tfTypeError(v, dt)
		}
		if err := take(left, int64(4+len(b))); err != nil {
			return err
		}
		tp.StringVal = append(tp.StringVal, b)
		return nil
	}
	num, isNum := v.(json.Number)
	switch dt {
	case tfpb.DataType_DT_FLOAT, tfpb.DataType_DT_DOUBLE:
		bits, size := 64, int64(8)
		if dt == tfpb.DataType_DT_FLOAT {
			bits, size = 32, 4
		}
		f, err := jsonFloat(v, bits)
		if err != nil {
			return err
		}
		if err := take(left, size); err != nil {
			return err
		}
		if bits == 32 {
			tp.FloatVal = append(tp.FloatVal, float32(f))
		} else {
			tp.DoubleVal = append(tp.DoubleVal, f)
		}
	case tfpb.DataType_DT_INT32, tfpb.DataType_DT_INT16, tfpb.DataType_DT_INT8, tfpb.DataType_DT_UINT8:
		if !isNum {
			return tfTypeError(v, dt)
		}
		i, err := strconv.ParseInt(string(num), 10, 32)
		if err != nil {
			return tfTypeError(v, dt)
		}
		if err := take(left, 4); err != nil {
			return err
		}
		tp.IntVal = append(tp.IntVal, int32(i))
	case tfpb.DataType_DT_INT64:
		if !isNum {
			return tfTypeError(v, dt)
		}
		i, err := strconv.ParseInt(string(num), 10, 64)
		if err != nil {
			return tfTypeError(v, dt)
		}
		if err := take(left, 8); err != nil {
			return err
		}
		tp.Int64Val = append(tp.Int64Val, i)
	case tfpb.DataType_DT_UINT32:
		if !isNum {
			return tfTypeError(v, dt)
		}
		u, err := strconv.ParseUint(string(num), 10, 32)
		if err != nil {
			return tfTypeError(v, dt)
		}
		if err := take(left, 4); err != nil {
			return err
		}
		tp.Uint32Val = append(tp.Uint32Val, uint32(u))
	case tfpb.DataType_DT_UINT64:
		if !isNum {
			return tfTypeError(v, dt)
		}
		u, err := strconv.ParseUint(string(num), 10, 64)
		if err != nil {
			return tfTypeError(v, dt)
		}
		if err := take(left, 8); err != nil {
			return err
		}
		tp.Uint64Val = append(tp.Uint64Val, u)
	case tfpb.DataType_DT_BOOL:
		b, ok := v.(bool)
		if !ok {
			return tfTypeError(v, dt)
		}
		if err := take(left, 1); err != nil {
			return err
		}
		tp.BoolVal = append(tp.BoolVal, b)
	case tfpb.DataType_DT_STRING:
		s, ok := v.(string)
		if !ok {
			return tfTypeError(v, dt)
		}
		if err := take(left, int64(4+len(s))); err != nil {
			return err
		}
		tp.StringVal = append(tp.StringVal, []byte(s))
	default:
		return status.Errorf(codes.Unimplemented, "Conversion of JSON Value: %s to type: %s", jsonText(v), tfDTypeName(dt))
	}
	return nil
}

// jsonFloat reads a float input value as TF Serving does (a number that
// converts without loss of precision: an integer literal within the
// type's exact integers, a value within its range), plus the strings
// "NaN", "Infinity" and "-Infinity".
func jsonFloat(v any, bits int) (float64, error) {
	typeName := "double"
	dt := tfpb.DataType_DT_DOUBLE
	if bits == 32 {
		typeName, dt = "float", tfpb.DataType_DT_FLOAT
	}
	switch x := v.(type) {
	case string:
		switch x {
		case "NaN":
			return math.NaN(), nil
		case "Infinity", "Inf":
			return math.Inf(1), nil
		case "-Infinity", "-Inf":
			return math.Inf(-1), nil
		}
		return 0, tfTypeError(v, dt)
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		lossy := status.Errorf(codes.InvalidArgument, "Cannot convert JSON value: %s to %s without loss of precision.", string(x), typeName)
		if err != nil {
			return 0, lossy
		}
		maxInt := float64(int64(1)<<53 - 1)
		maxVal := math.MaxFloat64
		if bits == 32 {
			maxInt, maxVal = float64(int64(1)<<24-1), math.MaxFloat32
		}
		if isIntLiteral(x) {
			if _, err := strconv.ParseInt(string(x), 10, 64); err == nil && math.Abs(f) > maxInt {
				return 0, lossy
			}
		}
		if math.Abs(f) > maxVal {
			return 0, lossy
		}
		return f, nil
	}
	return 0, tfTypeError(v, dt)
}

// tfOutputsJSON writes a PredictResponse's outputs as TF Serving's REST
// API does: {"predictions": ...} for a row-format request (one entry per
// row of the batch; objects keyed by output name when there are several
// outputs), {"outputs": ...} for a columnar one.
func tfOutputsJSON(outs map[string]*tfpb.TensorProto, row bool) ([]byte, error) {
	if len(outs) == 0 {
		return nil, status.Error(codes.InvalidArgument, "Cannot convert empty tensor map to JSON")
	}
	names := make([]string, 0, len(outs))
	for n := range outs {
		names = append(names, n)
	}
	sort.Strings(names)
	ts := make([]*tfOut, len(names))
	for i, n := range names {
		t, err := wire.FromTensorProto(n, outs[n])
		if err != nil {
			return nil, status.Errorf(codes.Internal, "output %q: %v", n, err)
		}
		o := &tfOut{t: t, b64: t.GetDatatype() == tensor.Bytes && strings.HasSuffix(n, "_bytes")}
		if t.GetDatatype() == tensor.Bytes {
			o.elems = wire.BytesElems(t.GetData())
		}
		ts[i] = o
	}
	multi := len(ts) > 1
	var out []byte
	if !row {
		out = append(out, `{"outputs": `...)
		if multi {
			out = append(out, '{')
		}
		for i, o := range ts {
			if i > 0 {
				out = append(out, ", "...)
			}
			if multi {
				out = appendJSONString(out, names[i])
				out = append(out, ": "...)
			}
			idx := 0
			out = o.appendNested(out, 0, &idx)
		}
		if multi {
			out = append(out, '}')
		}
		return append(out, "}\n"...), nil
	}
	batch := int64(0)
	for i, o := range ts {
		sh := o.t.GetShape()
		if len(sh) == 0 {
			return nil, status.Errorf(codes.InvalidArgument, "Tensor name: %s has no shape information ", names[i])
		}
		if sh[0] < 1 {
			return nil, status.Errorf(codes.InvalidArgument, "Tensor name: %s has invalid batch size: %d", names[i], sh[0])
		}
		if batch != 0 && sh[0] != batch {
			return nil, status.Errorf(codes.InvalidArgument, "Tensor name: %s has inconsistent batch size: %d expecting: %d", names[i], sh[0], batch)
		}
		batch = sh[0]
	}
	offsets := make([]int, len(ts))
	out = append(out, `{"predictions": [`...)
	for item := range batch {
		if item > 0 {
			out = append(out, ", "...)
		}
		if multi {
			out = append(out, '{')
		}
		for i, o := range ts {
			if i > 0 {
				out = append(out, ", "...)
			}
			if multi {
				out = appendJSONString(out, names[i])
				out = append(out, ": "...)
			}
			out = o.appendNested(out, 1, &offsets[i])
		}
		if multi {
			out = append(out, '}')
		}
	}
	return append(out, "]}\n"...), nil
}

// tfOut is one output tensor being written.
type tfOut struct {
	t     *hamsv1.Tensor
	elems [][]byte // BYTES elements
	b64   bool
}

// appendNested writes the values from dimension dim on, starting at
// element *idx (advanced), nested as the shape says (a scalar bare).
func (o *tfOut) appendNested(out []byte, dim int, idx *int) []byte {
	sh := o.t.GetShape()
	if dim >= len(sh) {
		out = o.appendElem(out, *idx)
		*idx++
		return out
	}
	out = append(out, '[')
	for i := range sh[dim] {
		if i > 0 {
			out = append(out, ", "...)
		}
		out = o.appendNested(out, dim+1, idx)
	}
	return append(out, ']')
}

func (o *tfOut) appendElem(out []byte, i int) []byte {
	d := o.t.GetData()
	switch dt := o.t.GetDatatype(); dt {
	case tensor.FP32:
		return appendTFDecimal(out, float64(math.Float32frombits(binary.LittleEndian.Uint32(d[4*i:]))), 32)
	case tensor.FP64:
		return appendTFDecimal(out, math.Float64frombits(binary.LittleEndian.Uint64(d[8*i:])), 64)
	case tensor.Bytes:
		if o.b64 {
			out = append(out, `{"b64": "`...)
			out = base64.StdEncoding.AppendEncode(out, o.elems[i])
			return append(out, `"}`...)
		}
		return appendJSONString(out, string(o.elems[i]))
	default:
		return appendElem(out, d[i*tensor.ElemSize(dt):(i+1)*tensor.ElemSize(dt)], dt)
	}
}

// tfClassifyRegress answers :classify and :regress: the body is checked
// as upstream checks it; a HAMS service has only a predict signature (TF
// Serving's answer for a model without a classification or regression
// signature); a pass-through model's Classify and Regress are not
// forwarded from REST.
func (a *httpAPI) tfClassifyRegress(r *http.Request, spec *tfapis.ModelSpec, method string, body []byte) error {
	var cb struct {
		Examples json.RawMessage `json:"examples"`
	}
	sig, err := parseTFBody(body, &cb)
	if err != nil {
		return err
	}
	if len(cb.Examples) == 0 {
		return status.Errorf(codes.InvalidArgument, "JSON Value: %s When method is %s, key 'examples' is expected and was not found", abbreviate(body), method)
	}
	if p := a.fe.passFor(spec.GetName()); p != nil {
		return status.Errorf(codes.Unimplemented, "model %q is served pass-through (ha: off): :%s is not forwarded from REST; call %s over gRPC", spec.GetName(), method, strings.ToUpper(method[:1])+method[1:])
	}
	defs, err := a.tfSignatureDefs(r, spec)
	if err != nil {
		return err
	}
	name := sig
	if name == "" {
		name = CompatSignature
	}
	def, ok := defs.GetSignatureDef()[name]
	if !ok {
		return status.Errorf(codes.InvalidArgument, "Serving signature name: %q not found in signature def", name)
	}
	kind := map[string]string{"classify": "classification", "regress": "regression"}[method]
	return status.Errorf(codes.InvalidArgument, "Expected %s signature method_name to be tensorflow/serving/%s. Was: %s", kind, method, def.GetMethodName())
}

func (a *httpAPI) handleTFGet(w http.ResponseWriter, r *http.Request) {
	m := tfStatusPath.FindStringSubmatch(r.URL.Path)
	if m == nil {
		a.writeRESTError(w, r, dialectTF, status.Errorf(codes.InvalidArgument, "Malformed request: %s %s", r.Method, r.URL.Path))
		return
	}
	if m[1] == "" {
		a.writeRESTError(w, r, dialectTF, status.Error(codes.InvalidArgument, "Missing model name in request."))
		return
	}
	spec, err := tfRESTSpec(m[1], m[2], m[3])
	if err != nil {
		a.writeRESTError(w, r, dialectTF, err)
		return
	}
	var out []byte
	if strings.EqualFold(m[4], "metadata") {
		out, err = a.tfRESTMetadata(r, spec)
	} else {
		out, err = a.tfRESTStatus(r, spec)
	}
	if err != nil {
		a.writeRESTError(w, r, dialectTF, err)
		return
	}
	writeRESTBody(w, http.StatusOK, "application/json", out)
}

// tfStatusJSON is GetModelStatusResponse as TF Serving's REST API writes
// it (error_code by name).
type tfStatusJSON struct {
	ModelVersionStatus []tfVersionStatusJSON `json:"model_version_status"`
}

type tfVersionStatusJSON struct {
	Version string `json:"version"`
	State   string `json:"state"`
	Status  struct {
		ErrorCode    string `json:"error_code"`
		ErrorMessage string `json:"error_message"`
	} `json:"status"`
}

// tfErrorCodes are tensorflow.error.Code's names (the gRPC codes'
// numbers).
var tfErrorCodes = []string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
	"ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
	"UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}

func (a *httpAPI) tfRESTStatus(r *http.Request, spec *tfapis.ModelSpec) ([]byte, error) {
	ctx, _ := inProcess(r.Context(), tfapis.ModelService_GetModelStatus_FullMethodName)
	resp, err := a.tfModel.GetModelStatus(ctx, &tfapis.GetModelStatusRequest{ModelSpec: cloneSpec(spec)})
	if err != nil {
		return nil, a.tfUnknown(spec, err, true)
	}
	out := tfStatusJSON{ModelVersionStatus: []tfVersionStatusJSON{}}
	for _, s := range resp.GetModelVersionStatus() {
		js := tfVersionStatusJSON{Version: strconv.FormatInt(s.GetVersion(), 10), State: s.GetState().String()}
		if c := int(s.GetStatus().GetErrorCode()); c >= 0 && c < len(tfErrorCodes) {
			js.Status.ErrorCode = tfErrorCodes[c]
		} else {
			js.Status.ErrorCode = strconv.Itoa(c)
		}
		js.Status.ErrorMessage = s.GetStatus().GetErrorMessage()
		out.ModelVersionStatus = append(out.ModelVersionStatus, js)
	}
	b, err := json.MarshalIndent(out, "", " ")
	if err != nil {
		return nil, status.Errorf(codes.Internal, "Failed to convert proto to json. Error: %v", err)
	}
	return append(b, '\n'), nil
}

// tfRESTMetadata writes GetModelMetadataResponse as TF Serving's REST API
// does: {"model_spec": ..., "metadata": {"signature_def": ...}}, both
// printed by protojson with proto field names and default values.
func (a *httpAPI) tfRESTMetadata(r *http.Request, spec *tfapis.ModelSpec) ([]byte, error) {
	resp, err := a.tfMetadata(r, spec)
	if err != nil {
		return nil, err
	}
	defs, err := unpackSignatureDefs(resp)
	if err != nil {
		return nil, err
	}
	opts := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}
	ms, err := opts.Marshal(resp.GetModelSpec())
	if err != nil {
		return nil, status.Errorf(codes.Internal, "Failed to convert model spec proto to json. Error: %v", err)
	}
	sd, err := opts.Marshal(defs)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "Failed to convert signature def proto to json. Error: %v", err)
	}
	var out bytes.Buffer
	if err := json.Indent(&out, fmt.Appendf(nil, `{"model_spec": %s, "metadata": {"signature_def": %s}}`, ms, sd), "", " "); err != nil {
		return nil, status.Errorf(codes.Internal, "Failed to convert proto to json. Error: %v", err)
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}
