package sidecar

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/hams-go/hams/internal/tracing"
)

// Tracing (docs/tracing.md). A Forward stream batches items of many
// requests, so a request's trace context travels in its items
// (Item.trace_context), and a batch gets one "sidecar.batch" span per
// traced request, a child of that request's incoming item (linked to the
// request's other parts at a join), with a "backend.call" child each: a
// request's trace then is a tree through every model it passed. The
// outputs carry their request's sidecar.batch span as trace context. The
// backend RPC itself (and the model server's side of it) hangs under the
// first traced request's backend.call. A snapshot covers several
// requests: "snapshot.ship" is a child of the first traced one's
// sidecar.batch, linked to the others, and its ShipSnapshot RPC carries
// it to the backup, whose "backup.apply" is its child.
//
// Everything here is nil when tracing is off: traceBatch returns nil
// after one atomic load, and the methods of a nil *batchTrace do nothing.

// batchTrace holds the spans of one batch's traced requests.
type batchTrace struct {
	batch []trace.Span // per request of the batch (nil: not traced)
	call  []trace.Span
	first int // index of the first traced request
}

// traceBatch starts the sidecar.batch spans of reqs' traced requests
// (nil: tracing is off or none of them is traced), on h's model and
// instance. batchID 0 is left out.
func traceBatch(h Host, reqs []request, batchID uint64) *batchTrace {
	if !tracing.Enabled() {
		return nil
	}
	var bt *batchTrace
	for i, r := range reqs {
		if len(r.j.Parts) == 0 || r.j.Parts[0] == nil || len(r.j.Parts[0].GetTraceContext()) == 0 {
			continue
		}
		if bt == nil {
			bt = &batchTrace{batch: make([]trace.Span, len(reqs)), call: make([]trace.Span, len(reqs)), first: i}
		}
		parent := tracing.Extract(context.Background(), r.j.Parts[0].GetTraceContext())
		var links []trace.Link
		for _, p := range r.j.Parts[1:] {
			if sc := tracing.SpanContextOf(p.GetTraceContext()); sc.IsValid() {
				links = append(links, trace.Link{SpanContext: sc})
			}
		}
		attrs := []attribute.KeyValue{
			tracing.AttrModel.String(h.Model()), tracing.AttrInstance.String(h.ID()),
			tracing.AttrReqID.Int64(int64(r.j.ReqID)), tracing.AttrBatchSize.Int(len(reqs)),
		}
		if batchID != 0 {
			attrs = append(attrs, tracing.AttrBatchID.Int64(int64(batchID)))
		}
		_, bt.batch[i] = tracing.Tracer().Start(parent, tracing.SpanSidecarBatch, trace.WithLinks(links...), trace.WithAttributes(attrs...))
	}
	return bt
}

// callCtx starts the backend.call spans and returns ctx carrying the
// first one (the backend RPC's parent).
func (bt *batchTrace) callCtx(ctx context.Context) context.Context {
	if bt == nil {
		return ctx
	}
	now := time.Now()
	for i, b := range bt.batch {
		if b == nil {
			continue
		}
		pctx := trace.ContextWithSpan(context.Background(), b)
		_, bt.call[i] = tracing.Tracer().Start(pctx, tracing.SpanBackendCall, trace.WithTimestamp(now), trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(tracing.AttrBatchSize.Int(len(bt.batch))))
	}
	return trace.ContextWithSpan(ctx, bt.call[bt.first])
}

// callDone ends the backend.call spans.
func (bt *batchTrace) callDone(err error) {
	if bt == nil {
		return
	}
	now := time.Now()
	for _, c := range bt.call {
		if c != nil {
			tracing.EndErr(c, err, trace.WithTimestamp(now))
		}
	}
}

// stamp sets each traced request's outgoing trace context (its
// sidecar.batch span).
func (bt *batchTrace) stamp(reqs []request) {
	if bt == nil {
		return
	}
	for i, b := range bt.batch {
		if b != nil && i < len(reqs) {
			reqs[i].trace = tracing.InjectSpan(b)
		}
	}
}

// seqs records the seqs the batch's requests got.
func (bt *batchTrace) seqs(seqs []uint64) {
	if bt == nil {
		return
	}
	for i, b := range bt.batch {
		if b != nil && i < len(seqs) {
			b.SetAttributes(tracing.AttrSeq.Int64(int64(seqs[i])))
		}
	}
}

// end ends the sidecar.batch spans (the batch's outputs were released,
// or it failed with err).
func (bt *batchTrace) end(err error) {
	if bt == nil {
		return
	}
	now := time.Now()
	for _, b := range bt.batch {
		if b != nil {
			tracing.EndErr(b, err, trace.WithTimestamp(now))
		}
	}
}

// links are the batch's sidecar.batch spans, for the snapshot that
// covers it.
func (bt *batchTrace) links() []trace.Link {
	if bt == nil {
		return nil
	}
	var out []trace.Link
	for _, b := range bt.batch {
		if b != nil {
			out = append(out, trace.Link{SpanContext: b.SpanContext()})
		}
	}
	return out
}

// traceShip starts the snapshot.ship span of sn (nil: tracing is off or
// sn covers no traced request) and returns ctx carrying it.
func traceShip(ctx context.Context, model, id string, sn *snapshot) (context.Context, trace.Span) {
	if len(sn.links) == 0 || !tracing.Enabled() {
		return ctx, nil
	}
	parent := trace.ContextWithRemoteSpanContext(context.Background(), sn.links[0].SpanContext)
	_, sp := tracing.Tracer().Start(parent, tracing.SpanSnapshotShip, trace.WithLinks(sn.links[1:]...), trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(tracing.AttrModel.String(model), tracing.AttrInstance.String(id),
			tracing.AttrBatchID.Int64(int64(sn.batch)), tracing.AttrRequests.Int(len(sn.header.GetRequests())),
			tracing.AttrStateBytes.Int64(int64(sn.header.GetStateBytes())), tracing.AttrDelta.Bool(sn.isDelta())))
	return trace.ContextWithSpan(ctx, sp), sp
}

// traceApply starts the backup.apply span of r (a child of the
// ShipSnapshot call that brought it; nil when that was not traced), from
// its receipt on.
func traceApply(model, id string, r *received) trace.Span {
	if !r.trace.IsValid() || !tracing.Enabled() {
		return nil
	}
	parent := trace.ContextWithRemoteSpanContext(context.Background(), r.trace)
	_, sp := tracing.Tracer().Start(parent, tracing.SpanBackupApply, trace.WithTimestamp(r.at), trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(tracing.AttrModel.String(model), tracing.AttrInstance.String(id),
			tracing.AttrBatchID.Int64(int64(r.header.GetBatchId())), tracing.AttrRequests.Int(len(r.header.GetRequests()))))
	return sp
}

// receivedTrace is the span context of a ShipSnapshot call (invalid when
// tracing is off).
func receivedTrace(ctx context.Context) trace.SpanContext {
	if !tracing.Enabled() {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(ctx)
}
