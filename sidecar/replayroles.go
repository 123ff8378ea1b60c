package sidecar

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Role transitions of a model in replay mode (replay.go): the sidecar
// stops the stage, has its replay role recover or drop its queues, and
// rewires the request path.

// promoteReplay makes the replay spare the primary at epoch: its replay
// role recovers (replayState.recover), then each successor gets the
// re-executed outputs it has not received (after[succ]).
func (s *Sidecar) promoteReplay(epoch uint64, after map[string]uint64) (uint64, error) {
	rp := s.rp
	var maxSeq uint64
	err := s.transition("Promote", func() error {
		if s.Role() == config.RolePrimary && s.epochV.Load() == epoch {
			maxSeq = s.exec.seq()
			return nil // repeated order
		}
		if s.receiver == nil {
			return status.Errorf(codes.FailedPrecondition, "Promote: spare of %q has no resolver: it cannot serve", s.cfg.Model)
		}
		if s.Role() == config.RolePrimary {
			// A deposed primary that was never demoted (falsely
			// suspected, then rewired as a spare while it ran on): its
			// own state and history are superseded by the checkpoint and
			// the log, as a spare's are.
			s.log.Warn("replay: promoting a deposed primary of an older epoch: its state is replaced by the newest checkpoint",
				"epoch", s.epochV.Load(), "new_epoch", epoch)
		}
		rp.takeOver()
		ctx, cancel := context.WithTimeout(s.host.runCtx, replayRecoverTimeout)
		defer cancel()
		s.epochV.Store(epoch)
		// A re-execution that lost its backend's answer may have applied
		// the batch: start again from the checkpoint's state, up to
		// replayRestarts times (a backend that is down fails the restart's
		// own WriteState after BackendLostAfter, which ends the loop).
		items, keys, st, err := rp.recover(ctx)
		for restarts := 0; err != nil && st.notRepeated && st.fromCheckpoint && restarts < replayRestarts; restarts++ {
			s.log.Warn("replay: re-execution lost the backend; starting again from the checkpoint", "err", err)
			t := time.NewTimer(backendRetry)
			select {
			case <-ctx.Done():
				t.Stop()
				return fmt.Errorf("Promote (replay): %w", err)
			case <-t.C:
			}
			items, keys, st, err = rp.recover(ctx)
		}
		if err != nil {
			return fmt.Errorf("Promote (replay): %w", err)
		}
		s.receiver.SeedDedup(keys)
		s.resetRequestPath()
		if err := s.newSenders(); err != nil {
			return status.Errorf(codes.Internal, "Promote: %v", err)
		}
		sent := 0
		for i, snd := range s.out.current() {
			lim, named := after[s.succs[i]]
			for _, it := range items {
				if named && s.out.position(it) <= lim {
					continue
				}
				snd.Send(&hamsv1.Item{ReqId: it.ReqId, Service: it.Service, StreamId: it.StreamId, Tensors: it.Tensors,
					Lineage: it.Lineage, DeadlineUnixNano: it.DeadlineUnixNano, Approximate: it.Approximate})
				sent++
			}
		}
		s.setRole(config.RolePrimary)
		maxSeq = s.exec.seq()
		s.log.Info("promoted: spare replayed the input log and becomes the primary", "epoch", epoch,
			"checkpoint_batch", st.ckptBatch, "checkpoint_seq", st.ckptSeq, "replayed_batches", st.batches,
			"replayed_requests", st.requests, "diverged_outputs", st.diverged, "max_seq", maxSeq, "stop", st.stop,
			"load", st.load, "reexecute", st.reexec, "forwarded", sent, "after", after)
		return nil
	})
	return maxSeq, err
}

// demoteReplay makes a replay primary a spare (or records the epoch of a
// spare asked to sync: it has nothing to sync, it reads the checkpoint
// when promoted).
func (s *Sidecar) demoteReplay(epoch uint64) error {
	if err := s.checkEpoch("Demote", epoch); err != nil {
		return err
	}
	if s.Role() == config.RoleBackup {
		s.epochV.Store(epoch)
		return nil
	}
	return s.transition("Demote", func() error {
		s.epochV.Store(epoch)
		s.resetRequestPath()
		s.idx.reset()
		dropped := s.rp.drop()
		s.setRole(config.RoleBackup)
		s.log.Info("demoted: replay primary becomes a spare (it loads the newest checkpoint when promoted)", "epoch", epoch,
			"dropped_log_and_checkpoint_items", dropped)
		return nil
	})
}
