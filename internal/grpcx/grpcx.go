// Package grpcx builds the gRPC servers and clients every HAMS-Go component
// uses, so that message limits, interceptors (go-grpc-middleware v2:
// metrics, slog logging, panic recovery) and the /metrics endpoint are the
// same everywhere.
package grpcx

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/tracing"
)

// DefaultMaxMessageBytes is the message limit used when a component is given
// none: 64 MiB on both directions (grpc-go's default receive limit is 4 MiB,
// too small for batched image tensors and state chunks).
const DefaultMaxMessageBytes = 64 << 20

// HTTP/2 flow-control windows of every HAMS server and client. Setting
// them turns off grpc-go's dynamic window (BDP estimation), which sends a
// PING, and gets a PING ack, with the data of a call or stream message
// whenever no estimate is in flight: on the request path that is two
// extra writes and reads per hop, at batch 1 several per request. The
// static windows are as large as the dynamic one may grow by default
// (16 MiB per connection), 4 MiB per stream: loopback and datacenter
// round trips keep even a 64 MiB message moving.
const (
	StreamWindow = 4 << 20
	ConnWindow   = 16 << 20
)

// SlogLogger adapts slog to go-grpc-middleware's logging interface.
func SlogLogger(l *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		l.Log(ctx, slog.Level(lvl), msg, fields...)
	})
}

// ServerOptions returns the interceptor chain and limits for a server.
// Per-call logs are at Debug (the go-grpc-middleware levels map to slog's).
func ServerOptions(log *slog.Logger, metrics *grpcprom.ServerMetrics, maxMsg int) []grpc.ServerOption {
	if maxMsg <= 0 {
		maxMsg = DefaultMaxMessageBytes
	}
	recoveryOpt := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		log.ErrorContext(ctx, "panic in gRPC handler", "panic", p, "stack", string(debug.Stack()))
		return status.Errorf(codes.Internal, "internal error: %v", p)
	})
	unary := []grpc.UnaryServerInterceptor{}
	stream := []grpc.StreamServerInterceptor{}
	if metrics != nil {
		unary = append(unary, metrics.UnaryServerInterceptor())
		stream = append(stream, metrics.StreamServerInterceptor())
	}
	logUnary, logStream := callLogs(log)
	unary = append(unary, append(logUnary, recovery.UnaryServerInterceptor(recoveryOpt))...)
	stream = append(stream, append(logStream, recovery.StreamServerInterceptor(recoveryOpt))...)
	// decode.go: undecodable requests answer InvalidArgument; its
	// interceptors come last (next to the handler), so the metrics and
	// logs around them see that code.
	dc := newDecodeCodec()
	unary = append(unary, dc.unary)
	stream = append(stream, dc.stream)
	return append(tracing.ServerOptions(), // otelgrpc when tracing is on (docs/tracing.md)
		grpc.ForceServerCodecV2(dc),
		grpc.MaxRecvMsgSize(maxMsg),
		grpc.MaxSendMsgSize(maxMsg),
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(stream...),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.InitialWindowSize(StreamWindow),
		grpc.InitialConnWindowSize(ConnWindow),
	)
}

// callLogs are the per-call log interceptors: go-grpc-middleware's
// logging interceptor while Debug is on; otherwise only calls that end at
// Warn or Error are logged (failureLog), with the same message and keys.
func callLogs(log *slog.Logger) ([]grpc.UnaryServerInterceptor, []grpc.StreamServerInterceptor) {
	lg := SlogLogger(log)
	opts := []logging.Option{logging.WithLogOnEvents(logging.FinishCall), logging.WithLevels(callLevel)}
	debugOn := selector.MatchFunc(func(ctx context.Context, _ interceptors.CallMeta) bool {
		return log.Enabled(ctx, slog.LevelDebug)
	})
	fl := failureLog{log: log}
	return []grpc.UnaryServerInterceptor{fl.unary, selector.UnaryServerInterceptor(logging.UnaryServerInterceptor(lg, opts...), debugOn)},
		[]grpc.StreamServerInterceptor{fl.stream, selector.StreamServerInterceptor(logging.StreamServerInterceptor(lg, opts...), debugOn)}
}

// callLevel is the level of a call's "finished call" log by its code.
func callLevel(c codes.Code) logging.Level {
	switch c {
	case codes.OK, codes.Canceled, codes.NotFound, codes.InvalidArgument, codes.DeadlineExceeded:
		return logging.LevelDebug
	case codes.Internal, codes.Unknown, codes.DataLoss:
		return logging.LevelError
	}
	return logging.LevelWarn
}

// failureLog logs, while Debug is off, the calls whose code callLevel
// puts at Warn or Error, as go-grpc-middleware's logging interceptor
// would ("finished call", its keys). That interceptor builds each call's
// fields (peer address, start time, a context with the fields) before
// the call, whether or not anything is logged: 51 allocations and 2.5 us
// per OK call against 9 and 0.2 us here (BenchmarkServerChain, one run),
// on each of the dozen or more calls a request makes at batch 1. With Debug on, the
// interceptor runs and this logs nothing.
type failureLog struct{ log *slog.Logger }

func (f failureLog) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if f.log.Enabled(ctx, slog.LevelDebug) {
		return h(ctx, req)
	}
	start := time.Now()
	resp, err := h(ctx, req)
	if err != nil {
		f.finished(ctx, interceptors.NewServerCallMeta(info.FullMethod, nil, req), start, err)
	}
	return resp, err
}

func (f failureLog) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx := ss.Context()
	if f.log.Enabled(ctx, slog.LevelDebug) {
		return h(srv, ss)
	}
	start := time.Now()
	err := h(srv, ss)
	if err != nil {
		f.finished(ctx, interceptors.NewServerCallMeta(info.FullMethod, info, nil), start, err)
	}
	return err
}

func (f failureLog) finished(ctx context.Context, c interceptors.CallMeta, start time.Time, err error) {
	code := status.Code(err)
	lvl := slog.Level(callLevel(code))
	if lvl < slog.LevelWarn || !f.log.Enabled(ctx, lvl) {
		return
	}
	attrs := []any{
		logging.SystemTag[0], logging.SystemTag[1],
		logging.ComponentFieldKey, logging.KindServerFieldValue,
		logging.ServiceFieldKey, c.Service,
		logging.MethodFieldKey, c.Method,
		logging.MethodTypeFieldKey, string(c.Typ),
	}
	if p, ok := peer.FromContext(ctx); ok {
		attrs = append(attrs, "peer.address", p.Addr.String())
	}
	attrs = append(attrs, "grpc.start_time", start.Format(time.RFC3339),
		"grpc.code", code.String(), "grpc.error", err.Error())
	attrs = append(attrs, logging.DurationToTimeMillisFields(time.Since(start))...)
	f.log.Log(ctx, lvl, "finished call", attrs...)
}

// NewServerMetrics creates gRPC server metrics registered on reg (with
// handling-time histograms).
func NewServerMetrics(reg prometheus.Registerer) *grpcprom.ServerMetrics {
	m := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
		grpcprom.WithHistogramBuckets([]float64{.0001, .0005, .001, .005, .01, .05, .1, .5, 1, 5}),
	))
	if reg != nil {
		reg.MustRegister(m)
	}
	return m
}

// DialOptions returns client options with the same limits (plaintext: the
// embedded default runs on loopback; deployments put a mesh or TLS
// terminator in front).
func DialOptions(maxMsg int) []grpc.DialOption {
	if maxMsg <= 0 {
		maxMsg = DefaultMaxMessageBytes
	}
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsg), grpc.MaxCallSendMsgSize(maxMsg)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		grpc.WithInitialWindowSize(StreamWindow),
		grpc.WithInitialConnWindowSize(ConnWindow),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}),
	}
}

// Dial creates a client connection (no I/O until first use).
func Dial(addr string, maxMsg int, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts := append(DialOptions(maxMsg), tracing.DialOptions()...) // otelgrpc when tracing is on
	cc, err := grpc.NewClient(addr, append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return cc, nil
}

// Serve runs srv on lis until ctx ends, then stops it gracefully (with a
// hard stop after grace). It returns the server's error, if any, other than
// the one caused by stopping.
func Serve(ctx context.Context, srv *grpc.Server, lis net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		srv.Stop()
		<-done
	}
	<-errc
	return nil
}

// ServeHTTP runs an HTTP server on lis until ctx ends.
func ServeHTTP(ctx context.Context, h http.Handler, lis net.Listener) error {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(lis) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// MetricsHandler serves reg (plus Go and process collectors if reg is a
// fresh registry the caller populated) in the Prometheus text format.
func MetricsHandler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{})
}
