package integration

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/integration/checker"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/loadgen"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// describeSinks starts a model server for the service's sinks (no manager)
// and returns their descriptions.
func describeSinks(t *testing.T, cfgPath string, dep *config.Deployment, svc string) map[string]*hamsv1.ModelDescription {
	t.Helper()
	sinks := dep.Service(svc).Graph().Sinks()
	ms := startHams(t, 30*time.Second, "modelserver", "--config", cfgPath, "--models", joinComma(sinks), "--insecure")
	cc, err := grpcx.Dial(ms.str(t, "grpc"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	out := map[string]*hamsv1.ModelDescription{}
	for _, s := range sinks {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		d, err := hamsv1.NewModelRuntimeClient(cc).Describe(ctx, &hamsv1.DescribeRequest{Model: dep.Model(s).Backend.Model})
		cancel()
		if err != nil {
			t.Fatalf("describe %s: %v", s, err)
		}
		out[s] = d
	}
	ms.stop(t, 10*time.Second)
	return out
}

func joinComma(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += ","
		}
		out += x
	}
	return out
}

// TestUpServesCheckedReplies runs `hams up` on the ap example, sends
// requests from several clients and checks every reply; bad requests fail
// with the right codes while good ones keep succeeding; SIGTERM stops all.
func TestUpServesCheckedReplies(t *testing.T) {
	cfgPath, _ := filepath.Abs("../examples/ap.yaml")
	dep, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	const svc = "ap"
	descs := describeSinks(t, cfgPath, dep, svc)
	cs, err := checker.ServiceOf(dep, svc, descs)
	if err != nil {
		t.Fatal(err)
	}
	chk := checker.New(cs)

	up := startHams(t, 90*time.Second, "up", "--config", cfgPath, "--run-dir", t.TempDir(), "--suspicion-timeout", suspicion)
	feAddr := up.str(t, "frontend_grpc")
	for _, k := range []string{"frontend_http", "manager"} {
		up.str(t, k)
	}
	if n := up.str(t, "nats"); len(n) < 7 || n[:7] != "nats://" {
		t.Fatalf("nats %q is not a nats:// URL", n)
	}
	cc, err := grpcx.Dial(feAddr, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	fe := hamsv1.NewFrontendClient(cc)

	// Good traffic from 4 clients, in the background, while bad requests go in.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var st loadgen.Stats
	wg.Add(1)
	go func() {
		defer wg.Done()
		gens := make([]*loadgen.Generator, 4)
		for i := range gens {
			gens[i], _ = loadgen.NewGenerator(dep.Service(svc), uint64(i+1), 1+i%2, loadgen.Fashion())
		}
		st, _ = loadgen.Run(ctx, loadgen.RunConfig{
			Client: fe, Concurrency: 4, Requests: 400, Timeout: 10 * time.Second,
			NewRequest: func(c int, n uint64) *hamsv1.PredictRequest {
				req := &hamsv1.PredictRequest{Service: svc, RequestId: fmt.Sprintf("c%d-%d", c, n), StreamId: fmt.Sprintf("s%d", c), Inputs: gens[c].Inputs()}
				chk.Sent(req.RequestId, req)
				return req
			},
			OnResult: func(r loadgen.Result) {
				if r.Err != nil {
					chk.Failed(r.Request.RequestId, r.Err)
					return
				}
				if err := chk.Check(r.Request.RequestId, r.Reply); err != nil {
					t.Error(err)
				}
			},
		})
	}()

	// Every frontend and manager is listed; the first ones are those of
	// frontend_grpc and manager. The second frontend serves too (the
	// leading one injects its requests from the request log).
	lists := map[string][]string{}
	for _, k := range []string{"frontends", "frontends_http", "managers"} {
		l, _ := up.ready[k].([]any)
		for _, v := range l {
			s, _ := v.(string)
			lists[k] = append(lists[k], s)
		}
		if len(lists[k]) != 2 {
			t.Fatalf("ready line %v: %s has %d addresses, want 2", up.ready, k, len(lists[k]))
		}
	}
	if lists["frontends"][0] != feAddr || lists["managers"][0] != up.str(t, "manager") || lists["frontends_http"][0] != up.str(t, "frontend_http") {
		t.Fatalf("ready line %v: the first frontend and manager are not frontend_grpc and manager", up.ready)
	}
	// The frontends' internal addresses (registered in the topology) are
	// not their client ones, and the client port serves no internal RPC:
	// the issue-17 Resend redirect and Forward fencing are Unimplemented.
	if in := up.str(t, "frontend_internal"); in == feAddr || in == up.str(t, "frontend_http") {
		t.Fatalf("ready line %v: frontend_internal is a client address", up.ready)
	}
	{
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := hamsv1.NewReplicationClient(cc).Resend(c, &hamsv1.ResendRequest{ToModel: "ap-inception", ToAddress: "127.0.0.1:1", Epoch: ^uint64(0)})
		if status.Code(err) != codes.Unimplemented {
			cancel()
			t.Fatalf("Resend on the client port: %v, want Unimplemented", err)
		}
		fs, err := hamsv1.NewDataplaneClient(cc).Forward(c)
		if err == nil {
			_ = fs.Send(&hamsv1.ForwardBatch{Incarnation: ^uint64(0)})
			_ = fs.CloseSend()
			_, err = fs.Recv()
		}
		cancel()
		if status.Code(err) != codes.Unimplemented {
			t.Fatalf("Forward on the client port: %v, want Unimplemented", err)
		}
	}
	cc2, err := grpcx.Dial(lists["frontends"][1], 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc2.Close()
	gen2, _ := loadgen.NewGenerator(dep.Service(svc), 77, 1, nil)
	for i := range 5 {
		req := &hamsv1.PredictRequest{Service: svc, RequestId: fmt.Sprintf("second-%d", i), Inputs: gen2.Inputs()}
		chk.Sent(req.RequestId, req)
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := hamsv1.NewFrontendClient(cc2).Predict(c, req)
		cancel()
		if err != nil {
			t.Fatalf("second frontend: %v", err)
		}
		if err := chk.Check(req.RequestId, resp); err != nil {
			t.Fatal(err)
		}
	}

	gen, _ := loadgen.NewGenerator(dep.Service(svc), 99, 1, nil)
	call := func(req *hamsv1.PredictRequest) error {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := fe.Predict(c, req)
		return err
	}
	for i := range 5 {
		if err := call(&hamsv1.PredictRequest{Service: "no-such-service", Inputs: gen.Inputs()}); status.Code(err) != codes.NotFound {
			t.Fatalf("unknown service: %v, want NotFound", err)
		}
		bad := gen.Inputs()
		bad[0].Data = bad[0].Data[:len(bad[0].Data)-1-i] // shorter than its shape says
		if err := call(&hamsv1.PredictRequest{Service: svc, Inputs: bad}); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("malformed tensor: %v, want InvalidArgument", err)
		}
		bad = gen.Inputs()
		bad[0].Datatype = "FP99"
		if err := call(&hamsv1.PredictRequest{Service: svc, Inputs: bad}); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("unknown datatype: %v, want InvalidArgument", err)
		}
	}
	wg.Wait()
	cancel()
	sum := chk.Finish()
	if sum.Violations != 0 || sum.Errors != 0 || sum.Correct != 405 || st.Replies != 400 {
		t.Fatalf("stats %+v, check %+v", st, sum)
	}
	t.Logf("ap via hams up: %d checked replies, p50 %.2f ms, p99 %.2f ms", sum.Correct, st.P50Ms, st.P99Ms)

	up.stop(t, 20*time.Second)
	if c, err := net.DialTimeout("tcp", feAddr, time.Second); err == nil {
		c.Close()
		t.Fatalf("frontend %s still accepts connections after hams up stopped", feAddr)
	}
}
