package frontend

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/trace"

	"github.com/hams-go/hams/internal/tracing"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Tracing (docs/tracing.md): a request gets a "frontend.predict" span
// (under the client's span when the call carried a W3C traceparent: the
// otelgrpc server span of the client API), whose context its items carry
// into the graph (Item.trace_context); the last sink item's context
// parents "frontend.gate", which lasts until the reply leaves (durability
// wait and, with a request log, the recording of the answer). Nothing of
// this runs when tracing is off: tracePredict returns a nil span after
// one atomic load, and the entry senders are not wrapped.

// traceReqs maps a request being admitted (its *PredictRequest) to the
// trace context its items carry, for the entry items the request-log
// path builds (tracedSender).
type traceReqs struct{ m sync.Map }

// tracePredict starts the frontend.predict span of a request (nil when
// tracing is off) and returns ctx carrying it and the items' trace
// context.
func (f *Frontend) tracePredict(ctx context.Context, svc string, req *hamsv1.PredictRequest) (context.Context, trace.Span, map[string]string) {
	if !tracing.Enabled() {
		return ctx, nil, nil
	}
	ctx, sp := tracing.Tracer().Start(ctx, tracing.SpanFrontendPredict, trace.WithAttributes(tracing.AttrService.String(svc)))
	if !sp.SpanContext().IsSampled() {
		return ctx, sp, nil
	}
	tc := tracing.InjectSpan(sp)
	f.traced.m.Store(req, tc)
	return ctx, sp, tc
}

// endPredict ends the frontend.predict span of req.
func (f *Frontend) endPredict(sp trace.Span, req *hamsv1.PredictRequest, resp *hamsv1.PredictResponse, err error) {
	if sp == nil {
		return
	}
	f.traced.m.Delete(req)
	if id := resp.GetReqId(); id != 0 {
		sp.SetAttributes(tracing.AttrReqID.Int64(int64(id)))
	}
	tracing.EndErr(sp, err)
}

// traceGate starts the frontend.gate span of request reqID, whose last
// sink item it completed, when the item is traced (under f.mu).
func (f *Frontend) traceGate(reqID uint64, it *hamsv1.Item) {
	if len(it.GetTraceContext()) == 0 || !tracing.Enabled() {
		return
	}
	c := f.calls[reqID]
	if c == nil || c.gate != nil {
		return
	}
	_, c.gate = tracing.Tracer().Start(tracing.Extract(context.Background(), it.GetTraceContext()), tracing.SpanFrontendGate,
		trace.WithAttributes(tracing.AttrService.String(c.service), tracing.AttrReqID.Int64(int64(reqID))))
}

// endGate ends c's frontend.gate span: its reply (or err) leaves now
// (under f.mu).
func endGate(c *call, err error) {
	if c.gate == nil {
		return
	}
	tracing.EndErr(c.gate, err)
	c.gate = nil
}

// traceSender wraps an entry edge when tracing is on: items of a request
// admitted with a trace context (the request-log path builds them in
// injectLocked) get it.
func (f *Frontend) traceSender(s sender) sender {
	if !tracing.Enabled() {
		return s
	}
	return tracedSender{sender: s, f: f}
}

type tracedSender struct {
	sender
	f *Frontend
}

// Send is called under f.mu.
func (t tracedSender) Send(items ...*hamsv1.Item) {
	for _, it := range items {
		if it.TraceContext != nil {
			continue
		}
		if c := t.f.calls[it.GetReqId()]; c != nil && c.req != nil {
			if tc, ok := t.f.traced.m.Load(c.req); ok {
				it.TraceContext = tc.(map[string]string)
			}
		}
	}
	t.sender.Send(items...)
}
