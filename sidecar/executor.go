package sidecar

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/edge"
	"github.com/hams-go/hams/internal/hamsmd"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/sidecar/datapath"
)

// requestPath is what an executor needs of the sidecar's request path
// besides Host: the clock request deadlines are on (Config.Now), failing a
// request (an error item to every successor), and the out-edges. The
// sidecar implements it; an executor never sees the rest of the sidecar.
type requestPath interface {
	now() time.Time
	fail(j *datapath.Joined, code codes.Code, msg string)
	// fanOut sends an output item to every successor; fanOutKeep also
	// returns the copies sent, in successor order (the output log keeps
	// them for resends).
	fanOut(it *hamsv1.Item)
	fanOutKeep(it *hamsv1.Item) []*hamsv1.Item
}

// batchLog sees every batch the executor ran, after its requests were
// numbered and before their outputs leave: replay mode's input log
// (replay.go). req is the exact request the backend got.
type batchLog interface {
	executed(ctx context.Context, req *hamsv1.BatchRequest, reqs []request, seqs []uint64, lins [][]*hamsv1.LineageEntry)
}

// executor runs a serving role's batches on the backend: it learns the
// backend's inputs (Describe), checks each request's deadline and inputs,
// builds batch requests, numbers executed requests (the model's Lineage,
// Algorithm 1) and fans their outputs out. One executor lives as long as
// the sidecar: the description and the numbering carry over role changes.
// The stateless stage runs serve (several at once for a concurrent
// backend); the replicated primary (primary.go) and replay mode
// (replay.go) drive the backend themselves and use the rest.
//
// Invariants: seqs are handed out and outputs sent in one order per model
// (finish runs one batch at a time); the lineage is written by the stage's
// executor goroutines, or by a role transition while no stage runs
// (renumber); the description, once set, never changes.
type executor struct {
	h    Host
	path requestPath
	bp   *backendPolicy
	// log: replay mode's input log (nil otherwise).
	log batchLog
	// backendModel is the model name the backend serves.
	backendModel string

	lineage *Lineage
	// desc is the backend's description; describeMu: the first executor
	// describes the backend, the others wait for it (a concurrent backend
	// runs several executors).
	desc       *hamsv1.ModelDescription
	describeMu sync.Mutex
	// nextBatchID numbers the batch requests built.
	nextBatchID atomic.Uint64
	// concurrent: the backend takes several batches at once
	// (ConcurrentBackend: a replica pool) and n executors run; finishMu
	// serialises finishing (seqs, lineage, sends).
	concurrent bool
	n          int
	finishMu   sync.Mutex
	// callID is the identity of the last batch request built (callid.go):
	// the backend call running it carries it in metadata.
	callID atomic.Pointer[batchIdentity]
}

// newExecutor builds the executor of a model whose backend serves
// backendModel and runs n batches at once (n > 1: a concurrent backend);
// its numbering starts at lin.
func newExecutor(h Host, path requestPath, bp *backendPolicy, backendModel string, n int, lin *Lineage) *executor {
	return &executor{h: h, path: path, bp: bp, backendModel: backendModel, n: max(n, 1), concurrent: n > 1, lineage: lin}
}

// seq is the last seq handed out (caller: a stage's executor, or a
// transition while no stage runs).
func (x *executor) seq() uint64 { return x.lineage.Seq() }

// renumber makes the next request seq from+1, stamped with epoch (see
// Sidecar.stampEpoch); caller: a role transition, stage stopped.
func (x *executor) renumber(from, epoch uint64) { x.lineage = NewLineage(x.h.Model(), from, epoch) }

// description is the backend's description (nil until described).
func (x *executor) description() *hamsv1.ModelDescription { return x.desc }

// serve runs batches one at a time (the executor goroutine of a model
// that is not replicated; several for a concurrent backend). It first
// learns the backend's inputs (Describe, retried until it answers), then
// reports idle after every batch.
func (x *executor) serve(ctx context.Context, work <-chan []*datapath.Joined, idle chan<- struct{}) error {
	if !x.describe(ctx) {
		return nil
	}
	for {
		select {
		case idle <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		select {
		case b := <-work:
			if err := x.execute(ctx, b); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// describe learns the backend's inputs once (false: ctx ended first).
func (x *executor) describe(ctx context.Context) bool {
	// Several executors (a concurrent backend) describe once: the first
	// holds describeMu until it has the description.
	x.describeMu.Lock()
	defer x.describeMu.Unlock()
	if x.desc != nil {
		return true // an earlier role stage described it
	}
	wait := describeRetry
	for attempt := 0; ; attempt++ {
		d, err := x.h.Backend().Describe(ctx)
		if err == nil {
			x.desc = d
			x.h.Logger().Info("backend described", "kind", d.GetKind(), "stateful", d.GetStateful(), "inputs", inputNames(d))
			return true
		}
		if attempt == 0 {
			x.h.Logger().Info("backend not describable yet, retrying", "err", err)
		} else {
			x.h.Logger().Debug("backend describe failed", "attempt", attempt, "err", err)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

func inputNames(d *hamsv1.ModelDescription) []string {
	var out []string
	for _, in := range d.GetInputs() {
		out = append(out, in.GetName())
	}
	return out
}

// request is a joined request prepared for the backend.
type request struct {
	j      *datapath.Joined
	inputs []*hamsv1.Tensor
	rows   uint32
	// approximate: the backend answered with a reconstruction (ParM).
	approximate bool
	// trace: the outputs' trace context (tracing.go; nil when untraced).
	trace map[string]string
}

// selectInputs picks the tensors the backend declares (all of them for
// AnyInput), from the parts in predecessor order, and validates them: the
// one rule of tensor.SelectInputs.
func (x *executor) selectInputs(j *datapath.Joined) ([]*hamsv1.Tensor, uint32, error) {
	return tensor.SelectInputs(x.desc.GetInputs(), j.Parts)
}

// prepare checks deadlines and inputs per request (failing the bad ones).
func (x *executor) prepare(batch []*datapath.Joined) []request {
	now := x.path.now().UnixNano()
	reqs := make([]request, 0, len(batch))
	for _, j := range batch {
		if j.Deadline != 0 && now >= j.Deadline {
			x.path.fail(j, codes.DeadlineExceeded, "deadline exceeded before execution")
			continue
		}
		ins, rows, err := x.selectInputs(j)
		if err != nil {
			x.path.fail(j, codes.InvalidArgument, err.Error())
			continue
		}
		reqs = append(reqs, request{j: j, inputs: ins, rows: rows})
	}
	return reqs
}

// execute runs one batch: deadline and input checks per request, then the
// backend on the valid ones. It fails only when the backend is lost
// (errBackendLost): the sidecar then stops.
func (x *executor) execute(ctx context.Context, batch []*datapath.Joined) error {
	if reqs := x.prepare(batch); len(reqs) > 0 {
		return x.run(ctx, reqs)
	}
	return nil
}

// run calls the backend on reqs; a batch rejected as InvalidArgument is
// re-run request by request so only the bad request fails; one that found
// the backend unreachable is held and retried (backendPolicy.retry),
// unless the model is stateful (backendPolicy.once: the sidecar stops
// instead).
func (x *executor) run(ctx context.Context, reqs []request) error {
	var outs [][]*hamsv1.Tensor
	var req *hamsv1.BatchRequest
	bt := traceBatch(x.h, reqs, 0) // nil when tracing is off
	cctx := bt.callCtx(ctx)
	err := x.bp.call()(ctx, "infer", func() (err error) {
		outs, req, err = x.infer(cctx, reqs)
		return err
	})
	bt.callDone(err)
	if err != nil {
		bt.end(err)
	}
	if err != nil && ctx.Err() != nil {
		// The role stage is stopping (shutdown, demotion, promotion):
		// the requests are not failed; they come again by resend.
		return nil
	}
	if errors.Is(err, errBackendLost) {
		// Not failed either: the replacement re-executes them.
		return err
	}
	if err != nil {
		code := status.Code(err)
		if code == codes.InvalidArgument && len(reqs) > 1 {
			x.h.Logger().Debug("batch rejected as invalid, re-running requests one by one", "size", len(reqs), "err", err)
			for i := range reqs {
				if err := x.run(ctx, reqs[i:i+1]); err != nil {
					return err
				}
			}
			return nil
		}
		if ctx.Err() != nil && code != codes.InvalidArgument {
			code = codes.Unavailable
		}
		msg := err.Error()
		if st, ok := status.FromError(err); ok {
			msg = st.Message()
		}
		for _, r := range reqs {
			x.path.fail(r.j, code, msg)
		}
		return nil
	}
	bt.stamp(reqs)
	x.finish(ctx, req, reqs, outs)
	bt.end(nil)
	return nil
}

// infer builds the batch request, runs it, and splits the response per
// request; it returns the request too (replay mode logs it).
func (x *executor) infer(ctx context.Context, reqs []request) ([][]*hamsv1.Tensor, *hamsv1.BatchRequest, error) {
	req, err := x.batchRequest(reqs, x.nextBatchID.Add(1))
	if err != nil {
		return nil, nil, err
	}
	if x.concurrent {
		// Several batches run at once: each call names its own requests.
		ctx = hamsmd.WithSource(ctx, x.identityOf(reqs))
	}
	m := x.h.Metrics()
	start := time.Now()
	resp, err := x.h.Backend().Infer(ctx, req)
	m.backend.Observe(time.Since(start).Seconds())
	m.batches.Inc()
	m.batchSize.Observe(float64(len(reqs)))
	if err != nil {
		return nil, nil, err
	}
	if ap := resp.GetApproximate(); len(ap) > 0 {
		if len(ap) != len(reqs) {
			return nil, nil, status.Errorf(codes.Internal, "backend marked %d requests approximate or not, batch has %d", len(ap), len(reqs))
		}
		for i := range reqs {
			reqs[i].approximate = ap[i]
		}
	}
	outs, err := splitOutputs(resp, len(reqs))
	return outs, req, err
}

// batchRequest concatenates the requests' inputs along dimension 0.
func (x *executor) batchRequest(reqs []request, batchID uint64) (*hamsv1.BatchRequest, error) {
	n := len(reqs)
	width := len(reqs[0].inputs)
	req := &hamsv1.BatchRequest{Model: x.backendModel, Rows: make([]uint32, n), StreamIds: make([]string, n), BatchId: batchID}
	for i, r := range reqs {
		if len(r.inputs) != width {
			return nil, status.Errorf(codes.InvalidArgument, "request %d has %d inputs, request 0 has %d", r.j.ReqID, len(r.inputs), width)
		}
		req.Rows[i] = r.rows
		req.StreamIds[i] = r.j.Parts[0].GetStreamId()
	}
	x.noteBatch(reqs)
	req.Inputs = make([]*hamsv1.Tensor, width)
	parts := make([]*hamsv1.Tensor, n)
	for k := 0; k < width; k++ {
		for i, r := range reqs {
			parts[i] = r.inputs[k]
		}
		t, err := tensor.Concat(parts)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		req.Inputs[k] = t
	}
	return req, nil
}

// splitOutputs cuts a batch response into each request's outputs.
func splitOutputs(resp *hamsv1.BatchResponse, n int) ([][]*hamsv1.Tensor, error) {
	if len(resp.GetRows()) != n {
		return nil, status.Errorf(codes.Internal, "backend returned rows for %d requests, batch has %d", len(resp.GetRows()), n)
	}
	outs := make([][]*hamsv1.Tensor, n)
	flat := make([]*hamsv1.Tensor, n*len(resp.GetOutputs()))
	for i := range outs {
		outs[i] = flat[i*len(resp.GetOutputs()) : i*len(resp.GetOutputs()) : (i+1)*len(resp.GetOutputs())]
	}
	for _, o := range resp.GetOutputs() {
		if n == 1 {
			outs[0] = append(outs[0], o)
			continue
		}
		split, err := tensor.Split(o, resp.GetRows())
		if err != nil {
			return nil, status.Errorf(codes.Internal, "backend output: %v", err)
		}
		for i := range outs {
			outs[i] = append(outs[i], split[i])
		}
	}
	return outs, nil
}

// finish records lineage and forwards every request's outputs (req is the
// batch request that computed them, for replay's input log).
func (x *executor) finish(ctx context.Context, req *hamsv1.BatchRequest, reqs []request, outs [][]*hamsv1.Tensor) {
	// Seqs are handed out and items sent in one order per model: with
	// several executors, one batch at a time finishes.
	x.finishMu.Lock()
	defer x.finishMu.Unlock()
	start := time.Now()
	parts := make([][]*hamsv1.Item, len(reqs))
	for i, r := range reqs {
		parts[i] = r.j.Parts
	}
	seqs, lineages := x.record(parts, outs)
	if x.log != nil && len(reqs) > 0 {
		x.log.executed(ctx, req, reqs, seqs, lineages)
	}
	m := x.h.Metrics()
	m.lineage.Observe(time.Since(start).Seconds())
	m.requests.Add(float64(len(reqs)))
	for i, r := range reqs {
		p0 := r.j.Parts[0]
		x.path.fanOut(&hamsv1.Item{
			ReqId: r.j.ReqID, Service: p0.GetService(), StreamId: p0.GetStreamId(),
			Tensors: outs[i], Lineage: lineages[i], DeadlineUnixNano: r.j.Deadline,
			Approximate: r.approximate || anyApproximate(r.j.Parts), TraceContext: r.trace,
		})
	}
}

// anyApproximate: some input part is (computed from) a reconstruction;
// what is computed from it is approximate too.
func anyApproximate(parts []*hamsv1.Item) bool {
	for _, p := range parts {
		if p.GetApproximate() {
			return true
		}
	}
	return false
}

// record numbers a batch the stage ran (number) and logs it at Debug
// (logExecuted).
func (x *executor) record(parts [][]*hamsv1.Item, outs [][]*hamsv1.Tensor) ([]uint64, [][]*hamsv1.LineageEntry) {
	seqs, lineages := x.number(parts, outs)
	x.logExecuted(parts, seqs)
	return seqs, lineages
}

// number numbers a batch's requests (parts per request, outs their
// outputs) in the model's lineage and tells the lineage index; it returns
// their seqs and lineages.
func (x *executor) number(parts [][]*hamsv1.Item, outs [][]*hamsv1.Tensor) ([]uint64, [][]*hamsv1.LineageEntry) {
	seqs, lineages := x.lineage.RecordBatch(parts, outs)
	x.h.Executed(execRecs(x.h, parts, seqs, lineages))
	return seqs, lineages
}

// execRecs describes executed requests for the lineage index.
func execRecs(h Host, parts [][]*hamsv1.Item, seqs []uint64, lineages [][]*hamsv1.LineageEntry) []execRec {
	recs := make([]execRec, len(parts))
	for i, ps := range parts {
		r := execRec{seq: seqs[i], lin: lineages[i], keys: make([]fromKey, 0, len(ps))}
		for _, p := range ps {
			r.keys = append(r.keys, fromKey{p.GetFromModel(), edge.DedupKey(p.GetReqId(), p.GetLineage(), h.IsStateful)})
		}
		recs[i] = r
	}
	return recs
}

// logExecuted logs, at Debug, which requests a batch ran and the seqs they
// got (tracing a request across a failover).
func (x *executor) logExecuted(parts [][]*hamsv1.Item, seqs []uint64) {
	log := x.h.Logger()
	if len(parts) == 0 || !log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	ids := make([]uint64, len(parts))
	for i, p := range parts {
		if len(p) > 0 && p[0] != nil {
			ids[i] = p[0].GetReqId()
		}
	}
	log.Debug("batch executed", "req_ids", ids, "seqs", seqs)
}
