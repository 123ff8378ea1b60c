package tfserving

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcretry"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// Signature conventions.
const (
	// DefaultSignature is the signature used when Config.Signature is empty.
	DefaultSignature = "serving_default"
	// StateInPrefix prefixes the signature inputs that carry the state a
	// batch starts from.
	StateInPrefix = "state/"
	// StateOutPrefix prefixes the signature outputs that carry the state
	// after the batch.
	StateOutPrefix = "state_next/"
	// StreamIDsInput is the optional BYTES [rows] input fed with each
	// row's stream id.
	StreamIDsInput = wire.StreamIDsInput
	// Kind is the ModelDescription kind of every model behind this adapter.
	Kind = "tfserving"
	// DefaultRetries is the number of attempts of an idempotent call.
	DefaultRetries = grpcretry.DefaultAttempts
)

// Sentinel errors.
var (
	// ErrConfig is wrapped by every error New returns for a bad Config.
	ErrConfig = errors.New("tfserving: invalid config")
	// ErrSignature is wrapped when the signature cannot be driven (unknown
	// dtype, a state input without its output, a state shape not fully
	// defined).
	ErrSignature = errors.New("tfserving: unusable signature")
)

// Config of a Backend.
type Config struct {
	// Model is the model name at TF Serving (required).
	Model string
	// Version selects the servable: "" the latest, an integer a version,
	// anything else a version label.
	Version string
	// Signature is the signature_name (default DefaultSignature).
	Signature string
	// Timeout bounds every call, retries included (0: only the caller's
	// context).
	Timeout time.Duration
	// Retries is the number of attempts of GetModelMetadata and
	// GetModelStatus on Unavailable (default DefaultRetries; 1 disables
	// retries). Predict is attempted once.
	Retries int
	// TypedInputs sends inputs in the typed *_val fields instead of
	// tensor_content (for servers or proxies that only read typed values).
	TypedInputs bool
	// InitialState, when set, is the state a stateful signature starts
	// from (one tensor per state tensor, named without "state/"); default
	// zeros. A signature whose state specs it does not match is refused.
	InitialState []*hamsv1.Tensor
	Logger       *slog.Logger
}

// ConfigFrom builds a Config from a deployment's model backend entry
// (Model, Version, Signature, Timeout).
func ConfigFrom(b config.Backend) Config {
	return Config{Model: b.Model, Version: b.Version, Signature: b.Signature, Timeout: b.Timeout.D(), TypedInputs: b.TypedInputs}
}

// Backend drives one TF Serving model. It implements sidecar.Backend and,
// for signatures with state tensors, sidecar.StatefulBackend.
type Backend struct {
	cfg   Config
	log   *slog.Logger
	pred  tfapis.PredictionServiceClient // Predict: no retries
	meta  tfapis.PredictionServiceClient // GetModelMetadata: retried
	stat  tfapis.ModelServiceClient      // GetModelStatus: retried
	spec  func() *tfapis.ModelSpec
	label string // "model[:version]" for messages

	// mu guards sig and the state buffers. Invariant: when sig has state,
	// cur holds one tensor per state spec, in spec order; next is non-nil
	// only between a Compute and its Update (or a WriteState).
	mu        sync.Mutex
	sig       *signature
	cur       []*hamsv1.Tensor
	curVer    uint64
	next      []*hamsv1.Tensor
	nextBatch uint64
	writes    uint64 // WriteState calls, so a Compute can tell its base state was replaced
}

// signature is the parsed signature_def.
type signature struct {
	inputs    []*hamsv1.TensorSpec // declared to the sidecar (no state, no stream ids)
	outputs   []*hamsv1.TensorSpec // declared to the sidecar (no state)
	state     []*hamsv1.TensorSpec // state tensors by bare name, sorted
	streamIDs bool                 // the signature takes hams_stream_ids
	stateSize uint64
}

// New builds a Backend over cc (owned by the caller; dial it with
// grpcx.Dial so large messages pass). It does no I/O.
func New(cc grpc.ClientConnInterface, cfg Config) (*Backend, error) {
	if cc == nil {
		return nil, fmt.Errorf("%w: no connection", ErrConfig)
	}
	if cfg.Model == "" {
		return nil, fmt.Errorf("%w: no model name", ErrConfig)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("%w: negative timeout %v", ErrConfig, cfg.Timeout)
	}
	if cfg.Signature == "" {
		cfg.Signature = DefaultSignature
	}
	if cfg.Retries == 0 {
		cfg.Retries = DefaultRetries
	}
	if cfg.Retries < 0 {
		return nil, fmt.Errorf("%w: negative retries %d", ErrConfig, cfg.Retries)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	b := &Backend{cfg: cfg, log: cfg.Logger.With("component", "tfserving", "backend_model", cfg.Model), label: cfg.Model}
	var version *int64
	if v := cfg.Version; v != "" {
		b.label += ":" + v
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			version = &n
		}
	}
	b.spec = func() *tfapis.ModelSpec {
		s := &tfapis.ModelSpec{Name: cfg.Model, SignatureName: cfg.Signature}
		switch {
		case version != nil:
			s.VersionChoice = &tfapis.ModelSpec_Version{Version: wrapperspb.Int64(*version)}
		case cfg.Version != "":
			s.VersionChoice = &tfapis.ModelSpec_VersionLabel{VersionLabel: cfg.Version}
		}
		return s
	}
	// GetModelMetadata and GetModelStatus are idempotent; Predict is not
	// named, so it is attempted once on any client.
	rc := grpcretry.Idempotent(cc, cfg.Retries, tfapis.PredictionService_GetModelMetadata_FullMethodName, tfapis.ModelService_GetModelStatus_FullMethodName)
	b.pred = tfapis.NewPredictionServiceClient(cc)
	b.meta = tfapis.NewPredictionServiceClient(rc)
	b.stat = tfapis.NewModelServiceClient(rc)
	return b, nil
}

func (b *Backend) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	if b.cfg.Timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, b.cfg.Timeout)
}

// mapErr keeps a gRPC status code and message, prefixed with what was
// attempted; context errors become their status codes.
func (b *Backend) mapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Errorf(codes.DeadlineExceeded, "tfserving %s %s: %v", b.label, op, err)
	case errors.Is(err, context.Canceled):
		return status.Errorf(codes.Canceled, "tfserving %s %s: %v", b.label, op, err)
	}
	st, ok := status.FromError(err)
	if !ok {
		return status.Errorf(codes.Unknown, "tfserving %s %s: %v", b.label, op, err)
	}
	return status.Errorf(st.Code(), "tfserving %s %s: %s", b.label, op, st.Message())
}

// Describe reads the signature and describes the model as the sidecar sees
// it: state tensors and the stream-id input are hidden.
func (b *Backend) Describe(ctx context.Context) (*hamsv1.ModelDescription, error) {
	sig, err := b.loadSignature(ctx)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	ver := b.curVer
	b.mu.Unlock()
	return &hamsv1.ModelDescription{
		Name: b.cfg.Model, Kind: Kind, Stateful: len(sig.state) > 0,
		Inputs: sig.inputs, Outputs: sig.outputs, StateBytes: sig.stateSize, StateVersion: ver,
	}, nil
}

// loadSignature fetches and parses the signature (every call, so a model
// reloaded with another signature is seen; the state buffers are kept
// when the state specs did not change, else reset to zeros).
func (b *Backend) loadSignature(ctx context.Context) (*signature, error) {
	ctx, cancel := b.ctx(ctx)
	defer cancel()
	// The answer holds every signature; the configured one is picked here.
	spec := b.spec()
	spec.SignatureName = ""
	resp, err := b.meta.GetModelMetadata(ctx, &tfapis.GetModelMetadataRequest{ModelSpec: spec, MetadataField: []string{"signature_def"}})
	if err != nil {
		return nil, b.mapErr("get model metadata", err)
	}
	anyv := resp.GetMetadata()["signature_def"]
	if anyv == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "tfserving %s get model metadata: no signature_def in the answer", b.label)
	}
	sigs := &tfapis.SignatureDefMap{}
	if err := anyv.UnmarshalTo(sigs); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "tfserving %s get model metadata: signature_def: %v", b.label, err)
	}
	def := sigs.GetSignatureDef()[b.cfg.Signature]
	if def == nil {
		names := make([]string, 0, len(sigs.GetSignatureDef()))
		for n := range sigs.GetSignatureDef() {
			names = append(names, n)
		}
		sort.Strings(names)
		return nil, status.Errorf(codes.NotFound, "tfserving %s: signature %q not found (has %v)", b.label, b.cfg.Signature, names)
	}
	sig, err := parseSignature(def)
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "tfserving %s signature %q: %v", b.label, b.cfg.Signature, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sig == nil || !sameSpecs(b.sig.state, sig.state) {
		init, err := b.initialState(sig.state)
		if err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "tfserving %s signature %q: %v", b.label, b.cfg.Signature, err)
		}
		if b.sig != nil {
			b.log.Info("state tensors of the signature changed; state reset to the initial state", "state", specNames(sig.state))
		}
		b.cur = init
		b.next = nil
	}
	b.sig = sig
	return sig, nil
}

// signatureOf returns the cached signature, loading it once.
func (b *Backend) signatureOf(ctx context.Context) (*signature, error) {
	b.mu.Lock()
	sig := b.sig
	b.mu.Unlock()
	if sig != nil {
		return sig, nil
	}
	return b.loadSignature(ctx)
}

func parseSignature(def *tfapis.SignatureDef) (*signature, error) {
	sig := &signature{}
	stateIn := map[string]*hamsv1.TensorSpec{}
	for _, k := range sortedKeys(def.GetInputs()) {
		sp, err := specOf(k, def.GetInputs()[k])
		if err != nil {
			return nil, fmt.Errorf("%w: input %w", ErrSignature, err)
		}
		switch {
		case k == StreamIDsInput:
			if sp.Datatype != tensor.Bytes {
				return nil, fmt.Errorf("%w: input %q must be DT_STRING, is %s", ErrSignature, k, sp.Datatype)
			}
			sig.streamIDs = true
		case strings.HasPrefix(k, StateInPrefix):
			sp.Name = strings.TrimPrefix(k, StateInPrefix)
			stateIn[sp.Name] = sp
		default:
			sig.inputs = append(sig.inputs, sp)
		}
	}
	stateOut := map[string]*hamsv1.TensorSpec{}
	for _, k := range sortedKeys(def.GetOutputs()) {
		sp, err := specOf(k, def.GetOutputs()[k])
		if err != nil {
			return nil, fmt.Errorf("%w: output %w", ErrSignature, err)
		}
		if strings.HasPrefix(k, StateOutPrefix) {
			sp.Name = strings.TrimPrefix(k, StateOutPrefix)
			stateOut[sp.Name] = sp
			continue
		}
		sig.outputs = append(sig.outputs, sp)
	}
	for _, n := range sortedKeys(stateIn) {
		in, out := stateIn[n], stateOut[n]
		if out == nil {
			return nil, fmt.Errorf("%w: state input %q has no output %q", ErrSignature, StateInPrefix+n, StateOutPrefix+n)
		}
		if in.Datatype != out.Datatype || !equalShape(in.Shape, out.Shape) {
			return nil, fmt.Errorf("%w: state %q: input is %s %v, output %s %v", ErrSignature, n, in.Datatype, in.Shape, out.Datatype, out.Shape)
		}
		es := tensor.ElemSize(in.Datatype)
		cnt, err := tensor.NumElements(in.Shape)
		if in.Shape == nil || err != nil || es <= 0 {
			return nil, fmt.Errorf("%w: state %q needs a fixed-size datatype and a fully defined shape, has %s %v", ErrSignature, n, in.Datatype, in.Shape)
		}
		sig.state = append(sig.state, in)
		sig.stateSize += uint64(cnt) * uint64(es)
	}
	for n := range stateOut {
		if stateIn[n] == nil {
			return nil, fmt.Errorf("%w: state output %q has no input %q", ErrSignature, StateOutPrefix+n, StateInPrefix+n)
		}
	}
	return sig, nil
}

// specOf converts a TensorInfo (unknown rank: nil shape, any rank).
func specOf(key string, ti *tfapis.TensorInfo) (*hamsv1.TensorSpec, error) {
	dt, ok := wire.KServeDatatype(ti.GetDtype())
	if !ok {
		return nil, fmt.Errorf("%q has dtype %v, which HAMS cannot carry", key, ti.GetDtype())
	}
	sp := &hamsv1.TensorSpec{Name: key, Datatype: dt}
	if s := ti.GetTensorShape(); s != nil && !s.GetUnknownRank() {
		sp.Shape = make([]int64, len(s.GetDim()))
		for i, d := range s.GetDim() {
			sp.Shape[i] = d.GetSize()
		}
	}
	return sp, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func equalShape(a, b []int64) bool {
	if (a == nil) != (b == nil) || len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func sameSpecs(a, b []*hamsv1.TensorSpec) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || a[i].Datatype != b[i].Datatype || !equalShape(a[i].Shape, b[i].Shape) {
			return false
		}
	}
	return true
}

func specNames(specs []*hamsv1.TensorSpec) []string {
	out := make([]string, len(specs))
	for i, s := range specs {
		out[i] = s.Name
	}
	return out
}

// initialState is Config.InitialState checked against specs (in spec
// order), or zeros.
func (b *Backend) initialState(specs []*hamsv1.TensorSpec) ([]*hamsv1.Tensor, error) {
	if b.cfg.InitialState == nil || len(specs) == 0 {
		// (A signature without state tensors has no state to start.)
		return zeroState(specs), nil
	}
	out := make([]*hamsv1.Tensor, len(specs))
	for i, sp := range specs {
		for _, t := range b.cfg.InitialState {
			if t.GetName() == sp.Name {
				out[i] = t
			}
		}
		t := out[i]
		if t == nil {
			return nil, fmt.Errorf("%w: no initial state for state tensor %q", ErrSignature, sp.Name)
		}
		if t.GetDatatype() != sp.Datatype || !equalShape(t.GetShape(), sp.Shape) || tensor.Validate(t) != nil {
			return nil, fmt.Errorf("%w: initial state %q is %s %v, the signature says %s %v", ErrSignature, sp.Name, t.GetDatatype(), t.GetShape(), sp.Datatype, sp.Shape)
		}
	}
	if len(b.cfg.InitialState) != len(specs) {
		return nil, fmt.Errorf("%w: %d initial state tensors for %d state tensors %v", ErrSignature, len(b.cfg.InitialState), len(specs), specNames(specs))
	}
	return out, nil
}

func zeroState(specs []*hamsv1.TensorSpec) []*hamsv1.Tensor {
	out := make([]*hamsv1.Tensor, len(specs))
	for i, s := range specs {
		n, _ := tensor.NumElements(s.Shape)
		out[i] = &hamsv1.Tensor{Name: s.Name, Datatype: s.Datatype, Shape: s.Shape, Data: make([]byte, int(n)*tensor.ElemSize(s.Datatype))}
	}
	return out
}

// predict runs one Predict with the batch's inputs (plus state and stream
// ids as the signature asks) and splits the answer into outputs (sorted by
// name) and next state (in state spec order).
func (b *Backend) predict(ctx context.Context, sig *signature, req *hamsv1.BatchRequest, state []*hamsv1.Tensor) (*hamsv1.BatchResponse, []*hamsv1.Tensor, error) {
	if len(req.GetInputs()) == 0 {
		return nil, nil, status.Errorf(codes.InvalidArgument, "tfserving %s predict: no input tensors", b.label)
	}
	preq := &tfapis.PredictRequest{ModelSpec: b.spec(), Inputs: make(map[string]*tfpb.TensorProto, len(req.GetInputs())+len(state)+1)}
	enc := wire.ToTensorProto
	if b.cfg.TypedInputs {
		enc = wire.ToTensorProtoTyped
	}
	var total int64 = -1
	for _, t := range req.GetInputs() {
		if _, dup := preq.Inputs[t.GetName()]; dup {
			return nil, nil, status.Errorf(codes.InvalidArgument, "tfserving %s predict: input %q given twice", b.label, t.GetName())
		}
		if t.GetName() == StreamIDsInput || strings.HasPrefix(t.GetName(), StateInPrefix) {
			return nil, nil, status.Errorf(codes.InvalidArgument, "tfserving %s predict: input %q is reserved for the adapter", b.label, t.GetName())
		}
		tp, err := enc(t)
		if err != nil {
			return nil, nil, status.Errorf(codes.InvalidArgument, "tfserving %s predict: %v", b.label, err)
		}
		preq.Inputs[t.GetName()] = tp
		if total < 0 && len(t.GetShape()) > 0 {
			total = t.GetShape()[0]
		}
	}
	for _, s := range state {
		tp, err := wire.ToTensorProto(s)
		if err != nil {
			return nil, nil, status.Errorf(codes.Internal, "tfserving %s predict: state: %v", b.label, err)
		}
		preq.Inputs[StateInPrefix+s.GetName()] = tp
	}
	if sig.streamIDs {
		ids, err := streamIDs(req)
		if err != nil {
			return nil, nil, status.Errorf(codes.InvalidArgument, "tfserving %s predict: %v", b.label, err)
		}
		preq.Inputs[StreamIDsInput] = ids
	}
	ctx, cancel := b.ctx(ctx)
	defer cancel()
	presp, err := b.pred.Predict(ctx, preq)
	if err != nil {
		return nil, nil, b.mapErr("predict", err)
	}
	resp := &hamsv1.BatchResponse{BatchId: req.GetBatchId(), Rows: append([]uint32(nil), req.GetRows()...)}
	if len(resp.Rows) == 0 && total >= 0 {
		resp.Rows = []uint32{uint32(total)}
	}
	var sum int64
	for _, r := range resp.Rows {
		sum += int64(r)
	}
	var next []*hamsv1.Tensor
	if len(sig.state) > 0 {
		next = make([]*hamsv1.Tensor, len(sig.state))
	}
	for _, k := range sortedKeys(presp.GetOutputs()) {
		tp := presp.GetOutputs()[k]
		if n, ok := strings.CutPrefix(k, StateOutPrefix); ok {
			i := specIndex(sig.state, n)
			if i < 0 {
				return nil, nil, status.Errorf(codes.Internal, "tfserving %s predict: output %q is not a state of the signature", b.label, k)
			}
			t, err := wire.FromTensorProto(n, tp)
			if err != nil {
				return nil, nil, status.Errorf(codes.Internal, "tfserving %s predict: answer: %v", b.label, err)
			}
			if sp := sig.state[i]; t.Datatype != sp.Datatype || !equalShape(t.Shape, sp.Shape) {
				return nil, nil, status.Errorf(codes.Internal, "tfserving %s predict: state %q came back %s %v, signature says %s %v", b.label, n, t.Datatype, t.Shape, sp.Datatype, sp.Shape)
			}
			next[i] = t
			continue
		}
		t, err := wire.FromTensorProto(k, tp)
		if err != nil {
			return nil, nil, status.Errorf(codes.Internal, "tfserving %s predict: answer: %v", b.label, err)
		}
		if len(resp.Rows) > 1 && (len(t.Shape) == 0 || t.Shape[0] != sum) {
			return nil, nil, status.Errorf(codes.Internal, "tfserving %s predict: output %q has shape %v, cannot split %d rows among %d requests", b.label, k, t.Shape, sum, len(resp.Rows))
		}
		resp.Outputs = append(resp.Outputs, t)
	}
	for i, t := range next {
		if t == nil {
			return nil, nil, status.Errorf(codes.Internal, "tfserving %s predict: answer has no %q", b.label, StateOutPrefix+sig.state[i].Name)
		}
	}
	return resp, next, nil
}

func specIndex(specs []*hamsv1.TensorSpec, name string) int {
	for i, s := range specs {
		if s.Name == name {
			return i
		}
	}
	return -1
}

// streamIDs is the BYTES [rows] tensor of every row's stream id.
func streamIDs(req *hamsv1.BatchRequest) (*tfpb.TensorProto, error) {
	if len(req.GetStreamIds()) != len(req.GetRows()) {
		return nil, fmt.Errorf("%d stream ids for %d requests", len(req.GetStreamIds()), len(req.GetRows()))
	}
	tp := &tfpb.TensorProto{Dtype: tfpb.DataType_DT_STRING}
	for i, r := range req.GetRows() {
		for range r {
			tp.StringVal = append(tp.StringVal, []byte(req.GetStreamIds()[i]))
		}
	}
	tp.TensorShape = wire.TFShape([]int64{int64(len(tp.StringVal))})
	return tp, nil
}

// InferRepeatable says that Infer may be repeated after a lost answer
// (the sidecar's RepeatableInfer): a stateful signature's state is the
// adapter's, sent with every Predict and installed here only after an
// answer; TF Serving keeps nothing between calls.
func (b *Backend) InferRepeatable() bool { return true }

// Infer runs one batch. For a stateful signature it is Compute followed by
// Update (bare mode: nothing is replicated).
func (b *Backend) Infer(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	sig, err := b.signatureOf(ctx)
	if err != nil {
		return nil, err
	}
	if len(sig.state) == 0 {
		resp, _, err := b.predict(ctx, sig, req, nil)
		return resp, err
	}
	resp, err := b.Compute(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp, b.Update(ctx, req.GetBatchId())
}

// Health is nil when TF Serving reports the model version AVAILABLE (any
// version when none is configured). TF Serving's GetModelStatus ignores a
// version label and answers every version, so a label is first resolved
// to its version with GetModelMetadata (whose answer names the version it
// used; an unknown label is TF Serving's InvalidArgument, reported as it
// is), and only that version's status counts.
func (b *Backend) Health(ctx context.Context) error {
	ctx, cancel := b.ctx(ctx)
	defer cancel()
	spec := b.spec()
	spec.SignatureName = ""
	var want *int64
	if l, ok := spec.GetVersionChoice().(*tfapis.ModelSpec_VersionLabel); ok {
		md, err := b.meta.GetModelMetadata(ctx, &tfapis.GetModelMetadataRequest{ModelSpec: spec, MetadataField: []string{"signature_def"}})
		if err != nil {
			return b.mapErr("resolve version label "+l.VersionLabel, err)
		}
		if v := md.GetModelSpec().GetVersion(); v != nil {
			want = &v.Value
		}
	}
	resp, err := b.stat.GetModelStatus(ctx, &tfapis.GetModelStatusRequest{ModelSpec: spec})
	if err != nil {
		return b.mapErr("get model status", err)
	}
	vs := resp.GetModelVersionStatus()
	if want != nil {
		var mine []*tfapis.ModelVersionStatus
		for _, v := range vs {
			if v.GetVersion() == *want {
				mine = append(mine, v)
			}
		}
		if len(mine) == 0 && len(vs) > 0 {
			return status.Errorf(codes.Unavailable, "tfserving %s: version %d (its label) is not among the loaded versions", b.label, *want)
		}
		vs = mine
	}
	if len(vs) == 0 {
		return status.Errorf(codes.Unavailable, "tfserving %s: no version loaded", b.label)
	}
	var states []string
	for _, v := range vs {
		if v.GetState() == tfapis.ModelVersionStatus_AVAILABLE && v.GetStatus().GetErrorCode() == 0 {
			return nil
		}
		s := fmt.Sprintf("version %d %s", v.GetVersion(), v.GetState())
		if st := v.GetStatus(); st.GetErrorCode() != 0 || st.GetErrorMessage() != "" {
			s += fmt.Sprintf(" (error %d: %s)", st.GetErrorCode(), st.GetErrorMessage())
		}
		states = append(states, s)
	}
	return status.Errorf(codes.Unavailable, "tfserving %s: not available: %s", b.label, strings.Join(states, "; "))
}

// Close releases nothing: the connection belongs to the caller.
func (b *Backend) Close() error { return nil }
