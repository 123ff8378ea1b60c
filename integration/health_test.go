package integration

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/protos/inference"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// TestHealthBackendDown runs examples/retrofit.yaml with its model pointed
// at a TF Serving address nothing serves (the case: the guide's
// YAML and no TF Serving running). `hams up` prints its ready line within
// its bound, naming the model in backends_not_ready; every health answer
// says not ready (TF Serving GetModelStatus, KServe ModelReady and
// ServerReady, /healthz, /v2/health/ready, grpc.health.v1); Predict and
// ModelInfer fail Unavailable at once, not at the deadline. Reflection on
// the client port lists client services only.
func TestHealthBackendDown(t *testing.T) {
	b, err := os.ReadFile("../examples/retrofit.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dead := freeAddr(t) // closed again: nothing listens there
	cfg := strings.Replace(string(b), "    kind: classifier\n", "    kind: classifier\n    backend: {type: tfserving, address: \""+dead+"\"}\n", 1)
	cfgPath := filepath.Join(t.TempDir(), "retrofit-down.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	up := startHams(t, 90*time.Second, "up", "--config", cfgPath, "--run-dir", t.TempDir(), "--suspicion-timeout", suspicion)
	t.Logf("ready line after %v: backends_not_ready %v", time.Since(start).Round(time.Millisecond), up.ready["backends_not_ready"])
	if nr, _ := up.ready["backends_not_ready"].([]any); len(nr) != 1 || nr[0] != "fashion" {
		t.Fatalf("ready line: backends_not_ready %v, want [fashion]", up.ready["backends_not_ready"])
	}
	addr := up.str(t, "frontend_grpc")
	cc, err := grpcx.Dial(addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 10*time.Second)
	}

	c, cancel := ctx()
	st, err := tfapis.NewModelServiceClient(cc).GetModelStatus(c, &tfapis.GetModelStatusRequest{ModelSpec: &tfapis.ModelSpec{Name: "fashion"}})
	cancel()
	if err != nil || len(st.GetModelVersionStatus()) != 1 || st.GetModelVersionStatus()[0].GetState() == tfapis.ModelVersionStatus_AVAILABLE ||
		st.GetModelVersionStatus()[0].GetStatus().GetErrorCode() != int32(codes.Unavailable) {
		t.Fatalf("GetModelStatus with the backend down: %v %v", st, err)
	}
	t.Logf("GetModelStatus: %v", st.GetModelVersionStatus()[0])
	ks := inference.NewGRPCInferenceServiceClient(cc)
	c, cancel = ctx()
	mr, err := ks.ModelReady(c, &inference.ModelReadyRequest{Name: "fashion"})
	cancel()
	if err != nil || mr.GetReady() {
		t.Fatalf("ModelReady with the backend down: %v %v", mr, err)
	}
	c, cancel = ctx()
	sr, err := ks.ServerReady(c, &inference.ServerReadyRequest{})
	cancel()
	if err != nil || sr.GetReady() {
		t.Fatalf("ServerReady with the backend down: %v %v", sr, err)
	}
	hc := healthpb.NewHealthClient(cc)
	for _, svc := range []string{"", "fashion"} {
		c, cancel = ctx()
		r, err := hc.Check(c, &healthpb.HealthCheckRequest{Service: svc})
		cancel()
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("grpc.health.v1 Check(%q): %v %v", svc, r, err)
		}
	}
	httpAddr := up.str(t, "frontend_http")
	for path, want := range map[string]int{"/healthz": http.StatusServiceUnavailable, "/v2/health/ready": http.StatusBadRequest, "/v2/models/fashion/ready": http.StatusBadRequest} {
		resp, err := http.Get("http://" + httpAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}

	// Fail fast: Unavailable within a second, not at the 10 s deadline.
	img := retrofitImages(t, 1)
	for i := range 5 {
		c, cancel = ctx()
		t0 := time.Now()
		_, err := tfapis.NewPredictionServiceClient(cc).Predict(c, &tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "fashion"},
			Inputs: map[string]*tfpb.TensorProto{"images": tfImages(img, false)}})
		cancel()
		took := time.Since(t0)
		if status.Code(err) != codes.Unavailable || took > time.Second {
			t.Fatalf("Predict %d with the backend down: %v after %v, want Unavailable within 1s", i, err, took)
		}
		c, cancel = ctx()
		t0 = time.Now()
		_, err = ks.ModelInfer(c, ksRequest("fashion", img, true))
		cancel()
		if took := time.Since(t0); status.Code(err) != codes.Unavailable || took > time.Second {
			t.Fatalf("ModelInfer %d with the backend down: %v after %v, want Unavailable within 1s", i, err, took)
		}
		if i == 0 {
			t.Logf("Predict: %v after %v", err, took)
		}
	}

	// Reflection on the client port: client services only.
	c, cancel = ctx()
	defer cancel()
	rs, err := reflectpb.NewServerReflectionClient(cc).ServerReflectionInfo(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&reflectpb.ServerReflectionRequest{MessageRequest: &reflectpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	lr, err := rs.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range lr.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	t.Logf("reflection lists %v", names)
	for _, want := range []string{"hams.v1.Frontend", "tensorflow.serving.PredictionService", "inference.GRPCInferenceService", "grpc.health.v1.Health"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lacks %s: %v", want, names)
		}
	}
	for _, n := range names {
		if n == "hams.v1.Dataplane" || n == "hams.v1.Replication" || n == "hams.v1.Manager" || n == "hams.v1.ModelRuntime" {
			t.Errorf("reflection on the client port lists internal service %s", n)
		}
	}
	up.stop(t, 20*time.Second)
}
