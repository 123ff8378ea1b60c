package recovery

import (
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"google.golang.org/protobuf/proto"
)

// The simulated service: fe -> a -> b -> c -> d -> fe, a -> x -> d, b -> e -> fe.
// b, d, e are stateful; a, c, x stateless. Every request visits every
// model, so a model's seq for request i is i, and every model's seq space
// is the same: a position "up to n" means the same prefix everywhere.
var simEdges = [][2]string{
	{config.Frontend, "a"}, {"a", "b"}, {"b", "c"}, {"c", "d"}, {"d", config.Frontend},
	{"a", "x"}, {"x", "d"}, {"b", "e"}, {"e", config.Frontend},
}
var simStateful = map[string]bool{"b": true, "d": true, "e": true}

type simEvent struct {
	at  int
	seq int
	f   func()
}
type evq []*simEvent

func (q evq) Len() int { return len(q) }
func (q evq) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q evq) Swap(i, j int)    { q[i], q[j] = q[j], q[i] }
func (q *evq) Push(x any)      { *q = append(*q, x.(*simEvent)) }
func (q *evq) Pop() any        { o := *q; x := o[len(o)-1]; *q = o[:len(o)-1]; return x }
func (q *evq) add(e *simEvent) { heap.Push(q, e) }

// sim models the graph's state and answers the machine's actions.
type sim struct {
	t        *testing.T
	rng      *rand.Rand
	g        *Graph
	m        *Machine
	topo     *hamsv1.Topology
	exec     map[string]uint64 // seq executed by the serving instance
	durable  map[string]uint64 // seq applied by the backup (stateful)
	applied  map[string]uint64 // after promotion/rollback: the new instance's position
	need     map[string]uint64 // stateless recovered: lowest position successors saw
	dead     map[string]bool   // crashed components
	part     map[string]bool   // partitioned from the manager (queries fail)
	dropP    float64
	now      int
	q        evq
	n        int
	promoted map[string]int // model -> promotions/rollbacks
	started  int
	log      []string
	fmMax    map[string]uint64 // failed-over model -> durable seq at failover
	unrec    map[string]bool
	resends  []Action
	recov    int
	// Replay mode (replay_test.go): logged is the end of each stateful
	// model's input log (durable is its newest checkpoint); promotions
	// record the ReplayAfter they carried.
	replay      bool
	logged      map[string]uint64
	replayAfter map[string]map[string]uint64
	// promoteFails, when set, fails the Promotes it reports true for.
	promoteFails func(Action) bool
	startedRole  map[hamsv1.Role]int
}

func newSim(t *testing.T, seed uint64, standby bool) *sim {
	return newSimSpares(t, seed, standby, false)
}

// newSimSpares: with spares, every stateful model also has a spare backup
// (a STANDBY placement of a stateful model).
func newSimSpares(t *testing.T, seed uint64, standby, spares bool) *sim {
	s := &sim{t: t, rng: rand.New(rand.NewPCG(seed, seed*7+1)), g: NewGraphFromEdges(simStateful, simEdges),
		exec: map[string]uint64{}, durable: map[string]uint64{}, applied: map[string]uint64{}, need: map[string]uint64{},
		dead: map[string]bool{}, part: map[string]bool{}, promoted: map[string]int{}, fmMax: map[string]uint64{}, unrec: map[string]bool{},
		startedRole: map[hamsv1.Role]int{}}
	m, err := New(Config{Graph: s.g})
	if err != nil {
		t.Fatal(err)
	}
	s.m = m
	s.topo = &hamsv1.Topology{Revision: 1, Frontends: []string{"fe:1"}}
	add := func(id, model string, role hamsv1.Role) {
		s.topo.Placements = append(s.topo.Placements, &hamsv1.Placement{ComponentId: id, Model: model, Role: role,
			SidecarAddress: id + ":1", Epoch: 1, Alive: true})
	}
	for _, md := range s.g.Models() {
		if s.g.Stateful(md) {
			add(md+"/p", md, hamsv1.Role_ROLE_PRIMARY)
			add(md+"/b", md, hamsv1.Role_ROLE_BACKUP)
			// The backup's model server registers too, without a sidecar
			// address: recovery must never aim an RPC at it.
			s.topo.Placements = append(s.topo.Placements, &hamsv1.Placement{ComponentId: md + "/bms", Model: md,
				Role: hamsv1.Role_ROLE_BACKUP, BackendAddress: md + "-bms:1", Epoch: 1, Alive: true})
			if spares {
				add(md+"/sp", md, hamsv1.Role_ROLE_STANDBY)
			}
		} else {
			add(md+"/a", md, hamsv1.Role_ROLE_ACTIVE)
			if standby {
				add(md+"/s", md, hamsv1.Role_ROLE_STANDBY)
			}
		}
	}
	// Progress: topological, each model behind its predecessors; backups
	// behind their primaries and their PFMs' backups (Algorithm 2).
	const n = 100
	order := []string{"a", "b", "x", "c", "e", "d"}
	for _, md := range order {
		lim := uint64(n)
		for _, p := range s.g.Pred(md) {
			if p != config.Frontend {
				lim = min(lim, s.exec[p])
			}
		}
		s.exec[md] = lim - uint64(s.rng.IntN(int(lim/4)+1))
		if s.g.Stateful(md) {
			d := s.exec[md] - uint64(s.rng.IntN(int(s.exec[md]/3)+1))
			if md != "b" {
				d = min(d, s.durable["b"])
			}
			s.durable[md] = d
		}
	}
	s.feedTopo()
	return s
}

func (s *sim) logf(f string, a ...any) {
	s.log = append(s.log, fmt.Sprintf("t=%d ", s.now)+fmt.Sprintf(f, a...))
}

func (s *sim) fail(f string, a ...any) {
	s.t.Helper()
	for _, l := range s.log {
		s.t.Log(l)
	}
	s.t.Fatalf(f, a...)
}

func (s *sim) at(d int, f func()) {
	s.n++
	s.q.add(&simEvent{at: s.now + d, seq: s.n, f: f})
}

func (s *sim) feedTopo() {
	s.topo.Revision++
	s.handle(s.m.onTopologyChanged(proto.Clone(s.topo).(*hamsv1.Topology)), nil)
}

func (s *sim) pl(id string) *hamsv1.Placement {
	for _, p := range s.topo.Placements {
		if p.GetComponentId() == id {
			return p
		}
	}
	return nil
}

// kill crashes id: membership notices (topology alive=false) and suspects.
func (s *sim) kill(id string) {
	s.dead[id] = true
	p := s.pl(id)
	p.Alive = false
	s.logf("kill %s", id)
	s.feedTopo()
	s.handle(s.m.onSuspected(p.Model, p.Role, id), nil)
}

func (s *sim) handle(acts []Action, err error) {
	s.t.Helper()
	if err != nil {
		s.fail("machine: %v", err)
	}
	for _, a := range acts {
		s.logf("action %v", a)
		s.do(a)
	}
}

func (s *sim) reachable(a Action) bool {
	if a.Component == "" {
		return true
	}
	return !s.dead[a.Component] && !s.part[a.Component]
}

func (s *sim) upstreamOf(md string) []string {
	seen := map[string]bool{}
	var out []string
	var walk func(n string)
	walk = func(n string) {
		for _, p := range s.g.Pred(n) {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
				if p != config.Frontend {
					walk(p)
				}
			}
		}
	}
	walk(md)
	return out
}

func (s *sim) summaryAt(md string, pos uint64) Summary {
	sum := Summary{MaxOut: pos, MaxIn: map[string]uint64{}}
	for _, u := range s.upstreamOf(md) {
		sum.MaxIn[u] = pos
	}
	return sum
}

func (s *sim) feExec() uint64 {
	v := ^uint64(0)
	for _, p := range s.g.Pred(config.Frontend) {
		v = min(v, s.exec[p])
	}
	return v
}

func (s *sim) do(a Action) {
	delay := 1 + s.rng.IntN(10)
	switch a.Kind {
	case GetMaxSeq, GetLineageSummary, Promote, Rollback, Resend, Demote, SyncBackup:
		if a.Address == "" {
			s.fail("action %v has no sidecar address", a)
		}
	}
	switch a.Kind {
	case Recovered:
		s.recov++
		return
	case Unrecoverable:
		s.unrec[a.Model] = true
		return
	case GetMaxSeq, GetLineageSummary:
		if s.replay && a.Kind == GetMaxSeq {
			s.fail("%v in replay mode: a spare has no applied state to ask about", a)
		}
		if !s.reachable(a) || s.rng.Float64() < s.dropP {
			s.at(delay+20, func() { s.handle(s.m.onQueryFailed(a.ID, errors.New("timeout"))) })
			return
		}
		p := s.pl(a.Component)
		if a.Kind == GetMaxSeq {
			if p.Role != hamsv1.Role_ROLE_BACKUP {
				s.fail("GetMaxSeq sent to %s in role %s", a.Component, p.Role)
			}
			v := s.durable[a.Model]
			s.at(delay, func() { s.handle(s.m.onMaxSeqAnswered(a.ID, v)) })
			return
		}
		var sum Summary
		switch {
		case a.Model == config.Frontend:
			sum = s.summaryAt(a.FailedModel, s.feExec())
		case a.FailedModel == "":
			// A backup (positions of what it applied) or a rolled-back primary.
			v := s.durable[a.Model]
			if v2, ok := s.applied[a.Model]; ok && p.Role == hamsv1.Role_ROLE_PRIMARY {
				v = v2
			}
			sum = s.summaryAt(a.Model, v)
		default:
			v := s.exec[a.Model]
			if p.Role == hamsv1.Role_ROLE_BACKUP {
				v = s.durable[a.Model]
			}
			sum = s.summaryAt(a.FailedModel, v)
			sum.ConsumedBeyond = a.FailedMaxSeq < s.exec[a.Model] && p.Role == hamsv1.Role_ROLE_PRIMARY
		}
		s.at(delay, func() { s.handle(s.m.onSummaryAnswered(a.ID, sum)) })
	case Promote, Rollback:
		p := s.pl(a.Component)
		var err error
		switch {
		case s.dead[a.Component]:
			err = errors.New("unavailable")
		case s.promoteFails != nil && s.promoteFails(a):
			err = errors.New("injected promotion failure")
		case a.Epoch <= s.maxEpoch(a.Model):
			s.fail("%v: epoch %d does not increase (max %d)", a, a.Epoch, s.maxEpoch(a.Model))
		case a.Kind == Promote && s.g.Stateful(a.Model) && p.Role != hamsv1.Role_ROLE_BACKUP:
			s.fail("%v: target is %s, not the backup", a, p.Role)
		case a.Kind == Promote && !s.g.Stateful(a.Model) && p.Role != hamsv1.Role_ROLE_STANDBY:
			s.fail("%v: target is %s, not a standby", a, p.Role)
		case a.Kind == Rollback && p.Role != hamsv1.Role_ROLE_PRIMARY:
			s.fail("%v: target is %s", a, p.Role)
		}
		if err == nil && s.replay && s.g.Stateful(a.Model) {
			if a.ReplayAfter == nil {
				s.fail("%v in replay mode carries no ReplayAfter", a)
			}
			s.promoted[a.Model]++
			s.replayAfter[a.Model] = a.ReplayAfter
			s.applied[a.Model] = s.logged[a.Model]
			s.exec[a.Model] = s.logged[a.Model]
		} else if err == nil {
			s.promoted[a.Model]++
			if s.g.Stateful(a.Model) {
				if a.Kind == Promote {
					s.fmMax[a.Model] = s.durable[a.Model]
				}
				s.applied[a.Model] = s.durable[a.Model]
				s.exec[a.Model] = s.durable[a.Model]
			}
		}
		s.at(delay, func() { s.handle(s.m.onActionDone(a.ID, err)) })
	case Rewire:
		for _, c := range a.Changes {
			p := s.pl(c.Component)
			p.Role, p.Epoch = c.Role, c.Epoch
		}
		s.checkPrimaries()
		s.at(delay, func() {
			s.feedTopo()
			s.handle(s.m.onActionDone(a.ID, nil))
		})
	case Resend:
		s.resends = append(s.resends, a)
		var err error
		if a.Component != "" && s.dead[a.Component] {
			err = errors.New("unavailable")
		}
		s.at(delay, func() { s.handle(s.m.onActionDone(a.ID, err)) })
	case Demote, SyncBackup:
		if s.replay && a.Kind == SyncBackup {
			s.fail("%v in replay mode: a spare has nothing to sync", a)
		}
		var err error
		if s.dead[a.Component] {
			err = errors.New("unavailable")
		} else if p := s.pl(a.Component); p.Role != hamsv1.Role_ROLE_BACKUP {
			s.fail("%v: target is %s", a, p.Role)
		}
		s.at(delay, func() { s.handle(s.m.onActionDone(a.ID, err)) })
	case StartInstance:
		s.started++
		s.startedRole[a.Role]++
		id := fmt.Sprintf("%s/new%d", a.Model, s.started)
		s.at(delay, func() { s.handle(s.m.onActionDone(a.ID, nil)) })
		// The new instance's model server registers first, without a
		// sidecar address; its sidecar follows.
		s.at(delay+2, func() {
			s.topo.Placements = append(s.topo.Placements, &hamsv1.Placement{ComponentId: id + "-ms", Model: a.Model, Role: a.Role,
				BackendAddress: id + "-ms:1", Epoch: max(s.maxEpoch(a.Model), 1), Alive: true})
			s.feedTopo()
		})
		s.at(delay+5, func() {
			s.topo.Placements = append(s.topo.Placements, &hamsv1.Placement{ComponentId: id, Model: a.Model, Role: a.Role,
				SidecarAddress: id + ":1", Epoch: max(s.maxEpoch(a.Model), 1), Alive: true})
			s.logf("started %s as %s", id, a.Role)
			s.feedTopo()
		})
	case Retire:
		// The retired process exits (told so at its next heartbeat, or
		// when a partition heals); membership then reports it.
		if sv := s.serving(a.Model); sv != nil && sv.ComponentId == a.Component {
			s.fail("%v retires %s's serving instance", a, a.Model)
		}
		s.logf("retired %s", a.Component)
		s.at(delay+3, func() {
			if !s.dead[a.Component] {
				s.kill(a.Component)
			}
		})
	default:
		s.fail("unexpected action %v", a)
	}
}

func (s *sim) maxEpoch(md string) uint64 {
	var e uint64
	for _, p := range s.topo.Placements {
		if p.Model == md {
			e = max(e, p.Epoch)
		}
	}
	return e
}

// checkPrimaries: never two live primaries of one model at the same epoch.
func (s *sim) checkPrimaries() {
	seen := map[string]bool{}
	for _, p := range s.topo.Placements {
		if p.Role != hamsv1.Role_ROLE_PRIMARY || s.dead[p.ComponentId] {
			continue
		}
		k := fmt.Sprintf("%s@%d", p.Model, p.Epoch)
		if seen[k] {
			s.fail("two live primaries of %s", k)
		}
		seen[k] = true
	}
}

func (s *sim) run() {
	for s.q.Len() > 0 {
		e := heap.Pop(&s.q).(*simEvent)
		s.now = e.at
		e.f()
		if s.now > 100000 {
			s.fail("simulation does not settle")
		}
	}
	if !s.m.Idle() {
		s.fail("machine not idle after the simulation settled (round %d)", s.m.Round())
	}
}

func (s *sim) serving(md string) *hamsv1.Placement {
	var best *hamsv1.Placement
	for _, p := range s.topo.Placements {
		if p.Model == md && !s.dead[p.ComponentId] && (p.Role == hamsv1.Role_ROLE_PRIMARY || p.Role == hamsv1.Role_ROLE_ACTIVE) {
			if best == nil || p.Epoch > best.Epoch {
				best = p
			}
		}
	}
	return best
}

// checkFinal asserts the end-state invariants.
func (s *sim) checkFinal(wantAllServing bool, initialExec map[string]uint64) {
	s.t.Helper()
	for _, md := range s.g.Models() {
		sv := s.serving(md)
		if wantAllServing && sv == nil && !s.unrec[md] {
			s.fail("model %s has no live serving instance", md)
		}
		if sv != nil && s.g.Stateful(md) && s.pl(sv.ComponentId).Role != hamsv1.Role_ROLE_PRIMARY {
			s.fail("model %s served by %s", md, sv.Role)
		}
	}
	// At most one live backup per stateful model: a second one (a deposed
	// primary listed as the backup beside the new one started for it)
	// never gets the primary's snapshots, and a later failover could
	// promote it. (Replay mode's backups are spares that replay the log:
	// several may run.)
	for _, md := range s.g.Models() {
		if s.replay {
			break
		}
		var backups []string
		for _, p := range s.topo.Placements {
			if p.Model == md && p.Role == hamsv1.Role_ROLE_BACKUP && p.SidecarAddress != "" && p.Alive && !s.dead[p.ComponentId] {
				backups = append(backups, p.ComponentId)
			}
		}
		if len(backups) > 1 {
			s.fail("model %s has %d live backups %v", md, len(backups), backups)
		}
	}
	// Every downstream model that consumed beyond a failed-over model's
	// durable seq was failed over or rolled back.
	for fm, mx := range s.fmMax {
		for _, d := range s.g.DownstreamStateful(fm) {
			if initialExec[d] > mx && s.promoted[d] == 0 && !s.unrec[d] {
				s.fail("%s consumed beyond %s's max_seq %d (exec %d) but was neither failed over nor rolled back", d, fm, mx, initialExec[d])
			}
		}
	}
	// Resend positions never skip what a new instance has not applied: for
	// every model X recovered, each resend on an edge towards X is at most
	// X's position.
	for _, r := range s.resends {
		for _, x := range s.towards(r.ToModel) {
			lim, ok := s.applied[x]
			if !s.g.Stateful(x) {
				lim, ok = s.need[x], s.promoted[x] > 0
			}
			if ok && r.After > lim {
				s.fail("%v skips seqs: %s only has %d", r, x, lim)
			}
		}
	}
}

// towards: y and every model reachable from y through stateless models
// (y included), i.e. the models a resend on an edge into y feeds.
func (s *sim) towards(y string) []string {
	out := []string{y}
	if y == config.Frontend || s.g.Stateful(y) {
		return out
	}
	for _, n := range s.g.Succ(y) {
		if n != config.Frontend {
			out = append(out, s.towards(n)...)
		}
	}
	return out
}

func (s *sim) snapshotNeeds() {
	// A recovered stateless model needs everything its successors (or
	// their fallbacks) have not seen: the lowest of their positions.
	for _, md := range s.g.Models() {
		if s.g.Stateful(md) {
			continue
		}
		v := ^uint64(0)
		for _, sc := range s.g.Succ(md) {
			if sc == config.Frontend {
				v = min(v, s.feExec())
			} else {
				v = min(v, s.exec[sc])
			}
		}
		s.need[md] = v
	}
}

type scenario struct {
	name     string
	kill     []string
	later    []string // killed at a random time during recovery
	part     []string // partitioned (queries fail) but alive
	standby  bool
	spares   bool // stateful models have a spare backup
	dropP    float64
	serving  bool // every model must end with a live serving instance
	check    func(s *sim)
	promoted []string // models that must have been failed over/rolled back
}

func TestScenarios(t *testing.T) {
	scs := []scenario{
		{name: "stateless", kill: []string{"a/a"}, standby: true, serving: true, promoted: []string{"a"}},
		{name: "stateless-no-standby", kill: []string{"c/a"}, serving: true, promoted: []string{"c"}},
		{name: "stateless-and-successor", kill: []string{"a/a", "x/a"}, standby: true, serving: true, promoted: []string{"a", "x"}},
		{name: "stateful-primary", kill: []string{"b/p"}, standby: true, serving: true, promoted: []string{"b"}},
		{name: "adjacent-stateful", kill: []string{"b/p", "d/p"}, standby: true, serving: true, promoted: []string{"b", "d"}},
		{name: "stateless-plus-stateful", kill: []string{"c/a", "b/p"}, standby: true, serving: true, promoted: []string{"b", "c"}},
		{name: "primary-plus-downstream-backup", kill: []string{"b/p", "d/b"}, standby: true, serving: true, promoted: []string{"b"}},
		{name: "backup", kill: []string{"d/b"}, standby: true, serving: true, check: func(s *sim) {
			if s.started == 0 {
				s.fail("no new backup started")
			}
		}},
		{name: "iterative", kill: []string{"b/p"}, later: []string{"c/a", "e/b"}, standby: true, serving: true, promoted: []string{"b"}},
		{name: "drops", kill: []string{"b/p", "a/a"}, standby: true, dropP: 0.2, serving: true, promoted: []string{"a", "b"}},
		{name: "partitioned-primary", part: []string{"b/p"}, kill: nil, standby: true, serving: true},
		{name: "primary-with-spare", kill: []string{"b/p"}, standby: true, spares: true, serving: true, promoted: []string{"b"}, check: spareUsed("b")},
		{name: "backup-with-spare", kill: []string{"d/b"}, standby: true, spares: true, serving: true, check: spareUsed("d")},
		{name: "primary-plus-spare", kill: []string{"b/p", "b/sp"}, standby: true, spares: true, serving: true, promoted: []string{"b"}, check: func(s *sim) {
			if s.startedRole[hamsv1.Role_ROLE_BACKUP] == 0 {
				s.fail("the spare died with the primary, yet no backup was started")
			}
		}},
		{name: "both-replicas", kill: []string{"b/p", "b/b"}, standby: true, check: func(s *sim) {
			if !s.unrec["b"] {
				s.fail("b not reported unrecoverable")
			}
		}},
	}
	for _, sc := range scs {
		t.Run(sc.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 200; seed++ {
				runScenario(t, sc, seed)
				if t.Failed() {
					t.Fatalf("seed %d", seed)
				}
			}
		})
	}
}

// spareUsed checks that model's lost backup was replaced by its spare:
// the spare is its live BACKUP at the primary's epoch, no backup was
// started the slow way, and a new spare was asked for.
func spareUsed(model string) func(*sim) {
	return func(s *sim) {
		sp := s.pl(model + "/sp")
		prim := s.serving(model)
		if sp.Role != hamsv1.Role_ROLE_BACKUP || prim == nil || sp.Epoch != prim.Epoch {
			s.fail("spare of %s is %s at epoch %d (primary at %v)", model, sp.Role, sp.Epoch, prim)
		}
		if n := s.startedRole[hamsv1.Role_ROLE_BACKUP]; n != 0 {
			s.fail("%d backups started although a spare was there", n)
		}
		if s.startedRole[hamsv1.Role_ROLE_STANDBY] == 0 {
			s.fail("no new spare asked for")
		}
	}
}

func runScenario(t *testing.T, sc scenario, seed uint64) {
	s := newSimSpares(t, seed, sc.standby, sc.spares)
	s.dropP = sc.dropP
	initial := map[string]uint64{}
	for k, v := range s.exec {
		initial[k] = v
	}
	s.snapshotNeeds()
	for _, id := range sc.part {
		s.part[id] = true
		p := s.pl(id)
		// A failure report from a peer: the component is alive to
		// membership but does not answer.
		s.handle(s.m.onSuspected(p.Model, p.Role, id), nil)
	}
	for _, id := range sc.kill {
		s.kill(id)
	}
	for _, id := range sc.later {
		s.at(s.rng.IntN(40), func() { s.kill(id) })
	}
	s.run()
	s.checkFinal(sc.serving, initial)
	for _, md := range sc.promoted {
		if s.promoted[md] == 0 && !(sc.dropP > 0 && s.unrec[md]) {
			s.fail("model %s was not recovered", md)
		}
	}
	if sc.check != nil {
		sc.check(s)
	}
	if len(sc.kill)+len(sc.part) > 0 && s.recov == 0 && len(s.unrec) == 0 && !strings.HasPrefix(sc.name, "backup") {
		s.fail("no Recovered notice")
	}
}

// A downstream model that consumed beyond the failed model's max_seq is
// failed over; one whose backup is dead is rolled back instead.
func TestConsumedBeyondFailoverAndRollback(t *testing.T) {
	for _, deadBackup := range []bool{false, true} {
		s := newSim(t, 1, true)
		s.exec["b"], s.durable["b"] = 50, 40
		s.exec["d"], s.durable["d"] = 45, 30 // consumed beyond 40
		s.exec["e"], s.durable["e"] = 38, 30 // did not
		s.feedTopo()
		s.snapshotNeeds()
		if deadBackup {
			s.kill("d/b")
		}
		s.kill("b/p")
		s.run()
		var kinds []string
		for _, l := range s.log {
			kinds = append(kinds, l)
		}
		if s.promoted["d"] != 1 || s.promoted["e"] != 0 {
			t.Fatalf("deadBackup=%v: promotions %v\n%v", deadBackup, s.promoted, kinds)
		}
		d := s.serving("d")
		if deadBackup && d.ComponentId != "d/p" || !deadBackup && d.ComponentId != "d/b" {
			t.Fatalf("deadBackup=%v: d served by %s", deadBackup, d.ComponentId)
		}
		if d.Epoch != 2 {
			t.Fatalf("d epoch %d, want 2", d.Epoch)
		}
		if !slices.Equal(s.m.Consumed(), nil) {
			t.Fatalf("round still open")
		}
		// Resends into d's side come from b's new primary after d's position 30.
		var got []string
		for _, r := range s.resends {
			got = append(got, fmt.Sprintf("%s->%s>%d", r.Model, r.ToModel, r.After))
		}
		sort.Strings(got)
		for _, w := range []string{"b->c>30"} {
			if !slices.Contains(got, w) {
				t.Fatalf("deadBackup=%v: resends %v lack %s", deadBackup, got, w)
			}
		}
	}
}

func TestMachineBadInput(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Fatal("New without a graph succeeded")
	}
	m, _ := New(Config{Graph: NewGraphFromEdges(simStateful, simEdges)})
	if _, err := m.onMaxSeqAnswered(7, 1); !errors.Is(err, ErrUnknownAction) {
		t.Fatalf("MaxSeq(unknown) = %v", err)
	}
	if _, err := m.onSummaryAnswered(7, Summary{}); !errors.Is(err, ErrUnknownAction) {
		t.Fatalf("LineageSummary(unknown) = %v", err)
	}
	if _, err := m.onQueryFailed(7, errors.New("x")); !errors.Is(err, ErrUnknownAction) {
		t.Fatalf("QueryFailed(unknown) = %v", err)
	}
	if _, err := m.onActionDone(7, nil); !errors.Is(err, ErrUnknownAction) {
		t.Fatalf("ActionDone(unknown) = %v", err)
	}
	if acts := m.onSuspected("nope", hamsv1.Role_ROLE_PRIMARY, "nope/p"); len(acts) != 0 || !m.Idle() {
		t.Fatalf("suspicion of an unknown model: %v", acts)
	}
	if acts := m.onTopologyChanged(nil); acts != nil {
		t.Fatal("nil topology produced actions")
	}
	if Kind(99).String() != "Kind(99)" || Promote.String() != "Promote" || !Recovered.Notice() {
		t.Fatal("kind names")
	}
}
