package manager

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/manager/dashboard/timeline"
	"github.com/hams-go/hams/protocol"
	"github.com/hams-go/hams/protocol/recovery"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// InstanceStarter starts a new instance of a model in a role (a new
// backup, or a hot standby): the process supervisor (cmd/hams) implements
// it. It returns once the process is started; the instance then registers
// with the manager like any other.
type InstanceStarter interface {
	StartInstance(ctx context.Context, model string, role hamsv1.Role) error
}

// StartSeqMetadata is the gRPC metadata key on a Promote of a stateless
// standby that carries the output seq to continue after (decimal). It
// stands in for a PromoteRequest field until the proto has one.
const StartSeqMetadata = "hams-start-seq"

// DefaultRPCTimeout bounds one recovery RPC to a sidecar.
const DefaultRPCTimeout = 500 * time.Millisecond

// StateOrderTimeout bounds a Promote of a stateful backup and a Rollback:
// they may write a whole state to the model server first (a backup's
// write-behind catching up, the kept state of a rollback; 512 MB at most).
// A slow order only delays the recovery; one given up on while it goes on
// leaves a promoted instance the manager does not count on.
const StateOrderTimeout = 30 * time.Second

// ReplayAfterMetadata is the gRPC metadata key of a Promote of a spare in
// replay mode: one "successor=seq" value per successor (the sidecar's
// sidecar.ReplayAfterMetadata).
const ReplayAfterMetadata = "hams-replay-after"

// ReplayPromoteTimeout bounds the Promote of a spare in replay mode: it
// loads the newest checkpoint and re-executes the input log after it
// before it answers.
const ReplayPromoteTimeout = 2 * time.Minute

// ErrNoStarter is the outcome of StartInstance without a Config.Starter.
var ErrNoStarter = errors.New("manager: no InstanceStarter configured")

// ErrNoAddress fails a recovery RPC aimed at a placement that has no
// sidecar address.
var ErrNoAddress = errors.New("manager: recovery target has no sidecar address")

// assignment is a role and epoch set by recovery; it overrides the
// registration in the deployment state.
type assignment struct {
	role  hamsv1.Role
	epoch uint64
}

// recEvent is one input of the recovery loop: events of the recovery
// machine, stepped in order and back to back on the loop's goroutine (a
// suspicion with the topology it must see first).
type recEvent []protocol.Event

// suspect posts a suspicion of component id to the recovery loop (only
// the active manager recovers).
func (m *Manager) suspect(id, model string, role hamsv1.Role, why string) {
	if !m.active.Load() {
		return
	}
	m.log.Info("recovery: suspect", "id", id, "model", model, "why", why)
	m.emit(timeline.Event{Kind: timeline.Suspicion, Model: model, Component: id, Role: roleName(role), Detail: why})
	ev := recEvent{recovery.Suspected{Model: model, Role: role, Component: id}}
	select {
	case m.recCh <- ev:
	default:
		m.log.Error("recovery: event queue full; suspicion dropped", "id", id)
	}
}

// recoveryLoop owns the recovery state machine: it steps it with
// topology changes, suspicions and the answers of its actions (events
// in), and performs the actions each step returns, in order (RPCs in
// their own goroutines, waited for before it returns).
func (m *Manager) recoveryLoop(ctx context.Context) error {
	rec, err := recovery.New(recovery.Config{Graph: recovery.NewGraph(m.cfg.Deployment), Replay: m.cfg.Deployment.RunMode().Replays()})
	if err != nil {
		return err
	}
	d := &driver{m: m, rec: rec, ctx: ctx, conns: map[string]*grpc.ClientConn{}}
	defer func() {
		d.wg.Wait()
		for _, cc := range d.conns {
			_ = cc.Close()
		}
	}()
	t, changed := m.hub.get()
	d.step(recovery.TopologyChanged{Topology: t})
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			t, changed = m.hub.get()
			d.step(recovery.TopologyChanged{Topology: t})
		case evs := <-m.recCh:
			if rec.Idle() {
				d.roundStart = time.Now()
			}
			for _, ev := range evs {
				d.step(ev)
			}
		}
	}
}

type driver struct {
	m          *Manager
	rec        protocol.Machine
	ctx        context.Context
	wg         sync.WaitGroup
	conns      map[string]*grpc.ClientConn
	roundStart time.Time
}

// step feeds one event to the recovery machine and performs the actions
// it returns, in order. An error from Step is a bug of this driver (an
// event the machine does not handle, or an answer to an action it does
// not wait for: every action is answered exactly once): the machine is
// unchanged, so step logs it at error level with the event and counts it
// in hams_manager_recovery_driver_errors_total; it never panics, and the
// loop goes on with the next event.
func (d *driver) step(ev protocol.Event) {
	acts, err := d.rec.Step(ev)
	if err != nil {
		d.m.metrics.driverErrors.Inc()
		d.m.log.Error("recovery driver bug: the recovery machine refused an event", "event", ev.String(), "err", err)
		return
	}
	d.perform(protocol.Select[recovery.Action](acts))
}

func (d *driver) conn(addr string) (hamsv1.ReplicationClient, error) {
	cc := d.conns[addr]
	if cc == nil {
		var err error
		var opts []grpc.DialOption
		if d.m.cfg.TLS != nil {
			opts = append(opts, grpcx.DialTLS(d.m.cfg.TLS))
		}
		cc, err = grpcx.Dial(addr, d.m.cfg.Deployment.Limits.MaxMessageBytes, opts...)
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		d.conns[addr] = cc
	}
	return hamsv1.NewReplicationClient(cc), nil
}

// post hands an answer back to the loop.
func (d *driver) post(ev protocol.Event) {
	select {
	case d.m.recCh <- recEvent{ev}:
	case <-d.ctx.Done():
	}
}

// async runs f in a goroutine with a per-call timeout and posts its
// result (the event that answers the action f performs).
func (d *driver) async(timeout time.Duration, f func(ctx context.Context) protocol.Event) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		ctx, cancel := context.WithTimeout(d.ctx, timeout)
		ev := f(ctx)
		cancel()
		d.post(ev)
	}()
}

func done(id recovery.ActionID, err error) protocol.Event {
	return recovery.ActionDone{ID: id, Err: err}
}

func (d *driver) perform(acts []recovery.Action) {
	m := d.m
	to := m.cfg.RPCTimeout
	for _, a := range acts {
		a := a
		m.log.Debug("recovery: action", "action", a.String())
		if a.Kind.Notice() {
			switch a.Kind {
			case recovery.Recovered:
				el := time.Since(d.roundStart)
				m.metrics.recoveryTime.Observe(el.Seconds())
				m.metrics.recoveries.Inc()
				m.log.Info("recovery: rewired", "models", a.Models, "elapsed", el)
				m.emit(timeline.Event{Kind: timeline.Failover, Model: strings.Join(a.Models, ","), Duration: el})
			case recovery.Unrecoverable:
				m.metrics.unrecoverable.Inc()
				m.log.Error("recovery: model cannot be recovered", "model", a.Model, "reason", a.Reason)
				m.emit(timeline.Event{Kind: timeline.Unrecoverable, Model: a.Model, Detail: a.Reason})
			case recovery.Retire:
				if !m.takeReincarnated(a.Component) {
					if m.retire(a) {
						// Listed alive (a round retired it as
						// unreachable): written dead now, so nobody
						// resolves it as its model's backup meanwhile.
						d.wg.Add(1)
						go func() {
							defer d.wg.Done()
							if _, err := m.reconcile(d.ctx); err != nil {
								m.log.Warn("write liveness to deployment state", "id", a.Component, "err", err)
							}
						}()
					}
					break
				}
				// A new process under the retired instance's id: a
				// fresh standby (incarnation.go).
				d.wg.Add(1)
				go func() {
					defer d.wg.Done()
					m.admitFresh(d.ctx, a)
				}()
			case recovery.Readmit:
				if m.takeReincarnated(a.Component) {
					// Nobody could take its role (no backup, no
					// standby): the new process serves in it, and what
					// the old one held is lost.
					m.log.Error("restarted component readmitted in its old role: nobody could replace it; the state its previous incarnation held is lost",
						"id", a.Component, "model", a.Model, "role", a.Role.String(), "epoch", a.Epoch)
				}
				d.wg.Add(1)
				go func() {
					defer d.wg.Done()
					m.readmit(d.ctx, a)
				}()
			}
			continue
		}
		var cl hamsv1.ReplicationClient
		if a.Address != "" {
			var err error
			if cl, err = d.conn(a.Address); err != nil {
				m.log.Warn("recovery: connect for action failed", "action", a.String(), "err", err)
				d.async(to, func(context.Context) protocol.Event { return failed(a, err) })
				continue
			}
		} else if a.Kind != recovery.StartInstance && a.Kind != recovery.Rewire {
			// An RPC action aimed at a placement without a sidecar
			// address (a model server's) cannot be performed: fail it
			// so the machine treats the target as unreachable.
			err := fmt.Errorf("%w: %s has no sidecar address", ErrNoAddress, a.String())
			m.log.Warn("recovery: action has no target address", "action", a.String())
			d.async(to, func(context.Context) protocol.Event { return failed(a, err) })
			continue
		}
		switch a.Kind {
		case recovery.GetMaxSeq:
			d.async(to, func(ctx context.Context) protocol.Event {
				resp, err := cl.GetMaxSeq(ctx, &hamsv1.GetMaxSeqRequest{Model: a.Model})
				if err != nil {
					m.log.Warn("recovery: query failed", "action", a.String(), "err", err)
					return failed(a, err)
				}
				return recovery.MaxSeqAnswered{ID: a.ID, MaxSeq: resp.GetMaxSeq()}
			})
		case recovery.GetLineageSummary:
			d.async(to, func(ctx context.Context) protocol.Event {
				resp, err := cl.GetLineageSummary(ctx, &hamsv1.LineageSummaryRequest{FailedModel: a.FailedModel, FailedMaxSeq: a.FailedMaxSeq})
				if err != nil {
					m.log.Warn("recovery: query failed", "action", a.String(), "err", err)
					return failed(a, err)
				}
				s := recovery.Summary{MaxOut: resp.GetMaxOutSeq(), MaxIn: resp.GetMaxInByPred(), ConsumedBeyond: resp.GetConsumedBeyond()}
				return recovery.SummaryAnswered{ID: a.ID, Summary: s}
			})
		case recovery.Promote:
			pto := to
			if d.m.cfg.Deployment.Model(a.Model).Stateful {
				pto = max(to, StateOrderTimeout)
			}
			if a.ReplayAfter != nil {
				pto = max(to, ReplayPromoteTimeout)
			}
			d.async(pto, func(ctx context.Context) protocol.Event {
				t0 := time.Now()
				if !d.m.cfg.Deployment.Model(a.Model).Stateful {
					ctx = metadata.AppendToOutgoingContext(ctx, StartSeqMetadata, strconv.FormatUint(a.StartSeq, 10))
				}
				for _, succ := range slices.Sorted(maps.Keys(a.ReplayAfter)) {
					ctx = metadata.AppendToOutgoingContext(ctx, ReplayAfterMetadata, succ+"="+strconv.FormatUint(a.ReplayAfter[succ], 10))
				}
				_, err := cl.Promote(ctx, &hamsv1.PromoteRequest{Model: a.Model, Epoch: a.Epoch})
				m.emitDone(a, t0, err)
				return done(a.ID, wrap(a, err))
			})
		case recovery.Rollback:
			d.async(max(to, StateOrderTimeout), func(ctx context.Context) protocol.Event {
				_, err := cl.Rollback(ctx, &hamsv1.RollbackRequest{Model: a.Model, Epoch: a.Epoch})
				return done(a.ID, wrap(a, err))
			})
		case recovery.Resend:
			d.async(to, func(ctx context.Context) protocol.Event {
				_, err := cl.Resend(ctx, &hamsv1.ResendRequest{ToModel: a.ToModel, ToAddress: a.ToAddress, AfterEdgeSeq: a.After, Epoch: a.Epoch})
				if err != nil {
					m.log.Warn("recovery: resend failed", "action", a.String(), "err", err)
				}
				return done(a.ID, wrap(a, err))
			})
		case recovery.Demote, recovery.SyncBackup:
			d.async(to, func(ctx context.Context) protocol.Event {
				t0 := time.Now()
				_, err := cl.Demote(ctx, &hamsv1.DemoteRequest{Model: a.Model, Epoch: a.Epoch, PrimaryAddress: a.PrimaryAddress})
				m.emitDone(a, t0, err)
				return done(a.ID, wrap(a, err))
			})
		case recovery.StartInstance:
			d.async(30*time.Second, func(ctx context.Context) protocol.Event {
				if m.cfg.Starter == nil {
					return done(a.ID, ErrNoStarter)
				}
				t0 := time.Now()
				err := m.cfg.Starter.StartInstance(ctx, a.Model, a.Role)
				m.emitDone(a, t0, err)
				if err != nil {
					m.log.Warn("recovery: start instance", "model", a.Model, "role", a.Role.String(), "err", err)
				}
				return done(a.ID, wrap(a, err))
			})
		case recovery.Rewire:
			d.async(10*time.Second, func(ctx context.Context) protocol.Event {
				return done(a.ID, wrap(a, m.rewire(ctx, a.Changes)))
			})
		default:
			d.async(to, func(context.Context) protocol.Event {
				return done(a.ID, fmt.Errorf("manager: unknown recovery action %v", a))
			})
		}
	}
}

// failed is the event that answers action a, which could not be
// performed (err): QueryFailed for a query, ActionDone with err otherwise.
func failed(a recovery.Action, err error) protocol.Event {
	err = wrap(a, err)
	if a.Kind == recovery.GetMaxSeq || a.Kind == recovery.GetLineageSummary {
		return recovery.QueryFailed{ID: a.ID, Err: err}
	}
	return done(a.ID, err)
}

func wrap(a recovery.Action, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("recovery %s at %s: %w", a.Kind, a.Address, err)
}

// rewire applies recovery's role and epoch changes atomically (one CAS
// write) and keeps them across re-registrations.
func (m *Manager) rewire(ctx context.Context, changes []recovery.Change) error {
	m.mu.Lock()
	for _, c := range changes {
		m.assigned[c.Component] = assignment{role: c.Role, epoch: c.Epoch}
	}
	m.mu.Unlock()
	t, err := m.st.mutate(ctx, m.applyState)
	if err != nil {
		return err
	}
	m.hub.offer(t)
	m.log.Info("recovery: topology rewired", "revision", t.GetRevision(), "changes", len(changes))
	return nil
}
