package frontend

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// JSON shapes of the HTTP API. Tensor data is a flat row-major array of
// JSON numbers (booleans for BOOL; "NaN", "Inf", "-Inf" strings for
// non-finite floats).
type (
	jsonTensor struct {
		Name     string  `json:"name"`
		Datatype string  `json:"datatype"`
		Shape    []int64 `json:"shape"`
		// Data is kept raw and scanned in place: a []any or
		// []json.RawMessage would cost tens of bytes per element.
		Data json.RawMessage `json:"data"`
	}
	jsonPredictRequest struct {
		RequestID string       `json:"request_id,omitempty"`
		StreamID  string       `json:"stream_id,omitempty"`
		Inputs    []jsonTensor `json:"inputs"`
	}
	jsonOutput struct {
		Model   string       `json:"model"`
		Tensors []jsonTensor `json:"tensors"`
	}
	jsonLineage struct {
		PredModel    string `json:"pred_model"`
		PredSeq      uint64 `json:"pred_seq"`
		Model        string `json:"model"`
		Seq          uint64 `json:"seq"`
		OutputDigest string `json:"output_digest,omitempty"`
	}
	jsonPredictResponse struct {
		Service   string        `json:"service"`
		RequestID string        `json:"request_id,omitempty"`
		ReqID     uint64        `json:"req_id"`
		Outputs   []jsonOutput  `json:"outputs"`
		Lineage   []jsonLineage `json:"lineage"`
		// Approximate marks a parity reconstruction; absent on an exact
		// reply.
		Approximate bool `json:"approximate,omitempty"`
	}
	jsonSpec struct {
		Name     string  `json:"name"`
		Datatype string  `json:"datatype"`
		Shape    []int64 `json:"shape"`
	}
	jsonService struct {
		Name        string     `json:"name"`
		EntryModels []string   `json:"entry_models"`
		SinkModels  []string   `json:"sink_models"`
		Models      []string   `json:"models"`
		Inputs      []jsonSpec `json:"inputs"`
	}
	jsonError struct {
		Error string `json:"error"`
		Code  string `json:"code"`
	}
)

func (a *httpAPI) httpHandler() http.Handler {
	mux := http.NewServeMux()
	// The {service}:predict suffix is not a whole path segment, so the
	// segment is matched whole and split here.
	// Client endpoints pass client authentication first (clientauth.go);
	// health and metrics stay open.
	mux.HandleFunc("POST /v1/services/{target}", a.fe.httpAuth(a.handlePredict, func(r *http.Request) (string, bool) {
		svc, ok := strings.CutSuffix(r.PathValue("target"), ":predict")
		return svc, ok && svc != ""
	}))
	mux.HandleFunc("GET /v1/services", a.fe.httpAuth(a.handleList, func(*http.Request) (string, bool) { return "", false }))
	mux.HandleFunc("GET /healthz", a.handleHealth)
	mux.Handle("GET /metrics", grpcx.MetricsHandler(a.registry))
	// The REST dialects of TF Serving and KServe v2 (rest_*.go).
	a.tfRESTRoutes(mux)
	a.kserveRESTRoutes(mux)
	return mux
}

func (a *httpAPI) handlePredict(w http.ResponseWriter, r *http.Request) {
	target := r.PathValue("target")
	svc, ok := strings.CutSuffix(target, ":predict")
	if !ok || svc == "" {
		writeError(w, status.Errorf(codes.NotFound, "no such endpoint %q (want /v1/services/{service}:predict)", r.URL.Path))
		return
	}
	// Admitted on the body's size before the body is read (at most the
	// message limit: MaxBytesReader refuses more).
	size := r.ContentLength
	if size < 0 || size > int64(a.maxBytes) {
		size = int64(a.maxBytes)
	}
	release, err := a.admit.acquire(svc, size)
	if err != nil {
		a.m.refused.Inc()
		a.m.requests.WithLabelValues(a.serviceLabel(svc), status.Code(err).String()).Inc()
		// Busy, not too large: 429 with a hint to retry.
		st := status.Convert(err)
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusTooManyRequests, jsonError{Error: st.Message(), Code: st.Code().String()})
		return
	}
	defer release()
	req, err := a.decodePredict(w, r, svc)
	if err != nil {
		a.m.requests.WithLabelValues(a.serviceLabel(svc), status.Code(err).String()).Inc()
		a.log.Debug("http predict rejected", "service", svc, "err", err)
		writeError(w, err)
		return
	}
	resp, err := a.fe.predictAdmitted(r.Context(), req, true)
	if err != nil {
		writeError(w, err)
		return
	}
	out, err := encodeResponse(resp)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *httpAPI) serviceLabel(name string) string {
	if a.services[name] != nil {
		return name
	}
	return unknownService
}

// decodePredict reads the body (at most maxBytes) into a PredictRequest.
func (a *httpAPI) decodePredict(w http.ResponseWriter, r *http.Request, svc string) (*hamsv1.PredictRequest, error) {
	body := http.MaxBytesReader(w, r.Body, int64(a.maxBytes))
	var jr jsonPredictRequest
	dec := json.NewDecoder(body)
	if err := dec.Decode(&jr); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, status.Errorf(codes.ResourceExhausted, "service %q: request body exceeds %d bytes", svc, mbe.Limit)
		}
		return nil, status.Errorf(codes.InvalidArgument, "service %q: malformed JSON body: %v", svc, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, status.Errorf(codes.InvalidArgument, "service %q: trailing data after the JSON body", svc)
	}
	req := &hamsv1.PredictRequest{Service: svc, RequestId: jr.RequestID, StreamId: jr.StreamID}
	total := 0
	for i, jt := range jr.Inputs {
		name := jt.Name
		if name == "" {
			name = fmt.Sprintf("#%d", i)
		}
		t, err := decodeTensor(jt, a.maxDecoded-total)
		if errors.Is(err, errTooLarge) {
			return nil, status.Errorf(codes.ResourceExhausted, "service %q: input %q: request tensors exceed %d bytes", svc, name, a.maxDecoded)
		}
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "service %q: input %q: %v", svc, name, err)
		}
		total += len(t.Data)
		req.Inputs = append(req.Inputs, t)
	}
	return req, nil
}

var (
	errJSONTensor = errors.New("frontend: bad JSON tensor")
	errTooLarge   = errors.New("frontend: tensor data over the byte cap")
)

// decodeTensor converts a flat (or nested, flattened row-major) JSON array
// to raw little-endian data. The element count must match the shape, and
// the data may take at most room bytes (checked before allocating).
func decodeTensor(jt jsonTensor, room int) (*hamsv1.Tensor, error) {
	es := tensor.ElemSize(jt.Datatype)
	if es <= 0 || jt.Datatype == tensor.FP16 {
		return nil, fmt.Errorf("%w: datatype %q is not supported over JSON", errJSONTensor, jt.Datatype)
	}
	n, err := tensor.NumElements(jt.Shape)
	if err != nil {
		return nil, err
	}
	count, err := scanElems(jt.Data, nil)
	if err != nil {
		return nil, err
	}
	if int64(count) != n {
		return nil, fmt.Errorf("%w: shape %v wants %d elements, data holds %d", errJSONTensor, jt.Shape, n, count)
	}
	if count*es > room {
		return nil, errTooLarge
	}
	b := make([]byte, count*es)
	i := 0
	_, err = scanElems(jt.Data, func(tok []byte) error {
		if err := putElem(b[i*es:], jt.Datatype, tok); err != nil {
			return fmt.Errorf("%w: element %d: %v", errJSONTensor, i, err)
		}
		i++
		return nil
	})
	if err != nil {
		return nil, err
	}
	shape := jt.Shape
	if shape == nil {
		shape = []int64{}
	}
	return &hamsv1.Tensor{Name: jt.Name, Datatype: jt.Datatype, Shape: shape, Data: b}, nil
}

// scanElems walks the scalars of a JSON array (already validated as JSON
// by the decoder), flattening nested arrays, and calls fn (if not nil) on
// each scalar's text. It returns the number of scalars.
func scanElems(raw []byte, fn func(tok []byte) error) (int, error) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return 0, fmt.Errorf("%w: data must be an array", errJSONTensor)
	}
	n := 0
	for i < len(raw) {
		switch c := raw[i]; c {
		case '[', ']', ',', ' ', '\t', '\n', '\r':
			i++
		case '{':
			return 0, fmt.Errorf("%w: element %d: data elements must be numbers or booleans", errJSONTensor, n)
		case '"':
			j := i + 1
			for j < len(raw) && raw[j] != '"' {
				if raw[j] == '\\' {
					j++
				}
				j++
			}
			j++ // closing quote
			if fn != nil {
				if err := fn(raw[i:min(j, len(raw))]); err != nil {
					return n, err
				}
			}
			n++
			i = j
		default:
			j := i
			for j < len(raw) && !isDelim(raw[j]) {
				j++
			}
			if fn != nil {
				if err := fn(raw[i:j]); err != nil {
					return n, err
				}
			}
			n++
			i = j
		}
	}
	return n, nil
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

func isDelim(c byte) bool {
	switch c {
	case ',', ']', '[', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}

func putElem(b []byte, dt string, tok []byte) error {
	s := string(tok)
	switch dt {
	case tensor.Bool:
		switch s {
		case "true", "1":
			b[0] = 1
		case "false", "0":
			b[0] = 0
		default:
			return fmt.Errorf("%s is not a boolean", s)
		}
	case tensor.FP32, tensor.FP64:
		bits := 64
		if dt == tensor.FP32 {
			bits = 32
		}
		v, err := parseFloat(s, bits)
		if err != nil {
			return err
		}
		if bits == 32 {
			binary.LittleEndian.PutUint32(b, math.Float32bits(float32(v)))
		} else {
			binary.LittleEndian.PutUint64(b, math.Float64bits(v))
		}
	case tensor.Int8, tensor.Int16, tensor.Int32, tensor.Int64:
		bits := tensor.ElemSize(dt) * 8
		v, err := strconv.ParseInt(s, 10, bits)
		if err != nil {
			return fmt.Errorf("%s is not an %s", s, dt)
		}
		putUint(b, uint64(v), bits/8)
	case tensor.Uint8, "UINT16", "UINT32", "UINT64":
		bits := tensor.ElemSize(dt) * 8
		v, err := strconv.ParseUint(s, 10, bits)
		if err != nil {
			return fmt.Errorf("%s is not a %s", s, dt)
		}
		putUint(b, v, bits/8)
	default:
		return fmt.Errorf("datatype %q is not supported over JSON", dt)
	}
	return nil
}

func parseFloat(s string, bits int) (float64, error) {
	switch s {
	case `"NaN"`:
		return math.NaN(), nil
	case `"Inf"`, `"Infinity"`:
		return math.Inf(1), nil
	case `"-Inf"`, `"-Infinity"`:
		return math.Inf(-1), nil
	}
	if s == "" || s[0] == '"' {
		return 0, fmt.Errorf("%s is not a number", s)
	}
	v, err := strconv.ParseFloat(s, bits)
	if err != nil {
		return 0, fmt.Errorf("%s is not a number", s)
	}
	return v, nil
}

func putUint(b []byte, v uint64, size int) {
	switch size {
	case 1:
		b[0] = byte(v)
	case 2:
		binary.LittleEndian.PutUint16(b, uint16(v))
	case 4:
		binary.LittleEndian.PutUint32(b, uint32(v))
	case 8:
		binary.LittleEndian.PutUint64(b, v)
	}
}

// encodeResponse converts a reply to JSON numbers.
func encodeResponse(resp *hamsv1.PredictResponse) (*jsonPredictResponse, error) {
	out := &jsonPredictResponse{Service: resp.GetService(), RequestID: resp.GetRequestId(), ReqID: resp.GetReqId(),
		Outputs: []jsonOutput{}, Lineage: []jsonLineage{}, Approximate: resp.GetApproximate()}
	for _, o := range resp.GetOutputs() {
		jo := jsonOutput{Model: o.GetModel(), Tensors: []jsonTensor{}}
		for _, t := range o.GetTensors() {
			jt, err := encodeTensor(t)
			if err != nil {
				return nil, status.Errorf(codes.Internal, "output %q of model %q: %v", t.GetName(), o.GetModel(), err)
			}
			jo.Tensors = append(jo.Tensors, jt)
		}
		out.Outputs = append(out.Outputs, jo)
	}
	for _, l := range resp.GetLineage() {
		out.Lineage = append(out.Lineage, jsonLineage{PredModel: l.GetPredModel(), PredSeq: l.GetPredSeq(),
			Model: l.GetModel(), Seq: l.GetSeq(), OutputDigest: l.GetOutputDigest()})
	}
	return out, nil
}

func encodeTensor(t *hamsv1.Tensor) (jsonTensor, error) {
	jt := jsonTensor{Name: t.GetName(), Datatype: t.GetDatatype(), Shape: t.GetShape(), Data: json.RawMessage("[]")}
	if jt.Shape == nil {
		jt.Shape = []int64{}
	}
	if err := tensor.Validate(t); err != nil {
		return jt, err
	}
	es := tensor.ElemSize(t.GetDatatype())
	if es <= 0 || t.GetDatatype() == tensor.FP16 {
		return jt, fmt.Errorf("%w: datatype %q is not supported over JSON", errJSONTensor, t.GetDatatype())
	}
	d := t.GetData()
	n := len(d) / es
	out := make([]byte, 0, 2+n*(es+2))
	out = append(out, '[')
	for i := range n {
		if i > 0 {
			out = append(out, ',')
		}
		out = appendElem(out, d[i*es:(i+1)*es], t.GetDatatype())
	}
	jt.Data = append(out, ']')
	return jt, nil
}

func appendElem(out, b []byte, dt string) []byte {
	switch dt {
	case tensor.Bool:
		return strconv.AppendBool(out, b[0] != 0)
	case tensor.FP32:
		return appendFloat(out, float64(math.Float32frombits(binary.LittleEndian.Uint32(b))), 32)
	case tensor.FP64:
		return appendFloat(out, math.Float64frombits(binary.LittleEndian.Uint64(b)), 64)
	case tensor.Int8:
		return strconv.AppendInt(out, int64(int8(b[0])), 10)
	case tensor.Int16:
		return strconv.AppendInt(out, int64(int16(binary.LittleEndian.Uint16(b))), 10)
	case tensor.Int32:
		return strconv.AppendInt(out, int64(int32(binary.LittleEndian.Uint32(b))), 10)
	case tensor.Int64:
		return strconv.AppendInt(out, int64(binary.LittleEndian.Uint64(b)), 10)
	case tensor.Uint8:
		return strconv.AppendUint(out, uint64(b[0]), 10)
	case "UINT16":
		return strconv.AppendUint(out, uint64(binary.LittleEndian.Uint16(b)), 10)
	case "UINT32":
		return strconv.AppendUint(out, uint64(binary.LittleEndian.Uint32(b)), 10)
	case "UINT64":
		return strconv.AppendUint(out, binary.LittleEndian.Uint64(b), 10)
	}
	return append(out, "null"...)
}

func appendFloat(out []byte, v float64, bits int) []byte {
	switch {
	case math.IsNaN(v):
		return append(out, `"NaN"`...)
	case math.IsInf(v, 1):
		return append(out, `"Inf"`...)
	case math.IsInf(v, -1):
		return append(out, `"-Inf"`...)
	}
	return strconv.AppendFloat(out, v, 'g', -1, bits)
}

func (a *httpAPI) handleList(w http.ResponseWriter, _ *http.Request) {
	out := struct {
		Services []jsonService `json:"services"`
	}{Services: []jsonService{}}
	for _, n := range a.svcOrder {
		s := a.services[n]
		js := jsonService{Name: s.name, EntryModels: s.entries, SinkModels: s.sinks, Models: s.models, Inputs: []jsonSpec{}}
		for _, in := range s.inputs {
			js.Inputs = append(js.Inputs, jsonSpec{Name: in.Name, Datatype: in.Datatype, Shape: in.Shape})
		}
		out.Services = append(out.Services, js)
	}
	writeJSON(w, http.StatusOK, out)
}

// handleHealth is ready (200) when every entry model resolves to a live
// instance, else 503 naming the ones that do not.
func (a *httpAPI) handleHealth(w http.ResponseWriter, _ *http.Request) {
	missing := a.fe.unresolved()
	if len(missing) > 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "unresolved": missing})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ready": true})
}

// httpStatus maps a gRPC code to the HTTP status of the JSON API.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.ResourceExhausted:
		return http.StatusRequestEntityTooLarge
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.Canceled:
		return 499 // client closed request (nginx convention)
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.Unimplemented:
		return http.StatusNotImplemented
	}
	return http.StatusInternalServerError
}

func writeError(w http.ResponseWriter, err error) {
	st := status.Convert(err)
	writeJSON(w, httpStatus(st.Code()), jsonError{Error: st.Message(), Code: st.Code().String()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
