package frontend

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// methodsOf lists every method of a generated service descriptor as full
// method names.
func methodsOf(sd grpc.ServiceDesc) []string {
	var out []string
	for _, m := range sd.Methods {
		out = append(out, "/"+sd.ServiceName+"/"+m.MethodName)
	}
	for _, s := range sd.Streams {
		out = append(out, "/"+sd.ServiceName+"/"+s.StreamName)
	}
	return out
}

// callRaw calls method with one empty message as a bidirectional stream
// (which carries a unary call as well) and returns the call's status.
func callRaw(ctx context.Context, cc *grpc.ClientConn, method string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cs, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method)
	if err != nil {
		return err
	}
	if err := cs.SendMsg(&emptypb.Empty{}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_ = cs.CloseSend()
	for {
		if err := cs.RecvMsg(&emptypb.Empty{}); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// TestClientPortServesNoInternalMethod: every method of HAMS's internal
// services (Dataplane, Replication, Manager, ModelRuntime, enumerated from
// their generated descriptors) answers Unimplemented on the client port,
// with and without client authentication; the internal port serves
// Dataplane and Replication and none of the client APIs.
func TestClientPortServesNoInternalMethod(t *testing.T) {
	internal := []grpc.ServiceDesc{hamsv1.Dataplane_ServiceDesc, hamsv1.Replication_ServiceDesc, hamsv1.Manager_ServiceDesc, hamsv1.ModelRuntime_ServiceDesc}
	client := []grpc.ServiceDesc{hamsv1.Frontend_ServiceDesc, tfapis.PredictionService_ServiceDesc, tfapis.ModelService_ServiceDesc, inference.GRPCInferenceService_ServiceDesc}
	for _, withAuth := range []bool{false, true} {
		name := "open"
		if withAuth {
			name = "client auth"
		}
		t.Run(name, func(t *testing.T) {
			// Pass-through models: the raw routes exist, and nothing
			// internal may reach them.
			yaml, _ := passYAMLFor(t)
			o := envOpts{yaml: yaml}
			if withAuth {
				o.yaml += authBlock(t)
				o.config = withClientAuth(t, nil)
			}
			e := newEnvWith(t, o)
			ctx := ctxT(t, 30*time.Second)
			cc, err := grpcx.Dial(e.grpcAddr, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			n := 0
			for _, sd := range internal {
				for _, m := range methodsOf(sd) {
					n++
					if err := callRaw(ctx, cc, m); status.Code(err) != codes.Unimplemented {
						t.Errorf("client port: %s answered %v, want Unimplemented", m, err)
					}
				}
			}
			if n < 10 {
				t.Fatalf("only %d internal methods enumerated", n)
			}
			iaddr, _, _ := e.res.Resolve(config.Frontend)
			if iaddr == e.grpcAddr {
				t.Fatalf("the registered address %s is the client port", iaddr)
			}
			icc, err := grpcx.Dial(iaddr, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer icc.Close()
			for _, sd := range client {
				for _, m := range methodsOf(sd) {
					if err := callRaw(ctx, icc, m); status.Code(err) != codes.Unimplemented {
						t.Errorf("internal port: %s answered %v, want Unimplemented", m, err)
					}
				}
			}
			for m := range rawRoutes {
				if err := callRaw(ctx, icc, m); status.Code(err) != codes.Unimplemented {
					t.Errorf("internal port: pass-through %s answered %v, want Unimplemented", m, err)
				}
			}
			// The internal services are served there.
			if _, err := hamsv1.NewReplicationClient(icc).GetLineageSummary(ctx, &hamsv1.LineageSummaryRequest{FailedModel: "a"}); err != nil {
				t.Fatalf("internal port: GetLineageSummary: %v", err)
			}
		})
	}
}
