package cluster

import (
	"testing"
	"time"

	"github.com/hams-go/hams/internal/config"
)

// TestReplicated: which models run as primary + backup, per mode.
func TestReplicated(t *testing.T) {
	dep, err := config.Parse([]byte(depRepl))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		mode  string
		model string
		want  bool
	}{
		{"nspb", "s", true}, {"remus", "s", true}, {"nspb-s1", "s", true}, {"nspb-s2", "s", true},
		{"bare", "s", false}, {"replay", "s", false}, {"nspb", "p", false}, {"nspb", "off", false},
	} {
		dep.Mode = c.mode
		if got := dep.Replicated(dep.Model(c.model)); got != c.want {
			t.Errorf("mode %s model %s: replicated %v, want %v", c.mode, c.model, got, c.want)
		}
		// Replay mode: the stateful model gets a spare instead.
		wantSpare := c.mode == "replay" && c.model == "s"
		if dep.Replays(dep.Model(c.model)) != wantSpare || dep.HasBackup(dep.Model(c.model)) != (c.want || wantSpare) {
			t.Errorf("mode %s model %s: spared %v, hasBackup %v", c.mode, c.model, dep.Replays(dep.Model(c.model)), dep.HasBackup(dep.Model(c.model)))
		}
	}
	for mode, want := range map[string]bool{"replay": true, "nspb": true, "bare": false} {
		dep.Mode = mode
		if dep.Coordinated() != want {
			t.Fatalf("%s: coordinated %v", mode, !want)
		}
	}
}

const depRepl = `
name: r
hosts: [h1, h2]
models:
  - {name: p, kind: prep}
  - {name: s, kind: lstm, stateful: true, placement: {primary: h1, backup: h2}, params: {input: x, output: y, in_dim: 4, hidden: 4, streams: 4}}
  - {name: off, kind: lstm, stateful: true, ha: off, params: {input: y, output: z, in_dim: 4, hidden: 4, streams: 4}}
services:
  - name: r
    inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]
    edges: [[frontend, p], [p, s], [s, off], [off, frontend]]
`

func TestSuspicionTimeout(t *testing.T) {
	if SuspicionFor(0) != time.Second || SuspicionFor(time.Second) != time.Second {
		t.Fatal("suspicion timeout choice")
	}
}

func TestControlCounts(t *testing.T) {
	for _, tc := range []struct {
		opt     Options
		mode    string
		fe, mgr int
	}{
		{Options{}, "nspb", 2, 2},
		{Options{}, "bare", 1, 1},
		{Options{Frontends: 3, Managers: 1}, "nspb", 3, 1},
		{Options{Frontends: 2}, "bare", 2, 1},
	} {
		if fe, mgr := tc.opt.Counts(tc.mode); fe != tc.fe || mgr != tc.mgr {
			t.Errorf("%+v in %s: %d frontends, %d managers; want %d, %d", tc.opt, tc.mode, fe, mgr, tc.fe, tc.mgr)
		}
	}
	if ManagerID(0, 3, 1) != ManagerID(0, 1, 1) || ManagerID(1, 1, 2) == ManagerID(1, 2, 2) {
		t.Fatal("a lone manager must keep its lease id across restarts, a manager with standbys must not")
	}
}
