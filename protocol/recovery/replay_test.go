package recovery

import (
	"testing"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// newReplaySim is the simulated service in replay mode: every stateful
// model's newest checkpoint covers durable[m] and its input log reaches
// logged[m] (between the checkpoint and what the primary executed).
func newReplaySim(t *testing.T, seed uint64) *sim {
	s := newSim(t, seed, true)
	m, err := New(Config{Graph: s.g, Replay: true})
	if err != nil {
		t.Fatal(err)
	}
	s.m, s.replay = m, true
	s.logged, s.replayAfter = map[string]uint64{}, map[string]map[string]uint64{}
	for _, md := range s.g.Models() {
		if s.g.Stateful(md) {
			s.logged[md] = s.durable[md] + uint64(s.rng.IntN(int(s.exec[md]-s.durable[md])+1))
		}
	}
	s.feedTopo()
	return s
}

type replayScenario struct {
	name  string
	kill  []string
	later []string
	dropP float64
	// replayed must have been promoted (replayed on a spare); no other
	// stateful model may be.
	replayed []string
}

// Replay-mode recovery (Lineage Stash: only the failed operator recovers):
// the spare of a failed primary is promoted carrying, per successor, what
// that successor received; downstream stateful models are never asked
// about consumption nor failed over; no backup is synced; the upstream
// resends start at most where the replayed state ends; a model whose
// primary and spare both died is still recovered (the checkpoint and the
// log are in JetStream) on a spare started for it.
func TestReplayScenarios(t *testing.T) {
	scs := []replayScenario{
		{name: "primary", kill: []string{"b/p"}, replayed: []string{"b"}},
		{name: "downstream-primary", kill: []string{"d/p"}, replayed: []string{"d"}},
		{name: "primary-and-spare", kill: []string{"b/p", "b/b"}, replayed: []string{"b"}},
		{name: "adjacent", kill: []string{"b/p", "e/p"}, replayed: []string{"b", "e"}},
		{name: "spare-dies-during-recovery", kill: []string{"b/p"}, later: []string{"b/b"}, replayed: []string{"b"}},
		{name: "stateless-and-stateful", kill: []string{"c/a", "b/p"}, replayed: []string{"b"}},
		{name: "drops", kill: []string{"b/p", "d/p"}, dropP: 0.2, replayed: []string{"b", "d"}},
		{name: "spare", kill: []string{"d/b"}},
	}
	for _, sc := range scs {
		t.Run(sc.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 200; seed++ {
				runReplayScenario(t, sc, seed)
				if t.Failed() {
					t.Fatalf("seed %d", seed)
				}
			}
		})
	}
}

func runReplayScenario(t *testing.T, sc replayScenario, seed uint64) {
	s := newReplaySim(t, seed)
	s.dropP = sc.dropP
	initial := map[string]uint64{}
	for k, v := range s.exec {
		initial[k] = v
	}
	s.snapshotNeeds()
	initialFE := s.feExec()
	for _, id := range sc.kill {
		s.kill(id)
	}
	for _, id := range sc.later {
		s.at(s.rng.IntN(40), func() { s.kill(id) })
	}
	s.run()
	s.checkFinal(true, initial)
	for _, md := range s.g.Models() {
		if !s.g.Stateful(md) {
			continue
		}
		want := false
		for _, r := range sc.replayed {
			want = want || r == md
		}
		switch {
		case want && s.promoted[md] == 0 && !(sc.dropP > 0 && s.unrec[md]):
			s.fail("%s was not replayed", md)
		case !want && s.promoted[md] > 0:
			s.fail("%s was promoted although it did not fail (replay recovers only the failed model)", md)
		case s.unrec[md] && sc.dropP == 0:
			s.fail("%s reported unrecoverable", md)
		}
		if after, ok := s.replayAfter[md]; ok {
			for _, sc := range s.g.Succ(md) {
				v, named := after[sc]
				recv := initial[sc]
				if sc == config.Frontend {
					recv = initialFE
				}
				if !named || v > recv {
					s.fail("%s's spare told %s received %d (named %v); it executed %d", md, sc, v, named, recv)
				}
			}
		}
	}
	// Every stateful model ends with a live spare.
	for _, md := range s.g.Models() {
		if !s.g.Stateful(md) {
			continue
		}
		ok := false
		for _, p := range s.topo.Placements {
			ok = ok || (p.Model == md && p.Role == hamsv1.Role_ROLE_BACKUP && p.SidecarAddress != "" && !s.dead[p.ComponentId])
		}
		if !ok {
			s.fail("%s has no live spare after recovery", md)
		}
	}
	if len(sc.replayed) > 0 && s.recov == 0 {
		s.fail("no Recovered notice")
	}
}

// The successors' answers bound what the spare resends to each: the
// frontend's and e's max_out of b are carried, a successor that cannot be
// asked gets everything (0).
func TestReplayAfterFromSuccessors(t *testing.T) {
	s := newReplaySim(t, 3)
	s.exec["b"], s.durable["b"], s.logged["b"] = 60, 20, 50
	s.exec["c"], s.exec["e"] = 40, 35
	s.feedTopo()
	s.kill("e/p") // b's successor e: its query fails, it is replayed too
	s.kill("b/p")
	s.run()
	after := s.replayAfter["b"]
	if after["c"] != 40 || after["e"] != 0 {
		t.Fatalf("b replay after %v, want c 40, e 0", after)
	}
	if s.promoted["b"] != 1 || s.promoted["e"] != 1 || s.promoted["d"] != 0 {
		t.Fatalf("promotions %v", s.promoted)
	}
	var got []string
	for _, r := range s.resends {
		if r.ToModel == "a" && r.Model == config.Frontend && r.After > 50 {
			t.Fatalf("%v skips what b's replayed state (50) lacks", r)
		}
		got = append(got, r.String())
	}
	if len(got) == 0 {
		t.Fatal("no resends")
	}
}

// A spare that fails to replay (its store unreachable, say) is replaced
// by another in the next round; after ReplayAttempts failures in a row the
// model is reported unrecoverable.
func TestReplayPromotionFailures(t *testing.T) {
	for _, fails := range []int{1, ReplayAttempts} {
		s := newReplaySim(t, 5)
		n := 0
		s.promoteFails = func(a Action) bool {
			if a.Model == "b" && n < fails {
				n++
				return true
			}
			return false
		}
		s.kill("b/p")
		s.run()
		switch {
		case fails < ReplayAttempts && (s.promoted["b"] != 1 || s.unrec["b"] || s.serving("b") == nil):
			t.Fatalf("%d failure(s): promoted %d, unrecoverable %v", fails, s.promoted["b"], s.unrec["b"])
		case fails == ReplayAttempts && !s.unrec["b"]:
			for _, l := range s.log {
				t.Log(l)
			}
			t.Fatalf("%d failures in a row: not reported unrecoverable", fails)
		}
		if s.started < fails {
			t.Fatalf("%d failure(s): only %d new spares started", fails, s.started)
		}
	}
}
