package clipper

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/hamsmd"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Defaults of the optional Config fields.
const (
	DefaultInput          = "input"
	DefaultOutput         = "output"
	DefaultOutputDatatype = tensor.FP32
	DefaultMaxBodyBytes   = 64 << 20
	// DefaultWriteBufferSize is the write buffer of the default client's
	// connections (net/http's default is 4 KiB).
	DefaultWriteBufferSize = 64 << 10
	// Kind is the ModelDescription kind of every model behind this adapter.
	Kind = "clipper"
)

// ErrConfig is wrapped by every error New returns for a bad Config.
var ErrConfig = errors.New("clipper: invalid config")

// Config of a Backend.
type Config struct {
	// Address of the query frontend: host:port or an http(s):// URL
	// (required).
	Address string
	// App is the Clipper application name (required).
	App string
	// Input names the one input tensor (default DefaultInput).
	Input string
	// InputDatatype is declared to the sidecar for Input (default: none,
	// any numeric or BYTES tensor is accepted).
	InputDatatype string
	// Output names the output tensor (default DefaultOutput).
	Output string
	// OutputDatatype of the output tensor: FP32 (default), FP64, INT32,
	// INT64 or BYTES.
	OutputDatatype string
	// Timeout bounds every call (0: only the caller's context).
	Timeout time.Duration
	// HealthProbe, when set, is one input row (as a one-row tensor) that
	// Health sends as a probe predict after GET /metrics.
	HealthProbe *hamsv1.Tensor
	// MaxBodyBytes bounds an answer (default DefaultMaxBodyBytes).
	MaxBodyBytes int64
	// Client is the HTTP client (default: one with keep-alive pooling, up
	// to 64 idle connections, DefaultWriteBufferSize).
	Client *http.Client
	Logger *slog.Logger
}

// ConfigFrom builds a Config from a deployment's model backend entry: the
// address, the app name (Backend.Model), the timeout, and the tensors of
// backend.clipper (a health probe's numbers become a one-row tensor of
// the input datatype, FP32 when unset; New validates the rest).
func ConfigFrom(b config.Backend) (Config, error) {
	c := b.Clipper
	cfg := Config{Address: b.Address, App: b.Model, Timeout: b.Timeout.D(),
		Input: c.Input, InputDatatype: c.InputDatatype, Output: c.Output, OutputDatatype: c.OutputDatatype}
	if len(c.HealthProbe) > 0 {
		name := c.Input
		if name == "" {
			name = DefaultInput
		}
		dt := c.InputDatatype
		if dt == "" {
			dt = tensor.FP32
		}
		es := tensor.ElemSize(dt)
		data := make([]byte, 0, es*len(c.HealthProbe))
		for _, x := range c.HealthProbe {
			switch dt {
			case tensor.FP32:
				data = binary.LittleEndian.AppendUint32(data, math.Float32bits(float32(x)))
			case tensor.FP64:
				data = binary.LittleEndian.AppendUint64(data, math.Float64bits(x))
			case tensor.Int32, tensor.Int64:
				if x != math.Trunc(x) || (dt == tensor.Int32 && (x < math.MinInt32 || x > math.MaxInt32)) || math.Abs(x) > 1<<53 {
					return Config{}, fmt.Errorf("%w: health probe value %v is not an integer of input datatype %s", ErrConfig, x, dt)
				}
				if dt == tensor.Int32 {
					data = binary.LittleEndian.AppendUint32(data, uint32(int32(x)))
				} else {
					data = binary.LittleEndian.AppendUint64(data, uint64(int64(x)))
				}
			default:
				return Config{}, fmt.Errorf("%w: a health probe needs a numeric input datatype (FP32, FP64, INT32, INT64), not %q", ErrConfig, dt)
			}
		}
		cfg.HealthProbe = &hamsv1.Tensor{Name: name, Datatype: dt, Shape: []int64{1, int64(len(c.HealthProbe))}, Data: data}
	}
	return cfg, nil
}

// Backend drives one Clipper application.
type Backend struct {
	cfg        Config
	log        *slog.Logger
	predictURL string
	metricsURL string
	client     *http.Client
}

// New validates cfg and builds a Backend (no I/O).
func New(cfg Config) (*Backend, error) {
	if cfg.Address == "" {
		return nil, fmt.Errorf("%w: no address", ErrConfig)
	}
	if cfg.App == "" || strings.ContainsAny(cfg.App, "/?# ") {
		return nil, fmt.Errorf("%w: app name %q", ErrConfig, cfg.App)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("%w: negative timeout %v", ErrConfig, cfg.Timeout)
	}
	base := cfg.Address
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	u, err := url.Parse(base)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("%w: address %q is not host:port or an http(s) URL", ErrConfig, cfg.Address)
	}
	base = strings.TrimRight(u.String(), "/")
	if cfg.Input == "" {
		cfg.Input = DefaultInput
	}
	if cfg.Output == "" {
		cfg.Output = DefaultOutput
	}
	if cfg.OutputDatatype == "" {
		cfg.OutputDatatype = DefaultOutputDatatype
	}
	switch cfg.OutputDatatype {
	case tensor.FP32, tensor.FP64, tensor.Int32, tensor.Int64, tensor.Bytes:
	default:
		return nil, fmt.Errorf("%w: output datatype %q (FP32, FP64, INT32, INT64 or BYTES)", ErrConfig, cfg.OutputDatatype)
	}
	if cfg.InputDatatype != "" && tensor.ElemSize(cfg.InputDatatype) < 0 {
		return nil, fmt.Errorf("%w: input datatype %q", ErrConfig, cfg.InputDatatype)
	}
	if p := cfg.HealthProbe; p != nil {
		if err := tensor.Validate(p); err != nil || len(p.Shape) == 0 || p.Shape[0] != 1 {
			return nil, fmt.Errorf("%w: health probe must be a valid one-row tensor (%v)", ErrConfig, err)
		}
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.Client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		// A batch-1 request of 784 numbers is ~7-10 KB: with the
		// default 4 KiB buffer it leaves in two writes (and the server
		// may wake up twice), with this one in one.
		tr.WriteBufferSize = DefaultWriteBufferSize
		cfg.Client = &http.Client{Transport: tr}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Backend{
		cfg: cfg, log: cfg.Logger.With("component", "clipper", "app", cfg.App), client: cfg.Client,
		predictURL: base + "/" + url.PathEscape(cfg.App) + "/predict", metricsURL: base + "/metrics",
	}, nil
}

func (b *Backend) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	if b.cfg.Timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, b.cfg.Timeout)
}

// Describe declares the one input and the one output (Clipper has no
// metadata API; the shapes are open).
func (b *Backend) Describe(context.Context) (*hamsv1.ModelDescription, error) {
	return &hamsv1.ModelDescription{
		Name: b.cfg.App, Kind: Kind,
		Inputs:  []*hamsv1.TensorSpec{{Name: b.cfg.Input, Datatype: b.cfg.InputDatatype}},
		Outputs: []*hamsv1.TensorSpec{{Name: b.cfg.Output, Datatype: b.cfg.OutputDatatype}},
	}, nil
}

// Infer sends the batch's rows as one predict and builds the output tensor
// from the answers in row order.
func (b *Backend) Infer(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	in, err := b.inputOf(req.GetInputs())
	if err != nil {
		return nil, err
	}
	body, rows, err := encodeBody(in)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "clipper %s: input %q: %v", b.cfg.App, in.GetName(), err)
	}
	answers, err := b.predict(ctx, body, rows)
	if err != nil {
		return nil, err
	}
	out, err := b.outputOf(answers)
	if err != nil {
		return nil, err
	}
	resp := &hamsv1.BatchResponse{Outputs: []*hamsv1.Tensor{out}, BatchId: req.GetBatchId(), Rows: append([]uint32(nil), req.GetRows()...)}
	if len(resp.Rows) == 0 {
		resp.Rows = []uint32{uint32(rows)}
	}
	var sum int
	for _, r := range resp.Rows {
		sum += int(r)
	}
	if sum != rows {
		return nil, status.Errorf(codes.InvalidArgument, "clipper %s: rows per request sum to %d, input %q has %d rows", b.cfg.App, sum, in.GetName(), rows)
	}
	return resp, nil
}

func (b *Backend) inputOf(ins []*hamsv1.Tensor) (*hamsv1.Tensor, error) {
	var in *hamsv1.Tensor
	for _, t := range ins {
		if t.GetName() == b.cfg.Input {
			if in != nil {
				return nil, status.Errorf(codes.InvalidArgument, "clipper %s: input %q given twice", b.cfg.App, b.cfg.Input)
			}
			in = t
		}
	}
	if in == nil {
		return nil, status.Errorf(codes.InvalidArgument, "clipper %s: missing input %q (a Clipper app takes one input)", b.cfg.App, b.cfg.Input)
	}
	if err := tensor.Validate(in); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "clipper %s: %v", b.cfg.App, err)
	}
	if len(in.GetShape()) == 0 || in.GetShape()[0] == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "clipper %s: input %q: shape %v has no rows", b.cfg.App, in.GetName(), in.GetShape())
	}
	if dt := b.cfg.InputDatatype; dt != "" && in.GetDatatype() != dt {
		return nil, status.Errorf(codes.InvalidArgument, "clipper %s: input %q is %s, the app takes %s", b.cfg.App, in.GetName(), in.GetDatatype(), dt)
	}
	return in, nil
}

// answer is one query's result.
type answer struct {
	QueryID            *int64          `json:"query_id"`
	Output             json.RawMessage `json:"output"`
	Default            bool            `json:"default"`
	DefaultExplanation string          `json:"default_explanation"`
}

type batchAnswer struct {
	answer
	BatchPredictions []json.RawMessage `json:"batch_predictions"`
	Error            string            `json:"error"`
	Cause            string            `json:"cause"`
}

// predict posts body (encodeBody's, of rows rows) and returns one answer
// per row; a default output is an error.
func (b *Backend) predict(ctx context.Context, body []byte, rows int) ([]answer, error) {
	ctx, cancel := b.ctx(ctx)
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, b.predictURL, bytes.NewReader(body))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "clipper %s: %v", b.cfg.App, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	if calls := hamsmd.FromContext(ctx); len(calls) > 0 {
		hamsmd.SetHeaders(hreq.Header, calls, hamsmd.DefaultBudget)
	}
	data, err := b.do(hreq, "predict")
	if err != nil {
		return nil, err
	}
	var ba batchAnswer
	if err := decodeAnswer(data, &ba); err != nil {
		return nil, status.Errorf(codes.Internal, "clipper %s predict: answer is not JSON: %v (%s)", b.cfg.App, err, snippet(data))
	}
	if ba.Error != "" {
		return nil, status.Errorf(codes.Internal, "clipper %s predict: %s: %s", b.cfg.App, ba.Error, ba.Cause)
	}
	var answers []answer
	if ba.BatchPredictions != nil {
		answers = make([]answer, len(ba.BatchPredictions))
		for i, raw := range ba.BatchPredictions {
			// Clipper nests each query's answer as an object, or as a
			// string holding it when it could not nest it.
			if len(raw) > 0 && raw[0] == '"' {
				var s string
				if err := json.Unmarshal(raw, &s); err == nil {
					raw = json.RawMessage(s)
				}
			}
			if err := json.Unmarshal(raw, &answers[i]); err != nil {
				return nil, status.Errorf(codes.Internal, "clipper %s predict: batch answer %d: %v (%s)", b.cfg.App, i, err, snippet(raw))
			}
		}
	} else {
		answers = []answer{ba.answer}
	}
	if len(answers) != rows {
		return nil, status.Errorf(codes.Internal, "clipper %s predict: %d answers for %d rows", b.cfg.App, len(answers), rows)
	}
	for i, a := range answers {
		if a.Default {
			expl := a.DefaultExplanation
			if expl == "" {
				expl = "no explanation given"
			}
			return nil, &fallbackError{app: b.cfg.App, row: i, explanation: expl}
		}
		if a.Output == nil {
			return nil, status.Errorf(codes.Internal, "clipper %s predict: answer %d has no output", b.cfg.App, i)
		}
	}
	return answers, nil
}

// do runs an HTTP request and returns the body of a 2xx answer; anything
// else is a gRPC status.
func (b *Backend) do(hreq *http.Request, op string) ([]byte, error) {
	resp, err := b.client.Do(hreq)
	if err != nil {
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			return nil, status.Errorf(codes.DeadlineExceeded, "clipper %s %s: %v", b.cfg.App, op, err)
		case errors.Is(err, context.Canceled):
			return nil, status.Errorf(codes.Canceled, "clipper %s %s: %v", b.cfg.App, op, err)
		}
		return nil, status.Errorf(codes.Unavailable, "clipper %s %s: %v", b.cfg.App, op, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, b.cfg.MaxBodyBytes+1))
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(hreq.Context().Err(), context.DeadlineExceeded) {
			return nil, status.Errorf(codes.DeadlineExceeded, "clipper %s %s: reading the answer: %v", b.cfg.App, op, err)
		}
		return nil, status.Errorf(codes.Unavailable, "clipper %s %s: reading the answer: %v", b.cfg.App, op, err)
	}
	if int64(len(data)) > b.cfg.MaxBodyBytes {
		return nil, status.Errorf(codes.ResourceExhausted, "clipper %s %s: answer larger than %d bytes", b.cfg.App, op, b.cfg.MaxBodyBytes)
	}
	if resp.StatusCode/100 == 2 {
		return data, nil
	}
	msg := snippet(data)
	var e struct{ Error, Cause string }
	if json.Unmarshal(data, &e) == nil && (e.Error != "" || e.Cause != "") {
		msg = e.Error + ": " + e.Cause
	}
	code := HTTPCode(resp.StatusCode)
	if resp.StatusCode == http.StatusBadRequest && e.Error == queryProcessingError {
		// Clipper answers 400 for its own query processor's failures too
		// (PredictError): not the request's fault.
		code = codes.Internal
	}
	return nil, status.Errorf(code, "clipper %s %s: HTTP %d: %s", b.cfg.App, op, resp.StatusCode, msg)
}

// queryProcessingError is the error name of Clipper's answer to a
// PredictError of its query processor (query_frontend.hpp,
// PREDICTION_ERROR_NAME_QUERY_PROCESSING), sent with HTTP 400 although
// the request is not at fault; "Json error" and "Request error" are the
// request's.
const queryProcessingError = "Query processing error"

// HTTPCode maps an HTTP status to the gRPC code the sidecar sees (a 400
// "Query processing error" is Internal: see queryProcessingError).
func HTTPCode(s int) codes.Code {
	switch s {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return codes.InvalidArgument
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		return codes.NotFound
	case http.StatusRequestTimeout, http.StatusGatewayTimeout:
		return codes.DeadlineExceeded
	case http.StatusRequestEntityTooLarge, http.StatusTooManyRequests:
		return codes.ResourceExhausted
	case http.StatusNotImplemented:
		return codes.Unimplemented
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		return codes.Unavailable
	}
	switch {
	case s >= 500:
		return codes.Internal
	case s >= 400:
		return codes.FailedPrecondition
	}
	return codes.Unknown
}

func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// outputOf builds the output tensor from the answers in row order.
func (b *Backend) outputOf(answers []answer) (*hamsv1.Tensor, error) {
	n := len(answers)
	dt := b.cfg.OutputDatatype
	t := &hamsv1.Tensor{Name: b.cfg.Output, Datatype: dt}
	bad := func(i int, format string, args ...any) error {
		return status.Errorf(codes.Internal, "clipper %s: output of row %d: %s", b.cfg.App, i, fmt.Sprintf(format, args...))
	}
	if dt == tensor.Bytes {
		elems := make([][]byte, n)
		for i, a := range answers {
			var s string
			if json.Unmarshal(a.Output, &s) == nil {
				elems[i] = []byte(s)
			} else {
				elems[i] = []byte(a.Output)
			}
		}
		t.Shape, t.Data = []int64{int64(n)}, wire.JoinBytes(elems)
		return t, nil
	}
	width := -1 // -1: scalars
	var vals []float64
	for i, a := range answers {
		var w int
		var ok bool
		if vals, w, ok = fastNumbers(a.Output, vals); !ok {
			var row []float64
			if row, w, ok = slowNumbers(a.Output); !ok {
				return nil, bad(i, "%s is neither a number nor an array of numbers (configure output datatype BYTES for other outputs)", snippet(a.Output))
			}
			vals = append(vals, row...)
		}
		if i == 0 {
			width = w
		} else if w != width {
			return nil, bad(i, "shape differs from row 0 (%d vs %d values)", w, width)
		}
	}
	if width < 0 {
		t.Shape = []int64{int64(n)}
	} else {
		t.Shape = []int64{int64(n), int64(width)}
	}
	es := tensor.ElemSize(dt)
	t.Data = make([]byte, 0, len(vals)*es)
	for i, v := range vals {
		switch dt {
		case tensor.FP32:
			t.Data = binary.LittleEndian.AppendUint32(t.Data, math.Float32bits(float32(v)))
		case tensor.FP64:
			t.Data = binary.LittleEndian.AppendUint64(t.Data, math.Float64bits(v))
		case tensor.Int32:
			if v != math.Trunc(v) || v < math.MinInt32 || v > math.MaxInt32 {
				return nil, bad(i/max(width, 1), "%v is not an INT32", v)
			}
			t.Data = binary.LittleEndian.AppendUint32(t.Data, uint32(int32(v)))
		case tensor.Int64:
			if v != math.Trunc(v) || math.Abs(v) > 1<<53 {
				return nil, bad(i/max(width, 1), "%v is not an exact INT64", v)
			}
			t.Data = binary.LittleEndian.AppendUint64(t.Data, uint64(int64(v)))
		}
	}
	return t, nil
}

// slowNumbers reads an output with encoding/json: a number (w = -1) or an
// array of numbers, either possibly inside a JSON string (a model's string
// output that holds one).
func slowNumbers(raw json.RawMessage) (row []float64, w int, ok bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		raw = json.RawMessage(s)
	}
	var one float64
	if err := json.Unmarshal(raw, &one); err == nil {
		return []float64{one}, -1, true
	}
	if err := json.Unmarshal(raw, &row); err == nil {
		return row, len(row), true
	}
	return nil, 0, false
}

// Health checks the query frontend (GET /metrics) and, with a probe, that
// the app answers a prediction without falling back to its default.
func (b *Backend) Health(ctx context.Context) error {
	cctx, cancel := b.ctx(ctx)
	defer cancel()
	hreq, err := http.NewRequestWithContext(cctx, http.MethodGet, b.metricsURL, nil)
	if err != nil {
		return status.Errorf(codes.Internal, "clipper %s: %v", b.cfg.App, err)
	}
	if _, err := b.do(hreq, "health (GET /metrics)"); err != nil {
		return err
	}
	if b.cfg.HealthProbe == nil {
		return nil
	}
	body, rows, err := encodeBody(b.cfg.HealthProbe)
	if err != nil {
		return status.Errorf(codes.Internal, "clipper %s: health probe: %v", b.cfg.App, err)
	}
	_, err = b.predict(ctx, body, rows)
	if fe := (*fallbackError)(nil); errors.As(err, &fe) {
		// The probe proves the app answers: one that falls back cannot
		// serve, which is what Unavailable tells the sidecar.
		return status.Errorf(codes.Unavailable, "clipper %s: health probe: %s", b.cfg.App, fe.message())
	}
	return err
}

// fallbackError is an answer carrying the application's default output:
// Clipper gave up on the models for that query. It fails the batch with
// DeadlineExceeded when the models missed the app's latency SLO and
// FailedPrecondition otherwise (no model linked, ...): errors of that
// query, never Unavailable, which the sidecar reads as its model server
// being unreachable (it holds the batch and, after BackendLostAfter,
// stops so that the manager fails over, which cannot help a Clipper that
// is up and answering).
type fallbackError struct {
	app         string
	row         int
	explanation string
}

func (e *fallbackError) message() string {
	return fmt.Sprintf("row %d got the app's default output instead of a prediction: %s", e.row, e.explanation)
}

func (e *fallbackError) Error() string { return e.GRPCStatus().Message() }

// GRPCStatus makes status.Code and status.FromError see the code.
func (e *fallbackError) GRPCStatus() *status.Status {
	code := codes.FailedPrecondition
	if strings.Contains(strings.ToLower(e.explanation), "slo") || strings.Contains(strings.ToLower(e.explanation), "latency") {
		code = codes.DeadlineExceeded
	}
	return status.New(code, fmt.Sprintf("clipper %s: %s", e.app, e.message()))
}

// Close releases idle connections of the default client.
func (b *Backend) Close() error {
	if b.cfg.Client != nil {
		b.cfg.Client.CloseIdleConnections()
	}
	return nil
}
