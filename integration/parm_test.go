package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hams-go/hams/integration/checker"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/loadgen"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver/models"
)

// parmReply is one answered request of a ParM run: what was sent, what
// came back, and when.
type parmReply struct {
	id      string
	inputs  []*hamsv1.Tensor
	outputs []*hamsv1.Tensor
	approx  bool
	lineage []*hamsv1.LineageEntry
	reqID   uint64
	arrived time.Time
	latency time.Duration
}

// exactModel builds the deployed model in this process (the reference
// model server's own code on the same config), so the test knows the
// exact output of every request without asking the deployment.
func exactModel(t *testing.T, dep *config.Deployment, name string) models.Model {
	t.Helper()
	m := dep.Model(name)
	if m == nil {
		t.Fatalf("deployment %s has no model %q", dep.Name, name)
	}
	mm := *m
	mm.Replicas, mm.Parity, mm.Straggle, mm.Redundancy = config.Instances{}, nil, nil, ""
	em, err := models.New(&mm)
	if err != nil {
		t.Fatalf("build model %s in process: %v", name, err)
	}
	return em
}

// exactOutputs runs one request through em.
func exactOutputs(t *testing.T, em models.Model, inputs []*hamsv1.Tensor, batchID uint64) []*hamsv1.Tensor {
	t.Helper()
	res, err := em.Infer(&models.Batch{Inputs: inputs, Rows: []uint32{uint32(inputs[0].Shape[0])}, BatchID: batchID})
	if err != nil {
		t.Fatalf("in-process inference: %v", err)
	}
	return res.Outputs
}

// maxAbsDiff is the largest |a-b| over the FP32 tensors of two outputs
// (paired by name); +Inf when they do not pair up.
func maxAbsDiff(t *testing.T, got, want []*hamsv1.Tensor) float64 {
	t.Helper()
	if len(got) != len(want) {
		return math.Inf(1)
	}
	worst := 0.0
	for _, w := range want {
		var g *hamsv1.Tensor
		for _, x := range got {
			if x.Name == w.Name {
				g = x
			}
		}
		if g == nil {
			return math.Inf(1)
		}
		gv, err1 := tensor.Float32(g)
		wv, err2 := tensor.Float32(w)
		if err1 != nil || err2 != nil || len(gv) != len(wv) {
			return math.Inf(1)
		}
		for i := range wv {
			worst = max(worst, math.Abs(float64(gv[i])-float64(wv[i])))
		}
	}
	return worst
}

// parmRun drives closed-loop load on svc for d with clients clients (one
// stream each), checks every reply with chk and collects them; during is
// called in its own goroutine when the load starts, and the run waits for
// it.
func parmRun(t *testing.T, fe hamsv1.FrontendClient, dep *config.Deployment, svc string, chk *checker.Checker, clients int, d time.Duration, during func()) ([]parmReply, []error, loadgen.Stats) {
	t.Helper()
	gens := make([]*loadgen.Generator, clients)
	for i := range gens {
		var err error
		if gens[i], err = loadgen.NewGenerator(dep.Service(svc), uint64(i+1), 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu      sync.Mutex
		replies []parmReply
		errs    []error
	)
	cfg := loadgen.RunConfig{
		Client: fe, Concurrency: clients, Duration: d, Timeout: 10 * time.Second,
		NewRequest: func(c int, n uint64) *hamsv1.PredictRequest {
			req := &hamsv1.PredictRequest{Service: svc, RequestId: fmt.Sprintf("c%d-%d", c, n), StreamId: fmt.Sprintf("s%d", c), Inputs: gens[c].Inputs()}
			chk.Sent(req.RequestId, req)
			return req
		},
		OnResult: func(r loadgen.Result) {
			if r.Err != nil {
				chk.Failed(r.Request.RequestId, r.Err)
				mu.Lock()
				errs = append(errs, fmt.Errorf("request %s: %w", r.Request.RequestId, r.Err))
				mu.Unlock()
				return
			}
			if err := chk.Check(r.Request.RequestId, r.Reply); err != nil {
				t.Error(err)
			}
			var outs []*hamsv1.Tensor
			for _, o := range r.Reply.GetOutputs() {
				outs = append(outs, o.GetTensors()...)
			}
			mu.Lock()
			replies = append(replies, parmReply{id: r.Request.RequestId, inputs: r.Request.Inputs, outputs: outs, lineage: r.Reply.GetLineage(),
				approx: r.Reply.GetApproximate(), reqID: r.Reply.GetReqId(), arrived: r.Sent.Add(r.Latency), latency: r.Latency})
			mu.Unlock()
		},
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if during != nil {
			during()
		}
	}()
	st, err := loadgen.Run(context.Background(), cfg)
	<-done
	if err != nil {
		t.Fatal(err)
	}
	return replies, errs, st
}

// TestParMFrozenReplicaReconstructed runs a ParM pool of a linear model
// (4 replicas, k = 2, batches of one request) under `hams up` and freezes
// replica 0 (SIGSTOP) for 2 s under closed-loop load. The parity
// instances run a linear model of another seed, so a reconstruction has
// well-defined, wrong values: the test tells every reconstructed reply
// from an original by value. Every request must be answered, none after
// waiting for the frozen replica; some replies must be marked
// approximate; every unmarked reply must be the deployed model's exact
// output (computed here, in process) and every marked one must not be
// (it came from the wrong-seed parity model). The audit log must mark
// exactly the same replies.
//
// Mode bare: the deployment has no stateful model, so nspb would only add
// a hot standby sidecar and a second manager and frontend that this test
// does not look at (TestParMApproximateMarkThroughStatefulModel and
// TestParMChaosFeedingStatefulModel run pools under nspb), and a frozen
// replica cannot be mistaken for a failure of the pool's sidecar: bare
// has no failover.
func TestParMFrozenReplicaReconstructed(t *testing.T) {
	const svc, model = "lin", "lin"
	cfgPath, _ := filepath.Abs("testdata/parm-frozen.yaml")
	dep, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	em := exactModel(t, dep, model)
	chk := checker.New(checker.Service{Name: svc, Models: []string{model}, Sinks: []string{model}})

	runDir, auditDir := t.TempDir(), t.TempDir()
	up := startHams(t, 90*time.Second, "up", "--config", cfgPath, "--mode", "bare", "--run-dir", runDir, "--audit", auditDir, "--suspicion-timeout", suspicion)
	cc, err := grpcx.Dial(up.str(t, "frontend_grpc"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	fe := hamsv1.NewFrontendClient(cc)
	replica := "pool-replica_" + model + ".0"
	pid := childPID(t, runDir, replica)
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })

	var stopAt, contAt time.Time
	replies, errs, st := parmRun(t, fe, dep, svc, chk, 4, 4*time.Second, func() {
		time.Sleep(time.Second)
		stopAt = time.Now()
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Errorf("SIGSTOP %s (pid %d): %v", replica, pid, err)
		}
		time.Sleep(2 * time.Second)
		contAt = time.Now()
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Errorf("SIGCONT %s (pid %d): %v", replica, pid, err)
		}
	})
	if len(errs) > 0 {
		t.Fatalf("%d of %d requests failed while %s was frozen, e.g. %v", len(errs), st.Requests, replica, errs[0])
	}
	if sum := chk.Finish(); sum.Violations != 0 || sum.Errors != 0 {
		t.Fatalf("stats %+v, check %+v", st, sum)
	}

	// Exact replies equal the deployed model's output bit for bit (the
	// model is deterministic); approximate ones are far from it (the
	// wrong-seed parity model's reconstruction: differences of the order
	// of the outputs themselves, ~1).
	const wrongBy = 1e-3
	var approx, exact, approxFrozen int
	var slowest time.Duration
	approxIDs := map[string]bool{}
	for i, r := range replies {
		slowest = max(slowest, r.latency)
		d := maxAbsDiff(t, r.outputs, exactOutputs(t, em, r.inputs, uint64(i+1)))
		switch {
		case !r.approx && d != 0:
			t.Errorf("request %s: reply not marked approximate differs from the deployed model's exact output by %g (a reconstruction released unmarked)", r.id, d)
		case r.approx && d < wrongBy:
			t.Errorf("request %s: reply marked approximate equals the deployed model's output (max diff %g): an original marked as a reconstruction", r.id, d)
		}
		if r.approx {
			approx++
			approxIDs[strconv.FormatUint(r.reqID, 10)] = true
			if r.arrived.After(stopAt) && r.arrived.Before(contAt.Add(100*time.Millisecond)) {
				approxFrozen++
			}
		} else {
			exact++
		}
	}
	frozen := contAt.Sub(stopAt)
	t.Logf("%d replies (%d exact, %d approximate, %d of them while %s was frozen %v), p50 %.2f ms, p99 %.2f ms, max %v",
		len(replies), exact, approx, approxFrozen, replica, frozen.Round(time.Millisecond), st.P50Ms, st.P99Ms, slowest.Round(time.Millisecond))
	if approx == 0 {
		t.Fatalf("no reply marked approximate although %s was frozen for %v under load", replica, frozen.Round(time.Millisecond))
	}
	if exact == 0 {
		t.Fatal("no exact reply at all")
	}
	// The pool keeps the frozen replica busy with the batch it holds:
	// that batch is answered by reconstruction, not after the SIGCONT.
	if slowest > frozen/2 {
		t.Fatalf("a request took %v: it waited for %s (frozen %v) instead of being reconstructed", slowest, replica, frozen.Round(time.Millisecond))
	}

	// The frontend's audit log marks the same replies, and only them.
	up.stop(t, 20*time.Second)
	marked := auditApproximate(t, auditDir)
	if len(marked.all) != len(replies) {
		t.Fatalf("audit: %d reply records, the client got %d replies", len(marked.all), len(replies))
	}
	for id := range approxIDs {
		if !marked.approx[id] {
			t.Errorf("audit: reply req_id %s was approximate at the client but its record is not marked", id)
		}
	}
	for id := range marked.approx {
		if !approxIDs[id] {
			t.Errorf("audit: record req_id %s is marked approximate but the client got an exact reply", id)
		}
	}
}

// TestParMApproximateMarkThroughStatefulModel runs, in mode nspb, a ParM
// pool (parity instances of a wrong-seed linear model) feeding a
// replicated stateful LSTM. A reply's lineage names the pool's output
// digest: the test computes the pool model's exact output in process, so
// it knows for every reply whether the LSTM consumed an original or a
// reconstruction. A reply computed from a reconstruction must be marked
// approximate (docs/design.md: approximate replies are always marked; what is
// computed from a reconstruction is approximate too), and a reply
// computed from an original must not be: without failures, and across a
// failover of the stateful model (its primary sidecar SIGKILLed under
// load: the promoted backup re-sends the outputs it holds).
func TestParMApproximateMarkThroughStatefulModel(t *testing.T) {
	for _, tc := range []struct {
		name string
		kill string // child SIGKILLed after 1 s ("": none)
	}{
		{"steady", ""},
		{"stateful-primary-killed", "sidecar_ps-track"},
	} {
		t.Run(tc.name, func(t *testing.T) { parmMarkRun(t, tc.kill) })
	}
}

func parmMarkRun(t *testing.T, kill string) {
	const svc, pooled, stateful = "ps", "ps-embed", "ps-track"
	cfgPath, _ := filepath.Abs("testdata/parm-stateful.yaml")
	dep, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	em := exactModel(t, dep, pooled)
	chk := checker.New(checker.Service{Name: svc, Models: []string{pooled, stateful}, Sinks: []string{stateful}})
	runDir := t.TempDir()
	up := startHams(t, 90*time.Second, "up", "--config", cfgPath, "--mode", "nspb", "--run-dir", runDir, "--suspicion-timeout", suspicion)
	cc, err := grpcx.Dial(up.str(t, "frontend_grpc"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	var during func()
	if kill != "" {
		pid := childPID(t, runDir, kill)
		during = func() {
			time.Sleep(time.Second)
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Errorf("SIGKILL %s (pid %d): %v", kill, pid, err)
			}
		}
	}
	replies, errs, st := parmRun(t, hamsv1.NewFrontendClient(cc), dep, svc, chk, 4, 3*time.Second, during)
	if len(errs) > 0 {
		t.Fatalf("%d of %d requests failed, e.g. %v", len(errs), st.Requests, errs[0])
	}
	if sum := chk.Finish(); sum.Violations != 0 || sum.Errors != 0 {
		t.Fatalf("stats %+v, check %+v", st, sum)
	}
	var fromRecon, marked, unmarkedRecon, markedOrig int
	epochs := map[uint64]int{} // of the stateful model's steps
	for i, r := range replies {
		var step *hamsv1.LineageEntry
		for _, e := range r.lineage {
			switch e.GetModel() {
			case pooled:
				step = e
			case stateful:
				epochs[e.GetEpoch()]++
			}
		}
		if step == nil {
			t.Fatalf("request %s: the reply's lineage has no step of %s", r.id, pooled)
		}
		recon := step.GetOutputDigest() != tensor.Digest(exactOutputs(t, em, r.inputs, uint64(i+1))...)
		if recon {
			fromRecon++
		}
		if r.approx {
			marked++
		}
		switch {
		case recon && !r.approx:
			unmarkedRecon++
			if unmarkedRecon <= 3 {
				t.Errorf("request %s: %s seq %d output is a reconstruction (not the exact output), but the reply is not marked approximate", r.id, pooled, step.GetSeq())
			}
		case !recon && r.approx:
			markedOrig++
			if markedOrig <= 3 {
				t.Errorf("request %s: %s seq %d output is the exact original, but the reply is marked approximate", r.id, pooled, step.GetSeq())
			}
		}
	}
	t.Logf("%d replies: %d computed from a reconstruction, %d marked approximate; %d reconstructions unmarked, %d originals marked; replies per %s epoch %v; p50 %.2f ms, p99 %.2f ms",
		len(replies), fromRecon, marked, unmarkedRecon, markedOrig, stateful, epochs, st.P50Ms, st.P99Ms)
	if kill != "" && len(epochs) < 2 {
		t.Fatalf("%s was killed but every reply went through one epoch of %s (%v): no failover happened under load", kill, stateful, epochs)
	}
	if fromRecon == 0 {
		t.Fatalf("no reply computed from a reconstruction in %d replies (the pool decodes as soon as it can: some parity outputs must win)", len(replies))
	}
	if unmarkedRecon > 0 || markedOrig > 0 {
		t.Fatalf("%d replies computed from reconstructions were released unmarked, %d from originals marked", unmarkedRecon, markedOrig)
	}
}

// auditMarks are the reply records of an audit directory: every req_id,
// and those marked approximate.
type auditMarks struct{ all, approx map[string]bool }

// auditApproximate reads every replies.jsonl under dir.
func auditApproximate(t *testing.T, dir string) auditMarks {
	t.Helper()
	out := auditMarks{all: map[string]bool{}, approx: map[string]bool{}}
	n := 0
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "replies.jsonl" {
			return nil
		}
		n++
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		s := bufio.NewScanner(f)
		s.Buffer(make([]byte, 1<<20), 64<<20)
		for s.Scan() {
			var rec struct {
				ReqID       string `json:"req_id"`
				Approximate *bool  `json:"approximate"`
			}
			if err := json.Unmarshal(s.Bytes(), &rec); err != nil {
				t.Fatalf("%s: %q: %v", p, s.Text(), err)
			}
			if rec.Approximate != nil && !*rec.Approximate {
				t.Fatalf("%s: %q: approximate present but false (an exact record omits it)", p, s.Text())
			}
			out.all[rec.ReqID] = true
			if rec.Approximate != nil {
				out.approx[rec.ReqID] = true
			}
		}
		return nil
	})
	if n == 0 {
		t.Fatalf("no replies.jsonl under %s", dir)
	}
	return out
}

// TestParMChaosFeedingStatefulModel runs `hams chaos --config` on a
// deployment where a ParM pool with a straggling replica feeds a
// replicated stateful LSTM (testdata/parm-chaos.yaml), mode nspb: random
// kills of the LSTM's primary and backup, the pool's sidecar (its hot
// standby, with a pool of its own over the same replicas, takes over),
// frontends and managers under load. The report must show kills, every
// one recovered, one of them the pool's sidecar, no conflict and nothing
// lost (the consistency check over the audit logs, which judges the
// stateful model's history and the replies and does not recompute
// outputs, so reconstructed ones are checked like any other).
func TestParMChaosFeedingStatefulModel(t *testing.T) {
	const pooled = "pc-embed"
	cfgPath, _ := filepath.Abs("testdata/parm-chaos.yaml")
	dir := t.TempDir()
	out := filepath.Join(dir, "chaos.json")
	r := runHams(t, 120*time.Second, "chaos", "--config", cfgPath, "--service", "pc", "--mode", "nspb", "--duration", "20s", "--seed", "1",
		"--audit", filepath.Join(dir, "audit"), "--json", out)
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("exit %d, no report: %v\nstdout:\n%s\nstderr:\n%s", r.code, err, r.stdout, r.stderr)
	}
	var c struct {
		chaosJSON
		Service     string `json:"service"`
		Approximate *int   `json:"approximate"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if c.Requests == nil || c.Replies == nil || c.Conflicts == nil || c.Lost == nil || c.Duplicates == nil || c.Approximate == nil {
		t.Fatalf("report lacks fields: %s", b)
	}
	if r.code != 0 || *c.Conflicts != 0 || *c.Lost != 0 || len(c.Kills) == 0 || c.Service != "pc" {
		t.Fatalf("exit %d, report %s\nstdout:\n%s\nstderr:\n%s", r.code, b, r.stdout, r.stderr)
	}
	poolKills := 0
	for _, k := range c.Kills {
		if !k.Recovered || k.RestoredMs < 0 {
			t.Fatalf("kill %+v did not recover\nstdout:\n%s", k, r.stdout)
		}
		if k.Target == "sidecar:"+pooled {
			poolKills++
		}
	}
	if poolKills == 0 {
		t.Fatalf("no kill of the pool's sidecar (sidecar:%s) among %d kills\nstdout:\n%s", pooled, len(c.Kills), r.stdout)
	}
	t.Logf("%d kills (%d of sidecar:%s), %d requests, %d replies, %d errors, %d approximate, conflicts %d, lost %d, duplicates %d\n%s",
		len(c.Kills), poolKills, pooled, *c.Requests, *c.Replies, c.Errors, *c.Approximate, *c.Conflicts, *c.Lost, *c.Duplicates, r.stdout)
}

// TestChaosConfigBadInput: `hams chaos --config` refuses, before starting
// anything, a file that does not exist or does not validate and a service
// the file does not have, naming what it tried.
func TestChaosConfigBadInput(t *testing.T) {
	good, _ := filepath.Abs("testdata/parm-chaos.yaml")
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("name: bad\nmodels:\n  - name: m\n    kind: linear\n    replicas: 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--config", missing}, []string{"--config", "missing.yaml"}},
		{[]string{"--config", bad}, []string{"--config", "bad.yaml"}},
		{[]string{"--config", good, "--service", "nope"}, []string{`"nope"`, "pc"}},
	} {
		r := runHams(t, 30*time.Second, append([]string{"chaos", "--duration", "1s"}, tc.args...)...)
		if r.code != 2 {
			t.Fatalf("hams chaos %v: exit %d, want 2\nstderr:\n%s", tc.args, r.code, r.stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("hams chaos %v: stderr %q does not name %s", tc.args, r.stderr, w)
			}
		}
	}
}
