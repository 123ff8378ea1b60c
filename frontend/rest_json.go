package frontend

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// REST dialects on the HTTP port (rest_tfserving.go: TF Serving's REST
// API; rest_kserve.go: KServe v2's HTTP/REST protocol with Triton's
// binary tensor data extension). A REST call is decoded into the request
// message of the matching gRPC compatibility method (compat.go) and
// answered by that method, in process: model lookup, versions, labels,
// signatures, validation, limits, pass-through and reply gating are the
// gRPC APIs' own, so both APIs give the same predictions. Client
// authentication is the HTTP API's (httpAuth).
//
// Limits: a body is admitted (limits.max_inflight_bytes) on its size
// while it is read (at most limits.max_message_bytes: 413 beyond) and
// decoded; the decoded tensors may take at most limits.max_decoded_bytes
// (413), checked before each value is stored; the admission is given
// back before the gRPC method, which admits the decoded request as any
// gRPC request. A busy frontend answers 429 with Retry-After.
//
// JSON is read with encoding/json: the body is decoded into typed structs
// whose tensor values stay json.RawMessage, then each tensor value is
// streamed token by token (walkTensor) into the typed values of its
// datatype, so nothing but the tensor itself is allocated per element.

// restDialect picks the status codes of the REST API answering.
type restDialect int

const (
	dialectTF restDialect = iota
	dialectKServe
)

// restError is the error body both dialects answer.
type restError struct {
	Error string `json:"error"`
}

// busyMarker is in the message of admission's refusals (admission.go):
// busy is 429, not 413.
const busyMarker = "frontend busy"

// restStatus maps a gRPC code to the HTTP status a dialect's server
// answers: TF Serving's ToHTTPStatusCode, and Triton's HttpCodeFromError
// (NOT_FOUND 404, UNAVAILABLE 503, UNSUPPORTED 501, INTERNAL 500, the
// rest 400). Both: 401 and 403 for client authentication, 413 for a
// request over a size limit, 429 for a busy frontend, 504 for a deadline.
func restStatus(d restDialect, st *status.Status) int {
	switch st.Code() {
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.ResourceExhausted:
		if strings.Contains(st.Message(), busyMarker) {
			return http.StatusTooManyRequests
		}
		return http.StatusRequestEntityTooLarge
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.NotFound:
		return http.StatusNotFound
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Internal, codes.DataLoss:
		return http.StatusInternalServerError
	}
	if d == dialectKServe {
		return http.StatusBadRequest
	}
	switch st.Code() {
	case codes.Canceled:
		return 499
	case codes.Unknown:
		return http.StatusInternalServerError
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	}
	return http.StatusBadRequest
}

// writeRESTError answers err as {"error": message} with the dialect's
// status code.
func (a *httpAPI) writeRESTError(w http.ResponseWriter, r *http.Request, d restDialect, err error) {
	st := status.Convert(err)
	code := restStatus(d, st)
	if code == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	a.log.Debug("rest call failed", "path", r.URL.Path, "http", code, "code", st.Code().String(), "err", st.Message())
	writeRESTJSON(w, code, restError{Error: st.Message()})
}

// writeRESTJSON answers v as JSON (HTML characters unescaped, as the
// upstream servers write them).
func writeRESTJSON(w http.ResponseWriter, code int, v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		code = http.StatusInternalServerError
		b.Reset()
		b.WriteString(`{"error":"encode the reply as JSON failed"}` + "\n")
	}
	writeRESTBody(w, code, "application/json", b.Bytes())
}

func writeRESTBody(w http.ResponseWriter, code int, contentType string, body []byte) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// restAuth is httpAuth (clientauth.go) answering the dialect's error
// body: 401 with WWW-Authenticate: Bearer without valid credentials, 403
// for a model the client may not call (model returns the call's model,
// false for a call naming none).
func (a *httpAPI) restAuth(d restDialect, h http.HandlerFunc, model func(*http.Request) (string, bool)) http.HandlerFunc {
	if a.auth == nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := a.auth.identifyHTTP(r)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="hams"`)
			a.writeRESTError(w, r, d, err)
			return
		}
		if name, ok := model(r); ok {
			if err := a.fe.authorize(p, name); err != nil {
				a.writeRESTError(w, r, d, err)
				return
			}
		}
		h(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	}
}

// readRESTBody reads a REST call's body for model name: admitted on its
// size (at most limits.max_message_bytes) before it is read. The caller
// releases the admission once the body is decoded.
func (a *httpAPI) readRESTBody(w http.ResponseWriter, r *http.Request, model string) ([]byte, func(), error) {
	size := r.ContentLength
	if size < 0 || size > int64(a.maxBytes) {
		size = int64(a.maxBytes)
	}
	release, err := a.admit.acquire(model, size)
	if err != nil {
		a.m.refused.Inc()
		return nil, nil, err
	}
	var b bytes.Buffer
	if r.ContentLength > 0 && r.ContentLength <= int64(a.maxBytes) {
		b.Grow(int(r.ContentLength))
	}
	if _, err := b.ReadFrom(http.MaxBytesReader(w, r.Body, int64(a.maxBytes))); err != nil {
		release()
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, nil, status.Errorf(codes.ResourceExhausted, "model %q: request body exceeds %d bytes (limits.max_message_bytes)", model, mbe.Limit)
		}
		return nil, nil, status.Errorf(codes.InvalidArgument, "model %q: read the request body: %v", model, err)
	}
	return b.Bytes(), release, nil
}

// headerCapture is the grpc.ServerTransportStream of an in-process call
// of a gRPC method: it keeps the header metadata the method sets (the
// approximate mark, a pass-through backend's headers).
type headerCapture struct {
	method string
	header metadata.MD
}

func (h *headerCapture) Method() string { return h.method }

func (h *headerCapture) SetHeader(md metadata.MD) error {
	h.header = metadata.Join(h.header, md)
	return nil
}

func (h *headerCapture) SendHeader(md metadata.MD) error { return h.SetHeader(md) }

func (h *headerCapture) SetTrailer(metadata.MD) error { return nil }

// approximate says whether the method marked its reply approximate.
func (h *headerCapture) approximate() bool {
	return slices.Contains(h.header.Get(HeaderApproximate), "true")
}

// inProcess is the context of an in-process call of a gRPC method.
func inProcess(ctx context.Context, method string) (context.Context, *headerCapture) {
	h := &headerCapture{method: method}
	return grpc.NewContextWithServerTransportStream(ctx, h), h
}

// ---- JSON tensor values ----

var errRESTJSON = errors.New("frontend: bad JSON tensor value")

// b64Value is a {"b64": "..."} object, decoded.
type b64Value []byte

// walkOpts steers walkTensor.
type walkOpts struct {
	// dense: the value must be a dense tensor (TF Serving's rule): every
	// scalar at the same depth (the rank) and every list at a depth as
	// long as the first one there. Without it, nesting is flattened.
	dense bool
	// b64: a {"b64": "<base64>"} object is a scalar (b64Value).
	b64 bool
	// maxDepth bounds the nesting.
	maxDepth int
}

// walkTensor streams the JSON value raw (syntax already checked by
// encoding/json), calling leaf on each scalar in row-major order:
// json.Number, string, bool, nil or b64Value. It returns the value's
// shape (dense) or its nesting of first elements (not dense).
func walkTensor(raw []byte, o walkOpts, leaf func(v any) error) ([]int64, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var (
		counts []int64 // elements so far of each open list
		dims   []int64 // size of the lists at each depth (-1: none closed yet)
		rank   = -1
	)
	setDim := func(level int, n int64) error {
		for len(dims) <= level {
			dims = append(dims, -1)
		}
		switch {
		case dims[level] < 0:
			dims[level] = n
		case o.dense && dims[level] != n:
			return fmt.Errorf("%w: Encountered list at unexpected size: %d at level: %d expected size: %d", errRESTJSON, n, level, dims[level])
		}
		return nil
	}
	scalar := func(v any) error {
		level := len(counts)
		if rank < 0 {
			rank = level
		} else if o.dense && level != rank {
			return fmt.Errorf("%w: JSON Value: %s found at incorrect level: %d in the JSON DOM. Expected at level: %d", errRESTJSON, jsonText(v), level+1, rank)
		}
		if level > 0 {
			counts[level-1]++
		}
		return leaf(v)
	}
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errRESTJSON, err)
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '[':
				level := len(counts)
				if o.dense && rank >= 0 && level >= rank {
					return nil, fmt.Errorf("%w: Encountered list at unexpected level: %d expected < %d", errRESTJSON, level, rank)
				}
				if level >= o.maxDepth {
					return nil, fmt.Errorf("%w: lists nested deeper than %d", errRESTJSON, o.maxDepth)
				}
				if level > 0 {
					counts[level-1]++
				}
				counts = append(counts, 0)
			case ']':
				level := len(counts) - 1
				n := counts[level]
				counts = counts[:level]
				if n == 0 && rank < 0 {
					rank = level + 1
				}
				if err := setDim(level, n); err != nil {
					return nil, err
				}
			case '{':
				v, err := readB64(dec, o.b64)
				if err != nil {
					return nil, err
				}
				if err := scalar(v); err != nil {
					return nil, err
				}
			default:
				return nil, fmt.Errorf("%w: unexpected %v", errRESTJSON, t)
			}
		default:
			if err := scalar(t); err != nil {
				return nil, err
			}
		}
	}
	if !o.dense {
		return dims, nil
	}
	if rank < 0 {
		rank = 0
	}
	shape := make([]int64, rank)
	for i := range shape {
		if i < len(dims) && dims[i] >= 0 {
			shape[i] = dims[i]
		}
	}
	return shape, nil
}

// readB64 reads the rest of an object (its '{' read) as {"b64": "..."}.
func readB64(dec *json.Decoder, allowed bool) (b64Value, error) {
	bad := func() error {
		if !allowed {
			return fmt.Errorf("%w: JSON Value: {...} Type: Object is not a scalar of the tensor's type", errRESTJSON)
		}
		return fmt.Errorf("%w: JSON Value: {...} not formatted correctly for base64 data", errRESTJSON)
	}
	if !allowed {
		return nil, bad()
	}
	key, err := dec.Token()
	if err != nil || key != "b64" {
		return nil, bad()
	}
	val, err := dec.Token()
	s, ok := val.(string)
	if err != nil || !ok {
		return nil, bad()
	}
	if end, err := dec.Token(); err != nil || end != json.Delim('}') {
		return nil, bad()
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%w: Unable to base64 decode", errRESTJSON)
	}
	return b64Value(b), nil
}

// isB64Object says whether raw is a {"b64": "<string>"} object.
func isB64Object(raw json.RawMessage) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || len(m) != 1 {
		return false
	}
	v, ok := m["b64"]
	return ok && len(v) > 0 && v[0] == '"'
}

// isJSONObject says whether raw is a JSON object.
func isJSONObject(raw json.RawMessage) bool {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	return len(raw) > 0 && raw[0] == '{'
}

// jsonText is a scalar as JSON text, for error messages.
func jsonText(v any) string {
	switch x := v.(type) {
	case json.Number:
		return string(x)
	case string:
		b, _ := json.Marshal(x)
		return string(b)
	case bool:
		return strconv.FormatBool(x)
	case nil:
		return "null"
	case b64Value:
		return `{"b64": "` + base64.StdEncoding.EncodeToString(x) + `"}`
	}
	return fmt.Sprint(v)
}

// jsonType names a scalar's JSON type as TF Serving's messages do.
func jsonType(v any) string {
	switch x := v.(type) {
	case json.Number:
		return "Number"
	case string:
		return "String"
	case bool:
		if x {
			return "True"
		}
		return "False"
	case nil:
		return "Null"
	case b64Value:
		return "Object"
	}
	return "Unknown"
}

// isIntLiteral says whether a JSON number is written as an integer.
func isIntLiteral(n json.Number) bool {
	return !strings.ContainsAny(string(n), ".eE")
}

// ---- JSON output ----

// appendJSONString appends s as a JSON string (HTML characters
// unescaped).
func appendJSONString(out []byte, s string) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return append(out, bytes.TrimRight(b.Bytes(), "\n")...)
}

// appendTFDecimal writes a float as TF Serving does (WriteDecimal): six
// significant digits when they round-trip, else max_digits10; a whole
// number gets ".0"; NaN, Infinity and -Infinity bare, as TF Serving and
// Python's json module write them.
func appendTFDecimal(out []byte, v float64, bits int) []byte {
	switch {
	case math.IsNaN(v):
		return append(out, "NaN"...)
	case math.IsInf(v, 1):
		return append(out, "Infinity"...)
	case math.IsInf(v, -1):
		return append(out, "-Infinity"...)
	}
	s := strconv.FormatFloat(v, 'g', 6, bits)
	if back, err := strconv.ParseFloat(s, bits); err != nil || back != v {
		prec := 17
		if bits == 32 {
			prec = 9
		}
		s = strconv.FormatFloat(v, 'g', prec, bits)
	}
	if !strings.ContainsAny(s, ".e") {
		s += ".0"
	}
	return append(out, s...)
}

// appendShortFloat writes a float in the shortest form that reads back
// to the same value (the KServe answers); non-finite values bare.
func appendShortFloat(out []byte, v float64, bits int) []byte {
	switch {
	case math.IsNaN(v):
		return append(out, "NaN"...)
	case math.IsInf(v, 1):
		return append(out, "Infinity"...)
	case math.IsInf(v, -1):
		return append(out, "-Infinity"...)
	}
	return strconv.AppendFloat(out, v, 'g', -1, bits)
}
