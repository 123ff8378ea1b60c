package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hams-go/hams/adapters/reference"
	"github.com/hams-go/hams/integration/checker"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/loadgen"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// upAP starts `hams up` on the ap example in mode with a run dir, and
// returns the process, the deployment, the run dir and a frontend client.
func upAP(t *testing.T, mode string, extra ...string) (*proc, *config.Deployment, string, hamsv1.FrontendClient) {
	t.Helper()
	cfgPath, _ := filepath.Abs("../examples/ap.yaml")
	dep, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	dep.Mode = mode
	runDir := t.TempDir()
	args := append([]string{"up", "--config", cfgPath, "--mode", mode, "--run-dir", runDir}, extra...)
	if !slices.Contains(extra, "--suspicion-timeout") {
		args = append(args, "--suspicion-timeout", suspicion)
	}
	up := startHams(t, 90*time.Second, args...)
	cc, err := grpcx.Dial(up.str(t, "frontend_grpc"), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return up, dep, runDir, hamsv1.NewFrontendClient(cc)
}

// apLoad returns a loadgen config of n clients (one stream each) on ap,
// checking every reply.
func apLoad(t *testing.T, dep *config.Deployment, fe hamsv1.FrontendClient, chk *checker.Checker, clients int, onReply func(loadgen.Result)) loadgen.RunConfig {
	t.Helper()
	gens := make([]*loadgen.Generator, clients)
	for i := range gens {
		var err error
		if gens[i], err = loadgen.NewGenerator(dep.Service("ap"), uint64(i+1), 1, loadgen.Fashion()); err != nil {
			t.Fatal(err)
		}
	}
	return loadgen.RunConfig{
		Client: fe, Concurrency: clients, Timeout: 15 * time.Second,
		NewRequest: func(c int, n uint64) *hamsv1.PredictRequest {
			req := &hamsv1.PredictRequest{Service: "ap", RequestId: fmt.Sprintf("c%d-%d", c, n), StreamId: fmt.Sprintf("s%d", c), Inputs: gens[c].Inputs()}
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
			if onReply != nil {
				onReply(r)
			}
		},
	}
}

func apChecker(t *testing.T, dep *config.Deployment) *checker.Checker {
	t.Helper()
	cfgPath, _ := filepath.Abs("../examples/ap.yaml")
	cs, err := checker.ServiceOf(dep, "ap", describeSinks(t, cfgPath, dep, "ap"))
	if err != nil {
		t.Fatal(err)
	}
	return checker.New(cs)
}

// instances returns, per replicated model, the model server addresses of
// its primary and its backup, from the manager's topology (the backend
// address each sidecar registered).
func instances(t *testing.T, manager string) map[string][2]string {
	t.Helper()
	cc := dialInternal(t, manager, operator)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	topo, err := hamsv1.NewManagerClient(cc).GetTopology(ctx, &hamsv1.GetTopologyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2]string{}
	for _, p := range topo.GetPlacements() {
		if p.GetSidecarAddress() == "" || !p.GetAlive() {
			continue
		}
		v := out[p.GetModel()]
		switch p.GetRole() {
		case hamsv1.Role_ROLE_PRIMARY:
			v[0] = p.GetBackendAddress()
		case hamsv1.Role_ROLE_BACKUP:
			v[1] = p.GetBackendAddress()
		default:
			continue
		}
		out[p.GetModel()] = v
	}
	return out
}

// stateDigest reads model's installed state at a reference model server.
func stateDigest(t *testing.T, addr, model string) (string, uint64) {
	t.Helper()
	cc := dialInternal(t, addr, asSidecarOf(model))
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ts, ver, err := reference.New(cc, model, 10*time.Second).ReadState(ctx)
	if err != nil {
		t.Fatalf("read state of %s at %s: %v", model, addr, err)
	}
	return tensor.Digest(ts...), ver
}

// TestNSPBBackupsMatchPrimaries: under nspb, after load and quiescence,
// every stateful model's backup holds exactly its primary's state (the
// models are non-deterministic, so only shipped state can make them equal).
func TestNSPBBackupsMatchPrimaries(t *testing.T) {
	up, dep, _, fe := upAP(t, "nspb")
	chk := apChecker(t, dep)
	cfg := apLoad(t, dep, fe, chk, 4, nil)
	cfg.Requests = 240
	st, err := loadgen.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if sum := chk.Finish(); sum.Violations != 0 || sum.Errors != 0 || st.Replies != 240 {
		t.Fatalf("stats %+v, check %+v", st, sum)
	}
	inst := instances(t, up.str(t, "manager"))
	var stateful []string
	for _, m := range dep.Models {
		if m.Stateful {
			stateful = append(stateful, m.Name)
		}
	}
	for _, m := range stateful {
		pb := inst[m]
		if pb[0] == "" || pb[1] == "" || pb[0] == pb[1] {
			t.Fatalf("%s: primary and backup model servers %q", m, pb)
		}
		deadline := time.Now().Add(15 * time.Second)
		for {
			pd, pv := stateDigest(t, pb[0], m)
			bd, bv := stateDigest(t, pb[1], m)
			if pd == bd && pv == bv {
				t.Logf("%s: backup at %s matches primary at %s: version %d, state %s", m, pb[1], pb[0], pv, pd[:16])
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: backup state %s (version %d) != primary state %s (version %d) after quiescence", m, bd, bv, pd, pv)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	up.stop(t, 20*time.Second)
}

// childPID finds the pid of a supervised child of `hams up` from its log
// (the ready fields it logs when serving).
func childPID(t *testing.T, runDir, child string) int {
	t.Helper()
	path := filepath.Join(runDir, "logs", child+".log")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		var l struct {
			Msg    string `json:"msg"`
			Fields struct {
				PID int `json:"pid"`
			} `json:"fields"`
		}
		if json.Unmarshal(s.Bytes(), &l) == nil && l.Msg == "serving" && l.Fields.PID > 0 {
			return l.Fields.PID
		}
	}
	t.Fatalf("no pid in %s", path)
	return 0
}

// TestNSPBRepliesWaitForDurability stops ap-route's backup sidecar
// (SIGSTOP) under load: its snapshots are not applied, so no reply that
// depends on an ap-route state after the stop can be durable, and the
// frontend must hold them all; after SIGCONT they flow again. The manager's
// suspicion timeout is long enough that the pause is not taken for a
// failure.
func TestNSPBRepliesWaitForDurability(t *testing.T) {
	_, dep, runDir, fe := upAP(t, "nspb", "--suspicion-timeout", "10s")
	chk := apChecker(t, dep)
	var (
		mu      sync.Mutex
		arrived []time.Time
	)
	cfg := apLoad(t, dep, fe, chk, 4, func(r loadgen.Result) {
		mu.Lock()
		arrived = append(arrived, r.Sent.Add(r.Latency))
		mu.Unlock()
	})
	cfg.Duration = 3500 * time.Millisecond
	pid := childPID(t, runDir, "backup-sidecar_ap-route")
	var stopAt, contAt time.Time
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(time.Second)
		stopAt = time.Now()
		syscall.Kill(pid, syscall.SIGSTOP)
		time.Sleep(1500 * time.Millisecond)
		contAt = time.Now()
		syscall.Kill(pid, syscall.SIGCONT)
	}()
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	st, err := loadgen.Run(context.Background(), cfg)
	<-done
	if err != nil {
		t.Fatal(err)
	}
	if sum := chk.Finish(); sum.Violations != 0 || sum.Errors != 0 {
		t.Fatalf("stats %+v, check %+v", st, sum)
	}
	// Replies in flight at the stop whose ap-route state was already
	// durable may still arrive; grace covers their remaining path.
	const grace = 300 * time.Millisecond
	var before, during, after int
	for _, a := range arrived {
		switch {
		case a.Before(stopAt):
			before++
		case a.After(stopAt.Add(grace)) && a.Before(contAt):
			during++
		case !a.Before(contAt):
			after++
		}
	}
	t.Logf("replies: %d before the stop, %d between stop+%v and cont (%v later), %d after cont", before, during, grace, contAt.Sub(stopAt).Round(time.Millisecond), after)
	if before == 0 || after == 0 {
		t.Fatalf("load did not run around the pause: %d before, %d after", before, after)
	}
	if during != 0 {
		t.Fatalf("%d replies left the frontend while ap-route's backup could not apply state", during)
	}
}

// TestModesServeCheckedReplies runs the demo in the other replicated modes.
func TestModesServeCheckedReplies(t *testing.T) {
	for _, mode := range []string{"remus", "nspb-s1", "nspb-s2"} {
		t.Run(mode, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out.json")
			r := runHams(t, 60*time.Second, "demo", "--service", "ap", "--mode", mode, "--duration", "2s", "--json", out, "--suspicion-timeout", suspicion)
			if r.code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
			}
			d := readDemo(t, out)
			if *d.Replies == 0 || *d.Errors != 0 || d.Incorrect != 0 {
				t.Fatalf("report %+v\nstdout:\n%s", d, r.stdout)
			}
			t.Logf("%s: %d replies, p50 %.2f ms", mode, *d.Replies, *d.P50Ms)
		})
	}
}

// auditRecords reads every file named name under dir as JSON objects,
// checking each has exactly the contract's keys.
func auditRecords(t *testing.T, dir, name string, keys ...string) []map[string]any {
	t.Helper()
	var out []map[string]any
	var files []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == name {
			files = append(files, p)
		}
		return nil
	})
	if len(files) == 0 {
		t.Fatalf("no %s under %s", name, dir)
	}
	sort.Strings(keys)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		s := bufio.NewScanner(bytes.NewReader(b))
		s.Buffer(make([]byte, 1<<20), 64<<20)
		for s.Scan() {
			var rec map[string]any
			if err := json.Unmarshal(s.Bytes(), &rec); err != nil {
				t.Fatalf("%s: %q: %v", f, s.Text(), err)
			}
			var got []string
			for k := range rec {
				got = append(got, k)
			}
			sort.Strings(got)
			if !slices.Equal(got, keys) {
				t.Fatalf("%s: record keys %v, want %v", f, got, keys)
			}
			out = append(out, rec)
		}
	}
	return out
}

func isHexDigest(v any) bool {
	s, ok := v.(string)
	if !ok || len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
