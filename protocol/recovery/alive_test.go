package recovery

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"google.golang.org/protobuf/proto"
)

// Transcript tests of false suspicion (alive.go): a component declared
// dead comes back. The service is fe -> m (stateful) -> x (stateless) ->
// fe; m has a primary m/p, a backup m/b and a spare m/sp, x an active x/a
// and a standby x/s. Every event fed to the machine is a "> " line, every
// action it returns a "< " line under it; the harness answers actions in
// order (queries with seq 10, everything else done) and starts instances
// at once (a new placement "MODEL/newN", logged as a topology event).

type transcript struct {
	t       *testing.T
	m       *Machine
	topo    *hamsv1.Topology
	lines   []string
	pending []Action
	started int
	// fail, when set, fails the actions it reports true for.
	fail func(Action) bool
}

func newTranscript(t *testing.T) *transcript {
	g := NewGraphFromEdges(map[string]bool{"m": true}, [][2]string{{config.Frontend, "m"}, {"m", "x"}, {"x", config.Frontend}})
	m, err := New(Config{Graph: g})
	if err != nil {
		t.Fatal(err)
	}
	tr := &transcript{t: t, m: m, topo: &hamsv1.Topology{Revision: 1, Frontends: []string{"fe:1"}}}
	for _, p := range []struct {
		id   string
		role hamsv1.Role
	}{{"m/p", hamsv1.Role_ROLE_PRIMARY}, {"m/b", hamsv1.Role_ROLE_BACKUP}, {"m/sp", hamsv1.Role_ROLE_STANDBY},
		{"x/a", hamsv1.Role_ROLE_ACTIVE}, {"x/s", hamsv1.Role_ROLE_STANDBY}} {
		tr.topo.Placements = append(tr.topo.Placements, &hamsv1.Placement{ComponentId: p.id, Model: p.id[:1], Role: p.role,
			SidecarAddress: p.id + ":1", Epoch: 1, Alive: true})
	}
	tr.feed("topology", tr.m.onTopologyChanged(proto.Clone(tr.topo).(*hamsv1.Topology)))
	tr.lines = nil
	return tr
}

func (tr *transcript) pl(id string) *hamsv1.Placement {
	for _, p := range tr.topo.Placements {
		if p.ComponentId == id {
			return p
		}
	}
	tr.t.Fatalf("no placement %s", id)
	return nil
}

// feed logs one event and the actions it returned.
func (tr *transcript) feed(event string, acts []Action) {
	tr.t.Helper()
	tr.lines = append(tr.lines, "> "+event)
	for _, a := range acts {
		tr.lines = append(tr.lines, "< "+a.String())
		if !a.Kind.Notice() {
			tr.pending = append(tr.pending, a)
		}
	}
}

func (tr *transcript) must(acts []Action, err error) []Action {
	tr.t.Helper()
	if err != nil {
		tr.t.Fatal(err)
	}
	return acts
}

func (tr *transcript) topology(why string) {
	tr.topo.Revision++
	tr.feed("topology: "+why, tr.m.onTopologyChanged(proto.Clone(tr.topo).(*hamsv1.Topology)))
}

// dies: membership declared id dead (topology) and suspects it.
func (tr *transcript) dies(id string) {
	p := tr.pl(id)
	p.Alive = false
	tr.topology(id + " dead")
	tr.feed("suspect "+id, tr.m.onSuspected(p.Model, p.Role, id))
}

// returns: id is heard from again (the driver holds it dead).
func (tr *transcript) returns(id string) []Action {
	acts := tr.m.onAliveAgain(id)
	tr.feed("alive again "+id, acts)
	for _, a := range acts {
		if a.Kind == Readmit {
			tr.pl(a.Component).Alive = true
			tr.topology(a.Component + " readmitted")
		}
	}
	return acts
}

// settle answers every pending action, in order, until none is left.
func (tr *transcript) settle() {
	tr.t.Helper()
	for n := 0; len(tr.pending) > 0; n++ {
		if n > 200 {
			tr.t.Fatalf("does not settle:\n%s", strings.Join(tr.lines, "\n"))
		}
		tr.step()
	}
	if !tr.m.Idle() {
		tr.t.Fatalf("machine not idle:\n%s", strings.Join(tr.lines, "\n"))
	}
}

// step answers the first pending action.
func (tr *transcript) step() {
	tr.t.Helper()
	a := tr.pending[0]
	tr.pending = tr.pending[1:]
	var err error
	if tr.fail != nil && tr.fail(a) {
		err = fmt.Errorf("injected failure")
	}
	switch a.Kind {
	case GetMaxSeq:
		tr.feed(fmt.Sprintf("#%d max_seq 10", a.ID), tr.must(tr.m.onMaxSeqAnswered(a.ID, 10)))
	case GetLineageSummary:
		if err != nil {
			tr.feed(fmt.Sprintf("#%d failed", a.ID), tr.must(tr.m.onQueryFailed(a.ID, err)))
			return
		}
		s := Summary{MaxOut: 10, MaxIn: map[string]uint64{config.Frontend: 10, "m": 10}}
		tr.feed(fmt.Sprintf("#%d summary max_out=10", a.ID), tr.must(tr.m.onSummaryAnswered(a.ID, s)))
	case Rewire:
		for _, c := range a.Changes {
			p := tr.pl(c.Component)
			p.Role, p.Epoch = c.Role, c.Epoch
		}
		tr.topology("rewired")
		tr.feed(fmt.Sprintf("#%d done", a.ID), tr.must(tr.m.onActionDone(a.ID, nil)))
	case StartInstance:
		if err == nil {
			tr.started++
			id := fmt.Sprintf("%s/new%d", a.Model, tr.started)
			var ep uint64 = 1
			for _, p := range tr.topo.Placements {
				if p.Model == a.Model {
					ep = max(ep, p.Epoch)
				}
			}
			tr.topo.Placements = append(tr.topo.Placements, &hamsv1.Placement{ComponentId: id, Model: a.Model, Role: a.Role,
				SidecarAddress: id + ":1", Epoch: ep, Alive: true})
			tr.topology(fmt.Sprintf("+%s %s", id, a.Role))
		}
		tr.feed(fmt.Sprintf("#%d %s", a.ID, outcome(err)), tr.must(tr.m.onActionDone(a.ID, err)))
	default:
		tr.feed(fmt.Sprintf("#%d %s", a.ID, outcome(err)), tr.must(tr.m.onActionDone(a.ID, err)))
	}
}

func outcome(err error) string {
	if err != nil {
		return "failed"
	}
	return "done"
}

func (tr *transcript) check(want string) {
	tr.t.Helper()
	var w []string
	for _, l := range strings.Split(strings.TrimSpace(want), "\n") {
		w = append(w, strings.TrimSpace(l))
	}
	if !slices.Equal(tr.lines, w) {
		tr.t.Fatalf("transcript:\n%s\n\nwant:\n%s", strings.Join(tr.lines, "\n"), strings.Join(w, "\n"))
	}
}
