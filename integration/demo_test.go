package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/config"
)

// suspicion is the manager's failure-suspicion timeout in these tests:
// they check the data path, and `go test ./...` runs other packages' tests
// beside them on the same cores, where the manager's 70 ms default can
// declare a live but descheduled component dead.
const suspicion = "300ms"

type demoJSON struct {
	Requests      *int     `json:"requests"`
	Replies       *int     `json:"replies"`
	Errors        *int     `json:"errors"`
	P50Ms         *float64 `json:"p50_ms"`
	P99Ms         *float64 `json:"p99_ms"`
	ThroughputRPS *float64 `json:"throughput_rps"`
	Incorrect     int      `json:"incorrect"`
	Check         struct {
		ByKind map[string]int `json:"by_kind"`
	} `json:"check"`
	Kills []struct {
		Target     string  `json:"target"`
		Kind       string  `json:"kind"`
		RecoveryMs float64 `json:"recovery_ms"`
		Recovered  bool    `json:"recovered"`
	} `json:"kills"`
}

func readDemo(t *testing.T, path string) demoJSON {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d demoJSON
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("report %s: %v", b, err)
	}
	if d.Requests == nil || d.Replies == nil || d.Errors == nil || d.P50Ms == nil || d.P99Ms == nil || d.ThroughputRPS == nil {
		t.Fatalf("report lacks contract fields: %s", b)
	}
	return d
}

// TestDemoReport runs the demo in its default mode, nspb, with --audit:
// the report has the contract's fields, and the audit directory has
// durable.jsonl (every replicated model's backup) and replies.jsonl (the
// frontend) with the contract's fields; every reply's stateful steps are
// durable records with the same output digest.
func TestDemoReport(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out.json")
	auditDir := t.TempDir()
	r := runHams(t, 60*time.Second, "demo", "--service", "ap", "--duration", "3s", "--json", out, "--audit", auditDir, "--suspicion-timeout", suspicion)
	if r.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "mode nspb") {
		t.Fatalf("demo's default mode is not nspb:\n%s", r.stdout)
	}
	d := readDemo(t, out)
	if *d.Replies == 0 || *d.Errors != 0 || d.Incorrect != 0 || *d.Requests < *d.Replies || *d.P50Ms <= 0 || *d.P99Ms < *d.P50Ms || *d.ThroughputRPS <= 0 {
		t.Fatalf("report %+v\nstdout:\n%s", d, r.stdout)
	}
	if len(d.Kills) != 0 {
		t.Fatalf("kills %v without --kill", d.Kills)
	}
	t.Logf("demo ap 3s: %d replies, p50 %.2f ms, p99 %.2f ms, %.0f req/s", *d.Replies, *d.P50Ms, *d.P99Ms, *d.ThroughputRPS)

	type key struct {
		model string
		seq   uint64
	}
	durable := map[key]string{}
	models := map[string]int{}
	for _, rec := range auditRecords(t, auditDir, "durable.jsonl", "model", "seq", "input_digest", "output_digest", "state_digest") {
		m, _ := rec["model"].(string)
		seq, _ := rec["seq"].(float64)
		if m == "" || seq < 1 || !isHexDigest(rec["input_digest"]) || !isHexDigest(rec["output_digest"]) || !isHexDigest(rec["state_digest"]) {
			t.Fatalf("durable record %v", rec)
		}
		durable[key{m, uint64(seq)}] = rec["output_digest"].(string)
		models[m]++
	}
	if models["ap-motion"] == 0 || models["ap-route"] == 0 || len(models) != 2 {
		t.Fatalf("durable records per model %v, want ap-motion and ap-route", models)
	}
	replies := auditRecords(t, auditDir, "replies.jsonl", "req_id", "lineage", "reply_digest")
	if len(replies) != *d.Replies {
		t.Fatalf("%d replies.jsonl records, %d replies", len(replies), *d.Replies)
	}
	for _, rec := range replies {
		lin, _ := rec["lineage"].([]any)
		if !isHexDigest(rec["reply_digest"]) || len(lin) != 5 {
			t.Fatalf("reply record %v", rec)
		}
		for _, e := range lin {
			step, _ := e.(map[string]any)
			m, _ := step["model"].(string)
			seq, _ := step["seq"].(float64)
			if len(step) != 3 || m == "" || seq < 1 || !isHexDigest(step["output_digest"]) {
				t.Fatalf("lineage step %v", step)
			}
			if models[m] == 0 {
				continue // stateless
			}
			if dg, ok := durable[key{m, uint64(seq)}]; !ok || dg != step["output_digest"] {
				t.Fatalf("reply %v: %s seq %d released without a durable record of that output (record %q)", rec["req_id"], m, uint64(seq), dg)
			}
		}
	}
	t.Logf("audit: %d durable records %v, %d replies", len(durable), models, len(replies))
}

// TestDemoKillStatelessSidecar SIGKILLs a stateless model's sidecar during
// a demo run in nspb: the manager promotes the model's hot standby with a
// start seq above every seq its successors saw (paper IV-E), the
// predecessor resends, and a new standby is started; every reply passes
// the checker (no seq reused) and the audit logs are consistent.
func TestDemoKillStatelessSidecar(t *testing.T) {
	dep, err := config.Load("../examples/ap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	victim := ""
	for _, m := range dep.Service("ap").Graph().Models() {
		if !dep.Model(m).Stateful {
			victim = m
			break
		}
	}
	if victim == "" {
		t.Skip("ap has no stateless model")
	}
	out := filepath.Join(t.TempDir(), "out.json")
	auditDir := t.TempDir()
	r := runHams(t, 90*time.Second, "demo", "--service", "ap", "--duration", "5s", "--timeout", "3s", "--kill", "sidecar:"+victim+"@1500ms",
		"--json", out, "--audit", auditDir, "--suspicion-timeout", suspicion)
	d := readDemo(t, out)
	if r.code != 0 || d.Incorrect != 0 {
		t.Fatalf("exit %d, incorrect %d (by kind %v)\nstdout:\n%s\nstderr:\n%s", r.code, d.Incorrect, d.Check.ByKind, r.stdout, r.stderr)
	}
	if len(d.Kills) != 1 || d.Kills[0].Target != "sidecar:"+victim || d.Kills[0].Kind != "stateless" {
		t.Fatalf("kills %+v", d.Kills)
	}
	if !d.Kills[0].Recovered || d.Kills[0].RecoveryMs < 0 || *d.Replies == 0 {
		t.Fatalf("replies did not resume after the kill: %+v\nstdout:\n%s", d, r.stdout)
	}
	checkAudit(t, auditDir)
	t.Logf("kill %s: recovery %.0f ms, %d replies, %d errors", victim, d.Kills[0].RecoveryMs, *d.Replies, *d.Errors)
}
