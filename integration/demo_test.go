package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
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
	Kills         []struct {
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

func TestDemoReport(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out.json")
	r := runHams(t, 60*time.Second, "demo", "--service", "ap", "--duration", "3s", "--json", out, "--suspicion-timeout", suspicion)
	if r.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	d := readDemo(t, out)
	if *d.Replies == 0 || *d.Errors != 0 || d.Incorrect != 0 || *d.Requests < *d.Replies || *d.P50Ms <= 0 || *d.P99Ms < *d.P50Ms || *d.ThroughputRPS <= 0 {
		t.Fatalf("report %+v\nstdout:\n%s", d, r.stdout)
	}
	if len(d.Kills) != 0 {
		t.Fatalf("kills %v without --kill", d.Kills)
	}
	t.Logf("demo ap 3s: %d replies, p50 %.2f ms, p99 %.2f ms, %.0f req/s", *d.Replies, *d.P50Ms, *d.P99Ms, *d.ThroughputRPS)
}

// TestDemoKillStatelessSidecar SIGKILLs a stateless model's sidecar during
// a demo run: the supervisor restarts it, it re-registers, senders
// re-resolve, and replies resume.
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
	r := runHams(t, 90*time.Second, "demo", "--service", "ap", "--duration", "5s", "--timeout", "2s", "--kill", "sidecar:"+victim+"@1500ms", "--json", out, "--suspicion-timeout", suspicion)
	if r.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	d := readDemo(t, out)
	if len(d.Kills) != 1 || d.Kills[0].Target != "sidecar:"+victim || d.Kills[0].Kind != "stateless" {
		t.Fatalf("kills %+v", d.Kills)
	}
	if !d.Kills[0].Recovered || d.Kills[0].RecoveryMs < 0 || d.Incorrect != 0 || *d.Replies == 0 {
		t.Fatalf("replies did not resume after the kill: %+v\nstdout:\n%s", d, r.stdout)
	}
	t.Logf("kill %s: recovery %.0f ms, %d replies, %d errors", victim, d.Kills[0].RecoveryMs, *d.Replies, *d.Errors)
}
