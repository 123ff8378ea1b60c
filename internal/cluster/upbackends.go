package cluster

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
)

// backendWait bounds how long `hams up` waits for the backends' first
// health checks (sidecars check every second) before its ready line.
const backendWait = 5 * time.Second

// WaitBackends polls the frontend's grpc.health.v1 at addr (the service
// named by a model is SERVING once the model's backend answered its health
// check, frontend/health.go) until every model is, or backendWait passed;
// it returns the models that are not. It never blocks longer: a backend
// that is down (an external backend.address nothing serves) is printed in
// the ready line, and its requests fail Unavailable until it answers.
func WaitBackends(ctx context.Context, addr string, dep *config.Deployment) []string {
	cc, err := grpcx.Dial(addr, 0)
	if err != nil {
		return nil
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	ctx, cancel := context.WithTimeout(ctx, backendWait)
	defer cancel()
	for {
		var missing []string
		for i := range dep.Models {
			m := &dep.Models[i]
			if m.Pooled() {
				continue // a pool's instances are not one backend
			}
			cctx, ccancel := context.WithTimeout(ctx, time.Second)
			r, err := hc.Check(cctx, &healthpb.HealthCheckRequest{Service: m.Name})
			ccancel()
			switch status.Code(err) {
			case codes.Unimplemented, codes.NotFound, codes.Unauthenticated, codes.PermissionDenied:
				continue // no health service, a model this frontend does not serve, or not ours to ask
			}
			if r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				missing = append(missing, m.Name)
			}
		}
		if len(missing) == 0 || ctx.Err() != nil {
			return missing
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}
