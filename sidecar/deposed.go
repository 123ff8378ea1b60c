package sidecar

import (
	"context"

	"github.com/hams-go/hams/internal/config"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RoleDeposed is the role of a replicated primary that learned from the
// topology that another instance serves its model at a newer epoch (it
// was failed over while it could not hear: stopped, descheduled, cut off
// for longer than the suspicion timeout). It stops acting as primary at
// once: no batch runs, nothing is shipped, sent or released, and traffic
// is refused (admit); hams_sidecar_role_transitions_total{rpc="Deposed"}
// counts it. The manager keeps it dead in the topology, so no primary
// resolves it as its backup (a snapshot to it would be refused: it is not
// a backup). A Demote makes it a
// backup (its state is overwritten by the new primary's); the manager
// retires it instead when it already restored redundancy with another
// instance (docs/recovery.md, "False suspicion"), and the process exits.
// It is a sidecar's role only, not one of config.Roles: the manager
// never records it.
const RoleDeposed config.Role = "deposed"

// watchDeposed checks, at every topology change, whether this replicated
// primary was deposed (runs for the sidecar's life).
func (s *Sidecar) watchDeposed(ctx context.Context) error {
	for {
		changed := s.cfg.Resolver.Changed()
		s.checkDeposed()
		select {
		case <-changed:
		case <-ctx.Done():
			return nil
		}
	}
}

// deposedBy reports the serving instance and epoch that depose this
// primary: the topology resolves the model to another address at an
// epoch above this instance's.
func (s *Sidecar) deposedBy() (addr string, epoch uint64, deposed bool) {
	addr, epoch, ok := s.cfg.Resolver.Resolve(s.cfg.Model)
	if !ok || addr == s.cfg.GRPCListener.Addr().String() || epoch <= s.epochV.Load() {
		return "", 0, false
	}
	return addr, epoch, true
}

// checkDeposed fences this primary if the topology names a newer one,
// and demotes a deposed primary the topology lists as its model's backup.
func (s *Sidecar) checkDeposed() {
	defer s.demoteIfListedBackup()
	if s.Role() != config.RolePrimary {
		return
	}
	if _, _, deposed := s.deposedBy(); !deposed {
		return
	}
	err := s.transition("Deposed", func() error {
		addr, epoch, deposed := s.deposedBy()
		if s.Role() != config.RolePrimary || !deposed {
			return nil // promoted or demoted meanwhile
		}
		s.setRole(RoleDeposed)
		s.log.Warn("deposed: another instance is the primary at a newer epoch; stopped acting as primary (no batches, shipments or outputs) until demoted or retired",
			"epoch", s.epochV.Load(), "primary", addr, "primary_epoch", epoch)
		return nil
	})
	if err != nil && status.Code(err) != codes.Unavailable {
		s.log.Warn("deposed: stop acting as primary", "err", err)
	}
}

// demoteIfListedBackup: a deposed primary that the topology lists as its
// model's backup (a failover of an upstream stateful model rolled this
// model back: its backup was promoted and the manager re-roled this
// instance as the new backup) becomes that backup at once, as the
// manager's Demote would make it (same epoch, same primary; a Demote that
// still arrives finds a backup and is a no-op). Without it, a recovery
// round that did not get to its Demote left the new primary's snapshots
// refused here ("the deposed sidecar, not a backup") and no reply was
// released again.
func (s *Sidecar) demoteIfListedBackup() {
	if s.Role() != RoleDeposed || s.cfg.BackupResolver == nil {
		return
	}
	addr, bepoch, ok := s.cfg.BackupResolver.ResolveBackup(s.cfg.Model)
	if !ok || addr != s.cfg.GRPCListener.Addr().String() {
		return
	}
	primary, pepoch, deposed := s.deposedBy()
	if !deposed {
		return
	}
	epoch := max(bepoch, pepoch)
	if err := s.demote(epoch, primary); err != nil {
		s.log.Warn("deposed primary listed as its model's backup: demote", "epoch", epoch, "primary", primary, "err", err)
		return
	}
	s.log.Info("deposed primary listed as its model's backup: demoted itself", "epoch", epoch, "primary", primary)
}
