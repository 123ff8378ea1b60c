package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/loadgen"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// stateCall is one "explicit state call" record of a reference model
// server's debug log: the digests of the state a TF Serving Predict of an
// explicit-state model started from and produced (in the tfserving
// adapter's state order, so equal to the audit's state_digest of the same
// state).
type stateCall struct{ in, out string }

// stateCalls reads the explicit-state records of child's log under runDir.
func stateCalls(t *testing.T, runDir, child string) []stateCall {
	t.Helper()
	f, err := os.Open(filepath.Join(runDir, "logs", child+".log"))
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		t.Fatal(err)
	}
	defer f.Close()
	var out []stateCall
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		var l struct {
			Msg      string `json:"msg"`
			StateIn  string `json:"state_in"`
			StateOut string `json:"state_out"`
		}
		if json.Unmarshal(s.Bytes(), &l) == nil && l.Msg == "explicit state call" {
			out = append(out, stateCall{l.StateIn, l.StateOut})
		}
	}
	return out
}

// streamLoad drives cfg's load on service svc from clients, one stream
// each (s0, s1, ...).
func streamLoad(t *testing.T, dep *config.Deployment, svc string, fe hamsv1.FrontendClient, clients int, cfg loadgen.RunConfig) loadgen.Stats {
	t.Helper()
	gens := make([]*loadgen.Generator, clients)
	for i := range gens {
		var err error
		if gens[i], err = loadgen.NewGenerator(dep.Service(svc), uint64(i+1), 1+i%2, nil); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Client, cfg.Concurrency, cfg.Timeout = fe, clients, 15*time.Second
	cfg.NewRequest = func(c int, n uint64) *hamsv1.PredictRequest {
		return &hamsv1.PredictRequest{Service: svc, RequestId: fmt.Sprintf("c%d-%d", c, n), StreamId: fmt.Sprintf("s%d", c), Inputs: gens[c].Inputs()}
	}
	var logged atomic.Bool
	onResult := cfg.OnResult
	cfg.OnResult = func(r loadgen.Result) {
		if r.Err != nil && !logged.Swap(true) {
			t.Logf("first failed request %s: %v", r.Request.GetRequestId(), r.Err)
		}
		if onResult != nil {
			onResult(r)
		}
	}
	st, err := loadgen.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestTFServingLSTMExplicitState runs examples/tfserving-lstm.yaml under
// nspb: a stateful LSTM behind the TF Serving adapter, each instance
// driving its own reference model server over TF Serving's Predict with
// the state signature convention (state/h, state/c in; state_next/h,
// state_next/c out; hams_stream_ids). The model servers log, at debug,
// the digest of the state each Predict started from and produced: what
// the adapters hold, seen from outside their process.
//
//   - After load and quiescence, the primary's last seq is the backup's
//     max seq and its last durable seq, and that record's state_digest
//     (the state the backup's adapter installed) is the state_out of the
//     primary's model server's last Predict: primary and backup hold the
//     same state. The backup's model server ran no Predict: its state
//     came only from shipped snapshots.
//   - Failover: the primary sidecar is SIGKILLed under load; the backup is
//     promoted and its first Predict starts from the state it last
//     applied (its last durable record's digest): the streams go on from
//     the replicated state. Replies continue without errors and the audit
//     logs are consistent.
func TestTFServingLSTMExplicitState(t *testing.T) {
	cfgPath, _ := filepath.Abs("../examples/tfserving-lstm.yaml")
	audit := filepath.Join(t.TempDir(), "audit")
	runDir := t.TempDir()
	up := startHams(t, 90*time.Second, "up", "--config", cfgPath, "--run-dir", runDir, "--audit", audit,
		"--suspicion-timeout", suspicion, "--log-level", "debug")
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	dep, err := config.Parse([]byte(strings.ReplaceAll(string(b), "backend: {type: tfserving}", "backend: {type: tfserving, address: \"placeholder:1\"}")))
	if err != nil {
		t.Fatal(err)
	}
	const svc, model = "tfserving-lstm", "tf-seq"
	cc, err := grpcx.Dial(up.str(t, "frontend_grpc"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	fe := hamsv1.NewFrontendClient(cc)

	var maxSeq atomic.Uint64
	st := streamLoad(t, dep, svc, fe, 4, loadgen.RunConfig{Requests: 240, OnResult: func(r loadgen.Result) {
		for _, l := range r.Reply.GetLineage() {
			if l.GetModel() == model {
				for v := maxSeq.Load(); l.GetSeq() > v && !maxSeq.CompareAndSwap(v, l.GetSeq()); v = maxSeq.Load() {
				}
			}
		}
	}})
	if st.Errors != 0 || st.Replies != 240 || maxSeq.Load() != 240 {
		t.Fatalf("load: %+v, max %s seq in the replies %d", st, model, maxSeq.Load())
	}
	inst := tritonInstances(t, up.str(t, "manager"), model)
	pri, bak := inst[hamsv1.Role_ROLE_PRIMARY], inst[hamsv1.Role_ROLE_BACKUP]
	if pri.backend == "" || bak.backend == "" || pri.backend == bak.backend {
		t.Fatalf("primary %+v and backup %+v must each have their own model server", pri, bak)
	}
	bc := dialInternal(t, bak.sidecar, asMgr)
	defer bc.Close()
	bakAudit := filepath.Join(audit, "backup-sidecar_"+model)
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ms, err := hamsv1.NewReplicationClient(bc).GetMaxSeq(ctx, &hamsv1.GetMaxSeqRequest{Model: model})
		cancel()
		if err != nil {
			t.Fatalf("GetMaxSeq at the backup sidecar: %v", err)
		}
		seq, digest := lastDurable(t, bakAudit, model)
		pc := stateCalls(t, runDir, "modelserver_"+model)
		var last stateCall
		if len(pc) > 0 {
			last = pc[len(pc)-1]
		}
		if ms.GetMaxSeq() == maxSeq.Load() && seq == maxSeq.Load() && digest != "" && last.out == digest {
			t.Logf("%s: primary's last seq %d = backup's max seq = its last durable seq; the primary model server's last Predict produced state %s…, the state the backup installed (%d Predicts at the primary)",
				model, seq, digest[:16], len(pc))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after quiescence: primary's last seq %d, backup max seq %d, backup durable seq %d digest %q; primary's last state_out %q (%d Predicts)",
				maxSeq.Load(), ms.GetMaxSeq(), seq, digest, last.out, len(pc))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := len(stateCalls(t, runDir, "backup-modelserver_"+model)); n != 0 {
		t.Fatalf("the backup's model server ran %d Predicts before any failover", n)
	}

	t.Run("failover", func(t *testing.T) {
		pid := childPID(t, runDir, "sidecar_"+model)
		var killed atomic.Bool
		var after atomic.Int64
		cfg := loadgen.RunConfig{Duration: 4 * time.Second, OnResult: func(r loadgen.Result) {
			if killed.Load() && r.Err == nil {
				after.Add(1)
			}
		}}
		go func() {
			time.Sleep(time.Second)
			killed.Store(true)
			syscall.Kill(pid, syscall.SIGKILL)
		}()
		st := streamLoad(t, dep, svc, fe, 4, cfg)
		if st.Errors != 0 || after.Load() == 0 {
			t.Fatalf("load across the failover: %+v, %d replies after the kill", st, after.Load())
		}
		now := tritonInstances(t, up.str(t, "manager"), model)
		if now[hamsv1.Role_ROLE_PRIMARY].id != bak.id {
			t.Fatalf("after the kill the primary is %+v, want the old backup %s", now[hamsv1.Role_ROLE_PRIMARY], bak.id)
		}
		_, promoted := lastDurable(t, bakAudit, model)
		bcalls := stateCalls(t, runDir, "backup-modelserver_"+model)
		if len(bcalls) == 0 {
			t.Fatal("the promoted backup's model server ran no Predict")
		}
		if bcalls[0].in != promoted {
			t.Fatalf("the promoted backup's first Predict started from state %s, the backup last applied %s", bcalls[0].in, promoted)
		}
		checkAudit(t, audit)
		t.Logf("failover: %d replies, %d after the kill; the promoted backup's first Predict started from its last applied state %s…; audit consistent",
			st.Replies, after.Load(), promoted[:16])
	})
	up.stop(t, 20*time.Second)
}
