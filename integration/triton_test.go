package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/loadgen"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
)

// tritonInstance is one instance of a model behind the triton adapter.
type tritonInstance struct {
	role             hamsv1.Role
	sidecar, backend string
	id               string
}

// tritonInstances lists model's live instances from the manager.
func tritonInstances(t *testing.T, manager, model string) map[hamsv1.Role]tritonInstance {
	t.Helper()
	cc := dialInternal(t, manager, operator)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	topo, err := hamsv1.NewManagerClient(cc).GetTopology(ctx, &hamsv1.GetTopologyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[hamsv1.Role]tritonInstance{}
	for _, p := range topo.GetPlacements() {
		if p.GetModel() == model && p.GetAlive() && p.GetSidecarAddress() != "" {
			out[p.GetRole()] = tritonInstance{role: p.GetRole(), sidecar: p.GetSidecarAddress(), backend: p.GetBackendAddress(), id: p.GetComponentId()}
		}
	}
	return out
}

// shmStateDigests reads the state regions a triton adapter registered at
// the model server addr (SystemSharedMemoryStatus names them and their
// POSIX shm keys; the test runs on the same host, so it opens the objects
// under /dev/shm) and returns the digest of the state held in buffer A and
// in buffer B: the hex SHA-256 of the state tensors' bytes in the model's
// state order (tensor.Digest, as the audit's state_digest). One buffer is
// the installed state, the other the scratch buffer the next compute
// writes; the adapter flips all state tensors together.
func shmStateDigests(t *testing.T, addr string, states []string) map[string]string {
	t.Helper()
	cc := dialInternal(t, addr, operator)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := inference.NewGRPCInferenceServiceClient(cc).SystemSharedMemoryStatus(ctx, &inference.SystemSharedMemoryStatusRequest{})
	if err != nil {
		t.Fatalf("shm status at %s: %v", addr, err)
	}
	out := map[string]string{}
	for _, buf := range []string{"A", "B"} {
		h := sha256.New()
		for _, s := range states {
			var key string
			for name, r := range st.GetRegions() {
				if strings.HasSuffix(name, "_"+s+"_"+buf) {
					if key != "" {
						t.Fatalf("two regions for state %s buffer %s at %s: %v", s, buf, addr, st.GetRegions())
					}
					key = r.GetKey()
				}
			}
			if key == "" {
				return nil // not set up yet
			}
			b, err := os.ReadFile("/dev/shm/" + strings.TrimPrefix(key, "/"))
			if err != nil {
				t.Fatalf("read shm object %s: %v", key, err)
			}
			h.Write(b)
		}
		out[buf] = hex.EncodeToString(h.Sum(nil))
	}
	return out
}

// lastDurable returns the highest seq of model in the durable.jsonl files
// under dir and the state_digest recorded for it.
func lastDurable(t *testing.T, dir, model string) (uint64, string) {
	t.Helper()
	var seq uint64
	var digest string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "durable.jsonl" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			var rec struct {
				Model       string `json:"model"`
				Seq         uint64 `json:"seq"`
				StateDigest string `json:"state_digest"`
			}
			if l == "" || json.Unmarshal([]byte(l), &rec) != nil || rec.Model != model {
				continue
			}
			if rec.Seq >= seq {
				seq, digest = rec.Seq, rec.StateDigest
			}
		}
		return nil
	})
	return seq, digest
}

// tritonLoad drives cfg's load from clients (one stream each) on the
// triton-lstm service and returns the stats; the first failure is logged.
func tritonLoad(t *testing.T, dep *config.Deployment, fe hamsv1.FrontendClient, clients int, cfg loadgen.RunConfig) loadgen.Stats {
	t.Helper()
	gens := make([]*loadgen.Generator, clients)
	for i := range gens {
		var err error
		if gens[i], err = loadgen.NewGenerator(dep.Service("triton-lstm"), uint64(i+1), 1+i%2, nil); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Client, cfg.Concurrency, cfg.Timeout = fe, clients, 15*time.Second
	cfg.NewRequest = func(c int, n uint64) *hamsv1.PredictRequest {
		return &hamsv1.PredictRequest{Service: "triton-lstm", RequestId: fmt.Sprintf("c%d-%d", c, n), StreamId: fmt.Sprintf("s%d", c), Inputs: gens[c].Inputs()}
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

// TestTritonLSTMSharedMemoryState runs examples/triton-lstm.yaml (a
// stateful lstm with explicit state behind the triton adapter, each
// instance with its own reference model server driven over KServe v2 with
// system shared memory) under nspb. After load and quiescence the backup
// holds exactly the primary's state:
//
//   - the primary's last seq (the highest tl-seq seq in the replies'
//     lineage) is the backup's max seq (Replication.GetMaxSeq at the
//     backup sidecar) and the highest seq in its durable.jsonl, so the
//     backup applied the snapshot of the primary's last batch;
//   - that record's state_digest (the state the backup installed, as
//     digested when it applied it) is the digest of one of the primary's
//     two shm buffers and of one of the backup's: the bytes both adapters
//     hold in shared memory, read from /dev/shm, not anything reported.
//
// The lstm is non-deterministic in its low bits, so equal bytes can only
// come from shipped state. Which buffer is current is private to each
// adapter; the other buffer holds the primary's state before its last
// batch (a different digest once a batch touched the state).
func TestTritonLSTMSharedMemoryState(t *testing.T) {
	cfgPath, _ := filepath.Abs("../examples/triton-lstm.yaml")
	states := []string{"h", "c", "streams"} // the lstm's state tensors (models/lstm.go)
	sigkilled := tritonStateReplication(t, cfgPath, stateMemory{
		name:    "shm",
		digests: func(t *testing.T, addr string) map[string]string { return shmStateDigests(t, addr, states) },
	})
	// Every adapter of a clean stop unlinks its objects; a SIGKILLed one
	// cannot (its objects are reclaimed by pid, docs/triton.md).
	left := shmLeft()
	for _, n := range left {
		os.Remove("/dev/shm/" + n)
	}
	if !sigkilled && len(left) > 0 {
		t.Errorf("shm objects left after hams up stopped: %v", left)
	}
}

// stateMemory is where the tl-seq adapter keeps its state buffers, for
// tritonStateReplication: digests reads the digests of the two buffers
// (by region suffix A and B) through the instance's model server at addr;
// loaded, if set, checks more once the load has run.
type stateMemory struct {
	name    string
	digests func(t *testing.T, addr string) map[string]string
	loaded  func(t *testing.T, pri, bak tritonInstance)
	// readsByInfer: digests reads the buffers with probe ModelInfers,
	// which the model servers' logs of state calls cannot tell from the
	// sidecars' (the checks on those logs are skipped).
	readsByInfer bool
}

// tritonStateReplication runs the deployment of cfgPath (the triton-lstm
// shape: tl-seq a stateful LSTM behind adapters/triton) under load with
// 4 client streams; after quiescence the backup applied the primary's
// last snapshot, and that snapshot's state_digest is the digest of one of
// the primary's two state buffers and of one of the backup's (the lstm is
// non-deterministic in its low bits, so equal bytes can only come from
// shipped state). Then a SIGKILL of the primary sidecar under load fails
// over to the backup, whose adapter holds the replicated state; the
// streams go on and the audit stays consistent. It reports whether the
// failover ran (a killed adapter leaves its objects behind).
func tritonStateReplication(t *testing.T, cfgPath string, mem stateMemory) (sigkilled bool) {
	t.Helper()
	audit := filepath.Join(t.TempDir(), "audit")
	runDir := t.TempDir()
	up := startHams(t, 90*time.Second, "up", "--config", cfgPath, "--run-dir", runDir, "--audit", audit, "--suspicion-timeout", suspicion,
		"--log-level", "debug") // the model servers log each call's state digests
	dep := tritonDeployment(t, cfgPath)
	cc, err := grpcx.Dial(up.str(t, "frontend_grpc"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	fe := hamsv1.NewFrontendClient(cc)

	// The primary's last seq at tl-seq: seqs are dense per model and every
	// request passes through tl-seq once, so it is the highest tl-seq seq
	// in the replies' lineage (and, with no failures, the request count).
	const clients = 4
	var maxSeq atomic.Uint64
	st := tritonLoad(t, dep, fe, clients, loadgen.RunConfig{Requests: 240, OnResult: func(r loadgen.Result) {
		for _, l := range r.Reply.GetLineage() {
			if l.GetModel() == "tl-seq" {
				for v := maxSeq.Load(); l.GetSeq() > v && !maxSeq.CompareAndSwap(v, l.GetSeq()); v = maxSeq.Load() {
				}
			}
		}
	}})
	if st.Errors != 0 || st.Replies != 240 || maxSeq.Load() != 240 {
		t.Fatalf("load: %+v, max tl-seq seq in the replies %d", st, maxSeq.Load())
	}
	inst := tritonInstances(t, up.str(t, "manager"), "tl-seq")
	pri, bak := inst[hamsv1.Role_ROLE_PRIMARY], inst[hamsv1.Role_ROLE_BACKUP]
	if pri.backend == "" || bak.backend == "" || pri.backend == bak.backend {
		t.Fatalf("tl-seq primary %+v and backup %+v must each have their own model server", pri, bak)
	}
	if mem.loaded != nil {
		mem.loaded(t, pri, bak)
	}
	bc := dialInternal(t, bak.sidecar, asMgr)
	defer bc.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ms, err := hamsv1.NewReplicationClient(bc).GetMaxSeq(ctx, &hamsv1.GetMaxSeqRequest{Model: "tl-seq"})
		cancel()
		if err != nil {
			t.Fatalf("GetMaxSeq at the backup sidecar: %v", err)
		}
		seq, digest := lastDurable(t, audit, "tl-seq")
		pd, bd := mem.digests(t, pri.backend), mem.digests(t, bak.backend)
		inP := pd != nil && (pd["A"] == digest || pd["B"] == digest)
		inB := bd != nil && (bd["A"] == digest || bd["B"] == digest)
		if ms.GetMaxSeq() == maxSeq.Load() && seq == maxSeq.Load() && inP && inB {
			t.Logf("tl-seq: primary's last seq %d = backup's max seq = its last durable seq; state %s… is in the primary's %s buffers %v and the backup's %v",
				seq, digest[:16], mem.name, short(pd), short(bd))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after quiescence: primary's last seq %d, backup max seq %d, backup durable seq %d digest %s; primary buffers %v, backup buffers %v",
				maxSeq.Load(), ms.GetMaxSeq(), seq, digest, pd, bd)
		}
		time.Sleep(50 * time.Millisecond)
	}

	if !mem.readsByInfer {
		if n := len(stateCalls(t, runDir, "backup-modelserver_tl-seq")); n != 0 {
			t.Fatalf("the backup's model server ran %d ModelInfers before any failover", n)
		}
		if n := len(stateCalls(t, runDir, "modelserver_tl-seq")); n == 0 {
			t.Fatal("the primary's model server logged no state calls (debug logging of explicit state calls missing)")
		}
	}

	// Failover: SIGKILL the primary sidecar (its model server goes with
	// it) under load; the manager promotes the backup, whose adapter owns
	// the replicated state; replies continue the same streams.
	t.Run("failover", func(t *testing.T) {
		sigkilled = true
		pid := childPID(t, runDir, "sidecar_tl-seq")
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
		st := tritonLoad(t, dep, fe, clients, cfg)
		if st.Errors != 0 || after.Load() == 0 {
			t.Fatalf("load across the failover: %+v, %d replies after the kill", st, after.Load())
		}
		now := tritonInstances(t, up.str(t, "manager"), "tl-seq")
		if now[hamsv1.Role_ROLE_PRIMARY].id != bak.id {
			t.Fatalf("after the kill the primary is %+v, want the old backup %s", now[hamsv1.Role_ROLE_PRIMARY], bak.id)
		}
		// the new primary's installed state is in its buffers: the last
		// durable state or a later one it computed
		if d := mem.digests(t, bak.backend); d == nil {
			t.Fatalf("the new primary has no %s state buffers", mem.name)
		}
		// The streams go on from the replicated state: the promoted
		// backup's model server ran no ModelInfer before the failover, and
		// its first one started from the state the backup last applied.
		if !mem.readsByInfer {
			_, promoted := lastDurable(t, filepath.Join(audit, "backup-sidecar_tl-seq"), "tl-seq")
			bcalls := stateCalls(t, runDir, "backup-modelserver_tl-seq")
			if len(bcalls) == 0 || promoted == "" {
				t.Fatalf("the promoted backup's model server logged %d state calls; the backup's last applied state %q", len(bcalls), promoted)
			}
			if bcalls[0].in != promoted {
				t.Fatalf("the promoted backup's first ModelInfer started from state %s, the backup last applied %s", bcalls[0].in, promoted)
			}
			t.Logf("the promoted backup's first ModelInfer started from its last applied state %s…", promoted[:16])
		}
		checkAudit(t, audit)
		t.Logf("failover: %d replies, %d after the kill; audit consistent", st.Replies, after.Load())
	})
	up.stop(t, 20*time.Second)
	return sigkilled
}

// shmLeft lists /dev/shm objects of the triton-lstm example's adapters.
func shmLeft() []string {
	es, _ := os.ReadDir("/dev/shm")
	var out []string
	for _, e := range es {
		if strings.HasPrefix(e.Name(), "hams-tl-seq-") {
			out = append(out, e.Name())
		}
	}
	return out
}

func short(m map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = v[:12]
	}
	return out
}

// tritonDeployment loads the example as `hams up` does (a triton backend
// without an address is started by the deployment).
func tritonDeployment(t *testing.T, path string) *config.Deployment {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The test only needs the service's inputs; give the triton backends a
	// placeholder address so config.Parse validates the rest.
	s := strings.ReplaceAll(string(b), "backend: {type: triton}", "backend: {type: triton, address: \"placeholder:1\"}")
	dep, err := config.Parse([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(dep.ServiceNames(), "triton-lstm") {
		t.Fatalf("services %v", dep.ServiceNames())
	}
	return dep
}
