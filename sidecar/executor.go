package sidecar

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/hamsmd"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// executor runs batches one at a time. It first learns the backend's
// inputs (Describe, retried until it answers), then reports idle after
// every batch.
func (s *Sidecar) executor(ctx context.Context, work <-chan []*Joined, idle chan<- struct{}) error {
	if !s.describe(ctx) {
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
			if err := s.execute(ctx, b); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
	}
}

func (s *Sidecar) describe(ctx context.Context) bool {
	// Several executors (a concurrent backend) describe once: the first
	// holds describeMu until it has the description.
	s.describeMu.Lock()
	defer s.describeMu.Unlock()
	if s.desc != nil {
		return true // an earlier role stage described it
	}
	wait := describeRetry
	for attempt := 0; ; attempt++ {
		d, err := s.cfg.Backend.Describe(ctx)
		if err == nil {
			s.setDescription(d)
			s.log.Info("backend described", "kind", d.GetKind(), "stateful", d.GetStateful(), "inputs", inputNames(d))
			return true
		}
		if attempt == 0 {
			s.log.Info("backend not describable yet, retrying", "err", err)
		} else {
			s.log.Debug("backend describe failed", "attempt", attempt, "err", err)
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

func (s *Sidecar) setDescription(d *hamsv1.ModelDescription) {
	s.desc = d
}

// request is a joined request prepared for the backend.
type request struct {
	j      *Joined
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
func (s *Sidecar) selectInputs(j *Joined) ([]*hamsv1.Tensor, uint32, error) {
	return tensor.SelectInputs(s.desc.GetInputs(), j.Parts)
}

// execute runs one batch: deadline and input checks per request, then the
// backend on the valid ones. It fails only when the backend is lost
// (errBackendLost): the sidecar then stops.
func (s *Sidecar) execute(ctx context.Context, batch []*Joined) error {
	now := s.now().UnixNano()
	reqs := make([]request, 0, len(batch))
	for _, j := range batch {
		if j.Deadline != 0 && now >= j.Deadline {
			s.fail(j, codes.DeadlineExceeded, "deadline exceeded before execution")
			continue
		}
		ins, rows, err := s.selectInputs(j)
		if err != nil {
			s.fail(j, codes.InvalidArgument, err.Error())
			continue
		}
		reqs = append(reqs, request{j: j, inputs: ins, rows: rows})
	}
	if len(reqs) > 0 {
		return s.run(ctx, reqs)
	}
	return nil
}

// run calls the backend on reqs; a batch rejected as InvalidArgument is
// re-run request by request so only the bad request fails; one that found
// the backend unreachable is held and retried (retryBackend), unless the
// model is stateful (callOnce: the sidecar stops instead).
func (s *Sidecar) run(ctx context.Context, reqs []request) error {
	var outs [][]*hamsv1.Tensor
	bt := s.traceBatch(reqs, 0) // nil when tracing is off
	cctx := bt.callCtx(ctx)
	err := s.backendCall()(ctx, "infer", func() (err error) {
		outs, err = s.infer(cctx, reqs)
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
			s.log.Debug("batch rejected as invalid, re-running requests one by one", "size", len(reqs), "err", err)
			for i := range reqs {
				if err := s.run(ctx, reqs[i:i+1]); err != nil {
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
			s.fail(r.j, code, msg)
		}
		return nil
	}
	bt.stamp(reqs)
	s.finish(ctx, reqs, outs)
	bt.end(nil)
	return nil
}

// infer builds the batch request and splits the response per request.
func (s *Sidecar) infer(ctx context.Context, reqs []request) ([][]*hamsv1.Tensor, error) {
	req, err := s.batchRequest(reqs, s.nextBatchID.Add(1))
	if err != nil {
		return nil, err
	}
	if s.concurrent {
		// Several batches run at once: each call names its own requests.
		ctx = hamsmd.WithSource(ctx, s.identityOf(reqs))
	}
	if s.rp != nil {
		s.rp.pending = req // logged by finish (replay mode)
	}
	start := time.Now()
	resp, err := s.cfg.Backend.Infer(ctx, req)
	s.metrics.backend.Observe(time.Since(start).Seconds())
	s.metrics.batches.Inc()
	s.metrics.batchSize.Observe(float64(len(reqs)))
	if err != nil {
		return nil, err
	}
	if ap := resp.GetApproximate(); len(ap) > 0 {
		if len(ap) != len(reqs) {
			return nil, status.Errorf(codes.Internal, "backend marked %d requests approximate or not, batch has %d", len(ap), len(reqs))
		}
		for i := range reqs {
			reqs[i].approximate = ap[i]
		}
	}
	return splitOutputs(resp, len(reqs))
}

// batchRequest concatenates the requests' inputs along dimension 0.
func (s *Sidecar) batchRequest(reqs []request, batchID uint64) (*hamsv1.BatchRequest, error) {
	n := len(reqs)
	width := len(reqs[0].inputs)
	req := &hamsv1.BatchRequest{Model: s.model.Backend.Model, Rows: make([]uint32, n), StreamIds: make([]string, n), BatchId: batchID}
	for i, r := range reqs {
		if len(r.inputs) != width {
			return nil, status.Errorf(codes.InvalidArgument, "request %d has %d inputs, request 0 has %d", r.j.ReqID, len(r.inputs), width)
		}
		req.Rows[i] = r.rows
		req.StreamIds[i] = r.j.Parts[0].GetStreamId()
	}
	s.noteBatch(reqs)
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

// finish records lineage and forwards every request's outputs. The state
// manager (replication) hooks in here: after compute, before release.
func (s *Sidecar) finish(ctx context.Context, reqs []request, outs [][]*hamsv1.Tensor) {
	// Seqs are handed out and items sent in one order per model: with
	// several executors, one batch at a time finishes.
	s.finishMu.Lock()
	defer s.finishMu.Unlock()
	start := time.Now()
	parts := make([][]*hamsv1.Item, len(reqs))
	for i, r := range reqs {
		parts[i] = r.j.Parts
	}
	seqs, lineages := s.lineage.RecordBatch(parts, outs)
	s.idx.executed(s.execRecs(parts, seqs, lineages))
	s.logExecuted(parts, seqs)
	if s.rp != nil {
		s.rp.executed(ctx, reqs, seqs, lineages)
	}
	s.metrics.lineage.Observe(time.Since(start).Seconds())
	s.metrics.requests.Add(float64(len(reqs)))
	for i, r := range reqs {
		p0 := r.j.Parts[0]
		s.fanOut(&hamsv1.Item{
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

// logExecuted logs, at Debug, which requests a batch ran and the seqs they
// got (tracing a request across a failover).
func (s *Sidecar) logExecuted(parts [][]*hamsv1.Item, seqs []uint64) {
	if len(parts) == 0 || !s.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	ids := make([]uint64, len(parts))
	for i, p := range parts {
		if len(p) > 0 && p[0] != nil {
			ids[i] = p[0].GetReqId()
		}
	}
	s.log.Debug("batch executed", "req_ids", ids, "seqs", seqs)
}
