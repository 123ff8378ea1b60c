package refserver

import (
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// TestGRPCHealth: the model server serves grpc.health.v1 (issue 19: on
// every gRPC server): "" and every hosted model SERVING, a model set not
// ready NOT_SERVING and back, a model not hosted NotFound.
func TestGRPCHealth(t *testing.T) {
	e := start(t)
	hc := healthpb.NewHealthClient(e.cc)
	check := func(svc string, want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		r, err := hc.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("Check(%q): %v", svc, err)
		}
		if r.GetStatus() != want {
			t.Fatalf("Check(%q): %v, want %v", svc, r.GetStatus(), want)
		}
	}
	check("", healthpb.HealthCheckResponse_SERVING)
	for _, m := range []string{"fashion", "seq", "join", "norm"} {
		check(m, healthpb.HealthCheckResponse_SERVING)
	}
	if _, err := hc.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: "notserved"}); status.Code(err) != codes.NotFound {
		t.Fatalf("Check of a model not hosted: %v, want NotFound", err)
	}
	if err := e.srv.SetReady("fashion", false); err != nil {
		t.Fatal(err)
	}
	check("fashion", healthpb.HealthCheckResponse_NOT_SERVING)
	check("seq", healthpb.HealthCheckResponse_SERVING)
	if err := e.srv.SetReady("fashion", true); err != nil {
		t.Fatal(err)
	}
	check("fashion", healthpb.HealthCheckResponse_SERVING)
}
