package models

import (
	"fmt"
	"io"
	"sync"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Explicit-state serving (param `state: explicit` on a stateful kind).
//
// The model is stateless from the server's point of view: every state
// tensor s of the kind (lstm: h, c; olearn: w1, b1, w2, b2) is an extra
// input s+StateIn (the state the batch starts from, its full fixed shape,
// no batch dimension) and an extra output s+StateOut (the state after the
// batch, same shape). The server keeps nothing between calls, so whoever
// calls it owns the state (adapters/triton keeps it in double-buffered
// shared memory). Given the same state and batch it computes exactly what
// the internal-state model computes (bit for bit with deterministic: 1).
const (
	StateIn  = "_in"
	StateOut = "_out"
	// ParamState selects internal (default) or explicit state.
	ParamState = "state"
)

// explicitModel serves a stateful kernel with its state as tensors.
type explicitModel struct {
	c      *core
	states []*hamsv1.TensorSpec
	ins    []*hamsv1.TensorSpec // batch inputs + state inputs
	outs   []*hamsv1.TensorSpec // batch outputs + state outputs
	// mu serialises calls: the kernel's state fields are scratch space,
	// loaded from the request's state inputs for each call.
	mu sync.Mutex
}

func newExplicit(c *core) (*explicitModel, error) {
	e := &explicitModel{c: c, states: c.sk.stateSpecs()}
	taken := map[string]bool{}
	for _, s := range c.ins {
		e.ins = append(e.ins, s.spec)
		taken[s.spec.Name] = true
	}
	for _, s := range c.outs {
		e.outs = append(e.outs, s)
		taken[s.Name] = true
	}
	for _, s := range e.states {
		in := &hamsv1.TensorSpec{Name: s.Name + StateIn, Datatype: s.Datatype, Shape: s.Shape}
		out := &hamsv1.TensorSpec{Name: s.Name + StateOut, Datatype: s.Datatype, Shape: s.Shape}
		for _, n := range []string{in.Name, out.Name} {
			if taken[n] {
				return nil, fmt.Errorf("state tensor name %q collides with an input or output of the model", n)
			}
			taken[n] = true
		}
		e.ins = append(e.ins, in)
		e.outs = append(e.outs, out)
	}
	return e, nil
}

func (e *explicitModel) Describe() *hamsv1.ModelDescription {
	return &hamsv1.ModelDescription{Name: e.c.name, Kind: e.c.kind, Inputs: e.ins, Outputs: e.outs}
}

// split separates the state inputs (checked against their specs and
// concatenated in state order) from the batch inputs.
func (e *explicitModel) split(b *Batch) (*Batch, []byte, error) {
	if b == nil {
		return nil, nil, fmt.Errorf("%w: nil batch", ErrInvalidInput)
	}
	byName := map[string]*hamsv1.Tensor{}
	rest := &Batch{Rows: b.Rows, StreamIDs: b.StreamIDs, BatchID: b.BatchID}
	isState := map[string]bool{}
	for _, s := range e.states {
		isState[s.Name+StateIn] = true
	}
	for _, t := range b.Inputs {
		if t == nil {
			return nil, nil, fmt.Errorf("%w: nil input tensor", ErrInvalidInput)
		}
		if isState[t.Name] {
			if byName[t.Name] != nil {
				return nil, nil, fmt.Errorf("%w: model %q: state input %q given twice", ErrInvalidInput, e.c.name, t.Name)
			}
			byName[t.Name] = t
			continue
		}
		rest.Inputs = append(rest.Inputs, t)
	}
	state := make([]byte, 0, specBytes(e.states))
	for _, s := range e.states {
		name := s.Name + StateIn
		t := byName[name]
		if t == nil {
			return nil, nil, fmt.Errorf("%w: model %q: missing state input %q", ErrInvalidInput, e.c.name, name)
		}
		if err := tensor.Validate(t); err != nil {
			return nil, nil, fmt.Errorf("%w: %v", ErrInvalidInput, err)
		}
		if t.Datatype != s.Datatype || !sameShape(t.Shape, s.Shape) {
			return nil, nil, fmt.Errorf("%w: state input %q: %s %v, want %s %v", ErrInvalidInput, name, t.Datatype, t.Shape, s.Datatype, s.Shape)
		}
		state = append(state, t.Data...)
	}
	return rest, state, nil
}

func sameShape(a, b []int64) bool {
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

// Infer loads the given state, runs the batch, installs its staged state
// and returns the outputs followed by the state outputs.
func (e *explicitModel) Infer(b *Batch) (*Result, error) {
	rest, state, err := e.split(b)
	if err != nil {
		return nil, err
	}
	in, err := e.c.validate(rest)
	if err != nil {
		return nil, err
	}
	b.Rows = rest.Rows
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.c.sk.load(state); err != nil {
		return nil, fmt.Errorf("%w: model %q: %v", ErrInvalidInput, e.c.name, err)
	}
	outs, staged, err := e.c.k.compute(in)
	if err != nil {
		return nil, err
	}
	e.c.sk.install(staged)
	var buf bytesWriter
	buf.b = make([]byte, 0, len(state))
	if err := e.c.sk.writeTo(&buf); err != nil {
		return nil, fmt.Errorf("model %q: write state: %w", e.c.name, err)
	}
	off := 0
	for _, s := range e.states {
		n := int(specBytes([]*hamsv1.TensorSpec{s}))
		outs = append(outs, &hamsv1.Tensor{Name: s.Name + StateOut, Datatype: s.Datatype, Shape: s.Shape, Data: buf.b[off : off+n : off+n]})
		off += n
	}
	return &Result{Outputs: outs}, nil
}

// Compute is Infer: the server keeps no state to stage.
func (e *explicitModel) Compute(b *Batch) (*Result, error) { return e.Infer(b) }

// Update is a no-op: nothing is staged.
func (e *explicitModel) Update(uint64) (uint64, error) { return 0, nil }

// ReadState reports an empty state: the state lives with the caller.
func (e *explicitModel) ReadState(begin func(StateInfo) (io.Writer, error)) error {
	_, err := begin(StateInfo{})
	return err
}

func (e *explicitModel) WriteState(_ uint64, data []byte) (uint64, error) {
	if len(data) != 0 {
		return 0, fmt.Errorf("%w: model %q serves its state explicitly (inputs *%s), got %d state bytes", ErrInvalidState, e.c.name, StateIn, len(data))
	}
	return 0, nil
}

// WriteStateRanges: the caller owns an explicit model's state.
func (e *explicitModel) WriteStateRanges(_, _ uint64, _ []Range) (uint64, error) {
	return 0, fmt.Errorf("%w: model %q serves its state explicitly (inputs *%s)", ErrNoDelta, e.c.name, StateIn)
}

func (e *explicitModel) StateInfo() StateInfo { return StateInfo{} }

// perStreamKernel is implemented by kernels that key state by stream id.
type perStreamKernel interface{ perStream() }

func (k *lstm) perStream() {}

// PerStream reports whether m keys its state by stream id (so a request
// may carry one stream id per row).
func PerStream(m Model) bool {
	var k kernel
	switch c := m.(type) {
	case *core:
		k = c.k
	case *explicitModel:
		k = c.c.k
	}
	_, ok := k.(perStreamKernel)
	return ok
}

// Explicit reports whether m serves its state as tensors, and the specs of
// its state tensors (inputs s+StateIn, outputs s+StateOut).
func Explicit(m Model) ([]*hamsv1.TensorSpec, bool) {
	if e, ok := m.(*explicitModel); ok {
		return e.states, true
	}
	return nil, false
}

// InitialState builds a model of m's kind and params with internal state
// and returns its initial state tensors (for seeding the state of an
// explicit-state deployment of m: zeros for lstm, the seeded weights for
// olearn).
func InitialState(m *config.Model) ([]*hamsv1.Tensor, error) {
	if m == nil {
		return nil, fmt.Errorf("%w: nil model", ErrInvalidConfig)
	}
	cp := *m
	cp.Params = map[string]any{}
	for k, v := range m.Params {
		cp.Params[k] = v
	}
	delete(cp.Params, ParamState)
	mm, err := New(&cp)
	if err != nil {
		return nil, err
	}
	_, ts, err := StateTensors(mm)
	return ts, err
}
