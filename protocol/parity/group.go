package parity

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// This file is the replica pool's dispatch and coding-group state machine
// (ParM paper sections 3-4 and 7, docs/design.md "Parity models"). It is
// pure, in the vocabulary of package protocol: the driver (sidecar/pool)
// feeds it events (Step with the events of step.go, or the direct methods
// of the same names) with the current time as a monotonic offset, and
// performs the actions it returns, in order. It never blocks, starts
// goroutines or reads a clock.
//
// Invariants:
//   - every submitted batch gets exactly one ActRelease, ActReleaseDecoded
//     or ActFail (one output per batch), unless it was cancelled;
//   - a batch is dispatched (ActRunData) before anything is encoded for
//     its group: encoding never delays a data batch;
//   - a group whose data outputs all arrive releases no reconstruction;
//   - an instance runs at most one batch at a time: RunData and RunParity
//     name only idle instances.

// Redundancy is the pool's protection against stragglers.
type Redundancy int

// Redundancy values.
const (
	// RedundancyNone: the data instances only.
	RedundancyNone Redundancy = iota
	// RedundancyER: more data instances (Equal-Resources); no coding.
	RedundancyER
	// RedundancyHedge: ER, plus a running batch older than the hedge
	// delay is run again on an idle instance; the first answer wins.
	RedundancyHedge
	// RedundancyParM: coding groups and parity models.
	RedundancyParM
)

func (r Redundancy) String() string {
	switch r {
	case RedundancyNone:
		return "none"
	case RedundancyER:
		return "er"
	case RedundancyHedge:
		return "hedge"
	case RedundancyParM:
		return "parm"
	}
	return fmt.Sprintf("Redundancy(%d)", int(r))
}

// BatchID names a data batch in the pool (the driver numbers them).
type BatchID uint64

// GroupID names a coding group (numbered from 1 in dispatch order).
type GroupID uint64

// Instance is an instance index: of the data instances in ActRunData and
// Data* events, of the parity instances in ActRunParity and Parity* events.
type Instance int

// ErrConfig is wrapped by NewMachine's validation errors.
var ErrConfig = errors.New("parity: invalid pool config")

// Config of a Machine.
type Config struct {
	Redundancy Redundancy
	// Code: K batches per group, R parity models (parm only).
	Code Code
	// DataInstances serve the deployed model; ParityInstances (parm) the
	// parity models.
	DataInstances, ParityInstances int
	// DecodeAfter: how much longer a missing original may take once the
	// group can reconstruct it (0: decode at once, the paper's rule).
	DecodeAfter time.Duration
	// HedgeAfter: hedge's re-send delay (SetHedgeAfter changes it).
	HedgeAfter time.Duration
	// MaxAttempts: runs of a data batch that fails retryably before it
	// fails for good (default: DataInstances, at least 2).
	MaxAttempts int
	// FailBackoff: an instance whose call failed retryably takes no work
	// for this long, doubling per failure in a row up to MaxBackoff
	// (defaults 20 ms and 1 s).
	FailBackoff, MaxBackoff time.Duration
	// SettleAfter: how long a group whose batches are all released waits
	// for late originals (the agreement metric) before it is forgotten
	// (default 10 s).
	SettleAfter time.Duration
	// FillAfter: a group still short of K batches this long after its
	// first one is closed with stand-ins: recently answered batches whose
	// inputs and outputs the driver keeps (ActEncode.Fill). Under light
	// load a straggler then waits for no more arrivals before its group can
	// be decoded. 0: groups fill with new batches only (the paper's rule).
	FillAfter time.Duration
}

// ActionKind says what an Action asks the driver to do.
type ActionKind int

// Actions.
const (
	// ActRunData: run data batch Batch on data instance Instance (Hedge:
	// it is a second copy of a running batch).
	ActRunData ActionKind = iota + 1
	// ActEncode: build parity batch Parity of Group from the inputs of
	// Members (group positions 0..len-1, in submit order) and, when Fill >
	// 0, of Fill stand-ins at positions len..K-1: recently answered
	// batches the driver picks and keeps with the group (their outputs
	// count as arrived originals when decoding), off the dispatch path;
	// then report Encoded (not ok: no stand-ins to be had).
	ActEncode
	// ActRunParity: run parity batch Parity of Group on parity instance
	// Instance.
	ActRunParity
	// ActRelease: answer Batch with its original output (the one the
	// driver got with the DataDone that caused this action).
	ActRelease
	// ActDecode: reconstruct Missing (batches of Group, in group order)
	// from the group's arrived originals and the parity outputs Parities,
	// then report Decoded.
	ActDecode
	// ActReleaseDecoded: answer Batch with its reconstruction (approximate).
	ActReleaseDecoded
	// ActFail: answer Batch with its last error: it failed and cannot be
	// reconstructed.
	ActFail
	// ActCompare: Batch's original arrived after its reconstruction was
	// released: compare them (agreement metric); the original is not
	// released.
	ActCompare
	// ActWithdraw: Batch was still queued when it was answered (by a
	// reconstruction or a cancel): it is not run.
	ActWithdraw
	// ActDropParity: parity batch Parity of Group is no longer needed and
	// was not yet run: it is not run.
	ActDropParity
	// ActForget: the driver may free everything it keeps for Group.
	ActForget
)

var actionNames = map[ActionKind]string{
	ActRunData: "run-data", ActEncode: "encode", ActRunParity: "run-parity", ActRelease: "release",
	ActDecode: "decode", ActReleaseDecoded: "release-decoded", ActFail: "fail", ActCompare: "compare",
	ActWithdraw: "withdraw", ActDropParity: "drop-parity", ActForget: "forget",
}

func (k ActionKind) String() string {
	if s, ok := actionNames[k]; ok {
		return s
	}
	return fmt.Sprintf("ActionKind(%d)", int(k))
}

// Action is one thing for the driver to do.
type Action struct {
	Kind     ActionKind
	Batch    BatchID
	Group    GroupID
	Parity   int
	Instance Instance
	Hedge    bool
	Members  []BatchID
	Fill     int
	Missing  []BatchID
	Parities []int
}

// String renders an action for transcripts and logs.
func (a Action) String() string {
	switch a.Kind {
	case ActRunData:
		if a.Hedge {
			return fmt.Sprintf("run-data b%d on d%d (hedge)", a.Batch, a.Instance)
		}
		return fmt.Sprintf("run-data b%d on d%d", a.Batch, a.Instance)
	case ActEncode:
		if a.Fill > 0 {
			return fmt.Sprintf("encode g%d p%d of %v and %d stand-ins", a.Group, a.Parity, a.Members, a.Fill)
		}
		return fmt.Sprintf("encode g%d p%d of %v", a.Group, a.Parity, a.Members)
	case ActRunParity:
		return fmt.Sprintf("run-parity g%d p%d on p%d", a.Group, a.Parity, a.Instance)
	case ActDecode:
		return fmt.Sprintf("decode g%d missing %v from parities %v", a.Group, a.Missing, a.Parities)
	case ActDropParity:
		return fmt.Sprintf("drop-parity g%d p%d", a.Group, a.Parity)
	case ActForget:
		return fmt.Sprintf("forget g%d", a.Group)
	}
	return fmt.Sprintf("%s b%d", a.Kind, a.Batch)
}

type batchState int

const (
	bQueued batchState = iota
	bRunning
	bReleased // answered (original, reconstruction, failure or cancel)
)

type batch struct {
	id    BatchID
	group *group
	pos   int
	state batchState
	// copies: instances running this batch now (two while hedged).
	copies []Instance
	// started: when the first copy started (hedging).
	started  time.Duration
	hedged   bool
	attempts int
	// original: its original output arrived (decoding may use it);
	// settled: no original will come any more (arrived, failed, withdrawn).
	original, settled bool
	// decoded: its reconstruction was released; failedWaiting: it failed
	// and waits for a reconstruction.
	decoded, failedWaiting bool
}

type parityState int

const (
	pNone parityState = iota
	pEncoding
	pQueued
	pRunning
	pDone
	pFailed
	pDropped
)

type group struct {
	id      GroupID
	members []*batch
	// closed: no more members (K of them, or fewer and standIns); the
	// parities are being encoded. createdAt: when the first member came.
	closed    bool
	standIns  int
	createdAt time.Duration
	parity    []parityState
	// decodableAt: when the group first could reconstruct its missing
	// members (-1: not now); decoding: a Decode action is outstanding.
	decodableAt time.Duration
	decoding    bool
	// releasedAt: when every member was answered (-1: not yet).
	releasedAt time.Duration
}

type instance struct {
	busy       bool
	resumeAt   time.Duration
	failStreak int
	// freed orders idle instances: the one idle the longest (smallest)
	// takes the next batch, so work spreads over every instance (a
	// lowest-index rule would send nearly all light traffic to one).
	freed uint64
}

type parityJob struct {
	g *group
	j int
}

// Machine is the pool's state machine (one per pool).
type Machine struct {
	cfg     Config
	batches map[BatchID]*batch
	groups  map[GroupID]*group
	filling *group
	nextG   GroupID
	queue   []*batch
	pqueue  []parityJob
	data    []instance
	par     []instance
	frees   uint64
	out     []Action
}

// NewMachine validates cfg and returns a machine with every instance idle.
func NewMachine(cfg Config) (*Machine, error) {
	var errs []error
	if cfg.DataInstances < 1 {
		errs = append(errs, fmt.Errorf("%w: %d data instances", ErrConfig, cfg.DataInstances))
	}
	if cfg.Redundancy == RedundancyParM {
		if _, err := NewCode(cfg.Code.K, cfg.Code.R); err != nil {
			errs = append(errs, fmt.Errorf("%w: %v", ErrConfig, err))
		}
		if cfg.ParityInstances < 1 {
			errs = append(errs, fmt.Errorf("%w: parm needs parity instances, got %d", ErrConfig, cfg.ParityInstances))
		}
	}
	if cfg.Redundancy < RedundancyNone || cfg.Redundancy > RedundancyParM {
		errs = append(errs, fmt.Errorf("%w: redundancy %d", ErrConfig, cfg.Redundancy))
	}
	if cfg.DecodeAfter < 0 || cfg.HedgeAfter < 0 {
		errs = append(errs, fmt.Errorf("%w: negative delay", ErrConfig))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = max(cfg.DataInstances, 2)
	}
	if cfg.FailBackoff <= 0 {
		cfg.FailBackoff = 20 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = time.Second
	}
	if cfg.SettleAfter <= 0 {
		cfg.SettleAfter = 10 * time.Second
	}
	if cfg.Redundancy != RedundancyParM {
		cfg.ParityInstances = 0
	}
	return &Machine{
		cfg: cfg, batches: map[BatchID]*batch{}, groups: map[GroupID]*group{},
		data: make([]instance, cfg.DataInstances), par: make([]instance, cfg.ParityInstances),
	}, nil
}

// SetHedgeAfter changes hedge's delay (the driver's observed p95).
func (m *Machine) SetHedgeAfter(d time.Duration) { m.cfg.HedgeAfter = max(d, 0) }

// HedgeAfter is hedge's current delay.
func (m *Machine) HedgeAfter() time.Duration { return m.cfg.HedgeAfter }

// QueueDepth is the number of data and parity batches waiting for an
// instance.
func (m *Machine) QueueDepth() (data, parity int) { return len(m.queue), len(m.pqueue) }

// Pending is the number of batches not yet answered.
func (m *Machine) Pending() int {
	n := 0
	for _, b := range m.batches {
		if b.state != bReleased {
			n++
		}
	}
	return n
}

func (m *Machine) emit(a Action) { m.out = append(m.out, a) }

func (m *Machine) flush(now time.Duration) []Action {
	m.dispatch(now)
	if m.cfg.Redundancy == RedundancyHedge {
		m.hedge(now)
	}
	out := m.out
	m.out = nil
	return out
}

// Submit: data batch id enters the pool (ids must be new).
func (m *Machine) Submit(id BatchID, now time.Duration) []Action {
	if _, dup := m.batches[id]; dup {
		panic(fmt.Sprintf("parity: batch %d submitted twice", id))
	}
	b := &batch{id: id}
	m.batches[id] = b
	m.queue = append(m.queue, b)
	m.dispatch(now) // data first: encoding never delays a data batch
	if m.cfg.Redundancy == RedundancyParM {
		if m.filling == nil {
			m.nextG++
			m.filling = &group{id: m.nextG, parity: make([]parityState, m.cfg.Code.R), decodableAt: -1, releasedAt: -1, createdAt: now}
			m.groups[m.filling.id] = m.filling
		}
		g := m.filling
		b.group, b.pos = g, len(g.members)
		g.members = append(g.members, b)
		if len(g.members) == m.cfg.Code.K {
			m.close(g, now)
		}
	}
	return m.flush(now)
}

// close ends g's membership: K members, or fewer completed by stand-ins;
// every parity is encoded.
func (m *Machine) close(g *group, now time.Duration) {
	if m.filling == g {
		m.filling = nil
	}
	g.closed = true
	g.standIns = m.cfg.Code.K - len(g.members)
	ids := make([]BatchID, len(g.members))
	for i, mb := range g.members {
		ids[i] = mb.id
	}
	for j := range g.parity {
		g.parity[j] = pEncoding
		m.emit(Action{Kind: ActEncode, Group: g.id, Parity: j, Members: ids, Fill: g.standIns})
	}
}

// Encoded: parity batch j of g was built (ok) or could not be (the
// group's inputs do not encode: it gets no parity j).
func (m *Machine) Encoded(g GroupID, j int, ok bool, now time.Duration) []Action {
	gr := m.groups[g]
	if gr == nil || j < 0 || j >= len(gr.parity) || gr.parity[j] != pEncoding {
		return m.flush(now)
	}
	switch {
	case !ok:
		gr.parity[j] = pFailed
		m.groupChanged(gr, now)
	case m.parityUseless(gr):
		gr.parity[j] = pDropped
		m.emit(Action{Kind: ActDropParity, Group: g, Parity: j})
	default:
		gr.parity[j] = pQueued
		m.pqueue = append(m.pqueue, parityJob{gr, j})
	}
	return m.flush(now)
}

// DataDone: data instance inst answered batch id with its original output.
func (m *Machine) DataDone(id BatchID, inst Instance, now time.Duration) []Action {
	m.freeData(inst, true, now)
	b := m.batches[id]
	if b == nil {
		return m.flush(now)
	}
	b.copies = slices.DeleteFunc(b.copies, func(i Instance) bool { return i == inst })
	if b.original {
		return m.flush(now) // the other copy of a hedged batch was first
	}
	b.original, b.settled = true, true
	switch {
	case b.decoded:
		m.emit(Action{Kind: ActCompare, Batch: id})
	case b.state != bReleased:
		b.state = bReleased
		b.failedWaiting = false
		m.emit(Action{Kind: ActRelease, Batch: id})
	}
	m.afterBatch(b, now)
	return m.flush(now)
}

// DataFailed: data instance inst failed batch id. retryable: the
// instance (not the request) is at fault (unavailable, timed out): the
// batch runs again elsewhere, and the instance rests for a backoff.
func (m *Machine) DataFailed(id BatchID, inst Instance, retryable bool, now time.Duration) []Action {
	m.freeData(inst, !retryable, now)
	b := m.batches[id]
	if b == nil {
		return m.flush(now)
	}
	b.copies = slices.DeleteFunc(b.copies, func(i Instance) bool { return i == inst })
	if b.original || b.state == bReleased && !b.decoded {
		// Answered already (another copy, a cancel): nothing to do.
		if len(b.copies) == 0 {
			b.settled = true
		}
		m.afterBatch(b, now)
		return m.flush(now)
	}
	if len(b.copies) > 0 {
		return m.flush(now) // the hedged copy still runs
	}
	if b.decoded {
		b.settled = true
		m.afterBatch(b, now)
		return m.flush(now)
	}
	if retryable && b.attempts < m.cfg.MaxAttempts {
		b.state = bQueued
		m.queue = append([]*batch{b}, m.queue...)
		return m.flush(now)
	}
	b.settled = true
	if !retryable || !m.canStillDecode(b.group) {
		b.state = bReleased
		m.emit(Action{Kind: ActFail, Batch: id})
		m.afterBatch(b, now)
		return m.flush(now)
	}
	b.failedWaiting = true
	m.groupChanged(b.group, now)
	return m.flush(now)
}

// ParityDone: parity instance inst answered parity j of g.
func (m *Machine) ParityDone(g GroupID, j int, inst Instance, now time.Duration) []Action {
	m.freeParity(inst, true, now)
	gr := m.groups[g]
	if gr == nil || j < 0 || j >= len(gr.parity) || gr.parity[j] != pRunning {
		return m.flush(now)
	}
	gr.parity[j] = pDone
	m.groupChanged(gr, now)
	return m.flush(now)
}

// ParityFailed: parity j of g failed or answered garbage: it costs only
// the reconstruction. retryable: the instance rests for a backoff.
func (m *Machine) ParityFailed(g GroupID, j int, inst Instance, retryable bool, now time.Duration) []Action {
	m.freeParity(inst, !retryable, now)
	gr := m.groups[g]
	if gr == nil || j < 0 || j >= len(gr.parity) {
		return m.flush(now)
	}
	if gr.parity[j] == pRunning || gr.parity[j] == pDone {
		gr.parity[j] = pFailed
		m.groupChanged(gr, now)
	}
	return m.flush(now)
}

// Decoded: the driver ran the Decode action of g; ok false means a parity
// output did not fit (ErrShape): those parities count as failed.
func (m *Machine) Decoded(g GroupID, parities []int, ok bool, now time.Duration) []Action {
	gr := m.groups[g]
	if gr == nil || !gr.decoding {
		return m.flush(now)
	}
	gr.decoding = false
	if !ok {
		for _, j := range parities {
			gr.parity[j] = pFailed
		}
		m.groupChanged(gr, now)
		return m.flush(now)
	}
	for _, b := range gr.members {
		if b.original || b.state == bReleased && !b.failedWaiting {
			continue
		}
		queued := b.state == bQueued
		b.state, b.decoded, b.failedWaiting = bReleased, true, false
		m.emit(Action{Kind: ActReleaseDecoded, Batch: b.id})
		if queued {
			m.unqueue(b)
			b.settled = true
			m.emit(Action{Kind: ActWithdraw, Batch: b.id})
		}
		if len(b.copies) == 0 {
			b.settled = true
		}
	}
	gr.decodableAt = -1
	m.afterGroup(gr, now)
	return m.flush(now)
}

// Cancel: the caller of batch id is gone (its context ended).
func (m *Machine) Cancel(id BatchID, now time.Duration) []Action {
	b := m.batches[id]
	if b == nil || b.state == bReleased {
		return m.flush(now)
	}
	if b.state == bQueued {
		m.unqueue(b)
		b.settled = true
		m.emit(Action{Kind: ActWithdraw, Batch: id})
	}
	b.state = bReleased
	b.failedWaiting = false
	m.afterBatch(b, now)
	return m.flush(now)
}

// Tick: time passed; decode_after, hedging, backoffs and settling.
func (m *Machine) Tick(now time.Duration) []Action {
	for _, ins := range [][]instance{m.data, m.par} {
		for i := range ins {
			if ins[i].resumeAt <= now {
				ins[i].resumeAt = 0 // rested (the failure streak stays until a success)
			}
		}
	}
	if g := m.filling; g != nil && m.cfg.FillAfter > 0 && now >= g.createdAt+m.cfg.FillAfter && m.awaited(g) {
		m.close(g, now)
	}
	for _, g := range m.sortedGroups() {
		if g.decodableAt >= 0 && !g.decoding && now >= g.decodableAt+m.cfg.DecodeAfter {
			m.decode(g)
		}
		if g.releasedAt >= 0 && now >= g.releasedAt+m.cfg.SettleAfter {
			m.forget(g)
		}
	}
	if m.cfg.Redundancy != RedundancyParM {
		m.forgetSettled()
	}
	return m.flush(now)
}

// NextDeadline is when Tick next has something to do (ok false: nothing
// until another event). A deadline already passed is returned as it is
// (the driver ticks at once): decode_after, settling and rests are acted
// on by Tick whatever happened meanwhile. A hedge that is due but finds
// no idle instance is not a deadline: the event that frees an instance
// hedges it.
func (m *Machine) NextDeadline(now time.Duration) (time.Duration, bool) {
	var next time.Duration
	ok := false
	at := func(t time.Duration) {
		if !ok || t < next {
			next, ok = t, true
		}
	}
	if g := m.filling; g != nil && m.cfg.FillAfter > 0 && m.awaited(g) {
		at(g.createdAt + m.cfg.FillAfter)
	}
	for _, g := range m.groups {
		if g.decodableAt >= 0 && !g.decoding {
			at(g.decodableAt + m.cfg.DecodeAfter)
		}
		if g.releasedAt >= 0 {
			at(g.releasedAt + m.cfg.SettleAfter)
		}
	}
	for _, in := range slices.Concat(m.data, m.par) {
		if !in.busy && in.resumeAt > 0 {
			at(in.resumeAt)
		}
	}
	if m.cfg.Redundancy == RedundancyHedge {
		for _, b := range m.batches {
			if t := b.started + m.cfg.HedgeAfter; b.state == bRunning && !b.hedged && len(b.copies) == 1 && t > now {
				at(t)
			}
		}
	}
	return next, ok
}

func (m *Machine) sortedGroups() []*group {
	out := make([]*group, 0, len(m.groups))
	for _, g := range m.groups {
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b *group) int { return int(a.id) - int(b.id) })
	return out
}

// hedge runs a second copy of the oldest running batch past the delay on
// an idle instance, while no batch waits in the queue (queued work first).
func (m *Machine) hedge(now time.Duration) {
	if len(m.queue) > 0 {
		return
	}
	var cand []*batch
	for _, b := range m.batches {
		if b.state == bRunning && !b.hedged && len(b.copies) == 1 && now >= b.started+m.cfg.HedgeAfter {
			cand = append(cand, b)
		}
	}
	slices.SortFunc(cand, func(a, b *batch) int { return int(a.id) - int(b.id) })
	for _, b := range cand {
		inst, ok := m.idle(m.data, now, b.copies[0])
		if !ok {
			return
		}
		m.data[inst].busy = true
		b.hedged = true
		b.copies = append(b.copies, inst)
		m.emit(Action{Kind: ActRunData, Batch: b.id, Instance: inst, Hedge: true})
	}
}

// dispatch gives queued batches to idle instances, data first.
func (m *Machine) dispatch(now time.Duration) {
	for {
		// A batch whose group is being decoded waits: the decode may
		// answer it (it is then withdrawn, never run).
		qi := slices.IndexFunc(m.queue, func(b *batch) bool { return b.group == nil || !b.group.decoding })
		if qi < 0 {
			break
		}
		inst, ok := m.idle(m.data, now, -1)
		if !ok {
			break
		}
		b := m.queue[qi]
		m.queue = slices.Delete(m.queue, qi, qi+1)
		m.data[inst].busy = true
		if b.attempts == 0 {
			b.started = now
		}
		b.state = bRunning
		b.attempts++
		b.copies = append(b.copies, inst)
		m.emit(Action{Kind: ActRunData, Batch: b.id, Instance: inst})
	}
	for len(m.pqueue) > 0 {
		inst, ok := m.idle(m.par, now, -1)
		if !ok {
			break
		}
		job := m.pqueue[0]
		m.pqueue = m.pqueue[1:]
		m.par[inst].busy = true
		job.g.parity[job.j] = pRunning
		m.emit(Action{Kind: ActRunParity, Group: job.g.id, Parity: job.j, Instance: inst})
	}
}

// idle returns the instance idle the longest, not resting (and not
// except); ties go to the lowest index.
func (m *Machine) idle(ins []instance, now time.Duration, except Instance) (Instance, bool) {
	best := -1
	for i := range ins {
		if !ins[i].busy && ins[i].resumeAt <= now && Instance(i) != except && (best < 0 || ins[i].freed < ins[best].freed) {
			best = i
		}
	}
	return Instance(best), best >= 0
}

func (m *Machine) freeData(inst Instance, ok bool, now time.Duration) {
	if int(inst) >= 0 && int(inst) < len(m.data) {
		m.free(&m.data[inst], ok, now)
	}
}

func (m *Machine) freeParity(inst Instance, ok bool, now time.Duration) {
	if int(inst) >= 0 && int(inst) < len(m.par) {
		m.free(&m.par[inst], ok, now)
	}
}

func (m *Machine) free(in *instance, ok bool, now time.Duration) {
	in.busy = false
	m.frees++
	in.freed = m.frees
	if ok {
		in.failStreak, in.resumeAt = 0, 0
		return
	}
	back := m.cfg.FailBackoff << min(in.failStreak, 16)
	in.failStreak++
	in.resumeAt = now + min(back, m.cfg.MaxBackoff)
}

func (m *Machine) unqueue(b *batch) {
	m.queue = slices.DeleteFunc(m.queue, func(q *batch) bool { return q == b })
}

// afterBatch updates b's group (or forgets b when it has none).
func (m *Machine) afterBatch(b *batch, now time.Duration) {
	if b.group == nil {
		if b.state == bReleased && b.settled {
			delete(m.batches, b.id)
		}
		return
	}
	m.groupChanged(b.group, now)
}

// groupChanged re-evaluates g after any change: decode, drop useless
// parities, fail members nothing can reconstruct any more, forget.
func (m *Machine) groupChanged(g *group, now time.Duration) {
	if m.parityUseless(g) {
		for j, st := range g.parity {
			if st == pQueued {
				g.parity[j] = pDropped
				m.pqueue = slices.DeleteFunc(m.pqueue, func(p parityJob) bool { return p.g == g && p.j == j })
				m.emit(Action{Kind: ActDropParity, Group: g.id, Parity: j})
			}
		}
	}
	if !g.decoding && g.closed && m.missing(g) > 0 {
		switch {
		case m.decodable(g) && m.anyFailedWaiting(g):
			m.decode(g) // the original will not come: no decode_after
		case m.decodable(g):
			if g.decodableAt < 0 {
				g.decodableAt = now
			}
			if now >= g.decodableAt+m.cfg.DecodeAfter {
				m.decode(g)
			}
		default:
			g.decodableAt = -1
		}
	}
	if !m.canStillDecode(g) {
		for _, b := range g.members {
			if b.failedWaiting {
				b.failedWaiting = false
				b.state = bReleased
				m.emit(Action{Kind: ActFail, Batch: b.id})
			}
		}
	}
	m.afterGroup(g, now)
}

func (m *Machine) afterGroup(g *group, now time.Duration) {
	if !g.closed || g.decoding {
		return
	}
	all, settled := true, true
	for _, b := range g.members {
		all = all && b.state == bReleased
		settled = settled && b.settled
	}
	if !all {
		return
	}
	if settled {
		m.forget(g)
		return
	}
	if g.releasedAt < 0 {
		g.releasedAt = now
	}
}

func (m *Machine) forget(g *group) {
	for j, st := range g.parity {
		if st == pQueued {
			m.pqueue = slices.DeleteFunc(m.pqueue, func(p parityJob) bool { return p.g == g && p.j == j })
			m.emit(Action{Kind: ActDropParity, Group: g.id, Parity: j})
		}
	}
	for _, b := range g.members {
		delete(m.batches, b.id)
	}
	delete(m.groups, g.id)
	m.emit(Action{Kind: ActForget, Group: g.id})
}

// awaited: some member of g still waits for its answer (closing a group
// of answered batches early would only cost a parity call).
func (m *Machine) awaited(g *group) bool {
	for _, b := range g.members {
		if b.state != bReleased {
			return true
		}
	}
	return false
}

// forgetSettled drops answered batches of a pool without groups.
func (m *Machine) forgetSettled() {
	for id, b := range m.batches {
		if b.group == nil && b.state == bReleased && b.settled {
			delete(m.batches, id)
		}
	}
}

// missing counts members still waiting for an answer that decoding could
// give (not answered, or failed and waiting).
func (m *Machine) missing(g *group) int {
	n := 0
	for _, b := range g.members {
		if !b.original && (b.state != bReleased || b.failedWaiting) {
			n++
		}
	}
	return n
}

func (m *Machine) anyFailedWaiting(g *group) bool {
	for _, b := range g.members {
		if b.failedWaiting {
			return true
		}
	}
	return false
}

// haves is which originals and parities of g are in.
func (m *Machine) haves(g *group) (data, par []bool) {
	data = make([]bool, m.cfg.Code.K)
	par = make([]bool, len(g.parity))
	for i := range data {
		data[i] = i >= len(g.members) || g.members[i].original // stand-ins are known
	}
	for j, st := range g.parity {
		par[j] = st == pDone
	}
	return data, par
}

func (m *Machine) decodable(g *group) bool {
	data, par := m.haves(g)
	return m.cfg.Code.CanDecode(data, par)
}

// canStillDecode: g may yet reconstruct its missing members (parities
// done or still to come cover every original that will not arrive).
func (m *Machine) canStillDecode(g *group) bool {
	if g == nil || !g.closed {
		// A group not yet closed has no parity coming for sure (traffic
		// may stop): a failed member does not wait for it.
		return false
	}
	data := make([]bool, m.cfg.Code.K)
	for i := range data {
		if i >= len(g.members) {
			data[i] = true // a stand-in
			continue
		}
		b := g.members[i]
		data[i] = b.original || !(b.failedWaiting || b.settled)
	}
	par := make([]bool, len(g.parity))
	for j, st := range g.parity {
		par[j] = st != pFailed && st != pDropped
	}
	// Originals still running count as arriving: a member waiting for a
	// reconstruction needs the parities to cover only those that will not.
	return m.cfg.Code.CanDecode(data, par)
}

// parityUseless: every member's original arrived or nobody waits for it.
func (m *Machine) parityUseless(g *group) bool {
	if !g.closed {
		return false
	}
	for _, b := range g.members {
		if !b.original && (b.state != bReleased || b.failedWaiting) {
			return false
		}
	}
	return true
}

func (m *Machine) decode(g *group) {
	// Every member without its original is unknown to the decoder (a
	// cancelled one too); Decoded releases only those still unanswered.
	var missing []BatchID
	for _, b := range g.members {
		if !b.original {
			missing = append(missing, b.id)
		}
	}
	if len(missing) == 0 {
		g.decodableAt = -1
		return
	}
	var parities []int
	for j, st := range g.parity {
		if st == pDone && len(parities) < len(missing) {
			parities = append(parities, j)
		}
	}
	g.decoding = true
	m.emit(Action{Kind: ActDecode, Group: g.id, Missing: missing, Parities: parities})
}
