package triton

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/cuda"
	"github.com/hams-go/hams/internal/shm"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
)

// instances numbers the Stateful backends of this process, so two of them
// (a primary and a backup in one test process) never share a key.
var instances atomic.Uint64

// stateBuf is one state tensor's pair of regions.
type stateBuf struct {
	spec  *hamsv1.TensorSpec
	bytes int
	names [2]string // registered region names (system memory: the shm key without '/')
	regs  [2]region
}

func (s *stateBuf) region(i int) string { return s.names[i] }

// Stateful drives a model serving its state as explicit tensors, the state
// double-buffered in shared memory owned by the adapter: system shared
// memory or CUDA device memory (StateMemory); the double-buffer, flip and
// ordering logic below is the same for both, only the region (statemem.go)
// differs.
//
// Ordering obligation (paper IV-B): ReadState copies the current region
// while the next batch computes into the other one. Update flips the two,
// after which the next Compute writes the region a copy may still be
// reading, so Update n+1 must not run before the copy of state n ends.
// The sidecar's pipeline orders it so; Update also enforces it by taking
// the flip lock exclusively, which waits for copies in flight.
type Stateful struct {
	*Backend

	setupMu sync.Mutex
	ready   bool
	closed  bool
	mem     memory
	bufs    []*stateBuf
	batch   func(string) bool // true for names the sidecar does not see

	// stepMu serialises Compute, Update and WriteState (the sidecar calls
	// them one at a time; the lock makes the invariants local).
	stepMu   sync.Mutex
	staged   bool
	stagedID uint64
	lastID   uint64
	hasLast  bool
	// flipMu guards cur and version: shared by ReadState (the copy) and
	// Compute (reading cur), exclusive for the flip and WriteState.
	flipMu  sync.RWMutex
	cur     int
	version uint64
	// released is set by Close once the regions are freed (written
	// holding stepMu and flipMu, so either lock reads it): a call that
	// passed setup before Close must not touch them.
	released bool
}

// NewStateful validates cfg and the options and returns a Stateful
// backend; it does no I/O (a CUDA device is opened by Setup). Regions are
// created and registered on first use (or by Setup).
func NewStateful(cfg Config, opts ...StatefulOption) (*Stateful, error) {
	b, err := New(cfg)
	if err != nil {
		return nil, err
	}
	for _, t := range cfg.InitialState {
		if err := tensor.Validate(t); err != nil {
			return nil, fmt.Errorf("%w: initial state: %v", ErrConfig, err)
		}
	}
	var o statefulOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.mem.validate(); err != nil {
		return nil, err
	}
	return &Stateful{Backend: b, mem: newMemory(o.mem, b.cl)}, nil
}

// StateMemory is where the state buffers live: "system" or "cuda".
func (s *Stateful) StateMemory() string { return s.mem.kind() }

// Setup reads the model's metadata, finds its state tensors, creates the
// two regions of each (seeded with InitialState or zeros) and registers
// them. It is idempotent; a failed Setup leaves nothing behind and may be
// retried. With CUDA state memory and no usable driver or device it fails
// with FailedPrecondition naming why; it never falls back to system
// memory.
func (s *Stateful) Setup(ctx context.Context) error {
	s.setupMu.Lock()
	defer s.setupMu.Unlock()
	if s.closed {
		return s.errClosed()
	}
	if s.ready {
		return nil
	}
	md, err := s.metadata(ctx)
	if err != nil {
		return err
	}
	stateSpecs, err := s.findState(md)
	if err != nil {
		return err
	}
	if err := s.mem.open(); err != nil {
		code := codes.Internal
		if errors.Is(err, cuda.ErrUnavailable) || errors.Is(err, cuda.ErrNoDevice) {
			code = codes.FailedPrecondition
		}
		return status.Errorf(code, "triton %s: state memory %s: %v", s.cfg.Model, s.mem.describe(), err)
	}
	n := instances.Add(1)
	var bufs []*stateBuf
	fail := func(err error) error {
		s.release(bufs)
		_ = s.mem.close()
		return err
	}
	for _, sp := range stateSpecs {
		size := int(specBytes(sp))
		sb := &stateBuf{spec: sp, bytes: size}
		bufs = append(bufs, sb)
		for i, ab := range []string{"A", "B"} {
			sb.names[i] = fmt.Sprintf("%s_%s_%d_%d_%s_%s", s.cfg.KeyPrefix, shm.KeyPart(s.cfg.Model), os.Getpid(), n, shm.KeyPart(sp.Name), ab)
			r, err := s.mem.alloc(sb.names[i], size)
			if err != nil {
				return fail(status.Errorf(codes.Internal, "triton %s: state %q in %s memory: %v", s.cfg.Model, sp.Name, s.mem.kind(), err))
			}
			sb.regs[i] = r
		}
	}
	if err := s.seed(bufs); err != nil {
		return fail(err)
	}
	var registered []string
	for _, sb := range bufs {
		for i := range 2 {
			if err := s.register(ctx, sb, i); err != nil {
				// The server must drop its mappings before the memory
				// is freed (a CUDA mapping of freed memory is stale).
				cctx, cancel := s.ctx(ctx)
				for _, name := range registered {
					_ = s.mem.unregister(cctx, name)
				}
				cancel()
				return fail(err)
			}
			registered = append(registered, sb.region(i))
		}
	}
	s.bufs, s.cur, s.ready = bufs, 0, true
	s.batch = func(name string) bool {
		if name == wire.StreamIDsInput {
			return true
		}
		for _, sb := range bufs {
			if name == sb.spec.Name+wire.StateInSuffix || name == sb.spec.Name+wire.StateOutSuffix {
				return true
			}
		}
		return false
	}
	s.log.Info("state regions registered", "memory", s.mem.describe(), "tensors", len(bufs), "bytes", totalBytes(bufs))
	return nil
}

func (s *Stateful) errClosed() error {
	return status.Errorf(codes.FailedPrecondition, "triton %s: backend closed", s.cfg.Model)
}

func (s *Stateful) register(ctx context.Context, sb *stateBuf, i int) error {
	name := sb.region(i)
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	err := s.mem.register(cctx, name, sb.regs[i], sb.bytes)
	if status.Code(err) == codes.AlreadyExists {
		// a stale registration of this name (our pid and number): replace it
		_ = s.mem.unregister(cctx, name)
		err = s.mem.register(cctx, name, sb.regs[i], sb.bytes)
	}
	return s.mapErr("register "+s.mem.kind()+" shared memory "+name, err)
}

func totalBytes(bufs []*stateBuf) int {
	n := 0
	for _, b := range bufs {
		n += b.bytes
	}
	return n
}

func specBytes(sp *hamsv1.TensorSpec) int64 {
	n, _ := tensor.NumElements(sp.GetShape())
	return n * int64(tensor.ElemSize(sp.GetDatatype()))
}

// findState picks the state tensors: the configured names, or every s with
// an input s_in and an output s_out of the same fixed datatype and shape.
func (s *Stateful) findState(md *inference.ModelMetadataResponse) ([]*hamsv1.TensorSpec, error) {
	ins := map[string]*inference.ModelMetadataResponse_TensorMetadata{}
	for _, in := range md.GetInputs() {
		ins[in.GetName()] = in
	}
	outs := map[string]*inference.ModelMetadataResponse_TensorMetadata{}
	for _, o := range md.GetOutputs() {
		outs[o.GetName()] = o
	}
	names := s.cfg.StateTensors
	auto := len(names) == 0
	if auto {
		for _, in := range md.GetInputs() {
			if base, ok := strings.CutSuffix(in.GetName(), wire.StateInSuffix); ok && outs[base+wire.StateOutSuffix] != nil {
				names = append(names, base)
			}
		}
	}
	if len(names) == 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "triton %s: the model has no explicit state tensors (input s%s with output s%s); Triton's implicit sequence state cannot be read or restored (triton#7119), so it cannot be replicated", s.cfg.Model, wire.StateInSuffix, wire.StateOutSuffix)
	}
	var out []*hamsv1.TensorSpec
	for _, n := range names {
		in, o := ins[n+wire.StateInSuffix], outs[n+wire.StateOutSuffix]
		if in == nil || o == nil {
			return nil, status.Errorf(codes.FailedPrecondition, "triton %s: state tensor %q needs input %q and output %q", s.cfg.Model, n, n+wire.StateInSuffix, n+wire.StateOutSuffix)
		}
		if in.GetDatatype() != o.GetDatatype() || fmt.Sprint(in.GetShape()) != fmt.Sprint(o.GetShape()) {
			return nil, status.Errorf(codes.FailedPrecondition, "triton %s: state %q: input is %s %v, output %s %v", s.cfg.Model, n, in.GetDatatype(), in.GetShape(), o.GetDatatype(), o.GetShape())
		}
		if es := tensor.ElemSize(in.GetDatatype()); es <= 0 {
			return nil, status.Errorf(codes.FailedPrecondition, "triton %s: state %q: datatype %s has no fixed size", s.cfg.Model, n, in.GetDatatype())
		}
		for _, d := range in.GetShape() {
			if d < 0 {
				return nil, status.Errorf(codes.FailedPrecondition, "triton %s: state %q: shape %v is not fixed", s.cfg.Model, n, in.GetShape())
			}
		}
		out = append(out, &hamsv1.TensorSpec{Name: n, Datatype: in.GetDatatype(), Shape: in.GetShape()})
	}
	return out, nil
}

// seed writes InitialState into region A of each state tensor.
func (s *Stateful) seed(bufs []*stateBuf) error {
	init := s.cfg.InitialState
	if init == nil {
		return nil
	}
	if err := checkState(bufs, init); err != nil {
		return status.Errorf(codes.FailedPrecondition, "triton %s: initial state: %v", s.cfg.Model, err)
	}
	for i, sb := range bufs {
		if err := sb.regs[0].write(init[i].GetData()); err != nil {
			return status.Errorf(codes.Internal, "triton %s: initial state %q: %v", s.cfg.Model, sb.spec.Name, err)
		}
	}
	return nil
}

// checkState checks tensors against the state specs, in order.
func checkState(bufs []*stateBuf, ts []*hamsv1.Tensor) error {
	if len(ts) != len(bufs) {
		return fmt.Errorf("%d state tensors, the model has %d", len(ts), len(bufs))
	}
	for i, sb := range bufs {
		t := ts[i]
		if t.GetName() != sb.spec.Name || t.GetDatatype() != sb.spec.Datatype || fmt.Sprint(t.GetShape()) != fmt.Sprint(sb.spec.Shape) {
			return fmt.Errorf("state tensor %d is %q %s %v, want %q %s %v", i, t.GetName(), t.GetDatatype(), t.GetShape(), sb.spec.Name, sb.spec.Datatype, sb.spec.Shape)
		}
		if len(t.GetData()) != sb.bytes {
			return fmt.Errorf("state tensor %q: %d bytes, want %d", t.GetName(), len(t.GetData()), sb.bytes)
		}
	}
	return nil
}

// release frees the regions of bufs (system: unmap and unlink; CUDA:
// free). Registrations are dropped before, by Close (or never made, in a
// failed Setup).
func (s *Stateful) release(bufs []*stateBuf) {
	for _, sb := range bufs {
		for i := range 2 {
			if sb.regs[i] != nil {
				if err := sb.regs[i].free(); err != nil {
					s.log.Warn("state region not freed", "region", sb.region(i), "err", err)
				}
			}
		}
	}
}

func (s *Stateful) setup(ctx context.Context) error {
	s.setupMu.Lock()
	ok := s.ready
	s.setupMu.Unlock()
	if ok {
		return nil
	}
	return s.Setup(ctx)
}

// Describe is the model's description less the state tensors (which the
// adapter supplies): stateful, with its state size and installed version.
func (s *Stateful) Describe(ctx context.Context) (*hamsv1.ModelDescription, error) {
	if err := s.setup(ctx); err != nil {
		return nil, err
	}
	md, err := s.metadata(ctx)
	if err != nil {
		return nil, err
	}
	d := s.describe(md, s.batch)
	d.Stateful = true
	d.StateBytes = uint64(totalBytes(s.bufs))
	s.flipMu.RLock()
	d.StateVersion = s.version
	s.flipMu.RUnlock()
	return d, nil
}

// Compute runs the batch from the current state regions; the model writes
// the next state into the other regions, which Update installs.
func (s *Stateful) Compute(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	if err := s.setup(ctx); err != nil {
		return nil, err
	}
	s.stepMu.Lock()
	defer s.stepMu.Unlock()
	return s.computeLocked(ctx, req)
}

func (s *Stateful) computeLocked(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	if s.released {
		return nil, s.errClosed()
	}
	r, err := s.request(ctx, req)
	if err != nil {
		return nil, err
	}
	md, err := s.metadata(ctx)
	if err != nil {
		return nil, err
	}
	// cur changes only under stepMu (held), so it is stable here.
	s.flipMu.RLock()
	cur, v := s.cur, s.version
	s.flipMu.RUnlock()
	for _, sb := range s.bufs {
		r.Inputs = append(r.Inputs, &inference.ModelInferRequest_InferInputTensor{Name: sb.spec.Name + wire.StateInSuffix,
			Datatype: sb.spec.Datatype, Shape: sb.spec.Shape, Parameters: wire.ShmParams(sb.region(cur), 0, int64(sb.bytes))})
		// No raw_input_contents entry: Triton reads them only for inputs
		// with neither a region nor typed contents.
	}
	for _, o := range md.GetOutputs() {
		if !s.batch(o.GetName()) {
			r.Outputs = append(r.Outputs, &inference.ModelInferRequest_InferRequestedOutputTensor{Name: o.GetName()})
		}
	}
	for _, sb := range s.bufs {
		r.Outputs = append(r.Outputs, &inference.ModelInferRequest_InferRequestedOutputTensor{Name: sb.spec.Name + wire.StateOutSuffix,
			Parameters: wire.ShmParams(sb.region(1-cur), 0, int64(sb.bytes))})
	}
	s.staged = false
	resp, err := s.infer(ctx, r)
	if err != nil {
		return nil, err
	}
	out, err := s.response(req, r, resp)
	if err != nil {
		return nil, err
	}
	s.staged, s.stagedID = true, req.GetBatchId()
	out.NextStateVersion = v + 1
	return out, nil
}

// infer is Compute's ModelInfer. A server that no longer knows the state
// regions (it restarted while the adapter stayed up; Triton answers
// NotFound "Unable to find shared memory region: 'x'", as does the
// refserver; older releases and forks another code with the same words)
// fails every compute while its health checks pass, so no failover would
// happen. After a failure that may be one (lostRegion), infer asks the
// server which regions it holds (Status: the answer, not the message's
// wording, decides), registers the missing ones again and retries the
// call once. The retry is safe: the model keeps no state
// (explicit state tensors), a compute reads only the current regions and
// writes only the other ones, and the regions are the adapter's memory,
// registered again under the same names over the same objects, so the
// installed state and which region is current do not change. An error
// with every region known is returned as it is (a bad input). Caller
// holds stepMu.
func (s *Stateful) infer(ctx context.Context, r *inference.ModelInferRequest) (*inference.ModelInferResponse, error) {
	resp, err := s.modelInfer(ctx, r)
	if !lostRegion(err) {
		return resp, err
	}
	cctx, cancel := s.ctx(ctx)
	known, serr := s.mem.registered(cctx)
	cancel()
	if serr != nil {
		// Unknown whether a region is lost: the compute's own error
		// (its code decides what the sidecar does), with the probe's.
		serr = s.mapErr(s.mem.kind()+" shared memory status", serr)
		return nil, status.Errorf(status.Code(err), "%s (%s)", status.Convert(err).Message(), status.Convert(serr).Message())
	}
	lost, rerr := s.reregister(ctx, known)
	if rerr != nil {
		return nil, status.Errorf(status.Code(rerr), "%s; state regions unknown to the server not registered again: %s", status.Convert(err).Message(), status.Convert(rerr).Message())
	}
	if len(lost) == 0 {
		return nil, err
	}
	s.flipMu.RLock()
	cur, v := s.cur, s.version
	s.flipMu.RUnlock()
	s.log.Warn("the model server had lost the state regions (restarted?); registered them again and retrying the compute",
		"memory", s.mem.kind(), "regions", lost, "current", string("AB"[cur]), "version", v, "err", err)
	return s.modelInfer(ctx, r)
}

// lostRegion is true for an infer error that may be a region the server
// does not know: NotFound or InvalidArgument, or any code whose message
// names a shared memory region.
func lostRegion(err error) bool {
	st, ok := status.FromError(err)
	if err == nil || !ok {
		return false
	}
	return st.Code() == codes.NotFound || st.Code() == codes.InvalidArgument || strings.Contains(st.Message(), "shared memory region")
}

func (s *Stateful) modelInfer(ctx context.Context, r *inference.ModelInferRequest) (*inference.ModelInferResponse, error) {
	cctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.cl.ModelInfer(cctx, r)
	return resp, s.mapErr("compute", err)
}

// reregister registers the regions not in known (the server's; their
// memory and contents unchanged) and returns their names; none when it
// holds them all. Caller holds stepMu.
func (s *Stateful) reregister(ctx context.Context, known map[string]bool) ([]string, error) {
	var lost []string
	for _, sb := range s.bufs {
		for i := range 2 {
			if known[sb.region(i)] {
				continue
			}
			if err := s.register(ctx, sb, i); err != nil {
				return nil, err
			}
			lost = append(lost, sb.region(i))
		}
	}
	return lost, nil
}

// Update installs the state Compute of batchID wrote: it flips the current
// and the other regions (no model call). Repeating the Update of the last
// installed batch is a no-op.
func (s *Stateful) Update(ctx context.Context, batchID uint64) error {
	if err := s.setup(ctx); err != nil {
		return err
	}
	s.stepMu.Lock()
	defer s.stepMu.Unlock()
	return s.updateLocked(batchID)
}

func (s *Stateful) updateLocked(batchID uint64) error {
	if !s.staged || s.stagedID != batchID {
		if !s.staged && s.hasLast && s.lastID == batchID {
			return nil
		}
		if s.staged {
			return status.Errorf(codes.FailedPrecondition, "triton %s: update of batch %d, staged batch is %d", s.cfg.Model, batchID, s.stagedID)
		}
		return status.Errorf(codes.FailedPrecondition, "triton %s: update of batch %d, nothing staged", s.cfg.Model, batchID)
	}
	// Exclusive: waits for ReadState copies of the current regions, which
	// the next Compute will overwrite once they are "other".
	s.flipMu.Lock()
	s.cur = 1 - s.cur
	s.version++
	s.flipMu.Unlock()
	s.staged, s.lastID, s.hasLast = false, batchID, true
	return nil
}

// InferRepeatable says that Infer may be repeated after a lost answer
// (the sidecar's RepeatableInfer): the state is the adapter's regions, a
// compute writes only the region that is not current, and Update runs
// here, after the answer.
func (s *Stateful) InferRepeatable() bool { return true }

// Infer is Compute then Update (bare mode).
func (s *Stateful) Infer(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	if err := s.setup(ctx); err != nil {
		return nil, err
	}
	s.stepMu.Lock()
	defer s.stepMu.Unlock()
	resp, err := s.computeLocked(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp, s.updateLocked(req.GetBatchId())
}

// ReadState copies the installed state out of the current regions. It may
// run while the next batch computes (which writes only the other regions);
// Update waits for it.
func (s *Stateful) ReadState(ctx context.Context) ([]*hamsv1.Tensor, uint64, error) {
	if err := s.setup(ctx); err != nil {
		return nil, 0, err
	}
	s.flipMu.RLock()
	defer s.flipMu.RUnlock()
	if s.released {
		return nil, 0, s.errClosed()
	}
	out := make([]*hamsv1.Tensor, len(s.bufs))
	for i, sb := range s.bufs {
		d := make([]byte, sb.bytes)
		if err := sb.regs[s.cur].read(d); err != nil {
			return nil, 0, status.Errorf(codes.Internal, "triton %s: read state %q from %s memory: %v", s.cfg.Model, sb.spec.Name, s.mem.kind(), err)
		}
		out[i] = &hamsv1.Tensor{Name: sb.spec.Name, Datatype: sb.spec.Datatype, Shape: sb.spec.Shape, Data: d}
	}
	return out, s.version, nil
}

// WriteState overwrites the installed state (the current regions) and sets
// its version; a staged state is dropped. A failed copy (CUDA) leaves the
// installed state undefined: the version is not set and the error is
// Internal; the caller must write a whole state again before computing.
func (s *Stateful) WriteState(ctx context.Context, tensors []*hamsv1.Tensor, version uint64) error {
	if err := s.setup(ctx); err != nil {
		return err
	}
	if err := checkState(s.bufs, tensors); err != nil {
		return status.Errorf(codes.InvalidArgument, "triton %s write state: %v", s.cfg.Model, err)
	}
	s.stepMu.Lock()
	defer s.stepMu.Unlock()
	s.flipMu.Lock()
	defer s.flipMu.Unlock()
	if s.released {
		return s.errClosed()
	}
	s.staged = false
	for i, sb := range s.bufs {
		if err := sb.regs[s.cur].write(tensors[i].GetData()); err != nil {
			return status.Errorf(codes.Internal, "triton %s: write state %q to %s memory: %v", s.cfg.Model, sb.spec.Name, s.mem.kind(), err)
		}
	}
	s.version = version
	return nil
}

// Regions lists the registered region names (A and B of each state
// tensor, in state order).
func (s *Stateful) Regions() []string {
	s.setupMu.Lock()
	defer s.setupMu.Unlock()
	var out []string
	for _, sb := range s.bufs {
		out = append(out, sb.region(0), sb.region(1))
	}
	return out
}

// Close waits for a compute in flight, unregisters the regions at the
// server (best effort, bounded), then frees them (system: unmap and
// unlink; CUDA: cuMemFree, after the unregistration, so the server drops
// its mapping first) and releases the CUDA device. Calls that passed their setup check before Close
// answer FailedPrecondition instead of touching freed regions. Closing
// twice is a no-op.
func (s *Stateful) Close() error {
	s.setupMu.Lock()
	defer s.setupMu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if !s.ready {
		return nil
	}
	timeout := s.cfg.Timeout
	if timeout <= 0 || timeout > 2*time.Second {
		timeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// stepMu first: a compute in flight (which may register lost regions
	// again) ends before the registrations are dropped, and none starts
	// on freed regions after (released).
	s.stepMu.Lock()
	defer s.stepMu.Unlock()
	var errs []error
	for _, sb := range s.bufs {
		for i := range 2 {
			if err := s.mem.unregister(ctx, sb.region(i)); err != nil {
				errs = append(errs, s.mapErr("unregister "+s.mem.kind()+" shared memory "+sb.region(i), err))
			}
		}
	}
	s.flipMu.Lock()
	s.release(s.bufs)
	s.released = true
	if err := s.mem.close(); err != nil {
		s.log.Warn("state memory not released", "memory", s.mem.describe(), "err", err)
	}
	s.flipMu.Unlock()
	s.ready = false
	if len(errs) > 0 {
		s.log.Warn("state regions not unregistered; freed anyway", "err", errors.Join(errs...))
	}
	return errors.Join(errs...)
}
