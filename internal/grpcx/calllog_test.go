package grpcx

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/testing/logbuf"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// logLines decodes every log line of buf (each must be JSON).
func logLines(t *testing.T, buf *logbuf.Buffer) []map[string]any {
	t.Helper()
	recs, err := buf.Records()
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// codeStub answers Predict with the code its service names ("ok",
// "unavailable", "notfound", "panic").
type codeStub struct {
	hamsv1.UnimplementedFrontendServer
}

func (codeStub) Predict(_ context.Context, r *hamsv1.PredictRequest) (*hamsv1.PredictResponse, error) {
	switch r.GetService() {
	case "unavailable":
		return nil, status.Error(codes.Unavailable, "backend gone")
	case "notfound":
		return nil, status.Error(codes.NotFound, "no such service")
	case "panic":
		panic("handler bug")
	}
	return &hamsv1.PredictResponse{}, nil
}

// Per-call logs: with Debug off, an OK call or one ending at Debug level
// (NotFound) logs nothing, one ending at Warn (Unavailable) or Error (a
// panic, Internal) logs one "finished call" line with go-grpc-middleware's
// keys; with Debug on, every call logs exactly one line (the library's),
// never a second one from failureLog.
func TestCallLogs(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		t.Run(level.String(), func(t *testing.T) {
			var buf logbuf.Buffer
			log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: level}))
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := grpc.NewServer(ServerOptions(log, NewServerMetrics(nil), 0)...)
			hamsv1.RegisterFrontendServer(srv, codeStub{})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- Serve(ctx, srv, lis, time.Second) }()
			defer func() { cancel(); <-done }()
			cc, err := Dial(lis.Addr().String(), 0)
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			client := hamsv1.NewFrontendClient(cc)
			want := map[string]codes.Code{"ok": codes.OK, "notfound": codes.NotFound, "unavailable": codes.Unavailable, "panic": codes.Internal}
			for _, svc := range []string{"ok", "notfound", "unavailable", "panic"} {
				_, err := client.Predict(ctx, &hamsv1.PredictRequest{Service: svc})
				if got := status.Code(err); got != want[svc] {
					t.Fatalf("%s: code %v, want %v", svc, got, want[svc])
				}
			}
			finished := map[string]map[string]any{}
			for _, m := range logLines(t, &buf) {
				if m["msg"] != "finished call" {
					continue
				}
				code, _ := m["grpc.code"].(string)
				if finished[code] != nil {
					t.Fatalf("two lines for a %s call: %v and %v", code, finished[code], m)
				}
				finished[code] = m
			}
			wantCodes := []string{"Unavailable", "Internal"}
			if level == slog.LevelDebug {
				wantCodes = append(wantCodes, "OK", "NotFound")
			}
			if len(finished) != len(wantCodes) {
				t.Fatalf("finished-call lines for codes %v, want %v", keys(finished), wantCodes)
			}
			for _, code := range wantCodes {
				m := finished[code]
				if m == nil {
					t.Fatalf("no finished-call line for %s (lines for %v)", code, keys(finished))
				}
				for _, k := range []string{"grpc.service", "grpc.method", "grpc.method_type", "grpc.component", "peer.address", "grpc.time_ms", "grpc.start_time", "protocol"} {
					if _, ok := m[k]; !ok {
						t.Errorf("%s line lacks %s: %v", code, k, m)
					}
				}
				if m["grpc.service"] != "hams.v1.Frontend" || m["grpc.method"] != "Predict" || m["grpc.method_type"] != "unary" {
					t.Errorf("%s line names %v.%v (%v)", code, m["grpc.service"], m["grpc.method"], m["grpc.method_type"])
				}
				wantLevel := map[string]string{"OK": "DEBUG", "NotFound": "DEBUG", "Unavailable": "WARN", "Internal": "ERROR"}[code]
				if m["level"] != wantLevel {
					t.Errorf("%s line at %v, want %s", code, m["level"], wantLevel)
				}
				if code != "OK" && m["grpc.error"] == nil {
					t.Errorf("%s line lacks grpc.error: %v", code, m)
				}
			}
		})
	}
}

func keys(m map[string]map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// BenchmarkServerChain is the server interceptors' cost per OK unary call
// (no network; Debug off, as in production): "library" is
// go-grpc-middleware's logging interceptor on every call, as before;
// "failures" is failureLog with the library's behind a Debug check, as
// now.
func BenchmarkServerChain(b *testing.B) {
	log := slog.New(slog.DiscardHandler)
	lg := SlogLogger(log)
	opts := []logging.Option{logging.WithLogOnEvents(logging.FinishCall), logging.WithLevels(callLevel)}
	rec := recovery.UnaryServerInterceptor()
	now, _ := callLogs(log)
	chains := map[string][]grpc.UnaryServerInterceptor{
		"library":  {logging.UnaryServerInterceptor(lg, opts...), rec},
		"failures": append(now, rec),
	}
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}})
	info := &grpc.UnaryServerInfo{FullMethod: "/hams.v1.ModelRuntime/Compute"}
	handler := func(context.Context, any) (any, error) { return nil, nil }
	for _, name := range []string{"library", "failures"} {
		chain := chains[name]
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				h := handler
				for i := len(chain) - 1; i >= 0; i-- {
					next, icpt := h, chain[i]
					h = func(ctx context.Context, req any) (any, error) { return icpt(ctx, req, info, next) }
				}
				if _, err := h(ctx, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
