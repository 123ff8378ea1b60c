package manager_test

import (
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/hams-go/hams/internal/grpcx"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// The manager answers grpc.health.v1 (issue 19: every gRPC server; it
// answered Unimplemented): SERVING for the server and its service while
// it runs.
func TestManagerServesHealth(t *testing.T) {
	r := startManager(t, nil, nil)
	cc, err := grpcx.Dial(r.addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	for _, svc := range []string{"", hamsv1.Manager_ServiceDesc.ServiceName} {
		resp, err := hc.Check(waitCtx(t), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health of %q: %v %v", svc, resp, err)
		}
	}
}
