package models

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver/nn"
)

// Sentinel errors; the server maps them to gRPC codes.
var (
	// ErrInvalidInput: a malformed or missing input tensor (InvalidArgument).
	ErrInvalidInput = errors.New("models: invalid input")
	// ErrNotStaged: Update names a batch that is not the staged one
	// (FailedPrecondition).
	ErrNotStaged = errors.New("models: batch not staged")
	// ErrInvalidState: WriteState with data that does not fit the model
	// (InvalidArgument).
	ErrInvalidState = errors.New("models: invalid state")
	// ErrInvalidConfig: unknown kind or bad params.
	ErrInvalidConfig = errors.New("models: invalid config")
	// ErrStaleBase: a partial state write whose base version is not the
	// installed one (FailedPrecondition).
	ErrStaleBase = errors.New("models: partial state write on another base version")
	// ErrNoDelta: the model cannot stage or write state ranges
	// (Unimplemented).
	ErrNoDelta = errors.New("models: state ranges not supported")
)

// AnyInput as the only declared input name means every input tensor is
// accepted (the concat join).
const AnyInput = "*"

// Batch is one batch: tensors concatenated along dim 0, item i owning
// Rows[i] rows; StreamIDs has one entry per item (or none).
type Batch struct {
	Inputs    []*hamsv1.Tensor
	Rows      []uint32
	StreamIDs []string
	BatchID   uint64
	// StageDelta (Compute of a model whose Describe has StateDelta): also
	// return the staged state as the ranges Update will write.
	StageDelta bool
	// InstallID (Compute of a stateful model): install the state staged
	// by that batch first, as Update would, then compute on it.
	InstallID uint64
}

// Result of Compute / Infer.
type Result struct {
	Outputs []*hamsv1.Tensor
	// NextStateVersion is the version the staged state becomes on Update
	// (the installed version for stateless models).
	NextStateVersion uint64
	// Delta (Compute with StageDelta): the bytes Update will write, as
	// increasing, non-overlapping ranges of the concatenated state;
	// HasDelta tells an empty delta (nothing staged) from none.
	Delta    []Range
	HasDelta bool
}

// StateInfo is the header of a state: its version and its tensors (4-byte
// elements, FP32 or INT32 as specified, little-endian, concatenated in
// this order, TotalBytes in all).
type StateInfo struct {
	Version    uint64
	Tensors    []*hamsv1.TensorSpec
	TotalBytes uint64
}

// Model is one hosted model.
type Model interface {
	Describe() *hamsv1.ModelDescription
	// Compute runs the batch against the installed state and stages the
	// next state (replacing any staged, not yet installed one).
	Compute(b *Batch) (*Result, error)
	// Update installs the state staged by Compute of batchID. Repeating
	// the Update of the last installed batch is a no-op that succeeds.
	Update(batchID uint64) (uint64, error)
	// Infer is Compute + Update as one step.
	Infer(b *Batch) (*Result, error)
	// ReadState captures the installed state under the state lock, then
	// calls begin with its header and writes its bytes to the writer begin
	// returns. begin runs only once the state is captured: an Update
	// after begin was called does not change the bytes written (Updates
	// wait only for the capture, not for the transfer; Compute may run).
	ReadState(begin func(StateInfo) (io.Writer, error)) error
	// WriteState replaces the installed state with data (the tensors of
	// StateInfo in order) and sets its version; any staged state is
	// dropped.
	WriteState(version uint64, data []byte) (uint64, error)
	// WriteStateRanges patches ranges into the installed state if its
	// version is base (ErrStaleBase otherwise) and sets version; any
	// staged state is dropped. Models without StateDelta refuse it.
	WriteStateRanges(base, version uint64, ranges []Range) (uint64, error)
	// StateInfo is the installed state's header (no data).
	StateInfo() StateInfo
}

// kernel is a model's computation.
type kernel interface {
	// compute runs with the state lock held shared; staged is nil for
	// stateless kernels.
	compute(in *inputs) (outs []*hamsv1.Tensor, staged any, err error)
}

// stateKernel is a stateful kernel.
type stateKernel interface {
	kernel
	// install applies staged (exclusive lock held).
	install(staged any)
	stateSpecs() []*hamsv1.TensorSpec
	// writeTo writes the installed state (shared lock held).
	writeTo(w io.Writer) error
	// capture takes the installed state (shared lock held) for writing
	// later without the lock: later installs must not change what the
	// returned function writes (copy-on-write blocks, or a copy).
	capture() func(w io.Writer) error
	// load replaces the state from data of exactly stateBytes bytes
	// (exclusive lock held).
	load(data []byte) error
}

// inputs is a validated batch.
type inputs struct {
	b      *Batch
	n      int // total rows
	byName map[string]*hamsv1.Tensor
	f32    map[string][]float32
}

func (in *inputs) float(name string) []float32 { return in.f32[name] }

// streamOfRow returns the stream id of every row.
func (in *inputs) streamOfRow() []string {
	out := make([]string, 0, in.n)
	for i, r := range in.b.Rows {
		id := ""
		if i < len(in.b.StreamIDs) {
			id = in.b.StreamIDs[i]
		}
		for j := uint32(0); j < r; j++ {
			out = append(out, id)
		}
	}
	return out
}

type inputSpec struct {
	spec     *hamsv1.TensorSpec
	optional bool
}

// core implements Model around a kernel: validation, the compute/update
// split, versions and locking.
type core struct {
	name, kind string
	ins        []inputSpec
	outs       []*hamsv1.TensorSpec
	k          kernel
	sk         stateKernel // nil when stateless

	// stepMu serialises Compute/Update/WriteState of a stateful model and
	// guards the staged fields.
	stepMu    sync.Mutex
	staged    any
	stagedID  uint64
	hasStaged bool
	lastID    uint64
	// stMu guards the installed state and version.
	stMu    sync.RWMutex
	version uint64

	// updateHook, when set (tests), runs inside Update with the exclusive
	// lock held, before the state is installed.
	updateHook func()
}

func (c *core) Describe() *hamsv1.ModelDescription {
	d := &hamsv1.ModelDescription{Name: c.name, Kind: c.kind, Stateful: c.sk != nil, Outputs: c.outs}
	for _, s := range c.ins {
		d.Inputs = append(d.Inputs, s.spec)
	}
	if c.sk != nil {
		c.stMu.RLock()
		d.StateVersion = c.version
		c.stMu.RUnlock()
		d.StateBytes = specBytes(c.sk.stateSpecs())
		_, d.StateDelta = c.sk.(deltaKernel)
		d.ComputeInstalls = true
	}
	return d
}

func specBytes(specs []*hamsv1.TensorSpec) uint64 {
	var n uint64
	for _, s := range specs {
		e := uint64(4)
		for _, d := range s.Shape {
			e *= uint64(d)
		}
		n += e
	}
	return n
}

func (c *core) validate(b *Batch) (*inputs, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: nil batch", ErrInvalidInput)
	}
	in := &inputs{b: b, byName: map[string]*hamsv1.Tensor{}, f32: map[string][]float32{}}
	for _, t := range b.Inputs {
		if t == nil {
			return nil, fmt.Errorf("%w: nil input tensor", ErrInvalidInput)
		}
		if err := tensor.Validate(t); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidInput, err)
		}
		if len(t.Shape) == 0 {
			return nil, fmt.Errorf("%w: tensor %q: scalar input, want batch on dim 0", ErrInvalidInput, t.Name)
		}
		if _, dup := in.byName[t.Name]; !dup {
			in.byName[t.Name] = t
		}
	}
	if len(b.Inputs) == 0 {
		return nil, fmt.Errorf("%w: model %q: no input tensors", ErrInvalidInput, c.name)
	}
	total := 0
	for _, r := range b.Rows {
		total += int(r)
	}
	if len(b.Rows) == 0 {
		total = int(b.Inputs[0].Shape[0])
		b.Rows = []uint32{uint32(total)}
	}
	if len(b.StreamIDs) != 0 && len(b.StreamIDs) != len(b.Rows) {
		return nil, fmt.Errorf("%w: %d stream ids for %d items", ErrInvalidInput, len(b.StreamIDs), len(b.Rows))
	}
	in.n = total
	if total == 0 {
		return nil, fmt.Errorf("%w: empty batch", ErrInvalidInput)
	}
	any := len(c.ins) == 1 && c.ins[0].spec.Name == AnyInput
	if any {
		for _, t := range b.Inputs {
			if t.Shape[0] != int64(total) {
				return nil, fmt.Errorf("%w: tensor %q: %d rows, batch has %d", ErrInvalidInput, t.Name, t.Shape[0], total)
			}
		}
		return in, nil
	}
	for _, s := range c.ins {
		t := in.byName[s.spec.Name]
		if t == nil {
			if s.optional {
				continue
			}
			return nil, fmt.Errorf("%w: model %q: missing input %q", ErrInvalidInput, c.name, s.spec.Name)
		}
		if t.Datatype != s.spec.Datatype {
			return nil, fmt.Errorf("%w: tensor %q: datatype %s, want %s", ErrInvalidInput, t.Name, t.Datatype, s.spec.Datatype)
		}
		if len(t.Shape) != len(s.spec.Shape) {
			return nil, fmt.Errorf("%w: tensor %q: shape %v, want %v", ErrInvalidInput, t.Name, t.Shape, s.spec.Shape)
		}
		for d := 1; d < len(t.Shape); d++ {
			if s.spec.Shape[d] >= 0 && t.Shape[d] != s.spec.Shape[d] {
				return nil, fmt.Errorf("%w: tensor %q: shape %v, want %v", ErrInvalidInput, t.Name, t.Shape, s.spec.Shape)
			}
		}
		if t.Shape[0] != int64(total) {
			return nil, fmt.Errorf("%w: tensor %q: %d rows, items hold %d", ErrInvalidInput, t.Name, t.Shape[0], total)
		}
		if t.Datatype == tensor.FP32 {
			v, err := tensor.Float32(t)
			if err != nil {
				return nil, fmt.Errorf("%w: %v", ErrInvalidInput, err)
			}
			in.f32[t.Name] = v
		}
	}
	return in, nil
}

func (c *core) Compute(b *Batch) (*Result, error) {
	if c.sk == nil {
		return c.computeStateless(b)
	}
	c.stepMu.Lock()
	defer c.stepMu.Unlock()
	return c.computeLocked(b)
}

func (c *core) computeStateless(b *Batch) (*Result, error) {
	in, err := c.validate(b)
	if err != nil {
		return nil, err
	}
	outs, _, err := c.k.compute(in)
	if err != nil {
		return nil, err
	}
	return &Result{Outputs: outs}, nil
}

func (c *core) computeLocked(b *Batch) (*Result, error) {
	in, err := c.validate(b)
	if err != nil {
		return nil, err
	}
	// A valid batch only: a rejected one installs nothing. A repeat of
	// this very compute (its answer was lost: batch InstallID installed,
	// this batch staged) installs nothing again and stages the batch anew
	// from the same state; any other install of the batch installed last
	// while another batch is staged is an error (updateLocked).
	repeat := b.InstallID != 0 && b.InstallID == c.lastID && c.hasStaged && c.stagedID == b.BatchID
	if b.InstallID != 0 && !repeat {
		if _, err := c.updateLocked(b.InstallID); err != nil {
			return nil, err
		}
	}
	c.stMu.RLock()
	outs, staged, err := c.k.compute(in)
	v := c.version
	c.stMu.RUnlock()
	if err != nil {
		return nil, err
	}
	c.staged, c.stagedID, c.hasStaged = staged, b.BatchID, true
	r := &Result{Outputs: outs, NextStateVersion: v + 1}
	if b.StageDelta {
		dk, ok := c.sk.(deltaKernel)
		if !ok {
			return nil, fmt.Errorf("%w: model %q (%s)", ErrNoDelta, c.name, c.kind)
		}
		// staged is the kernel's own, not yet installed: reading it needs
		// no state lock.
		r.Delta, r.HasDelta = dk.delta(staged), true
	}
	return r, nil
}

func (c *core) Update(batchID uint64) (uint64, error) {
	if c.sk == nil {
		return 0, nil
	}
	c.stepMu.Lock()
	defer c.stepMu.Unlock()
	return c.updateLocked(batchID)
}

func (c *core) updateLocked(batchID uint64) (uint64, error) {
	if !c.hasStaged || c.stagedID != batchID {
		c.stMu.RLock()
		v := c.version
		c.stMu.RUnlock()
		if !c.hasStaged && v > 0 && batchID == c.lastID {
			return v, nil
		}
		if c.hasStaged {
			return 0, fmt.Errorf("%w: model %q: update of batch %d, staged batch is %d", ErrNotStaged, c.name, batchID, c.stagedID)
		}
		return 0, fmt.Errorf("%w: model %q: update of batch %d, nothing staged", ErrNotStaged, c.name, batchID)
	}
	c.stMu.Lock()
	if c.updateHook != nil {
		c.updateHook()
	}
	c.sk.install(c.staged)
	c.version++
	v := c.version
	c.stMu.Unlock()
	c.staged, c.hasStaged, c.lastID = nil, false, batchID
	return v, nil
}

func (c *core) Infer(b *Batch) (*Result, error) {
	if c.sk == nil {
		return c.computeStateless(b)
	}
	c.stepMu.Lock()
	defer c.stepMu.Unlock()
	r, err := c.computeLocked(b)
	if err != nil {
		return nil, err
	}
	v, err := c.updateLocked(b.BatchID)
	if err != nil {
		return nil, err
	}
	r.NextStateVersion = v
	return r, nil
}

func (c *core) ReadState(begin func(StateInfo) (io.Writer, error)) error {
	c.stMu.RLock()
	info := StateInfo{Version: c.version}
	var write func(io.Writer) error
	if c.sk != nil {
		info.Tensors = c.sk.stateSpecs()
		info.TotalBytes = specBytes(info.Tensors)
		write = c.sk.capture()
	}
	c.stMu.RUnlock()
	w, err := begin(info)
	if err != nil {
		return err
	}
	if write == nil {
		return nil
	}
	return write(w)
}

func (c *core) StateInfo() StateInfo {
	c.stMu.RLock()
	defer c.stMu.RUnlock()
	info := StateInfo{Version: c.version}
	if c.sk != nil {
		info.Tensors = c.sk.stateSpecs()
		info.TotalBytes = specBytes(info.Tensors)
	}
	return info
}

func (c *core) WriteState(version uint64, data []byte) (uint64, error) {
	if c.sk == nil {
		if len(data) != 0 {
			return 0, fmt.Errorf("%w: model %q is stateless, got %d state bytes", ErrInvalidState, c.name, len(data))
		}
		return 0, nil
	}
	want := specBytes(c.sk.stateSpecs())
	if uint64(len(data)) != want {
		return 0, fmt.Errorf("%w: model %q: %d state bytes, want %d", ErrInvalidState, c.name, len(data), want)
	}
	c.stepMu.Lock()
	defer c.stepMu.Unlock()
	c.stMu.Lock()
	defer c.stMu.Unlock()
	if err := c.sk.load(data); err != nil {
		return 0, fmt.Errorf("%w: model %q: %v", ErrInvalidState, c.name, err)
	}
	c.version = version
	c.staged, c.hasStaged = nil, false
	return version, nil
}

func (c *core) WriteStateRanges(base, version uint64, ranges []Range) (uint64, error) {
	dk, ok := c.sk.(deltaKernel)
	if c.sk == nil || !ok {
		return 0, fmt.Errorf("%w: model %q (%s)", ErrNoDelta, c.name, c.kind)
	}
	total := specBytes(c.sk.stateSpecs())
	for _, r := range ranges {
		if r.Off%4 != 0 || len(r.Data)%4 != 0 || r.Off > total || uint64(len(r.Data)) > total-r.Off {
			return 0, fmt.Errorf("%w: model %q: range of %d bytes at %d (state %d bytes, FP32 aligned)", ErrInvalidState, c.name, len(r.Data), r.Off, total)
		}
	}
	c.stepMu.Lock()
	defer c.stepMu.Unlock()
	c.stMu.Lock()
	defer c.stMu.Unlock()
	if c.version != base {
		return 0, fmt.Errorf("%w: model %q: base version %d, installed %d", ErrStaleBase, c.name, base, c.version)
	}
	if err := dk.patch(ranges); err != nil {
		return 0, fmt.Errorf("%w: model %q: %v", ErrInvalidState, c.name, err)
	}
	c.version = version
	c.staged, c.hasStaged = nil, false
	return version, nil
}

// SetUpdateHook installs a function Update calls with the state lock held
// exclusively, before installing (tests make updates slow with it). It
// returns false for models that are not built by this package.
func SetUpdateHook(m Model, f func()) bool {
	c, ok := m.(*core)
	if ok {
		c.updateHook = f
	}
	return ok
}

// StateTensors reads the installed state as named FP32 tensors.
func StateTensors(m Model) (uint64, []*hamsv1.Tensor, error) {
	var info StateInfo
	var buf bytesWriter
	err := m.ReadState(func(i StateInfo) (io.Writer, error) {
		info = i
		buf.b = make([]byte, 0, i.TotalBytes)
		return &buf, nil
	})
	if err != nil {
		return 0, nil, err
	}
	var out []*hamsv1.Tensor
	off := uint64(0)
	for _, s := range info.Tensors {
		n := uint64(4)
		for _, d := range s.Shape {
			n *= uint64(d)
		}
		out = append(out, &hamsv1.Tensor{Name: s.Name, Datatype: s.Datatype, Shape: s.Shape, Data: buf.b[off : off+n]})
		off += n
	}
	return info.Version, out, nil
}

type bytesWriter struct{ b []byte }

func (w *bytesWriter) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }

// builder makes a model of one kind.
type builder func(m *config.Model, p *params) (*core, error)

var kinds = map[string]builder{}

func register(kind string, b builder) { kinds[kind] = b }

// Kinds lists the model kinds, sorted.
func Kinds() []string {
	out := make([]string, 0, len(kinds))
	for k := range kinds {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// New builds the model m describes (kind and params).
func New(m *config.Model) (Model, error) {
	if m == nil {
		return nil, fmt.Errorf("%w: nil model", ErrInvalidConfig)
	}
	b, ok := kinds[m.Kind]
	if !ok {
		return nil, fmt.Errorf("%w: model %q: unknown kind %q (known: %v)", ErrInvalidConfig, m.Name, m.Kind, Kinds())
	}
	p := &params{m: m}
	c, err := b(m, p)
	if err == nil {
		err = p.err
	}
	if err != nil {
		return nil, fmt.Errorf("%w: model %q: %v", ErrInvalidConfig, m.Name, err)
	}
	c.name, c.kind = m.Name, m.Kind
	// A stateful kind hosted as stateless still keeps state; the config's
	// stateful flag is about replication, so it does not matter here.
	switch mode := p.str(ParamState, "internal"); {
	case p.err != nil:
		return nil, fmt.Errorf("%w: model %q: %v", ErrInvalidConfig, m.Name, p.err)
	case mode == "internal":
	case mode == "explicit":
		if c.sk == nil {
			return nil, fmt.Errorf("%w: model %q: state: explicit on kind %q, which has no state", ErrInvalidConfig, m.Name, m.Kind)
		}
		e, err := newExplicit(c)
		if err != nil {
			return nil, fmt.Errorf("%w: model %q: %v", ErrInvalidConfig, m.Name, err)
		}
		return e, nil
	default:
		return nil, fmt.Errorf("%w: model %q: param state=%q, want internal or explicit", ErrInvalidConfig, m.Name, mode)
	}
	return c, nil
}

// params reads config params, collecting the first error.
type params struct {
	m   *config.Model
	err error
}

func (p *params) int(key string, def, lo, hi int) int {
	v, err := p.m.ParamInt(key, def)
	if err != nil && p.err == nil {
		p.err = err
	}
	if err == nil && (v < lo || v > hi) && p.err == nil {
		p.err = fmt.Errorf("param %s=%d out of range %d..%d", key, v, lo, hi)
	}
	return v
}

func (p *params) float(key string, def, lo, hi float64) float64 {
	v, err := p.m.ParamFloat(key, def)
	if err != nil && p.err == nil {
		p.err = err
	}
	if err == nil && (v < lo || v > hi) && p.err == nil {
		p.err = fmt.Errorf("param %s=%g out of range %g..%g", key, v, lo, hi)
	}
	return v
}

func (p *params) str(key, def string) string {
	v, err := p.m.ParamString(key, def)
	if err != nil && p.err == nil {
		p.err = err
	}
	return v
}

// reducer returns the reducer the params ask for: deterministic: 1 makes
// products bit-exact; chunks sets the max number of parallel chunks.
func (p *params) reducer() *nn.Reducer {
	det := p.int("deterministic", 0, 0, 1)
	ch := p.int("chunks", 4, 1, 64)
	return &nn.Reducer{Deterministic: det == 1, MaxChunks: ch}
}

func fp32Spec(name string, dims ...int64) *hamsv1.TensorSpec {
	return &hamsv1.TensorSpec{Name: name, Datatype: tensor.FP32, Shape: append([]int64{-1}, dims...)}
}

func stateSpec(name string, dims ...int64) *hamsv1.TensorSpec {
	return &hamsv1.TensorSpec{Name: name, Datatype: tensor.FP32, Shape: dims}
}

func out32(name string, n, w int, v []float32) *hamsv1.Tensor {
	return tensor.FromFloat32(name, []int64{int64(n), int64(w)}, v)
}
