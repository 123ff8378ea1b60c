package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// False suspicion (issue 18 item 1, docs/recovery.md "False suspicion"):
// under load, one process is stopped (SIGSTOP) for 3 s, three times the
// demo's default 1 s suspicion timeout, then resumed (SIGCONT): `hams demo
// --kill freeze:ROLE[:MODEL]@2s+3s`. Each case ends with replies flowing
// after the freeze, redundancy restored (the demo's restored_ms: every
// model has a live serving instance and backup or standby again, the
// frozen model instance is not alive in the topology, the control plane is
// whole) and the demo's consistency check passing (exit 0: every reply
// checked, no (model, seq) in two replies). A frozen model instance is
// retired by the active manager when it resumes (its log says so).
func TestFalseSuspicion(t *testing.T) {
	cases := []struct {
		name, kill string
		retired    bool // the frozen process is a model instance the manager retires
	}{
		{"stateful-primary", "sidecar:ap-motion", true},
		{"backup", "backup-sidecar:ap-motion", true},
		{"stateless", "sidecar:ap-inception", true},
		{"frontend", "frontend", false},
		{"manager", "manager", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, "out.json")
			runDir := filepath.Join(dir, "run")
			r := runHams(t, 150*time.Second, "demo", "--service", "ap", "--duration", "8s",
				"--kill", "freeze:"+c.kill+"@2s+3s", "--json", out, "--run-dir", runDir)
			var rep struct {
				Requests, Replies, Errors, Incorrect int
				Kills                                []struct {
					Target     string  `json:"target"`
					Kind       string  `json:"kind"`
					Note       string  `json:"note"`
					RecoveryMs float64 `json:"recovery_ms"`
					RestoredMs float64 `json:"restored_ms"`
					Recovered  bool    `json:"recovered"`
					Error      string  `json:"error"`
				} `json:"kills"`
			}
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatalf("exit %d: %v\nstderr:\n%s", r.code, err, r.stderr)
			}
			if err := json.Unmarshal(b, &rep); err != nil {
				t.Fatal(err)
			}
			if r.code != 0 || rep.Incorrect != 0 || !strings.Contains(r.stdout, "every reply checked") {
				t.Fatalf("exit %d, incorrect %d\nstdout:\n%s\nstderr:\n%s", r.code, rep.Incorrect, r.stdout, r.stderr)
			}
			if len(rep.Kills) != 1 || rep.Kills[0].Error != "" {
				t.Fatalf("kills %+v", rep.Kills)
			}
			k := rep.Kills[0]
			if !k.Recovered || k.RecoveryMs < 0 {
				t.Fatalf("no reply after the freeze: %+v\nstdout:\n%s", k, r.stdout)
			}
			if k.RestoredMs < 0 {
				t.Fatalf("redundancy not restored within the run: %+v\nstdout:\n%s", k, r.stdout)
			}
			if c.retired {
				logs, _ := filepath.Glob(filepath.Join(runDir, "logs", "manager*.log"))
				found := false
				for _, l := range logs {
					b, _ := os.ReadFile(l)
					found = found || strings.Contains(string(b), "falsely suspected component retired")
				}
				if !found {
					t.Fatalf("no manager log retired the frozen %s (logs %v)", c.kill, logs)
				}
			}
			t.Logf("freeze %s (%s%s) 3s at 2s: %d requests, %d replies, %d errors; first reply after %.0f ms, redundancy restored after %.0f ms",
				k.Target, k.Kind, map[bool]string{true: ", " + k.Note}[k.Note != ""], rep.Requests, rep.Replies, rep.Errors, k.RecoveryMs, k.RestoredMs)
		})
	}
}
