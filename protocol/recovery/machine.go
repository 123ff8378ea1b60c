package recovery

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// ErrUnknownAction is returned (wrapped) for an answer to an action the
// machine is not waiting for.
var ErrUnknownAction = errors.New("recovery: answer to an unknown or finished action")

// DefaultQueryAttempts is how often a query is sent before its target is
// deemed dead.
const DefaultQueryAttempts = 3

// ReplayAttempts is how many spares in a row may fail to replay a model's
// log (replay mode) before it is reported Unrecoverable.
const ReplayAttempts = 3

// Config of a Machine.
type Config struct {
	Graph *Graph
	// QueryAttempts per query before the target is deemed dead (default
	// DefaultQueryAttempts).
	QueryAttempts int
	// RewireAttempts before a round gives up rewiring (default 5).
	RewireAttempts int
	// Replay: the deployment runs mode replay (Lineage-Stash-style
	// checkpoint and replay): a stateful model's failed primary is
	// replaced by its spare, which re-executes the input log; nothing
	// downstream is failed over and no backup is synced (machine.go,
	// "replay mode"; the package doc).
	Replay bool
}

type taskKind int

const (
	tStateless taskKind = iota + 1 // dead ACTIVE replaced by a standby
	tFailover                      // primary replaced by its backup
	tRollback                      // primary rolls back to its kept previous state
	tReplay                        // replay mode: the spare replays the input log
)

func (k taskKind) String() string {
	return map[taskKind]string{tStateless: "stateless", tFailover: "failover", tRollback: "rollback", tReplay: "replay"}[k]
}

// task is the recovery of one model within a round.
type task struct {
	model string
	kind  taskKind
	gen   int // bumped when kind or instance changes; stale answers are ignored

	old     []*hamsv1.Placement // the instance(s) being replaced (or rolled back)
	inst    *hamsv1.Placement   // new primary / active (rollback: the primary itself)
	waitStd bool                // a StartInstance(STANDBY) is pending; inst chosen from the topology

	maxSeq     uint64
	haveMaxSeq bool
	pos        map[string]uint64 // upstream model -> resend after
	havePos    bool

	// replay: per successor, the highest seq of the model it received
	// (the minimum over its answers; 0 when it could not be asked).
	succPos map[string]uint64

	// stateless: summaries from successors (or fallbacks).
	sources   []Summary
	visited   map[string]bool
	startSeq  uint64
	installed bool
	newEpoch  uint64
	abandoned string
}

type qPurpose int

const (
	qMaxSeq qPurpose = iota + 1
	qBackupPos
	qDownstream
	qSource
	qPostRollback
	qSucc       // replay: a successor's max_out of the failed model
	qPostReplay // replay: the new primary's own positions
)

type query struct {
	purpose  qPurpose
	task     string // model of the task it serves
	gen      int
	act      Action
	attempts int
	target   string // model the target serves
}

const (
	stQuery = iota + 1
	stInstall
	stRewire
	stFinish
)

type round struct {
	id      int
	stage   int
	dead    map[string]bool // component ids deemed dead in this round
	tasks   map[string]*task
	backupL map[string]bool // models whose backup is lost
	standL  map[string]int  // models whose standby was lost or used
	// sparesUsed: spare backups (STANDBY placements of stateful models)
	// this round made a backup.
	sparesUsed map[string]bool
	pending    map[ActionID]func(err error) []Action
	queries    map[ActionID]*query
	rewires    int
	// consumed records downstream models found to have consumed beyond a
	// failed model's max_seq (for tests and logs).
	consumed map[string]bool
}

// Machine is the recovery state machine (see doc.go). Not safe for
// concurrent use; the driver serialises Steps.
type Machine struct {
	cfg    Config
	g      *Graph
	topo   *hamsv1.Topology
	nextID ActionID
	rounds int
	r      *round
	queued []suspicion
	// awaitSync: model -> backup components known when a new backup was
	// asked for; a new alive backup not in the set gets SyncBackup.
	awaitSync map[string]map[string]bool
	syncing   map[ActionID]string
	// handled: components a finished round treated as dead; later
	// suspicions of them are ignored until the topology shows them come
	// back (dead -> alive).
	handled   map[string]bool
	lastAlive map[string]bool
	// replayTries counts failed replay promotions per model since its
	// last successful one (replay mode).
	replayTries map[string]int
	// deposed: old primaries a failover rewired to BACKUP (alive.go).
	deposed map[string]bool
	// starts: StartInstance actions issued outside a round (alive.go),
	// by id -> model.
	starts map[ActionID]string
	// returning: components heard from again while a round recovered
	// them or their model; decided when the round ends (alive.go).
	returning []string
	// failoverOnReturn: model -> its dead primary, for a model given up
	// (primary and backup both failed) whose backup returned and was
	// readmitted: once the topology shows the backup alive, the
	// primary's death is recovered again, by a failover to it (alive.go).
	failoverOnReturn map[string]string
	// sparesJoined: spares that joined while a round ran (SpareJoined),
	// looked at again when it ends (backupreplace.go).
	sparesJoined []string
}

type suspicion struct {
	model, component string
	role             hamsv1.Role
}

// New returns an idle machine.
func New(cfg Config) (*Machine, error) {
	if cfg.Graph == nil {
		return nil, errors.New("recovery: Config.Graph is required")
	}
	if cfg.QueryAttempts <= 0 {
		cfg.QueryAttempts = DefaultQueryAttempts
	}
	if cfg.RewireAttempts <= 0 {
		cfg.RewireAttempts = 5
	}
	return &Machine{cfg: cfg, g: cfg.Graph, topo: &hamsv1.Topology{},
		awaitSync: map[string]map[string]bool{}, syncing: map[ActionID]string{},
		handled: map[string]bool{}, lastAlive: map[string]bool{}, replayTries: map[string]int{},
		deposed: map[string]bool{}, starts: map[ActionID]string{}, failoverOnReturn: map[string]string{}}, nil
}

// Idle reports whether no round is in progress and none is queued.
func (m *Machine) Idle() bool { return m.r == nil && len(m.queued) == 0 }

// Round returns the number of the current round (0 when idle).
func (m *Machine) Round() int {
	if m.r == nil {
		return 0
	}
	return m.r.id
}

// Consumed lists the models found to have consumed beyond a failed model's
// durable seq in the current round (sorted).
func (m *Machine) Consumed() []string {
	if m.r == nil {
		return nil
	}
	return sortedKeys(m.r.consumed)
}

// onTopologyChanged handles TopologyChanged: it installs the newest
// deployment state. New instances started for
// recovery are found here.
func (m *Machine) onTopologyChanged(t *hamsv1.Topology) []Action {
	if t == nil {
		return nil
	}
	m.topo = t
	for _, p := range t.GetPlacements() {
		id := p.GetComponentId()
		if was, ok := m.lastAlive[id]; ok && !was && p.GetAlive() {
			delete(m.handled, id)
		}
		m.lastAlive[id] = p.GetAlive()
	}
	var out []Action
	// Backups waiting for a sync.
	for _, model := range sortedKeys(m.awaitSync) {
		known := m.awaitSync[model]
		prim := m.livePrimary(model, nil)
		if prim == nil {
			continue
		}
		for _, p := range t.GetPlacements() {
			// A model server's placement has no sidecar address: only a
			// backup sidecar can be synced.
			if p.GetModel() != model || p.GetRole() != hamsv1.Role_ROLE_BACKUP || !p.GetAlive() || known[p.GetComponentId()] || p.GetSidecarAddress() == "" {
				continue
			}
			delete(m.awaitSync, model)
			a := m.act(Action{Kind: SyncBackup, Model: model, Component: p.GetComponentId(), Address: p.GetSidecarAddress(),
				Epoch: prim.GetEpoch(), PrimaryAddress: prim.GetSidecarAddress()})
			m.syncing[a.ID] = model
			out = append(out, a)
			break
		}
	}
	out = append(out, m.failOverToReturnedBackups()...)
	if r := m.r; r != nil && r.stage == stQuery {
		for _, model := range sortedKeys(r.tasks) {
			tk := r.tasks[model]
			if !tk.waitStd || tk.abandoned != "" {
				continue
			}
			switch tk.kind {
			case tStateless:
				if s := m.pickStandby(model); s != nil {
					tk.inst, tk.waitStd = s, false
					tk.gen++
				}
			case tReplay:
				if s := m.liveBackup(model); s != nil {
					tk.inst, tk.waitStd = s, false
				}
			}
		}
		out = append(out, m.maybeCommit()...)
	}
	return out
}

// onSuspected handles Suspected: it starts (or extends) recovery for component, an instance of model
// in role. The topology's view of the component wins over model/role when
// it knows the component.
func (m *Machine) onSuspected(model string, role hamsv1.Role, component string) []Action {
	s := suspicion{model: model, component: component, role: role}
	if p := m.placement(component); p != nil {
		s.model, s.role = p.GetModel(), p.GetRole()
	}
	if !m.g.Has(s.model) || component == "" || m.handled[component] {
		return nil
	}
	if m.r != nil && m.r.stage != stQuery {
		if !m.r.dead[component] {
			m.queued = append(m.queued, s)
		}
		return nil
	}
	var out []Action
	if m.r == nil {
		out = append(out, m.startRound()...)
	}
	out = append(out, m.suspect(s)...)
	return append(out, m.maybeCommit()...)
}

func (m *Machine) startRound() []Action {
	m.rounds++
	m.r = &round{id: m.rounds, stage: stQuery, dead: map[string]bool{}, tasks: map[string]*task{},
		backupL: map[string]bool{}, standL: map[string]int{}, sparesUsed: map[string]bool{}, pending: map[ActionID]func(error) []Action{},
		queries: map[ActionID]*query{}, consumed: map[string]bool{}}
	return nil
}

// suspect folds one suspicion into the current round (stage stQuery).
func (m *Machine) suspect(s suspicion) []Action {
	r := m.r
	if r.dead[s.component] {
		return nil
	}
	r.dead[s.component] = true
	var out []Action
	tk := r.tasks[s.model]
	switch s.role {
	case hamsv1.Role_ROLE_ACTIVE:
		if m.g.Stateful(s.model) {
			return nil
		}
		if tk != nil {
			if tk.inst != nil && tk.inst.GetComponentId() == s.component {
				return m.rechooseStandby(tk)
			}
			return nil
		}
		if m.liveActive(s.model) != nil {
			return nil // another active still serves
		}
		tk = &task{model: s.model, kind: tStateless, visited: map[string]bool{}}
		for _, p := range m.topo.GetPlacements() {
			if p.GetModel() == s.model && p.GetRole() == hamsv1.Role_ROLE_ACTIVE {
				tk.old = append(tk.old, p)
			}
		}
		r.tasks[s.model] = tk
		out = append(out, m.rechooseStandby(tk)...)
		out = append(out, m.querySources(tk, s.model)...)
	case hamsv1.Role_ROLE_PRIMARY:
		if !m.g.Stateful(s.model) {
			return nil
		}
		cur := m.currentPrimary(s.model)
		if cur == nil || cur.GetComponentId() != s.component {
			return nil // not the serving primary (already failed over)
		}
		if tk != nil {
			if tk.kind == tRollback {
				tk.abandoned = "primary and backup both failed"
				out = append(out, m.notice(tk.model, tk.abandoned))
			}
			return out
		}
		if m.cfg.Replay {
			return m.newReplay(s.model, cur)
		}
		return m.newFailover(s.model, cur)
	case hamsv1.Role_ROLE_BACKUP:
		if !m.g.Stateful(s.model) {
			return nil
		}
		r.backupL[s.model] = true
		if tk != nil && tk.kind == tFailover && tk.inst.GetComponentId() == s.component {
			return m.failoverLostBackup(tk)
		}
		if tk != nil && tk.kind == tReplay && tk.inst != nil && tk.inst.GetComponentId() == s.component {
			if r.stage == stQuery {
				return m.chooseSpare(tk)
			}
			// The spare being (or just) promoted died: the rewire makes
			// it the primary, and the next round replays again on
			// another spare (it must not count as handled).
			delete(r.dead, s.component)
			m.queued = append(m.queued, suspicion{model: s.model, component: s.component, role: hamsv1.Role_ROLE_PRIMARY})
		}
	case hamsv1.Role_ROLE_STANDBY:
		r.standL[s.model]++
		if tk != nil && tk.kind == tStateless && tk.inst != nil && tk.inst.GetComponentId() == s.component {
			return m.rechooseStandby(tk)
		}
	}
	return out
}

// newFailover creates the failover task of a stateful model whose primary
// (old) is replaced by its live backup.
func (m *Machine) newFailover(model string, old *hamsv1.Placement) []Action {
	r := m.r
	// A backup that holds the state first; a new one still waiting for
	// its sync would refuse the promotion.
	b := m.syncedLiveBackup(model)
	if b == nil {
		// A new backup still waiting for its sync: it refuses the
		// promotion, and the model is reported unrecoverable.
		b = m.liveBackup(model)
	}
	if b == nil {
		r.backupL[model] = true
		if m.live(old) {
			tk := &task{model: model, kind: tRollback, inst: old, old: []*hamsv1.Placement{old}}
			r.tasks[model] = tk
			return nil
		}
		tk := &task{model: model, kind: tFailover, old: []*hamsv1.Placement{old}, abandoned: "primary and backup both failed" + m.backupsSeen(model)}
		r.tasks[model] = tk
		return []Action{m.notice(model, tk.abandoned)}
	}
	tk := &task{model: model, kind: tFailover, inst: b, old: []*hamsv1.Placement{old}}
	r.tasks[model] = tk
	return []Action{
		m.ask(qMaxSeq, tk, model, Action{Kind: GetMaxSeq, Model: model, Component: b.GetComponentId(), Address: b.GetSidecarAddress()}),
		m.ask(qBackupPos, tk, model, Action{Kind: GetLineageSummary, Model: model, Component: b.GetComponentId(), Address: b.GetSidecarAddress()}),
	}
}

// backupsSeen lists model's backup placements as this machine sees them
// (for the reason of an abandoned failover: which backup was not live).
func (m *Machine) backupsSeen(model string) string {
	var out []string
	for _, p := range m.topo.GetPlacements() {
		if p.GetModel() == model && p.GetRole() == hamsv1.Role_ROLE_BACKUP {
			out = append(out, fmt.Sprintf("%s epoch=%d alive=%t dead-in-round=%t", p.GetComponentId(), p.GetEpoch(), p.GetAlive(), m.r != nil && m.r.dead[p.GetComponentId()]))
		}
	}
	if len(out) == 0 {
		return " (no backup in the topology)"
	}
	return " (backups: " + strings.Join(out, "; ") + ")"
}

// failoverLostBackup handles the loss of the backup a failover task was
// going to promote: roll the primary back if it lives, else give up.
func (m *Machine) failoverLostBackup(tk *task) []Action {
	tk.gen++
	m.r.backupL[tk.model] = true
	old := tk.old[0]
	if m.live(old) {
		tk.kind, tk.inst = tRollback, old
		tk.haveMaxSeq, tk.havePos = false, false
		return nil
	}
	tk.abandoned = "primary and backup both failed"
	return []Action{m.notice(tk.model, tk.abandoned)}
}

func (m *Machine) rechooseStandby(tk *task) []Action {
	tk.gen++
	if s := m.pickStandby(tk.model); s != nil {
		tk.inst, tk.waitStd = s, false
		return nil
	}
	tk.inst = nil
	if tk.waitStd {
		return nil
	}
	tk.waitStd = true
	a := m.act(Action{Kind: StartInstance, Model: tk.model, Role: hamsv1.Role_ROLE_STANDBY})
	gen := tk.gen
	m.r.pending[a.ID] = func(err error) []Action {
		if err != nil && tk.gen == gen && tk.waitStd && m.r.stage == stQuery {
			tk.abandoned = "no standby: " + err.Error()
			return []Action{m.notice(tk.model, tk.abandoned)}
		}
		return nil
	}
	return []Action{a}
}

// querySources asks the instances that received failed's outputs (the
// successors of via, or their fallbacks) for their lineage summary.
func (m *Machine) querySources(tk *task, via string) []Action {
	var out []Action
	for _, s := range m.g.Succ(via) {
		out = append(out, m.querySource(tk, s)...)
	}
	return out
}

func (m *Machine) querySource(tk *task, s string) []Action {
	if tk.visited[s] {
		return nil
	}
	tk.visited[s] = true
	if s == config.Frontend {
		fes := m.topo.GetFrontends()
		if len(fes) == 0 {
			tk.sources = append(tk.sources, Summary{})
			return nil
		}
		var out []Action
		for _, a := range fes {
			out = append(out, m.ask(qSource, tk, s, Action{Kind: GetLineageSummary, Model: config.Frontend, Address: a, FailedModel: tk.model}))
		}
		return out
	}
	if p := m.liveServing(s); p != nil {
		return []Action{m.ask(qSource, tk, s, Action{Kind: GetLineageSummary, Model: s, Component: p.GetComponentId(),
			Address: p.GetSidecarAddress(), FailedModel: tk.model})}
	}
	return m.sourceFallback(tk, s)
}

// sourceFallback reconstructs a dead source's view conservatively: from
// its backup (stateful) or its own successors (stateless).
func (m *Machine) sourceFallback(tk *task, s string) []Action {
	if m.g.Stateful(s) {
		if b := m.liveBackup(s); b != nil {
			return []Action{m.ask(qSource, tk, s, Action{Kind: GetLineageSummary, Model: s, Component: b.GetComponentId(),
				Address: b.GetSidecarAddress(), FailedModel: tk.model})}
		}
		tk.sources = append(tk.sources, Summary{})
		return nil
	}
	out := m.querySources(tk, s)
	if len(out) == 0 {
		tk.sources = append(tk.sources, Summary{})
	}
	return out
}

// ask issues a query.
func (m *Machine) ask(p qPurpose, tk *task, target string, a Action) Action {
	a = m.act(a)
	m.r.queries[a.ID] = &query{purpose: p, task: tk.model, gen: tk.gen, act: a, attempts: 1, target: target}
	return a
}

func (m *Machine) act(a Action) Action {
	m.nextID++
	a.ID = m.nextID
	return a
}

func (m *Machine) notice(model, reason string) Action {
	return Action{Kind: Unrecoverable, Model: model, Reason: reason}
}

// onMaxSeqAnswered handles MaxSeqAnswered, the answer to a GetMaxSeq.
func (m *Machine) onMaxSeqAnswered(id ActionID, maxSeq uint64) ([]Action, error) {
	_, tk, err := m.answer(id, GetMaxSeq)
	if err != nil {
		return nil, err
	}
	if tk == nil {
		return m.progress(), nil
	}
	tk.maxSeq, tk.haveMaxSeq = maxSeq, true
	var out []Action
	for _, d := range m.g.DownstreamStateful(tk.model) {
		if m.r.tasks[d] != nil {
			continue
		}
		p := m.currentPrimary(d)
		if p == nil {
			continue
		}
		if !m.live(p) {
			out = append(out, m.suspect(suspicion{model: d, component: p.GetComponentId(), role: hamsv1.Role_ROLE_PRIMARY})...)
			continue
		}
		out = append(out, m.ask(qDownstream, tk, d, Action{Kind: GetLineageSummary, Model: d, Component: p.GetComponentId(),
			Address: p.GetSidecarAddress(), FailedModel: tk.model, FailedMaxSeq: maxSeq}))
	}
	return append(out, m.maybeCommit()...), nil
}

// onSummaryAnswered handles SummaryAnswered, the answer to a
// GetLineageSummary.
func (m *Machine) onSummaryAnswered(id ActionID, s Summary) ([]Action, error) {
	q, tk, err := m.answer(id, GetLineageSummary)
	if err != nil {
		return nil, err
	}
	if tk == nil {
		return m.progress(), nil
	}
	var out []Action
	switch q.purpose {
	case qBackupPos, qPostRollback, qPostReplay:
		tk.pos, tk.havePos = copyMap(s.MaxIn), true
		if q.purpose != qBackupPos {
			out = append(out, m.installed(tk)...)
		}
	case qSucc:
		tk.succPos[q.target] = min(tk.succPos[q.target], s.MaxOut)
	case qSource:
		tk.sources = append(tk.sources, s)
	case qDownstream:
		d := q.target
		if s.ConsumedBeyond && m.r.tasks[d] == nil {
			m.r.consumed[d] = true
			old := m.placement(q.act.Component)
			if old == nil {
				old = m.currentPrimary(d)
			}
			out = append(out, m.newFailover(d, old)...)
		} else if s.ConsumedBeyond {
			m.r.consumed[d] = true
		}
	}
	return append(out, m.progress()...), nil
}

// onQueryFailed handles QueryFailed: a query could not be answered (timeout,
// connection refused): it is retried, then its target is deemed dead.
func (m *Machine) onQueryFailed(id ActionID, cause error) ([]Action, error) {
	if m.r == nil {
		return nil, fmt.Errorf("%w: #%d", ErrUnknownAction, id)
	}
	q := m.r.queries[id]
	if q == nil {
		return nil, fmt.Errorf("%w: #%d", ErrUnknownAction, id)
	}
	delete(m.r.queries, id)
	tk := m.r.tasks[q.task]
	if tk == nil || tk.gen != q.gen || tk.abandoned != "" {
		return m.progress(), nil
	}
	if q.attempts < m.cfg.QueryAttempts {
		a := q.act
		a = m.act(a)
		nq := *q
		nq.act, nq.attempts = a, q.attempts+1
		m.r.queries[a.ID] = &nq
		return []Action{a}, nil
	}
	var out []Action
	comp := q.act.Component
	if comp != "" {
		if p := m.placement(comp); p != nil {
			out = append(out, m.suspect(suspicion{model: p.GetModel(), component: comp, role: p.GetRole()})...)
		}
	}
	tk = m.r.tasks[q.task]
	if tk.gen == q.gen && tk.abandoned == "" {
		switch q.purpose {
		case qMaxSeq, qBackupPos:
			// The backup is dead: suspect() already converted the task.
		case qPostRollback:
			tk.abandoned = "primary unreachable after rollback: " + cause.Error()
			out = append(out, m.notice(tk.model, tk.abandoned))
			out = append(out, m.installed(tk)...)
		case qPostReplay:
			// The spare serves already: rewire it with conservative
			// positions (predecessors resend all they keep; the new
			// primary drops what its state covers by request key). If it
			// died, the suspicion above is the next round's.
			tk.pos, tk.havePos = map[string]uint64{}, true
			out = append(out, m.installed(tk)...)
		case qSucc:
			// Not known what it received: it gets every re-executed
			// output (its own recovery, if it died, resends the rest).
			tk.succPos[q.target] = 0
		case qSource:
			if comp == "" { // a frontend: no fallback
				tk.sources = append(tk.sources, Summary{})
			} else {
				out = append(out, m.sourceFallback(tk, q.target)...)
			}
		case qDownstream:
			// suspect() created the failover task of the downstream model.
		}
	}
	return append(out, m.progress()...), nil
}

// answer finds the query id of kind k; tk is nil when the answer is stale.
func (m *Machine) answer(id ActionID, k Kind) (*query, *task, error) {
	if m.r == nil {
		return nil, nil, fmt.Errorf("%w: #%d", ErrUnknownAction, id)
	}
	q := m.r.queries[id]
	if q == nil || q.act.Kind != k {
		return nil, nil, fmt.Errorf("%w: #%d (%s)", ErrUnknownAction, id, k)
	}
	delete(m.r.queries, id)
	tk := m.r.tasks[q.task]
	if tk == nil || tk.gen != q.gen || tk.abandoned != "" {
		return q, nil, nil
	}
	return q, tk, nil
}

// onActionDone handles ActionDone, the outcome of a non-query action.
func (m *Machine) onActionDone(id ActionID, err error) ([]Action, error) {
	if model, ok := m.syncing[id]; ok {
		delete(m.syncing, id)
		if err != nil {
			return []Action{m.notice(model, "sync of new backup failed: "+err.Error())}, nil
		}
		return nil, nil
	}
	if model, ok := m.starts[id]; ok {
		delete(m.starts, id)
		if err != nil {
			delete(m.awaitSync, model)
			return []Action{m.notice(model, "new backup could not be started: "+err.Error())}, nil
		}
		return nil, nil
	}
	if m.r == nil {
		return nil, fmt.Errorf("%w: #%d", ErrUnknownAction, id)
	}
	f := m.r.pending[id]
	if f == nil {
		return nil, fmt.Errorf("%w: #%d", ErrUnknownAction, id)
	}
	delete(m.r.pending, id)
	out := f(err)
	return append(out, m.progress()...), nil
}

// progress commits a round whose queries are answered, or moves a later
// stage on when its actions are done.
func (m *Machine) progress() []Action {
	if m.r != nil && m.r.stage == stQuery {
		return m.maybeCommit()
	}
	return m.advance()
}

// maybeCommit moves a round whose queries are all answered to the install
// stage.
func (m *Machine) maybeCommit() []Action {
	r := m.r
	if r == nil || r.stage != stQuery || len(r.queries) > 0 {
		return nil
	}
	for _, tk := range r.tasks {
		if tk.abandoned == "" && (tk.kind == tStateless || tk.kind == tReplay) && tk.waitStd {
			return nil
		}
	}
	r.stage = stInstall
	var out []Action
	for _, model := range sortedKeys(r.tasks) {
		tk := r.tasks[model]
		if tk.abandoned != "" {
			continue
		}
		tk.newEpoch = m.maxEpoch(model) + 1
		switch tk.kind {
		case tStateless:
			if len(tk.old) > 0 {
				tk.startSeq = 0
				for _, s := range tk.sources {
					tk.startSeq = max(tk.startSeq, s.MaxOut)
				}
			}
			tk.pos = minPositions(tk.sources)
			tk.havePos = true
			out = append(out, m.install(tk, Action{Kind: Promote, Model: model, Component: tk.inst.GetComponentId(),
				Address: tk.inst.GetSidecarAddress(), Epoch: tk.newEpoch, StartSeq: tk.startSeq}))
		case tFailover:
			out = append(out, m.install(tk, Action{Kind: Promote, Model: model, Component: tk.inst.GetComponentId(),
				Address: tk.inst.GetSidecarAddress(), Epoch: tk.newEpoch}))
		case tRollback:
			out = append(out, m.install(tk, Action{Kind: Rollback, Model: model, Component: tk.inst.GetComponentId(),
				Address: tk.inst.GetSidecarAddress(), Epoch: tk.newEpoch}))
		case tReplay:
			for k, v := range tk.succPos {
				if v == ^uint64(0) {
					tk.succPos[k] = 0 // no answer counted: conservative
				}
			}
			out = append(out, m.install(tk, Action{Kind: Promote, Model: model, Component: tk.inst.GetComponentId(),
				Address: tk.inst.GetSidecarAddress(), Epoch: tk.newEpoch, ReplayAfter: copyMap(tk.succPos)}))
		}
	}
	return append(out, m.advance()...)
}

// install issues a Promote/Rollback of tk and handles its outcome.
func (m *Machine) install(tk *task, a Action) Action {
	a = m.act(a)
	m.r.pending[a.ID] = func(err error) []Action {
		if err != nil && tk.kind == tReplay {
			// The spare is lost for this round; another one is started.
			m.r.dead[tk.inst.GetComponentId()] = true
			m.r.backupL[tk.model] = true
		}
		switch {
		case err == nil && tk.kind == tRollback:
			// Positions come from the rolled-back primary itself.
			return []Action{m.ask(qPostRollback, tk, tk.model, Action{Kind: GetLineageSummary, Model: tk.model,
				Component: tk.inst.GetComponentId(), Address: tk.inst.GetSidecarAddress()})}
		case err == nil && tk.kind == tReplay:
			delete(m.replayTries, tk.model)
			// Positions come from the new primary: what its replayed
			// state covers.
			return []Action{m.ask(qPostReplay, tk, tk.model, Action{Kind: GetLineageSummary, Model: tk.model,
				Component: tk.inst.GetComponentId(), Address: tk.inst.GetSidecarAddress()})}
		case err == nil:
			return m.installed(tk)
		case tk.kind == tFailover && m.live(tk.old[0]) && !m.r.dead[tk.old[0].GetComponentId()]:
			// The backup died while being promoted; the old primary is
			// alive (a downstream model that consumed beyond): roll back.
			m.r.dead[tk.inst.GetComponentId()] = true
			m.r.backupL[tk.model] = true
			tk.kind, tk.inst, tk.havePos = tRollback, tk.old[0], false
			tk.gen++
			return []Action{m.install(tk, Action{Kind: Rollback, Model: tk.model, Component: tk.inst.GetComponentId(),
				Address: tk.inst.GetSidecarAddress(), Epoch: tk.newEpoch})}
		case tk.kind == tReplay && m.replayTries[tk.model] < ReplayAttempts-1:
			// The spare could not replay (it died, or the store failed):
			// the next round tries again with another spare, started
			// after this round for the lost one.
			m.replayTries[tk.model]++
			tk.abandoned = "spare failed to replay: " + err.Error()
			old := tk.old[0]
			delete(m.r.dead, old.GetComponentId())
			m.queued = append(m.queued, suspicion{model: tk.model, component: old.GetComponentId(), role: hamsv1.Role_ROLE_PRIMARY})
			return m.installed(tk)
		case tk.kind == tStateless:
			// Another standby (or a fresh one) next round.
			m.r.dead[tk.inst.GetComponentId()] = true
			tk.abandoned = "standby promotion failed: " + err.Error()
			for _, o := range tk.old {
				m.queued = append(m.queued, suspicion{model: tk.model, component: o.GetComponentId(), role: hamsv1.Role_ROLE_ACTIVE})
			}
			return m.installed(tk)
		default:
			tk.abandoned = fmt.Sprintf("%s of %s failed: %v", tk.kind, tk.inst.GetComponentId(), err)
			return append([]Action{m.notice(tk.model, tk.abandoned)}, m.installed(tk)...)
		}
	}
	return a
}

func (m *Machine) installed(tk *task) []Action {
	tk.installed = true
	return nil
}

// advance moves the round on when the current stage's actions are done.
func (m *Machine) advance() []Action {
	r := m.r
	if r == nil || len(r.pending) > 0 || len(r.queries) > 0 {
		return nil
	}
	switch r.stage {
	case stInstall:
		r.stage = stRewire
		return m.rewire()
	case stRewire:
		return nil // rewire's callback moves on
	case stFinish:
		return m.endRound()
	}
	return nil
}

func (m *Machine) rewire() []Action {
	r := m.r
	var ch []Change
	for _, model := range sortedKeys(r.tasks) {
		tk := r.tasks[model]
		if tk.abandoned != "" {
			continue
		}
		switch tk.kind {
		case tStateless:
			ch = append(ch, Change{Component: tk.inst.GetComponentId(), Model: model, Role: hamsv1.Role_ROLE_ACTIVE, Epoch: tk.newEpoch})
			for _, o := range tk.old {
				ch = append(ch, Change{Component: o.GetComponentId(), Model: model, Role: hamsv1.Role_ROLE_STANDBY, Epoch: o.GetEpoch()})
				m.deposed[o.GetComponentId()] = true
			}
		case tFailover, tReplay:
			ch = append(ch, Change{Component: tk.inst.GetComponentId(), Model: model, Role: hamsv1.Role_ROLE_PRIMARY, Epoch: tk.newEpoch})
			for _, o := range tk.old {
				ch = append(ch, Change{Component: o.GetComponentId(), Model: model, Role: hamsv1.Role_ROLE_BACKUP, Epoch: tk.newEpoch})
				m.deposed[o.GetComponentId()] = true
			}
		case tRollback:
			ch = append(ch, Change{Component: tk.inst.GetComponentId(), Model: model, Role: hamsv1.Role_ROLE_PRIMARY, Epoch: tk.newEpoch})
		}
	}
	if len(ch) == 0 {
		return m.finish()
	}
	a := m.act(Action{Kind: Rewire, Changes: ch})
	r.pending[a.ID] = func(err error) []Action {
		if err != nil {
			r.rewires++
			if r.rewires < m.cfg.RewireAttempts {
				return m.rewire()
			}
			var out []Action
			for _, model := range sortedKeys(r.tasks) {
				if r.tasks[model].abandoned == "" {
					r.tasks[model].abandoned = "topology update failed: " + err.Error()
					out = append(out, m.notice(model, r.tasks[model].abandoned))
				}
			}
			return append(out, m.finish()...)
		}
		return m.finish()
	}
	return []Action{a}
}

// finish issues the after-rewire actions: the Recovered notice, resends,
// demotions and new instances that restore redundancy.
func (m *Machine) finish() []Action {
	r := m.r
	r.stage = stFinish
	var out []Action
	var recovered []string
	// New serving instance per model after this round.
	serving := map[string]*hamsv1.Placement{}
	epochs := map[string]uint64{}
	for _, model := range sortedKeys(r.tasks) {
		if tk := r.tasks[model]; tk.abandoned == "" {
			recovered = append(recovered, model)
			serving[model], epochs[model] = tk.inst, tk.newEpoch
		}
	}
	if len(recovered) > 0 {
		out = append(out, Action{Kind: Recovered, Models: recovered})
	}
	// Resends: per recovered model X, from each stateful (or frontend)
	// upstream model S whose outputs reach X through stateless models only,
	// after the position X (its new instance) applied for S. Merged per
	// (S, first hop) with the minimum position.
	pos := map[string]map[string]uint64{}
	for _, model := range recovered {
		pos[model] = r.tasks[model].pos
	}
	after, keys := resendPlan(m.g, recovered, pos)
	for _, k := range keys {
		toInst := serving[k.to]
		toEpoch := epochs[k.to]
		if toInst == nil {
			toInst = m.liveServing(k.to)
			if toInst == nil {
				continue
			}
			toEpoch = toInst.GetEpoch()
		}
		if k.from == config.Frontend {
			for _, fe := range m.topo.GetFrontends() {
				out = append(out, m.doneIgnored(Action{Kind: Resend, Model: config.Frontend, Address: fe,
					ToModel: k.to, ToAddress: toInst.GetSidecarAddress(), Epoch: toEpoch, After: after[k]}))
			}
			continue
		}
		from := serving[k.from]
		if from == nil {
			from = m.liveServing(k.from)
		}
		if from == nil {
			continue
		}
		out = append(out, m.doneIgnored(Action{Kind: Resend, Model: k.from, Component: from.GetComponentId(), Address: from.GetSidecarAddress(),
			ToModel: k.to, ToAddress: toInst.GetSidecarAddress(), Epoch: toEpoch, After: after[k]}))
	}
	// Redundancy.
	needBackup := map[string]bool{}
	for m2 := range r.backupL {
		needBackup[m2] = true
	}
	for _, model := range recovered {
		tk := r.tasks[model]
		switch tk.kind {
		case tFailover, tReplay:
			old := tk.old[0]
			switch {
			case m.live(old):
				a := m.act(Action{Kind: Demote, Model: model, Component: old.GetComponentId(), Address: old.GetSidecarAddress(),
					Epoch: tk.newEpoch, PrimaryAddress: tk.inst.GetSidecarAddress()})
				r.pending[a.ID] = func(err error) []Action {
					if err != nil {
						// Not demoted, yet listed as the backup by the
						// rewire: retired, so it cannot serve as a
						// second backup beside the new one.
						return append([]Action{m.retireDeposed(model, old, tk.newEpoch, "demotion failed: "+err.Error())}, m.startBackup(model)...)
					}
					return nil
				}
				out = append(out, a)
				delete(needBackup, model)
			default:
				// Dead, or dead to this round only (retired below).
				needBackup[model] = true
			}
		case tStateless:
			anyAlive := false
			for _, o := range tk.old {
				anyAlive = anyAlive || m.live(o)
			}
			if !anyAlive {
				r.standL[model]++
			}
		}
	}
	out = append(out, m.retireUnreachableBackups(recovered)...)
	for _, model := range sortedKeys(needBackup) {
		if tk := r.tasks[model]; tk != nil && tk.abandoned != "" && tk.kind == tFailover {
			continue // no primary to sync from
		}
		if !m.cfg.Replay && m.backupReplaced(model) {
			// Another path replaced the lost backup already (a new backup
			// started when a spare's sync failed, or one that registered
			// during this round): a second replacement would be a second
			// backup that the primary never ships to and that never
			// syncs (a 30-minute soak, 2026-11-27: ap-route got a new
			// backup and a spare after a mass suspicion). Replay mode's
			// backups are spares: several may run.
			continue
		}
		out = append(out, m.startBackup(model)...)
	}
	for _, model := range sortedKeys(r.standL) {
		for range r.standL[model] {
			out = append(out, m.doneIgnored(Action{Kind: StartInstance, Model: model, Role: hamsv1.Role_ROLE_STANDBY}))
		}
	}
	return append(out, m.advance()...)
}

// backupReplaced reports whether model, whose backup this round lost,
// has a replacement already: a new backup being started (awaitSync), or a
// live BACKUP that is neither the instance this round promotes nor one of
// the primaries it deposes (the topology may not show the round's rewire
// yet).
func (m *Machine) backupReplaced(model string) bool {
	if m.awaitSync[model] != nil {
		return true
	}
	skip := map[string]bool{}
	if tk := m.r.tasks[model]; tk != nil {
		if tk.inst != nil {
			skip[tk.inst.GetComponentId()] = true
		}
		for _, o := range tk.old {
			skip[o.GetComponentId()] = true
		}
	}
	for _, p := range m.topo.GetPlacements() {
		if p.GetModel() == model && p.GetRole() == hamsv1.Role_ROLE_BACKUP && m.live(p) && !skip[p.GetComponentId()] {
			return true
		}
	}
	return false
}

// resendKey is one resend: from a stateful model (or the frontend) to the
// first hop towards a recovered model.
type resendKey struct{ from, to string }

// resendPlan computes the resends after a round: per recovered model X,
// from each stateful (or frontend) model S whose outputs reach X through
// stateless models only, to the first hop on each such path, after the
// position X applied for S (pos[X][S]); merged per (S, first hop) with the
// minimum position. keys lists them in a stable order. Every path counts:
// a stateless join before X needs the parts of all its branches again,
// even when two branches start at the same S (the frontend, typically).
func resendPlan(g *Graph, recovered []string, pos map[string]map[string]uint64) (map[resendKey]uint64, []resendKey) {
	after := map[resendKey]uint64{}
	var keys []resendKey
	add := func(from, to string, p uint64) {
		k := resendKey{from, to}
		if v, ok := after[k]; !ok || p < v {
			if !ok {
				keys = append(keys, k)
			}
			after[k] = p
		}
	}
	for _, model := range recovered {
		// walked: stateless models already walked from X (a diamond of
		// stateless models yields the same resends twice otherwise).
		walked := map[string]bool{}
		var walk func(to string)
		walk = func(to string) {
			for _, p := range g.Pred(to) {
				if p == config.Frontend || g.Stateful(p) {
					add(p, to, pos[model][p])
					continue
				}
				if !walked[p] {
					walked[p] = true
					walk(p)
				}
			}
		}
		walk(model)
	}
	return after, keys
}

func (m *Machine) startBackup(model string) []Action {
	if sp, prim, epoch := m.spareFor(model); sp != nil {
		return m.useSpare(model, sp, prim, epoch)
	}
	return m.startNewBackup(model)
}

// spareFor finds a live spare backup of stateful model (a STANDBY
// placement: started in the backup role, synced to nothing yet, so a lost
// backup is replaced at once instead of after a process start) and the
// primary it is to follow with the primary's epoch. Replay mode has no
// such spares (its spare is the backup).
func (m *Machine) spareFor(model string) (spare, prim *hamsv1.Placement, epoch uint64) {
	if m.cfg.Replay || !m.g.Stateful(model) || m.r == nil {
		return nil, nil, 0
	}
	if tk := m.r.tasks[model]; tk != nil && tk.abandoned == "" && (tk.kind == tFailover || tk.kind == tRollback) {
		prim, epoch = tk.inst, tk.newEpoch
	} else if prim = m.livePrimary(model, nil); prim != nil {
		epoch = prim.GetEpoch()
	}
	if prim == nil {
		return nil, nil, 0
	}
	for _, p := range m.topo.GetPlacements() {
		if p.GetModel() != model || p.GetRole() != hamsv1.Role_ROLE_STANDBY || !m.live(p) || m.r.sparesUsed[p.GetComponentId()] {
			continue
		}
		if spare == nil || p.GetComponentId() < spare.GetComponentId() {
			spare = p
		}
	}
	return spare, prim, epoch
}

// useSpare makes spare model's backup: one Rewire (the spare becomes
// BACKUP at the primary's epoch, so the primary resolves it and ships it
// its state), then SyncBackup, and a new spare is started. Should either
// fail, a new backup is started the slow way (a spare rewired but not
// synced is retired first).
func (m *Machine) useSpare(model string, spare, prim *hamsv1.Placement, epoch uint64) []Action {
	r := m.r
	r.sparesUsed[spare.GetComponentId()] = true
	a := m.act(Action{Kind: Rewire, Changes: []Change{{Component: spare.GetComponentId(), Model: model, Role: hamsv1.Role_ROLE_BACKUP, Epoch: epoch}}})
	r.pending[a.ID] = func(err error) []Action {
		if err != nil {
			return m.startNewBackup(model)
		}
		s := m.act(Action{Kind: SyncBackup, Model: model, Component: spare.GetComponentId(), Address: spare.GetSidecarAddress(),
			Epoch: epoch, PrimaryAddress: prim.GetSidecarAddress()})
		r.pending[s.ID] = func(err error) []Action {
			if err != nil {
				// The rewire listed the spare as the backup: left alive,
				// it would stay a second backup beside the new one, and
				// the primary ships to whichever its topology lists first
				// (possibly this one, which nobody synced).
				return append([]Action{m.retireReplaced(spare.GetComponentId(), model, epoch,
					"spare made the backup of "+model+" not synced ("+err.Error()+"): a new backup replaces it")}, m.startNewBackup(model)...)
			}
			return nil
		}
		if m.spareLeft(model) {
			// Another live spare (an instance that returned and was
			// admitted fresh, say) takes the used one's place: starting
			// one more each time piled up spare processes (seven of one
			// model after a 30-minute soak).
			return []Action{s}
		}
		return []Action{s, m.doneIgnored(Action{Kind: StartInstance, Model: model, Role: hamsv1.Role_ROLE_STANDBY})}
	}
	return []Action{a}
}

// spareLeft reports whether model has a live spare (STANDBY) this round
// has not used.
func (m *Machine) spareLeft(model string) bool {
	for _, p := range m.topo.GetPlacements() {
		if p.GetModel() == model && p.GetRole() == hamsv1.Role_ROLE_STANDBY && m.live(p) && !m.r.sparesUsed[p.GetComponentId()] {
			return true
		}
	}
	return false
}

// startNewBackup asks for a new backup instance and syncs it once it shows
// up in the topology.
func (m *Machine) startNewBackup(model string) []Action {
	known := map[string]bool{}
	for _, p := range m.topo.GetPlacements() {
		if p.GetModel() == model && p.GetRole() == hamsv1.Role_ROLE_BACKUP {
			known[p.GetComponentId()] = true
		}
	}
	if r := m.r; r != nil {
		for _, tk := range r.tasks {
			if tk.model == model && tk.kind == tFailover {
				for _, o := range tk.old {
					known[o.GetComponentId()] = true
				}
			}
		}
	}
	if !m.cfg.Replay {
		// Replay mode's spare has no state to sync: it reads the
		// checkpoint when promoted.
		m.awaitSync[model] = known
	}
	a := m.act(Action{Kind: StartInstance, Model: model, Role: hamsv1.Role_ROLE_BACKUP})
	m.r.pending[a.ID] = func(err error) []Action {
		if err == nil || m.cfg.Replay {
			return nil
		}
		// Nothing is on its way any more: a later loss or round must be
		// free to replace the backup (finish skips a model awaiting one).
		delete(m.awaitSync, model)
		return []Action{m.notice(model, "new backup could not be started: "+err.Error())}
	}
	return []Action{a}
}

// doneIgnored issues an action whose outcome does not change the plan.
func (m *Machine) doneIgnored(a Action) Action {
	a = m.act(a)
	m.r.pending[a.ID] = func(error) []Action { return nil }
	return a
}

func (m *Machine) endRound() []Action {
	for id := range m.r.dead {
		// Components deemed dead only by a failed RPC, but alive per
		// membership, stay eligible: their later death is a new failure.
		if p := m.placement(id); p == nil || !p.GetAlive() {
			m.handled[id] = true
		}
	}
	m.r = nil
	var out []Action
	ret := m.returning
	m.returning = nil
	for _, id := range ret {
		out = append(out, m.onAliveAgain(id)...)
	}
	q := m.queued
	m.queued = nil
	for _, s := range q {
		// Drop suspicions of components the topology shows alive again in
		// a role that needs no recovery (a standby made of an old active).
		out = append(out, m.onSuspected(s.model, s.role, s.component)...)
	}
	// Spares that joined during the round: one whose model still has no
	// backup becomes it (a round started by the queue above takes the
	// rest along to its own end).
	sp := m.sparesJoined
	m.sparesJoined = nil
	for _, id := range sp {
		out = append(out, m.onSpareJoined(id)...)
	}
	return out
}

// --- topology helpers ---

func (m *Machine) placement(id string) *hamsv1.Placement {
	if id == "" {
		return nil
	}
	for _, p := range m.topo.GetPlacements() {
		if p.GetComponentId() == id {
			return p
		}
	}
	return nil
}

// listedAlive reports whether the topology lists p's component alive
// (whatever the current round decided about it).
func (m *Machine) listedAlive(p *hamsv1.Placement) bool {
	cur := m.placement(p.GetComponentId())
	return cur != nil && cur.GetAlive() && cur.GetSidecarAddress() != ""
}

// retireReplaced retires id, listed as model's backup (role BACKUP at
// epoch), which a new backup replaces. Its exit (the retirement's effect)
// is not a new failure: the new backup is already asked for.
func (m *Machine) retireReplaced(id, model string, epoch uint64, reason string) Action {
	m.handled[id] = true
	return Action{Kind: Retire, Component: id, Model: model, Role: hamsv1.Role_ROLE_BACKUP, Epoch: epoch, Reason: reason}
}

// retireDeposed retires old, model's primary before a failover to epoch
// that could not be demoted: the rewire listed it as the backup, and a new
// backup replaces it.
func (m *Machine) retireDeposed(model string, old *hamsv1.Placement, epoch uint64, why string) Action {
	return m.retireReplaced(old.GetComponentId(), model, epoch, "deposed primary of "+model+" not demoted ("+why+"): a new backup replaces it")
}

// retireUnreachableBackups retires, at the end of a round, every instance
// of a stateful model the round deemed dead because RPCs to it failed
// while membership still lists it alive, and that is (or the round's
// rewire made it) its model's backup: the round replaces it with a new
// backup. If it runs, it would stay a second backup (a deposed primary
// listed as the backup demotes itself) that the primary never ships to,
// and a later failover could promote it. Retired, its process exits and
// it is never reused. Replay mode's backups are spares that replay the
// log: several may run.
func (m *Machine) retireUnreachableBackups(recovered []string) []Action {
	if m.cfg.Replay {
		return nil
	}
	r := m.r
	deposedOld := map[string]uint64{} // failed-over primaries the rewire made backups -> new epoch
	for _, model := range recovered {
		if tk := r.tasks[model]; tk.kind == tFailover {
			for _, o := range tk.old {
				deposedOld[o.GetComponentId()] = tk.newEpoch
			}
		}
	}
	var out []Action
	for _, id := range sortedKeys(r.dead) {
		p := m.placement(id)
		if p == nil || !m.listedAlive(p) || !m.g.Stateful(p.GetModel()) {
			continue
		}
		if tk := r.tasks[p.GetModel()]; tk != nil && tk.abandoned != "" {
			continue // no new backup: it may hold the last copy of the state
		}
		if epoch, ok := deposedOld[id]; ok {
			out = append(out, m.retireDeposed(p.GetModel(), p, epoch, "unreachable during the recovery that replaced it"))
			continue
		}
		if p.GetRole() != hamsv1.Role_ROLE_BACKUP {
			continue
		}
		out = append(out, m.retireReplaced(id, p.GetModel(), p.GetEpoch(), "backup of "+p.GetModel()+" unreachable during a recovery: a new backup replaces it"))
	}
	return out
}

// live: alive in the topology and not deemed dead in this round.
func (m *Machine) live(p *hamsv1.Placement) bool {
	if p == nil || !p.GetAlive() || p.GetSidecarAddress() == "" {
		return false
	}
	return m.r == nil || !m.r.dead[p.GetComponentId()]
}

func (m *Machine) best(model string, role hamsv1.Role, onlyLive bool) *hamsv1.Placement {
	return m.bestWhere(model, role, func(p *hamsv1.Placement) bool { return !onlyLive || m.live(p) })
}

// bestWhere is the highest-epoch placement of model in role with a sidecar
// address that keep accepts (the first listed among equals).
func (m *Machine) bestWhere(model string, role hamsv1.Role, keep func(*hamsv1.Placement) bool) *hamsv1.Placement {
	var best *hamsv1.Placement
	for _, p := range m.topo.GetPlacements() {
		if p.GetModel() != model || p.GetRole() != role || p.GetSidecarAddress() == "" || !keep(p) {
			continue
		}
		if best == nil || p.GetEpoch() > best.GetEpoch() {
			best = p
		}
	}
	return best
}

// currentPrimary is the highest-epoch primary placement (alive or not).
func (m *Machine) currentPrimary(model string) *hamsv1.Placement {
	return m.best(model, hamsv1.Role_ROLE_PRIMARY, false)
}

func (m *Machine) livePrimary(model string, _ *round) *hamsv1.Placement {
	return m.best(model, hamsv1.Role_ROLE_PRIMARY, true)
}

func (m *Machine) liveBackup(model string) *hamsv1.Placement {
	return m.best(model, hamsv1.Role_ROLE_BACKUP, true)
}

func (m *Machine) liveActive(model string) *hamsv1.Placement {
	return m.best(model, hamsv1.Role_ROLE_ACTIVE, true)
}

// liveServing is the instance that receives model's traffic.
func (m *Machine) liveServing(model string) *hamsv1.Placement {
	if m.g.Stateful(model) {
		return m.best(model, hamsv1.Role_ROLE_PRIMARY, true)
	}
	return m.liveActive(model)
}

func (m *Machine) pickStandby(model string) *hamsv1.Placement {
	var pick *hamsv1.Placement
	for _, p := range m.topo.GetPlacements() {
		if p.GetModel() == model && p.GetRole() == hamsv1.Role_ROLE_STANDBY && m.live(p) {
			if pick == nil || p.GetComponentId() < pick.GetComponentId() {
				pick = p
			}
		}
	}
	return pick
}

func (m *Machine) maxEpoch(model string) uint64 {
	var e uint64
	for _, p := range m.topo.GetPlacements() {
		if p.GetModel() == model {
			e = max(e, p.GetEpoch())
		}
	}
	return e
}

func minPositions(ss []Summary) map[string]uint64 {
	keys := map[string]bool{}
	for _, s := range ss {
		for k := range s.MaxIn {
			keys[k] = true
		}
	}
	out := map[string]uint64{}
	for k := range keys {
		v := ^uint64(0)
		for _, s := range ss {
			v = min(v, s.MaxIn[k]) // missing = 0: conservative
		}
		out[k] = v
	}
	return out
}

func copyMap(in map[string]uint64) map[string]uint64 {
	out := make(map[string]uint64, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
}

func sortedKeys[V any](mp map[string]V) []string {
	ks := make([]string, 0, len(mp))
	for k := range mp {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// --- replay mode ---

// newReplay creates the task of a stateful model whose primary (old)
// failed in replay mode (Lineage Stash recovers only the failed operator):
// its spare (a live BACKUP, or one started now) will be promoted and
// re-execute the input log after the newest checkpoint. Meanwhile every
// successor is asked how far it received the model's outputs, so the spare
// sends each only the re-executed outputs beyond (Action.ReplayAfter).
// After the promotion the resend positions come from the new primary
// itself; downstream stateful models are neither asked nor failed over.
func (m *Machine) newReplay(model string, old *hamsv1.Placement) []Action {
	tk := &task{model: model, kind: tReplay, old: []*hamsv1.Placement{old}, succPos: map[string]uint64{}}
	m.r.tasks[model] = tk
	out := m.chooseSpare(tk)
	for _, sc := range m.g.Succ(model) {
		tk.succPos[sc] = ^uint64(0)
		if sc == config.Frontend {
			fes := m.topo.GetFrontends()
			if len(fes) == 0 {
				tk.succPos[sc] = 0
			}
			for _, a := range fes {
				out = append(out, m.ask(qSucc, tk, sc, Action{Kind: GetLineageSummary, Model: config.Frontend, Address: a, FailedModel: model}))
			}
			continue
		}
		p := m.liveServing(sc)
		if p == nil {
			tk.succPos[sc] = 0
			continue
		}
		out = append(out, m.ask(qSucc, tk, sc, Action{Kind: GetLineageSummary, Model: sc, Component: p.GetComponentId(),
			Address: p.GetSidecarAddress(), FailedModel: model}))
	}
	return out
}

// chooseSpare picks a live spare for a replay task, or starts one (once)
// and waits for it in the topology.
func (m *Machine) chooseSpare(tk *task) []Action {
	if b := m.liveBackup(tk.model); b != nil {
		tk.inst, tk.waitStd = b, false
		return nil
	}
	tk.inst = nil
	if tk.waitStd {
		return nil
	}
	tk.waitStd = true
	a := m.act(Action{Kind: StartInstance, Model: tk.model, Role: hamsv1.Role_ROLE_BACKUP})
	m.r.pending[a.ID] = func(err error) []Action {
		if err != nil && tk.waitStd && tk.abandoned == "" && m.r.stage == stQuery {
			tk.abandoned = "no spare to replay on: " + err.Error()
			return []Action{m.notice(tk.model, tk.abandoned)}
		}
		return nil
	}
	return []Action{a}
}
