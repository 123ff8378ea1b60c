package frontend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/audit"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// gateYAML: "one" is frontend -> s1 -> frontend (s1 replicated stateful);
// "two" is frontend -> t1 -> q -> t2 -> frontend (two replicated stateful
// models with a stateless one between); "plain" is stateless; "loose" runs
// through u, stateful but not replicated (ha: off).
const gateYAML = `
name: gt
mode: %s
limits:
  max_message_bytes: 65536
  request_timeout: %s
models:
  - {name: s1, kind: lstm, stateful: true, placement: {primary: h1, backup: h2}}
  - {name: t1, kind: lstm, stateful: true, placement: {primary: h1, backup: h2}}
  - {name: q, kind: prep}
  - {name: t2, kind: olearn, stateful: true, placement: {primary: h2, backup: h1}}
  - {name: p, kind: prep}
  - {name: u, kind: lstm, stateful: true, ha: "off"}
services:
  - name: one
    edges: [[frontend, s1], [s1, frontend]]
  - name: two
    edges: [[frontend, t1], [t1, q], [q, t2], [t2, frontend]]
  - name: plain
    edges: [[frontend, p], [p, frontend]]
  - name: loose
    edges: [[frontend, u], [u, frontend]]
`

// fakeCoord is a channel-driven Coord: notices sent on durable reach the
// running watch; the first watchFails watches and the first completeFails
// Complete calls fail.
type fakeCoord struct {
	durable chan *hamsv1.DurabilityNotice

	mu            sync.Mutex
	watchFails    int
	watchCalls    int
	watchModels   []string
	applied       int // notices handed to the frontend
	completeFails int
	completeCalls int
	completed     []*hamsv1.CompletionNotice
}

func newFakeCoord() *fakeCoord {
	return &fakeCoord{durable: make(chan *hamsv1.DurabilityNotice, 64)}
}

func (c *fakeCoord) WatchDurable(ctx context.Context, models []string, fn func(*hamsv1.DurabilityNotice)) error {
	c.mu.Lock()
	c.watchCalls++
	c.watchModels = append([]string(nil), models...)
	fail := c.watchCalls <= c.watchFails
	c.mu.Unlock()
	if fail {
		return errors.New("fake coord: watch failed")
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case n := <-c.durable:
			fn(n)
			c.mu.Lock()
			c.applied++
			c.mu.Unlock()
		}
	}
}

func (c *fakeCoord) Complete(ctx context.Context, n *hamsv1.CompletionNotice) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.completeCalls++
	if c.completeCalls <= c.completeFails {
		return errors.New("fake coord: publish failed")
	}
	c.completed = append(c.completed, n)
	return nil
}

func (c *fakeCoord) get(fn func()) { c.mu.Lock(); defer c.mu.Unlock(); fn() }

// announce hands a notice to the watch and waits until the frontend applied
// it, so what the test checks next already reflects it.
func (c *fakeCoord) announce(t *testing.T, model string, seq uint64) {
	t.Helper()
	var before int
	c.get(func() { before = c.applied })
	c.durable <- &hamsv1.DurabilityNotice{Model: model, DurableSeq: seq, Epoch: 1}
	eventually(t, fmt.Sprintf("notice %s>=%d applied", model, seq), func() bool {
		var n int
		c.get(func() { n = c.applied })
		return n > before
	})
}

// completedIDs counts every req_id published in completion notices.
func (c *fakeCoord) completedIDs() map[uint64]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[uint64]int{}
	for _, n := range c.completed {
		for _, id := range n.ReqIds {
			out[id]++
		}
	}
	return out
}

func newGateEnv(t *testing.T, mode, timeout string, co Coord, seqStart map[string]uint64, more func(*Config)) *env {
	t.Helper()
	return newEnvWith(t, envOpts{
		yaml:     fmt.Sprintf(gateYAML, mode, timeout),
		seqStart: seqStart,
		config: func(c *Config) {
			if co != nil {
				c.Coord = co
			}
			if more != nil {
				more(c)
			}
		},
	})
}

func (e *env) held() int {
	e.fe.mu.Lock()
	defer e.fe.mu.Unlock()
	if e.fe.holds == nil {
		return 0
	}
	if e.fe.holds.len() != e.fe.holds.gate.Held() {
		e.t.Errorf("hold area %d replies, gate %d", e.fe.holds.len(), e.fe.holds.gate.Held())
	}
	return e.fe.holds.len()
}

// onlyHeld is the req_id and reply of the one reply in the hold area (the
// caller waited for held() == 1).
func (e *env) onlyHeld() (uint64, *hamsv1.PredictResponse) {
	e.fe.mu.Lock()
	defer e.fe.mu.Unlock()
	if n := e.fe.holds.len(); n != 1 {
		e.t.Fatalf("%d held replies, want 1", n)
	}
	for id, r := range e.fe.holds.byID {
		return id, r.resp
	}
	return 0, nil
}

type result struct {
	resp *hamsv1.PredictResponse
	err  error
}

// predictAsync sends one request and delivers its answer on the channel.
func (e *env) predictAsync(ctx context.Context, req *hamsv1.PredictRequest) <-chan result {
	out := make(chan result, 1)
	go func() {
		resp, err := e.client.Predict(ctx, req)
		out <- result{resp, err}
	}()
	return out
}

func vec(v float32) []*hamsv1.Tensor {
	return []*hamsv1.Tensor{tensor.FromFloat32("v", []int64{1, 2}, []float32{v, v + 1})}
}

func await(t *testing.T, what string, c <-chan result) result {
	t.Helper()
	select {
	case r := <-c:
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
	return result{}
}

func notDone(t *testing.T, what string, c <-chan result) {
	t.Helper()
	select {
	case r := <-c:
		t.Fatalf("%s answered before its states were durable: %v %v", what, r.resp, r.err)
	default:
	}
}

func lineageSeq(resp *hamsv1.PredictResponse, model string) uint64 {
	for _, l := range resp.GetLineage() {
		if l.Model == model {
			return l.Seq
		}
	}
	return 0
}

func TestGatedReplyWaitsForItsStatefulSeq(t *testing.T) {
	co := newFakeCoord()
	e := newGateEnv(t, "nspb", "5s", co, map[string]uint64{"s1": 4}, nil)
	c := e.predictAsync(ctxT(t, 10*time.Second), &hamsv1.PredictRequest{Service: "one", Inputs: vec(1)})
	eventually(t, "reply held", func() bool { return e.held() == 1 })
	if got := metricValue(t, e.fe.m.held); got != 1 {
		t.Fatalf("held_replies gauge %v, want 1", got)
	}
	co.announce(t, "s1", 4)
	notDone(t, "a reply depending on s1 seq 5 after s1>=4", c)
	if e.held() != 1 {
		t.Fatal("s1>=4 released a reply depending on seq 5")
	}
	co.announce(t, "s1", 5)
	r := await(t, "release after s1>=5", c)
	if r.err != nil {
		t.Fatalf("Predict: %v", r.err)
	}
	if lineageSeq(r.resp, "s1") != 5 || tensor.Digest(r.resp.Outputs[0].Tensors...) != tensor.Digest(vec(1)...) {
		t.Fatalf("reply %v", r.resp)
	}
	if e.held() != 0 || e.pending() != 0 {
		t.Fatalf("state left: held %d pending %d", e.held(), e.pending())
	}
	if n := histCount(t, e.fe.m.gatingWait); n != 1 {
		t.Fatalf("gating wait histogram has %d observations, want 1", n)
	}
	// s1 is durable to 5 now: the next reply (seq 6) waits, a notice to 7
	// releases it.
	c = e.predictAsync(ctxT(t, 10*time.Second), &hamsv1.PredictRequest{Service: "one", Inputs: vec(2)})
	eventually(t, "second reply held", func() bool { return e.held() == 1 })
	co.announce(t, "s1", 7)
	if r := await(t, "second release", c); r.err != nil || lineageSeq(r.resp, "s1") != 6 {
		t.Fatalf("second reply %v %v", r.resp, r.err)
	}
	co.get(func() {
		if fmt.Sprint(co.watchModels) != "[s1 t1 t2]" {
			t.Errorf("watched %v, want the replicated stateful models [s1 t1 t2]", co.watchModels)
		}
	})
}

func TestGatedReplyWaitsForEveryStatefulModel(t *testing.T) {
	co := newFakeCoord()
	e := newGateEnv(t, "nspb-s2", "5s", co, nil, nil)
	c := e.predictAsync(ctxT(t, 10*time.Second), &hamsv1.PredictRequest{Service: "two", Inputs: vec(1)})
	eventually(t, "reply held", func() bool { return e.held() == 1 })
	co.announce(t, "t2", 1)
	co.announce(t, "s1", 100) // another service's model
	notDone(t, "a reply depending on t1 and t2 after t2 alone", c)
	co.announce(t, "t1", 1)
	r := await(t, "release after t1 and t2", c)
	if r.err != nil {
		t.Fatalf("Predict: %v", r.err)
	}
	if lineageSeq(r.resp, "t1") != 1 || lineageSeq(r.resp, "q") != 1 || lineageSeq(r.resp, "t2") != 1 {
		t.Fatalf("lineage %v", r.resp.Lineage)
	}
	if e.held() != 0 || e.pending() != 0 {
		t.Fatalf("state left: held %d pending %d", e.held(), e.pending())
	}
}

func TestUngatedRepliesLeaveAtOnce(t *testing.T) {
	t.Run("stateless and unreplicated services in nspb", func(t *testing.T) {
		co := newFakeCoord()
		e := newGateEnv(t, "nspb", "5s", co, nil, nil)
		for _, svc := range []string{"plain", "loose"} {
			resp, err := e.client.Predict(ctxT(t, 5*time.Second), &hamsv1.PredictRequest{Service: svc, Inputs: vec(1)})
			if err != nil || len(resp.Outputs) != 1 {
				t.Fatalf("%s: %v %v", svc, resp, err)
			}
		}
		eventually(t, "completions of both", func() bool { return len(co.completedIDs()) == 2 })
	})
	for _, mode := range []string{"bare", "remus", "nspb-s1", "replay"} {
		t.Run(mode+" without coordination", func(t *testing.T) {
			e := newGateEnv(t, mode, "5s", nil, nil, nil)
			if e.fe.holds != nil {
				t.Fatalf("mode %s gates replies", mode)
			}
			for _, svc := range []string{"one", "two", "plain"} {
				if _, err := e.client.Predict(ctxT(t, 5*time.Second), &hamsv1.PredictRequest{Service: svc, Inputs: vec(1)}); err != nil {
					t.Fatalf("%s: %v", svc, err)
				}
			}
		})
	}
	t.Run("bare with coordination", func(t *testing.T) {
		co := newFakeCoord()
		e := newGateEnv(t, "bare", "5s", co, nil, nil)
		if _, err := e.client.Predict(ctxT(t, 5*time.Second), &hamsv1.PredictRequest{Service: "one", Inputs: vec(1)}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "completion", func() bool { return co.completedIDs()[1] == 1 })
		co.get(func() {
			if co.watchCalls != 0 {
				t.Errorf("bare mode watched durability %d times", co.watchCalls)
			}
		})
	})
}

func TestHeldReplyPastItsDeadlineLeavesNoState(t *testing.T) {
	co := newFakeCoord()
	dir := t.TempDir()
	e := newGateEnv(t, "nspb", "5s", co, nil, func(c *Config) { c.AuditDir = dir })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	c := e.predictAsync(ctx, &hamsv1.PredictRequest{Service: "one", Inputs: vec(1), RequestId: "r-1"})
	eventually(t, "reply held", func() bool { return e.held() == 1 })
	r := await(t, "deadline", c)
	if status.Code(r.err) != codes.DeadlineExceeded {
		t.Fatalf("held reply past its deadline: %v %v", r.resp, r.err)
	}
	eventually(t, "no state", func() bool { return e.held() == 0 && e.pending() == 0 })
	e.fe.mu.Lock()
	gateHeld, heap := e.fe.holds.gate.Held(), e.fe.holds.byDue.Len()
	e.fe.mu.Unlock()
	if gateHeld != 0 || heap != 0 {
		t.Fatalf("gate still holds %d, deadline heap %d", gateHeld, heap)
	}
	// A late notice releases nothing; a retry executes again and is
	// released by the next notice.
	co.announce(t, "s1", 1)
	c = e.predictAsync(ctxT(t, 10*time.Second), &hamsv1.PredictRequest{Service: "one", Inputs: vec(1), RequestId: "r-1"})
	eventually(t, "retry held", func() bool { return e.held() == 1 })
	co.announce(t, "s1", 2)
	if r := await(t, "retry", c); r.err != nil || r.resp.ReqId != 2 || lineageSeq(r.resp, "s1") != 2 {
		t.Fatalf("retry: %v %v", r.resp, r.err)
	}
	eventually(t, "completions", func() bool { ids := co.completedIDs(); return ids[1] == 1 && ids[2] == 1 })
	e.stop()
	recs, err := audit.ReadAll[audit.Reply](dir, audit.RepliesFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].ReqID != "2" {
		t.Fatalf("audit records %+v, want only the released req 2", recs)
	}
}

// TestHoldExpiryLoopBackstop: the expiry loop answers a held reply at its
// table deadline even when the client's own deadline is later.
func TestHoldExpiryLoopBackstop(t *testing.T) {
	co := newFakeCoord()
	var skew atomic.Int64
	e := newEnvWith(t, envOpts{
		yaml:      fmt.Sprintf(gateYAML, "nspb", "5s"),
		config:    func(c *Config) { c.Coord = co },
		beforeRun: func(f *Frontend) { f.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) } },
	})
	// The frontend clock jumps 10 s ahead once the reply is held, so the
	// expiry loop sees its deadline passed while the caller still waits.
	c := e.predictAsync(ctxT(t, 10*time.Second), &hamsv1.PredictRequest{Service: "one", Inputs: vec(1)})
	eventually(t, "reply held", func() bool { return e.held() == 1 })
	skew.Store(int64(10 * time.Second))
	signal(e.fe.kick)
	r := await(t, "expiry", c)
	st := status.Convert(r.err)
	if st.Code() != codes.DeadlineExceeded || !msgHas(st.Message(), "durability of s1 (seq 1, durable 0)") {
		t.Fatalf("expired held reply: %v", st)
	}
	eventually(t, "no state", func() bool { return e.held() == 0 && e.pending() == 0 })
}

func TestCompletionNoticesNameEveryAnsweredRequestOnce(t *testing.T) {
	co := newFakeCoord()
	co.completeFails = 2
	e := newGateEnv(t, "nspb", "5s", co, nil, func(c *Config) { c.Name = "fe-a" })
	const n = 300
	var wg sync.WaitGroup
	var mu sync.Mutex
	codesSeen := map[codes.Code]int{}
	var okIDs []uint64
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := &hamsv1.PredictRequest{Service: "one", Inputs: vec(float32(i))}
			ctx := ctxT(t, 10*time.Second)
			switch {
			case i%10 == 3:
				req.Service = "plain"
				req.StreamId = "fail:p"
			case i%10 == 7:
				req.Service = "plain"
			case i == 5:
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
				defer cancel()
				req.StreamId = "drop:s1" // never comes back: expires in the table
			}
			resp, err := e.client.Predict(ctx, req)
			mu.Lock()
			defer mu.Unlock()
			codesSeen[status.Code(err)]++
			if err == nil {
				okIDs = append(okIDs, resp.ReqId)
			}
		}()
	}
	// Release the gated replies as they arrive until every call returned.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	deadline := time.After(20 * time.Second)
	for seq := uint64(1); ; seq++ {
		select {
		case <-done:
		case <-deadline:
			t.Fatal("calls did not finish")
		default:
			eventually(t, "some reply held or all answered", func() bool {
				select {
				case <-done:
					return true
				default:
				}
				return e.held() > 0
			})
			co.announce(t, "s1", seq*8)
			continue
		}
		break
	}
	if codesSeen[codes.OK] != n-31 || codesSeen[codes.InvalidArgument] != 30 || codesSeen[codes.DeadlineExceeded] != 1 {
		t.Fatalf("answers by code %v", codesSeen)
	}
	// The request with a 200 ms deadline may expire in the client before
	// it is sent when the machine is loaded (then no req_id was handed
	// out for it): every req_id the frontend handed out is completed.
	e.fe.mu.Lock()
	assigned := e.fe.table.next
	e.fe.mu.Unlock()
	if assigned != n && assigned != n-1 {
		t.Fatalf("%d req_ids handed out for %d requests", assigned, n)
	}
	eventually(t, "every req_id completed", func() bool { return uint64(len(co.completedIDs())) == assigned })
	ids := co.completedIDs()
	for id := uint64(1); id <= assigned; id++ {
		if ids[id] != 1 {
			t.Fatalf("req_id %d named %d times in completion notices", id, ids[id])
		}
	}
	for _, id := range okIDs {
		if ids[id] != 1 {
			t.Fatalf("released req_id %d not completed", id)
		}
	}
	co.get(func() {
		for _, cn := range co.completed {
			if cn.Frontend != "fe-a" || len(cn.ReqIds) == 0 || len(cn.ReqIds) > completionBatch {
				t.Errorf("notice from %q with %d ids", cn.Frontend, len(cn.ReqIds))
			}
		}
	})
	if got := metricValue(t, e.fe.m.completionErrors); got != 2 {
		t.Fatalf("completion errors %v, want 2 (retried)", got)
	}
	if got := metricValue(t, e.fe.m.completions); got != float64(assigned) {
		t.Fatalf("completed requests published %v, want %d", got, assigned)
	}
}

func TestCompletionsAnsweredAtShutdownAreFlushed(t *testing.T) {
	co := newFakeCoord()
	e := newGateEnv(t, "nspb", "5s", co, nil, nil)
	c := e.predictAsync(ctxT(t, 10*time.Second), &hamsv1.PredictRequest{Service: "one", Inputs: vec(1)})
	eventually(t, "reply held", func() bool { return e.held() == 1 })
	e.stop()
	if r := await(t, "shutdown answer", c); status.Code(r.err) != codes.Unavailable {
		t.Fatalf("held reply at shutdown: %v %v", r.resp, r.err)
	}
	if ids := co.completedIDs(); len(ids) != 1 || ids[1] != 1 {
		t.Fatalf("completions after shutdown %v, want req 1 once", ids)
	}
}

func TestAuditOneRecordPerReleasedReply(t *testing.T) {
	co := newFakeCoord()
	dir := t.TempDir()
	e := newGateEnv(t, "nspb", "5s", co, map[string]uint64{"t1": 10}, func(c *Config) { c.AuditDir = dir; c.Name = "fe-7" })
	co.announce(t, "t1", 1000)
	co.announce(t, "t2", 1000)
	var resps []*hamsv1.PredictResponse
	for i, svc := range []string{"two", "plain", "two", "loose"} {
		req := &hamsv1.PredictRequest{Service: svc, Inputs: vec(float32(i))}
		if i == 2 {
			req.RequestId = "client-chose-this"
		}
		resp, err := e.client.Predict(ctxT(t, 5*time.Second), req)
		if err != nil {
			t.Fatalf("%s: %v", svc, err)
		}
		resps = append(resps, resp)
	}
	// Errors are answered but not audited.
	if _, err := e.client.Predict(ctxT(t, 5*time.Second), &hamsv1.PredictRequest{Service: "two", Inputs: vec(9), StreamId: "fail:q"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("failing request: %v", err)
	}
	path := filepath.Join(dir, "fe-7", audit.RepliesFile)
	// The periodic flush writes them while the frontend runs.
	eventually(t, "audit flushed", func() bool {
		recs, err := audit.ReadAll[audit.Reply](dir, audit.RepliesFile)
		return err == nil && len(recs) == len(resps)
	})
	e.stop()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("audit file: %v", err)
	}
	recs, err := audit.ReadAll[audit.Reply](dir, audit.RepliesFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(resps) {
		t.Fatalf("%d records, want %d (one per released reply)", len(recs), len(resps))
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].ReqID < recs[j].ReqID })
	for i, resp := range resps {
		rec := recs[i]
		if rec.ReqID != fmt.Sprint(resp.ReqId) {
			t.Fatalf("record %d req_id %q, want %d", i, rec.ReqID, resp.ReqId)
		}
		var ts []*hamsv1.Tensor
		for _, o := range resp.Outputs {
			ts = append(ts, o.Tensors...)
		}
		if rec.ReplyDigest != tensor.Digest(ts...) || rec.ReplyDigest != tensor.Digest(vec(float32(i))...) {
			t.Fatalf("record %d reply digest %s", i, rec.ReplyDigest)
		}
		if len(rec.Lineage) != len(resp.Lineage) {
			t.Fatalf("record %d lineage %+v, reply lineage %v", i, rec.Lineage, resp.Lineage)
		}
		for j, l := range resp.Lineage {
			s := rec.Lineage[j]
			if s.Model != l.Model || s.Seq != l.Seq || s.OutputDigest != l.OutputDigest || s.OutputDigest == "" {
				t.Fatalf("record %d step %d %+v, reply entry %v", i, j, s, l)
			}
		}
	}
	if recs[0].Lineage[0].Model != "t1" || recs[0].Lineage[0].Seq != 11 || recs[0].Lineage[2].Model != "t2" {
		t.Fatalf("lineage not in traversal order: %+v", recs[0].Lineage)
	}
}

func TestDurabilityWatchIsRetried(t *testing.T) {
	co := newFakeCoord()
	co.watchFails = 3
	e := newGateEnv(t, "nspb", "5s", co, nil, nil)
	c := e.predictAsync(ctxT(t, 10*time.Second), &hamsv1.PredictRequest{Service: "one", Inputs: vec(1)})
	eventually(t, "watch restarted", func() bool {
		var n int
		co.get(func() { n = co.watchCalls })
		return n == 4
	})
	co.announce(t, "s1", 1)
	if r := await(t, "release through the restarted watch", c); r.err != nil {
		t.Fatalf("Predict: %v", r.err)
	}
	if got := metricValue(t, e.fe.m.watchRestarts); got != 3 {
		t.Fatalf("watch restarts %v, want 3", got)
	}
}

func TestCoordinationConfigErrors(t *testing.T) {
	mk := func(mode string, more func(*Config)) error {
		dep, err := config.Parse([]byte(fmt.Sprintf(gateYAML, mode, "5s")))
		if err != nil {
			t.Fatal(err)
		}
		l := listen(t)
		defer l.Close()
		cfg := Config{Deployment: dep, Resolver: newStaticResolver(), GRPCListener: l, InternalListener: listen(t)}
		if more != nil {
			more(&cfg)
		}
		_, err = New(cfg)
		return err
	}
	for _, mode := range []string{"nspb", "nspb-s2"} {
		err := mk(mode, nil)
		if !errors.Is(err, ErrConfig) || !msgHas(err.Error(), mode, "Coord", "s1") {
			t.Fatalf("%s without Coord: %v", mode, err)
		}
	}
	for _, mode := range []string{"bare", "remus", "nspb-s1", "replay"} {
		if err := mk(mode, nil); err != nil {
			t.Fatalf("%s without Coord: %v", mode, err)
		}
	}
	for _, name := range []string{"a/b", `a\b`, "..", "."} {
		err := mk("nspb", func(c *Config) { c.Coord = newFakeCoord(); c.AuditDir = t.TempDir(); c.Name = name })
		if !errors.Is(err, ErrConfig) || !msgHas(err.Error(), "audit") {
			t.Fatalf("name %q: %v", name, err)
		}
	}
	// A stateless deployment in nspb needs no Coord.
	dep, err := config.Parse([]byte("name: x\nmodels: [{name: p, kind: prep}]\nservices: [{name: s, edges: [[frontend, p], [p, frontend]]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if dep.Mode != "nspb" {
		t.Fatalf("default mode %q", dep.Mode)
	}
	l := listen(t)
	defer l.Close()
	if _, err := New(Config{Deployment: dep, Resolver: newStaticResolver(), GRPCListener: l, InternalListener: listen(t)}); err != nil {
		t.Fatalf("stateless nspb deployment without Coord: %v", err)
	}
}

func TestAuditDirThatCannotBeCreatedFailsRun(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dep, err := config.Parse([]byte(fmt.Sprintf(gateYAML, "bare", "5s")))
	if err != nil {
		t.Fatal(err)
	}
	l := listen(t)
	defer l.Close()
	fe, err := New(Config{Deployment: dep, Resolver: newStaticResolver(), GRPCListener: l, InternalListener: listen(t), AuditDir: file})
	if err != nil {
		t.Fatal(err)
	}
	if err := fe.Run(ctxT(t, 5*time.Second)); err == nil || !msgHas(err.Error(), "audit") {
		t.Fatalf("Run with an audit dir under a file: %v", err)
	}
}

// metricValue reads a gauge or counter.
func metricValue(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		t.Fatal(err)
	}
	switch {
	case out.Gauge != nil:
		return out.Gauge.GetValue()
	case out.Counter != nil:
		return out.Counter.GetValue()
	}
	t.Fatalf("metric %v is neither gauge nor counter", m.Desc())
	return 0
}

func histCount(t *testing.T, h prometheus.Histogram) uint64 {
	t.Helper()
	var out dto.Metric
	if err := h.Write(&out); err != nil {
		t.Fatal(err)
	}
	return out.GetHistogram().GetSampleCount()
}
