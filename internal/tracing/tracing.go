// Package tracing is HAMS-Go's OpenTelemetry tracing (docs/tracing.md):
// the process-wide tracer provider (OTLP export when an endpoint is
// configured, nothing at all otherwise), the W3C trace context carried per
// item on the dataplane (Item.trace_context), and the gRPC stats handlers
// (otelgrpc) that carry it on every other internal RPC.
//
// Off by default: until Setup finds an endpoint (or a test calls Install),
// Enabled is false, no stats handler is installed and the request path
// starts no span, so tracing costs one atomic load per batch.
package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync/atomic"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
)

// InstrumentationName names HAMS-Go's own tracer.
const InstrumentationName = "github.com/hams-go/hams"

// Span names of HAMS-Go's own spans (docs/tracing.md).
const (
	SpanFrontendPredict = "frontend.predict"
	SpanFrontendGate    = "frontend.gate"
	SpanSidecarBatch    = "sidecar.batch"
	SpanBackendCall     = "backend.call"
	SpanSnapshotShip    = "snapshot.ship"
	SpanBackupApply     = "backup.apply"
)

// Attribute keys of HAMS-Go's spans and resources.
const (
	AttrDeployment = attribute.Key("hams.deployment")
	AttrModel      = attribute.Key("hams.model")
	AttrInstance   = attribute.Key("hams.instance")
	AttrService    = attribute.Key("hams.service")
	AttrReqID      = attribute.Key("hams.req_id")
	AttrSeq        = attribute.Key("hams.seq")
	AttrBatchID    = attribute.Key("hams.batch_id")
	AttrBatchSize  = attribute.Key("hams.batch_size")
	AttrRequests   = attribute.Key("hams.requests")
	AttrStateBytes = attribute.Key("hams.state_bytes")
	AttrDelta      = attribute.Key("hams.delta")
	AttrHeld       = attribute.Key("hams.held")
)

// EnvEndpoint and EnvTracesEndpoint are the standard OTLP endpoint
// variables; EnvProtocol picks the OTLP transport for them.
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
)

var enabled atomic.Bool

// Enabled reports whether a tracer provider is installed (Setup found an
// endpoint, or a test called Install). Hot paths test it before building
// any span.
func Enabled() bool { return enabled.Load() }

// Tracer is HAMS-Go's tracer from the global provider.
func Tracer() trace.Tracer { return otel.Tracer(InstrumentationName) }

// Config configures Setup.
type Config struct {
	// Endpoint is --otlp: "http://host:4318" or "https://..." exports
	// OTLP over HTTP (protobuf), "grpc://host:4317" or a bare
	// "host:4317" OTLP over gRPC (plaintext). Empty: the standard
	// OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, read by the exporter itself
	// (OTEL_EXPORTER_OTLP_PROTOCOL picks grpc or http/protobuf, the
	// default). Neither set: tracing stays off.
	Endpoint string
	// Ratio is the fraction of new traces sampled (parent-based: a
	// request whose caller sampled it is always traced): 0 starts no
	// new trace; outside [0, 1] it is 1.
	Ratio float64
	// Service is the resource's service.name (hams-<role>).
	Service string
	// Deployment, Model and Instance are resource attributes (empty ones
	// are left out).
	Deployment, Model, Instance string
	Logger                      *slog.Logger
}

// Configured reports whether cfg (or the environment) names an endpoint.
func Configured(endpoint string) bool {
	return endpoint != "" || os.Getenv(EnvEndpoint) != "" || os.Getenv(EnvTracesEndpoint) != ""
}

// Setup installs a tracer provider exporting over OTLP when cfg or the
// environment names an endpoint, and returns its shutdown (which flushes
// the spans still buffered); without an endpoint it installs nothing and
// the shutdown is a no-op.
func Setup(ctx context.Context, cfg Config) (shutdown func(context.Context) error, err error) {
	noop := func(context.Context) error { return nil }
	if !Configured(cfg.Endpoint) {
		return noop, nil
	}
	exp, err := newExporter(ctx, cfg.Endpoint)
	if err != nil {
		return noop, err
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", cfg.Service)}
	for k, v := range map[attribute.Key]string{AttrDeployment: cfg.Deployment, AttrModel: cfg.Model, AttrInstance: cfg.Instance} {
		if v != "" {
			attrs = append(attrs, k.String(v))
		}
	}
	if cfg.Instance != "" {
		attrs = append(attrs, attribute.String("service.instance.id", cfg.Instance))
	}
	if cfg.Deployment != "" {
		attrs = append(attrs, attribute.String("service.namespace", cfg.Deployment))
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attrs...))
	if err != nil {
		return noop, fmt.Errorf("tracing resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(NewSampler(cfg.Ratio)),
	)
	restore := Install(tp)
	if cfg.Logger != nil {
		cfg.Logger.Info("tracing: exporting spans over OTLP", "endpoint", describeEndpoint(cfg.Endpoint), "ratio", ratioOf(cfg.Ratio), "service", cfg.Service)
	}
	return func(ctx context.Context) error {
		restore()
		if err := tp.Shutdown(ctx); err != nil {
			return fmt.Errorf("flush and stop the span exporter: %w", err)
		}
		return nil
	}, nil
}

func describeEndpoint(ep string) string {
	if ep != "" {
		return ep
	}
	if v := os.Getenv(EnvTracesEndpoint); v != "" {
		return v
	}
	return os.Getenv(EnvEndpoint)
}

func ratioOf(r float64) float64 {
	if r < 0 || r > 1 {
		return 1
	}
	return r
}

// newExporter builds the OTLP exporter for endpoint (see Config.Endpoint).
func newExporter(ctx context.Context, endpoint string) (sdktrace.SpanExporter, error) {
	if endpoint == "" {
		proto := os.Getenv(EnvTracesProtocol)
		if proto == "" {
			proto = os.Getenv(EnvProtocol)
		}
		var (
			exp sdktrace.SpanExporter
			err error
		)
		if proto == "grpc" {
			exp, err = otlptracegrpc.New(ctx)
		} else {
			exp, err = otlptracehttp.New(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("OTLP exporter from %s: %w", EnvEndpoint, err)
		}
		return exp, nil
	}
	scheme, rest, hasScheme := strings.Cut(endpoint, "://")
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch {
	case hasScheme && (scheme == "http" || scheme == "https"):
		u, perr := url.Parse(endpoint)
		if perr != nil {
			return nil, fmt.Errorf("--otlp %q: %w", endpoint, perr)
		}
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(u.Host)}
		if scheme == "http" {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		if p := strings.TrimSuffix(u.Path, "/"); p != "" {
			opts = append(opts, otlptracehttp.WithURLPath(p))
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	case hasScheme && scheme == "grpc":
		exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(rest), otlptracegrpc.WithInsecure())
	case !hasScheme:
		exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(endpoint), otlptracegrpc.WithInsecure())
	default:
		return nil, fmt.Errorf("--otlp %q: want http://, https://, grpc:// or host:port", endpoint)
	}
	if err != nil {
		return nil, fmt.Errorf("OTLP exporter for %s: %w", endpoint, err)
	}
	return exp, nil
}

// Install makes tp the global tracer provider (with the W3C trace-context
// propagator) and turns tracing on; the returned function turns it off
// and puts the previous provider and propagator back (tests install an
// in-memory exporter with it).
func Install(tp trace.TracerProvider) (restore func()) {
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(Propagator)
	enabled.Store(true)
	return func() {
		enabled.Store(false)
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
	}
}

// Propagator is the W3C trace context (traceparent, tracestate) and
// baggage.
var Propagator propagation.TextMapPropagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// NewSampler is parent-based with ratio for new traces, except that an
// RPC client or server span without a parent (a heartbeat, a topology
// poll, a dataplane stream: internal traffic no request started) is never
// a trace of its own. New traces start at the client APIs: the
// frontend's own spans and its client-facing gRPC services.
func NewSampler(ratio float64) sdktrace.Sampler {
	return sampler{parent: sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratioOf(ratio)))}
}

type sampler struct{ parent sdktrace.Sampler }

func (s sampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	psc := trace.SpanContextFromContext(p.ParentContext)
	if !psc.IsValid() {
		switch p.Kind {
		case trace.SpanKindClient:
			return sdktrace.SamplingResult{Decision: sdktrace.Drop, Tracestate: psc.TraceState()}
		case trace.SpanKindServer:
			if !clientFacing(p.Name) {
				return sdktrace.SamplingResult{Decision: sdktrace.Drop, Tracestate: psc.TraceState()}
			}
		}
	}
	return s.parent.ShouldSample(p)
}

func (s sampler) Description() string { return "HAMSSampler{" + s.parent.Description() + "}" }

// clientFacing: a gRPC method of the frontend's client APIs (own, TF
// Serving, KServe v2).
func clientFacing(method string) bool {
	method = strings.TrimPrefix(method, "/")
	for _, p := range []string{"hams.v1.Frontend/", "tensorflow.serving.", "inference.GRPCInferenceService/"} {
		if strings.HasPrefix(method, p) {
			return true
		}
	}
	return false
}

// ServerOptions are the gRPC server options of tracing: the otelgrpc
// server stats handler when tracing is on, none otherwise.
func ServerOptions() []grpc.ServerOption {
	if !Enabled() {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler())}
}

// DialOptions are the client counterpart of ServerOptions.
func DialOptions() []grpc.DialOption {
	if !Enabled() {
		return nil
	}
	return []grpc.DialOption{grpc.WithStatsHandler(otelgrpc.NewClientHandler())}
}

// mapCarrier adapts an Item's trace_context map.
type mapCarrier map[string]string

func (m mapCarrier) Get(k string) string { return m[k] }
func (m mapCarrier) Set(k, v string)     { m[k] = v }
func (m mapCarrier) Keys() []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Inject returns the W3C trace context of ctx's span as an Item's
// trace_context, or nil when the span is not sampled (nothing to carry).
func Inject(ctx context.Context) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsSampled() {
		return nil
	}
	m := make(map[string]string, 2)
	Propagator.Inject(ctx, mapCarrier(m))
	return m
}

// InjectSpan is Inject for a span.
func InjectSpan(sp trace.Span) map[string]string {
	if sp == nil {
		return nil
	}
	return Inject(trace.ContextWithSpan(context.Background(), sp))
}

// Extract returns a context whose remote parent is the trace context
// carried in m (ctx itself when m carries none).
func Extract(ctx context.Context, m map[string]string) context.Context {
	if len(m) == 0 {
		return ctx
	}
	return Propagator.Extract(ctx, mapCarrier(m))
}

// SpanContextOf is the span context carried in m (invalid when none).
func SpanContextOf(m map[string]string) trace.SpanContext {
	if len(m) == 0 {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(Propagator.Extract(context.Background(), mapCarrier(m)))
}

// EndErr records err (if any) on sp and ends it.
func EndErr(sp trace.Span, err error, opts ...trace.SpanEndOption) {
	if err != nil {
		sp.RecordError(err)
		sp.SetStatus(otelcodes.Error, err.Error())
	}
	sp.End(opts...)
}
