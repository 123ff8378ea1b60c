package sidecar

import (
	"context"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/edge"
	"github.com/hams-go/hams/internal/run"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// StartSeqMetadata is the gRPC metadata key by which the manager may pass
// PromoteRequest.start_seq (decimal) to a stateless standby; the field wins
// when set.
const StartSeqMetadata = "hams-start-seq"

// stateWriteTimeout bounds the WriteState of a rollback.
const stateWriteTimeout = 30 * time.Second

// replicationServer serves hamsv1.Replication on the sidecar's gRPC
// server: ShipSnapshot and GetMaxSeq on a backup, the recovery RPCs
// (paper IV-E) wherever they apply.
type replicationServer struct {
	hamsv1.UnimplementedReplicationServer
	s *Sidecar
}

func (r *replicationServer) notBackup(rpc string) error {
	return status.Errorf(codes.FailedPrecondition, "%s: %s is the %s sidecar of %q, not a backup", rpc, r.s.cfg.GRPCListener.Addr(), r.s.Role(), r.s.cfg.Model)
}

// backup returns the backup state while this sidecar is a backup.
func (r *replicationServer) backup() *backupState {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.role != config.RoleBackup {
		return nil
	}
	return s.bk
}

func (r *replicationServer) checkModel(rpc, m string) error {
	if m != "" && m != r.s.cfg.Model {
		return status.Errorf(codes.NotFound, "%s: this is the sidecar of %q, not %q", rpc, r.s.cfg.Model, m)
	}
	return nil
}

func (r *replicationServer) ShipSnapshot(stream hamsv1.Replication_ShipSnapshotServer) error {
	bk := r.backup()
	if bk == nil {
		return r.notBackup("ShipSnapshot")
	}
	return bk.shipSnapshot(stream)
}

func (r *replicationServer) GetMaxSeq(_ context.Context, req *hamsv1.GetMaxSeqRequest) (*hamsv1.GetMaxSeqResponse, error) {
	bk := r.backup()
	if bk == nil {
		return nil, r.notBackup("GetMaxSeq")
	}
	if err := r.checkModel("GetMaxSeq", req.GetModel()); err != nil {
		return nil, err
	}
	seq, batch := bk.MaxSeq()
	return &hamsv1.GetMaxSeqResponse{MaxSeq: seq, BatchId: batch}, nil
}

func (r *replicationServer) GetLineageSummary(_ context.Context, req *hamsv1.LineageSummaryRequest) (*hamsv1.LineageSummary, error) {
	s := r.s
	if f := req.GetFailedModel(); f != "" && f != config.Frontend && !slices.Contains(s.graph.Models(), f) {
		return nil, status.Errorf(codes.NotFound, "GetLineageSummary: model %q is not in service %q", f, s.service)
	}
	return s.idx.summary(s.graph, s.cfg.Model, req.GetFailedModel(), req.GetFailedMaxSeq(), s.Role() == config.RoleBackup), nil
}

func (r *replicationServer) Resend(_ context.Context, req *hamsv1.ResendRequest) (*hamsv1.ResendResponse, error) {
	n, err := r.s.resend(req)
	if err != nil {
		return nil, err
	}
	return &hamsv1.ResendResponse{Resent: uint64(n)}, nil
}

func (r *replicationServer) Promote(ctx context.Context, req *hamsv1.PromoteRequest) (*hamsv1.PromoteResponse, error) {
	if err := r.checkModel("Promote", req.GetModel()); err != nil {
		return nil, err
	}
	if r.s.rp != nil {
		after, err := replayAfter(ctx)
		if err != nil {
			return nil, err
		}
		if err := r.s.checkEpoch("Promote", req.GetEpoch()); err != nil {
			return nil, err
		}
		seq, err := r.s.promoteReplay(req.GetEpoch(), after)
		if err != nil {
			return nil, err
		}
		return &hamsv1.PromoteResponse{MaxSeq: seq}, nil
	}
	start := req.GetStartSeq()
	if md, ok := metadata.FromIncomingContext(ctx); ok && start == 0 {
		if v := md.Get(StartSeqMetadata); len(v) > 0 {
			n, err := strconv.ParseUint(v[0], 10, 64)
			if err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "Promote: metadata %s=%q: %v", StartSeqMetadata, v[0], err)
			}
			start = n
		}
	}
	seq, err := r.s.promote(req.GetEpoch(), start)
	if err != nil {
		return nil, err
	}
	return &hamsv1.PromoteResponse{MaxSeq: seq}, nil
}

func (r *replicationServer) Demote(_ context.Context, req *hamsv1.DemoteRequest) (*hamsv1.DemoteResponse, error) {
	if err := r.checkModel("Demote", req.GetModel()); err != nil {
		return nil, err
	}
	if err := r.s.demote(req.GetEpoch(), req.GetPrimaryAddress()); err != nil {
		return nil, err
	}
	return &hamsv1.DemoteResponse{}, nil
}

func (r *replicationServer) Rollback(_ context.Context, req *hamsv1.RollbackRequest) (*hamsv1.RollbackResponse, error) {
	if err := r.checkModel("Rollback", req.GetModel()); err != nil {
		return nil, err
	}
	v, err := r.s.rollback(req.GetEpoch(), req.GetToBatchId())
	if err != nil {
		return nil, err
	}
	return &hamsv1.RollbackResponse{StateVersion: v}, nil
}

// transition runs f with the role stage stopped (no batch in flight, no
// snapshot being applied) and starts the stage of the resulting role.
func (s *Sidecar) transition(rpc string, f func() error) error {
	s.roleMu.Lock()
	defer s.roleMu.Unlock()
	s.mu.Lock()
	running := s.host.runCtx != nil && !s.stopped
	s.mu.Unlock()
	if !running {
		return status.Errorf(codes.Unavailable, "%s: sidecar of %q is not running", rpc, s.cfg.Model)
	}
	s.stopStage()
	err := f()
	s.startStage()
	if err == nil {
		s.metrics.transitions.WithLabelValues(rpc).Inc()
	}
	return err
}

func (s *Sidecar) setRole(role config.Role) {
	s.mu.Lock()
	s.role = role
	s.mu.Unlock()
}

// checkEpoch refuses an order for an epoch older than this instance's.
func (s *Sidecar) checkEpoch(rpc string, epoch uint64) error {
	if cur := s.epochV.Load(); epoch < cur {
		return status.Errorf(codes.FailedPrecondition, "%s: epoch %d is older than this instance's %d", rpc, epoch, cur)
	}
	return nil
}

// resetRequestPath forgets requests not yet executed: they come again by
// resends (caller stopped the stage).
func (s *Sidecar) resetRequestPath() {
	if s.intake != nil {
		s.intake.reset()
	}
}

// promote makes a backup the primary (stateful) or numbers a stateless
// standby's outputs after startSeq; both continue at epoch.
func (s *Sidecar) promote(epoch, startSeq uint64) (uint64, error) {
	if err := s.checkEpoch("Promote", epoch); err != nil {
		return 0, err
	}
	var maxSeq uint64
	err := s.transition("Promote", func() error {
		if !s.replicated {
			if s.Role() != config.RolePrimary {
				return status.Errorf(codes.FailedPrecondition, "Promote: stateless sidecar of %q is a %s", s.cfg.Model, s.Role())
			}
			if s.epochV.Load() == epoch && epoch != 0 {
				maxSeq = s.exec.seq()
				return nil // repeated order
			}
			from := max(startSeq, s.exec.seq())
			s.exec.renumber(from, 0)
			s.epochV.Store(epoch)
			// New sender incarnations, as a stateful promotion makes: a
			// receiver follows the newest incarnation of a model's
			// senders, and the replaced instance may have started one
			// after this standby's were made (a Resend a frontend asked
			// for when it took over), which would fence this one off for
			// good (docs/recovery.md, blocker 4). A standby sent nothing.
			if err := s.newSenders(); err != nil {
				return status.Errorf(codes.Internal, "Promote: %v", err)
			}
			s.startCollecting()
			maxSeq = from
			s.log.Info("promoted: stateless instance takes traffic", "epoch", epoch, "start_seq", from)
			return nil
		}
		if s.Role() == RoleDeposed {
			return status.Errorf(codes.FailedPrecondition, "Promote: sidecar of %q is a deposed primary of epoch %d: it must be demoted (and synced) first", s.cfg.Model, s.epochV.Load())
		}
		if s.Role() == config.RolePrimary {
			if s.epochV.Load() == epoch {
				maxSeq = s.exec.seq()
				return nil // repeated order
			}
			return status.Errorf(codes.FailedPrecondition, "Promote: sidecar of %q is already the primary (epoch %d)", s.cfg.Model, s.epochV.Load())
		}
		if s.receiver == nil {
			return status.Errorf(codes.FailedPrecondition, "Promote: backup of %q has no resolver: it cannot serve", s.cfg.Model)
		}
		// The model server gets the applied state first: the new
		// primary computes on it.
		fctx, cancel := context.WithTimeout(s.host.runCtx, stateWriteTimeout)
		ho, err := s.bk.handover(fctx)
		cancel()
		if err != nil {
			return status.Errorf(codes.Unavailable, "Promote: write the applied state to the model server: %v", err)
		}
		last, seq, batch := ho.last, ho.seq, ho.batch
		if err := s.coversDurable(seq); err != nil {
			return err
		}
		// The new epoch's durability starts at what this backup applied:
		// published before anything of the new epoch runs, so a frontend
		// drops the replies it holds on the lost primary's speculative
		// state beyond seq before a later notice could release them.
		if err := s.announceEpoch("Promote", epoch, seq, batch); err != nil {
			return err
		}
		s.prim.baseBatch, s.prim.baseSeq = batch, seq
		s.exec.renumber(seq, s.stampEpoch(epoch))
		s.epochV.Store(epoch)
		s.prim.recoveredEpoch.Store(epoch)
		s.receiver.SeedDedup(s.idx.cut(seq))
		s.resetRequestPath()
		if err := s.newSenders(); err != nil {
			return status.Errorf(codes.Internal, "Promote: %v", err)
		}
		var base *snapshot
		if last != nil {
			// The backup role is over: the new primary's base owns cur.
			state, err := tensor.SplitBySpecs(ho.specs, ho.cur)
			if err != nil {
				return status.Errorf(codes.Internal, "Promote: applied state: %v", err)
			}
			base = s.prim.baseSnapshot(state, last.header.GetStateVersion(), last.header.GetRequests())
			base.batch, base.header.BatchId = batch, batch
			base.header.Sha256Marks = ho.marks
		}
		s.prim.ship.reset(base, base != nil)
		s.setRole(config.RolePrimary)
		// The outputs this backup applied with its state may never have
		// left the lost primary (remus releases them only after this
		// backup had them; any mode can die with them queued on an
		// edge). Nobody runs those requests again (the state covers
		// them), so they go out now, on the new senders, ahead of
		// anything of the new epoch; receivers drop the ones they had by
		// request key.
		resent := s.resendOutputLog()
		maxSeq = seq
		s.log.Info("promoted: backup becomes the primary", "epoch", epoch, "max_seq", seq, "batch", batch,
			"pending_snapshots_dropped", ho.pending, "outputs_resent", resent)
		return nil
	})
	return maxSeq, err
}

// demote makes this sidecar the backup of the primary at primaryAddr: its
// state is overwritten by the first snapshot of epoch or later it
// receives.
func (s *Sidecar) demote(epoch uint64, primaryAddr string) error {
	if s.rp != nil {
		return s.demoteReplay(epoch)
	}
	if !s.replicated {
		return status.Errorf(codes.FailedPrecondition, "Demote: model %q is not replicated", s.cfg.Model)
	}
	if err := s.checkEpoch("Demote", epoch); err != nil {
		return err
	}
	if s.Role() == config.RoleBackup {
		// Already a backup (SyncBackup of a new one): take the next
		// full snapshot of this epoch as the base, whatever this backup
		// applied before. In the same epoch too: a backup that was
		// replaced and is chosen again (a false suspicion, then the loss
		// of its replacement) is behind the primary, which ships it its
		// last kept state and deltas from there; kept in sync, it held
		// them all behind the gap for good. Deltas are refused until the
		// base came (the primary then ships it first).
		s.backupNow().resync(epoch)
		s.epochV.Store(epoch)
		s.log.Info("backup: syncing from primary", "epoch", epoch, "primary", primaryAddr)
		return nil
	}
	return s.transition("Demote", func() error {
		s.epochV.Store(epoch)
		s.resetRequestPath()
		if s.receiver != nil {
			// Its senders go on at the new primary; if this instance is
			// promoted again, each edge starts where its sender stands.
			s.receiver.Forget()
		}
		s.prim.ship.reset(nil, false)
		s.outlog.Reset()
		s.idx.reset()
		bk := newBackupState(s.host, s.epochV.Load())
		s.mu.Lock()
		s.bk = bk
		s.role = config.RoleBackup
		s.mu.Unlock()
		s.log.Info("demoted: primary becomes a backup; state will be overwritten by the primary's", "epoch", epoch, "primary", primaryAddr)
		return nil
	})
}

// startCollecting starts the completion watch (once).
func (s *Sidecar) startCollecting() {
	s.collectMu.Do(func() { close(s.collecting) })
}

func (s *Sidecar) backupNow() *backupState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bk
}

// rollback reinstalls the state the backup last applied and discards what
// came after it (outputs, seqs, dedup memory), continuing at epoch.
func (s *Sidecar) rollback(epoch, toBatch uint64) (uint64, error) {
	if !s.replicated {
		return 0, status.Errorf(codes.FailedPrecondition, "Rollback: model %q is not replicated", s.cfg.Model)
	}
	if err := s.checkEpoch("Rollback", epoch); err != nil {
		return 0, err
	}
	var version uint64
	err := s.transition("Rollback", func() error {
		if s.Role() != config.RolePrimary {
			return status.Errorf(codes.FailedPrecondition, "Rollback: sidecar of %q is a %s", s.cfg.Model, s.Role())
		}
		target := s.prim.ship.Applied()
		if target == nil {
			return status.Errorf(codes.FailedPrecondition, "Rollback: primary of %q keeps no applied state yet", s.cfg.Model)
		}
		if toBatch != 0 && toBatch != target.batch {
			return status.Errorf(codes.FailedPrecondition, "Rollback: kept state is after batch %d, not %d", target.batch, toBatch)
		}
		// As on promotion: outputs after target.seq are lost speculative
		// state; the new epoch's durability starts at target.seq.
		if err := s.announceEpoch("Rollback", epoch, target.seq, target.batch); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(s.host.runCtx, stateWriteTimeout)
		defer cancel()
		if err := s.host.sbe.WriteState(ctx, target.state, target.header.GetStateVersion()); err != nil {
			return status.Errorf(codes.Unavailable, "Rollback: write kept state of batch %d: %v", target.batch, err)
		}
		s.prim.baseBatch, s.prim.baseSeq = target.batch, target.seq
		s.exec.renumber(target.seq, s.stampEpoch(epoch))
		s.epochV.Store(epoch)
		s.prim.recoveredEpoch.Store(epoch)
		s.outlog.DropAfter(s.cfg.Model, target.seq)
		s.receiver.SeedDedup(s.idx.cut(target.seq))
		s.resetRequestPath()
		base := s.prim.baseSnapshot(target.state, target.header.GetStateVersion(), target.header.GetRequests())
		base.digest = target.digest
		s.prim.ship.reset(base, true)
		version = target.header.GetStateVersion()
		s.log.Info("rolled back to the state the backup last applied", "epoch", epoch, "batch", target.batch,
			"seq", target.seq, "state_version", version)
		return nil
	})
	return version, err
}

// coversDurable refuses to promote a backup whose applied state (up to
// request seq) is behind what its model already made durable: the reply
// gates may have released replies that depend on the later state. A
// backup is behind when it never took a base from the current primary (it
// was started, or chosen again, after the model had run, and the primary
// was lost before its first full snapshot arrived). Promoting it would
// restart the model's state silently under the same request seqs; refused
// (FailedPrecondition), the recovery reports the model's state as lost.
// A model with no stored notice has no history to lose (the deployment's
// first backup, promoted before any snapshot). Coords that cannot read the
// stored notices (DurableReader) are not checked.
func (s *Sidecar) coversDurable(seq uint64) error {
	dr, ok := s.cfg.Coord.(DurableReader)
	if !ok {
		return nil
	}
	var n *hamsv1.DurabilityNotice
	err := s.retryStateOp(func(ctx context.Context) error {
		var err error
		n, err = dr.LastDurable(ctx, s.cfg.Model)
		return err
	}, nil)
	if err != nil {
		return status.Errorf(codes.Unavailable, "Promote: read how far %q is durable: %v", s.cfg.Model, err)
	}
	if n.GetDurableSeq() > seq {
		return status.Errorf(codes.FailedPrecondition,
			"Promote: backup of %q applied state up to request seq %d, but the model is durable up to seq %d (epoch %d): it has not taken a base from the primary, and promoting it would lose state behind released replies",
			s.cfg.Model, seq, n.GetDurableSeq(), n.GetEpoch())
	}
	return nil
}

// retryStateOp runs op (a coordination read or write of a role
// transition) until it succeeds, for at most stateOpAttempts attempts
// within stateWriteTimeout, backing off between them; failed is told of
// each failure that is retried. It returns op's last error.
func (s *Sidecar) retryStateOp(op func(ctx context.Context) error, failed func(attempt int, err error)) error {
	ctx, cancel := context.WithTimeout(s.host.runCtx, stateWriteTimeout)
	defer cancel()
	backoff := stateOpBackoff
	for attempt := 1; ; attempt++ {
		err := op(ctx)
		if err == nil {
			return nil
		}
		if attempt >= stateOpAttempts || !run.Sleep(ctx, backoff) {
			return err
		}
		if failed != nil {
			failed(attempt, err)
		}
		backoff = min(2*backoff, time.Second)
	}
}

// announceEpoch publishes DurabilityNotice{model, epoch, seq, batch}
// through Coord and returns once it is published (retrying within
// stateWriteTimeout). A recovered primary calls it before it resends or
// executes anything of epoch, with seq the last request its state covers:
// whoever holds outputs of this model beyond seq from an older epoch
// (a frontend's reply gate) learns they are lost before any notice of
// epoch could cover them.
func (s *Sidecar) announceEpoch(rpc string, epoch, seq, batch uint64) error {
	n := &hamsv1.DurabilityNotice{Model: s.cfg.Model, Epoch: epoch, DurableSeq: seq, BatchId: batch}
	err := s.retryStateOp(func(ctx context.Context) error { return s.cfg.Coord.Announce(ctx, n) }, func(attempt int, err error) {
		s.log.Warn("new-epoch announcement failed, retrying", "rpc", rpc, "epoch", epoch, "attempt", attempt, "err", err)
	})
	if err != nil {
		return status.Errorf(codes.Unavailable, "%s: announce durability of %q to %d at epoch %d: %v", rpc, s.cfg.Model, seq, epoch, err)
	}
	s.log.Info("new epoch announced", "rpc", rpc, "epoch", epoch, "durable_seq", seq, "batch", batch)
	return nil
}

// resendOutputLog queues every output kept in the output log on the
// current senders, each edge its own items, and returns how many. The
// caller holds the role transition (no traffic runs yet).
func (s *Sidecar) resendOutputLog() int {
	senders := s.out.current()
	n := 0
	for i, snd := range senders {
		items := s.outlog.ForEdge(s.cfg.Model, i, len(senders))
		if len(items) == 0 {
			continue
		}
		n += snd.Resend(edge.ResendSpec{Items: items})
	}
	return n
}

// resend sends the saved outputs on the edge to req.ToModel after a
// position again (to a replacement at req.ToAddress).
func (s *Sidecar) resend(req *hamsv1.ResendRequest) (int, error) {
	s.roleMu.Lock()
	defer s.roleMu.Unlock()
	// A stateless (or unreplicated) sidecar serves whenever it runs: a
	// sink's retained items go to a new leader frontend from any of them.
	if s.receiver == nil || ((s.replicated || s.rp != nil) && s.Role() != config.RolePrimary) {
		return 0, status.Errorf(codes.FailedPrecondition, "Resend: sidecar of %q is a %s", s.cfg.Model, s.Role())
	}
	senders := s.out.current()
	for i, to := range s.succs {
		if to != req.GetToModel() {
			continue
		}
		spec := edge.ResendSpec{After: req.GetAfterEdgeSeq(), Addr: req.GetToAddress(), Epoch: req.GetEpoch()}
		if s.replicated {
			spec.Items = s.outlog.ForEdge(s.cfg.Model, i, len(senders))
			if spec.Items == nil {
				spec.Items = []*hamsv1.Item{}
			}
		}
		n := senders[i].Resend(spec)
		s.metrics.resent.Add(float64(n))
		s.log.Info("resend", "to", req.GetToModel(), "addr", req.GetToAddress(), "after", req.GetAfterEdgeSeq(),
			"epoch", req.GetEpoch(), "resent", n)
		return n, nil
	}
	return 0, status.Errorf(codes.NotFound, "Resend: %q is not a successor of %q", req.GetToModel(), s.cfg.Model)
}
