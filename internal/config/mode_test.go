package config

import "testing"

func TestModeMethods(t *testing.T) {
	for _, c := range []struct {
		m                              Mode
		protected, replays, replicates bool
	}{
		{ModeBare, false, false, false},
		{"", false, false, false},
		{ModeNSPB, true, false, true},
		{ModeRemus, true, false, true},
		{ModeNSPBS1, true, false, true},
		{ModeNSPBS2, true, false, true},
		{ModeReplay, true, true, false},
	} {
		if c.m.Protected() != c.protected || c.m.Replays() != c.replays || c.m.Replicates() != c.replicates {
			t.Errorf("%q: protected %v replays %v replicates %v, want %v %v %v", c.m, c.m.Protected(), c.m.Replays(), c.m.Replicates(), c.protected, c.replays, c.replicates)
		}
	}
	for _, s := range Modes {
		if Mode(s) == "" {
			t.Fatal("empty mode listed")
		}
	}
}
