package config

import "testing"

// TestReplicatedRule pins the one "is this model replicated" rule: only a
// stateful model with ha stateful, and only under a mode that replicates.
func TestReplicatedRule(t *testing.T) {
	stateful := &Model{Name: "m", Stateful: true, HA: "stateful"}
	for _, c := range []struct {
		m    *Model
		mode Mode
		want bool
	}{
		{stateful, ModeBare, false},
		{stateful, ModeReplay, false},
		{stateful, Mode("nspb"), true},
		{stateful, Mode("remus"), true},
		{&Model{Name: "m", Stateful: true, HA: "off"}, Mode("nspb"), false},
		{&Model{Name: "m", HA: "stateful"}, Mode("nspb"), false},
		{nil, Mode("nspb"), false},
	} {
		if got := Replicated(c.m, c.mode); got != c.want {
			t.Errorf("Replicated(%+v, %q) = %v, want %v", c.m, c.mode, got, c.want)
		}
	}
	d := &Deployment{Mode: "replay", Models: []Model{*stateful}}
	if d.Replicated(&d.Models[0]) || !d.HasBackup(&d.Models[0]) || !d.Coordinated() {
		t.Errorf("replay: want a spare (HasBackup, Coordinated) and no replication")
	}
}
