package frontend

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func TestPredictEcho(t *testing.T) {
	e := newEnv(t, "5s")
	r1 := e.mustEcho(1)
	if r1.ReqId != 1 || r1.Service != "echo" {
		t.Fatalf("first reply req_id %d service %q", r1.ReqId, r1.Service)
	}
	if len(r1.Lineage) != 1 {
		t.Fatalf("lineage %v", r1.Lineage)
	}
	l := r1.Lineage[0]
	if l.PredModel != config.Frontend || l.PredSeq != 1 || l.Model != "a" || l.Seq != 1 || l.OutputDigest == "" {
		t.Fatalf("lineage entry %v", l)
	}
	r2 := e.mustEcho(2)
	if r2.ReqId != 2 || r2.Lineage[0].PredSeq != 2 || r2.Lineage[0].Seq != 2 {
		t.Fatalf("second reply req_id %d lineage %v", r2.ReqId, r2.Lineage)
	}
	eventually(t, "empty request table", func() bool { return e.pending() == 0 })
}

func TestPredictFanOutJoinsSinks(t *testing.T) {
	e := newEnv(t, "5s")
	in := []*hamsv1.Tensor{tensor.FromFloat32("v", []int64{1, 3}, []float32{1, 2, 3})}
	resp, err := e.client.Predict(ctxT(t, 5*time.Second), &hamsv1.PredictRequest{Service: "fan", Inputs: in})
	if err != nil {
		t.Fatalf("Predict: %v", err)
	}
	var models []string
	for _, o := range resp.Outputs {
		models = append(models, o.Model)
		if tensor.Digest(o.Tensors...) != tensor.Digest(in...) {
			t.Fatalf("output of %s carries other data", o.Model)
		}
	}
	if fmt.Sprint(models) != "[q x y]" {
		t.Fatalf("outputs %v, want [q x y] (sorted by model)", models)
	}
	// Lineage union: p (shared by x and y) once, q, x, y.
	count := map[string]int{}
	for _, l := range resp.Lineage {
		count[l.Model]++
	}
	if len(resp.Lineage) != 4 || count["p"] != 1 || count["q"] != 1 || count["x"] != 1 || count["y"] != 1 {
		t.Fatalf("lineage %v", resp.Lineage)
	}
	for _, l := range resp.Lineage {
		if (l.Model == "x" || l.Model == "y") && (l.PredModel != "p" || l.PredSeq != 1) {
			t.Fatalf("lineage entry %v should follow p's seq 1", l)
		}
	}
}

func TestConcurrentClientsGetTheirOwnReplies(t *testing.T) {
	e := newEnv(t, "5s")
	const n = 40
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := echoInputs(1+i%3, float32(100*i))
			svc := "echo"
			if i%2 == 1 {
				svc = "fan"
				in = in[:1]
			}
			resp, err := e.client.Predict(ctxT(t, 10*time.Second), &hamsv1.PredictRequest{Service: svc, Inputs: in, RequestId: fmt.Sprintf("c-%d", i)})
			if err != nil {
				errs <- err
				return
			}
			if resp.RequestId != fmt.Sprintf("c-%d", i) {
				errs <- fmt.Errorf("client %d got reply for %q", i, resp.RequestId)
				return
			}
			for _, o := range resp.Outputs {
				if tensor.Digest(o.Tensors...) != tensor.Digest(in...) {
					errs <- fmt.Errorf("client %d got another client's data from %s", i, o.Model)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	eventually(t, "empty request table", func() bool { return e.pending() == 0 })
}

func TestIdempotentRetryAfterAnswer(t *testing.T) {
	e := newEnv(t, "5s")
	req := &hamsv1.PredictRequest{Service: "echo", RequestId: "once", Inputs: echoInputs(1, 5)}
	r1, err := e.client.Predict(ctxT(t, 5*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := e.client.Predict(ctxT(t, 5*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	if r1.ReqId != r2.ReqId || tensor.Digest(r2.Outputs[0].Tensors...) != tensor.Digest(r1.Outputs[0].Tensors...) {
		t.Fatalf("retry got another reply: %d vs %d", r1.ReqId, r2.ReqId)
	}
	if got := e.models["a"].executed.Load(); got != 1 {
		t.Fatalf("model a executed %d times, want 1", got)
	}
	// A model error is remembered too.
	bad := &hamsv1.PredictRequest{Service: "echo", RequestId: "bad-once", StreamId: "fail:a", Inputs: echoInputs(1, 5)}
	for range 2 {
		_, err := e.client.Predict(ctxT(t, 5*time.Second), bad)
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("error retry: %v", err)
		}
	}
	if got := e.models["a"].executed.Load(); got != 2 {
		t.Fatalf("model a executed %d times, want 2", got)
	}
	// The same request_id in another service is another request.
	r3, err := e.client.Predict(ctxT(t, 5*time.Second), &hamsv1.PredictRequest{Service: "fan", RequestId: "once", Inputs: echoInputs(1, 5)[:1]})
	if err != nil || r3.ReqId == r1.ReqId {
		t.Fatalf("other service, same request_id: %v %v", r3, err)
	}
}

func TestIdempotentRetryWhileInFlight(t *testing.T) {
	e := newEnv(t, "5s")
	req := &hamsv1.PredictRequest{Service: "echo", RequestId: "dup", StreamId: "hold:a", Inputs: echoInputs(1, 9)}
	type res struct {
		r   *hamsv1.PredictResponse
		err error
	}
	out := make(chan res, 3)
	for range 3 {
		go func() {
			r, err := e.client.Predict(ctxT(t, 5*time.Second), req)
			out <- res{r, err}
		}()
	}
	// Wait until all three calls are in the frontend (one execution, three
	// waiters) before letting the model run.
	eventually(t, "three waiters on one call", func() bool {
		e.fe.mu.Lock()
		defer e.fe.mu.Unlock()
		c := e.fe.inflight[idemKey{"echo", "dup"}]
		return c != nil && c.waiters == 3
	})
	close(e.models["a"].gate)
	var ids []uint64
	for range 3 {
		r := <-out
		if r.err != nil {
			t.Fatalf("Predict: %v", r.err)
		}
		ids = append(ids, r.r.ReqId)
	}
	if ids[0] != ids[1] || ids[1] != ids[2] {
		t.Fatalf("req_ids %v: retries executed separately", ids)
	}
	if got := e.models["a"].executed.Load(); got != 1 {
		t.Fatalf("model a executed %d times, want 1", got)
	}
}

func TestModelErrorAnswersClient(t *testing.T) {
	e := newEnv(t, "5s")
	_, err := e.client.Predict(ctxT(t, 5*time.Second), &hamsv1.PredictRequest{Service: "echo", StreamId: "fail:a", Inputs: echoInputs(1, 1)})
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument || !msgHas(st.Message(), "model a", "images") {
		t.Fatalf("error %v", err)
	}
	// An error in a branch of a fan-out answers the client at once, and
	// the other branches' late parts are dropped.
	_, err = e.client.Predict(ctxT(t, 5*time.Second), &hamsv1.PredictRequest{Service: "fan", StreamId: "fail:x", Inputs: echoInputs(1, 1)[:1]})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !msgHas(st.Message(), "model x") {
		t.Fatalf("fan error %v", err)
	}
	e.mustEcho(3)
	eventually(t, "empty request table", func() bool { return e.pending() == 0 })
}

func TestClientDeadline(t *testing.T) {
	e := newEnv(t, "5s")
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	_, err := e.client.Predict(ctx, &hamsv1.PredictRequest{Service: "echo", StreamId: "drop:a", Inputs: echoInputs(1, 1)})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("error %v, want DeadlineExceeded", err)
	}
	eventually(t, "expired request leaves the table", func() bool { return e.pending() == 0 })
	e.mustEcho(4)
}

func TestRequestTimeoutDefault(t *testing.T) {
	e := newEnv(t, "200ms")
	start := time.Now()
	_, err := e.client.Predict(ctxT(t, 5*time.Second), &hamsv1.PredictRequest{Service: "fan", RequestId: "slow", StreamId: "drop:y", Inputs: echoInputs(1, 1)[:1]})
	if st := status.Convert(err); st.Code() != codes.DeadlineExceeded {
		t.Fatalf("error %v, want DeadlineExceeded", err)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("answered after %v; request_timeout is 200ms", el)
	}
	eventually(t, "expired request leaves the table", func() bool { return e.pending() == 0 })
	// A deadline is not remembered: the retry executes again.
	_, err = e.client.Predict(ctxT(t, 5*time.Second), &hamsv1.PredictRequest{Service: "fan", RequestId: "slow", Inputs: echoInputs(1, 1)[:1]})
	if err != nil {
		t.Fatalf("retry after deadline: %v", err)
	}
}

func TestExpiryLoopWithoutWaiter(t *testing.T) {
	// The table's deadline is enforced by the expiry loop on its own: put a
	// request in the table with no client and a deadline in the past.
	e := newEnv(t, "5s")
	e.fe.mu.Lock()
	id := e.fe.table.add("echo", "", []string{"a"}, time.Now().Add(-time.Millisecond))
	c := &call{reqID: id, service: "echo", waiters: 1, done: make(chan struct{})}
	e.fe.calls[id] = c
	e.fe.mu.Unlock()
	select {
	case e.fe.kick <- struct{}{}:
	default:
	}
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		t.Fatal("expiry loop did not expire the request")
	}
	if status.Code(c.err) != codes.DeadlineExceeded {
		t.Fatalf("error %v", c.err)
	}
	eventually(t, "empty table", func() bool { return e.pending() == 0 })
}

func TestUnavailableEntry(t *testing.T) {
	e := newEnv(t, "5s")
	addr, _, _ := e.res.Resolve("a")
	e.res.set("a", "")
	_, err := e.client.Predict(ctxT(t, 5*time.Second), &hamsv1.PredictRequest{Service: "echo", Inputs: echoInputs(1, 1)})
	if st := status.Convert(err); st.Code() != codes.Unavailable || !msgHas(st.Message(), `"a"`) {
		t.Fatalf("error %v, want Unavailable naming a", err)
	}
	e.res.set("a", addr)
	e.mustEcho(5)
}

func TestListServices(t *testing.T) {
	e := newEnv(t, "5s")
	resp, err := e.client.ListServices(ctxT(t, 5*time.Second), &hamsv1.ListServicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Services) != 2 || resp.Services[0].Name != "echo" || resp.Services[1].Name != "fan" {
		t.Fatalf("services %v", resp.Services)
	}
	fan := resp.Services[1]
	if fmt.Sprint(fan.EntryModels) != "[p q]" || fmt.Sprint(fan.SinkModels) != "[q x y]" || len(fan.Models) != 4 {
		t.Fatalf("fan %v", fan)
	}
	if len(resp.Services[0].Inputs) != 2 || resp.Services[0].Inputs[0].Shape[0] != -1 {
		t.Fatalf("echo inputs %v", resp.Services[0].Inputs)
	}
}

func TestShutdownAnswersPending(t *testing.T) {
	e := newEnv(t, "5s")
	errc := make(chan error, 1)
	go func() {
		_, err := e.client.Predict(ctxT(t, 5*time.Second), &hamsv1.PredictRequest{Service: "echo", StreamId: "drop:a", Inputs: echoInputs(1, 1)})
		errc <- err
	}()
	eventually(t, "request pending", func() bool { return e.pending() > 0 })
	e.stop()
	select {
	case err := <-errc:
		if c := status.Code(err); c != codes.Unavailable {
			t.Fatalf("pending call answered %v, want Unavailable", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("pending call not answered at shutdown")
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	dep, err := config.Parse([]byte(fmt.Sprintf(testYAML, "1s")))
	if err != nil {
		t.Fatal(err)
	}
	l := listen(t)
	defer l.Close()
	cases := map[string]Config{
		"deployment":        {Resolver: newStaticResolver(), GRPCListener: l, InternalListener: l},
		"resolver":          {Deployment: dep, GRPCListener: l, InternalListener: l},
		"listener":          {Deployment: dep, Resolver: newStaticResolver(), InternalListener: l},
		"internal listener": {Deployment: dep, Resolver: newStaticResolver(), GRPCListener: l},
	}
	for name, cfg := range cases {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New accepted a config without it", name)
		}
	}
}
