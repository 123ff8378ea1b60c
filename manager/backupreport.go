package manager

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/authz"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/pki"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// A primary cut off from its backup (issue 18: a partition between the
// two, both still heartbeating the manager) cannot ship snapshots, so no
// reply it computes becomes durable and the frontend releases none: the
// deployment stalls for the whole partition. The primary's sidecar
// notices that shipping has made no progress for a bound derived from the
// suspicion timeout (sidecar/backupwatch.go) and reports its backup with
// ReportFailure (reporter: its own id; suspect: the backup's id; its
// model). Invariants:
//   - Only the model's current primary (alive, PRIMARY, the highest epoch
//     of its model) may have its backup replaced this way, and only the
//     current live BACKUP of the same model; anything else a sidecar
//     reports (a backup against its primary, another model's instance, a
//     deposed primary) is refused with FailedPrecondition and changes
//     nothing. Authorization (internal/authz) already limits a sidecar to
//     reports about its own model under its own registered id.
//   - The reported backup is declared dead and retired (its process is
//     told to exit, and that incarnation is never readmitted), then
//     recovered as a lost backup: a live spare (STANDBY) of the model is
//     made the backup at the primary's epoch and synced from the primary
//     (its state overwritten), else a new backup is started. The retired
//     backup is never promoted: it is dead in the topology for good, and
//     a failover promotes only a live backup.
//   - Replies are never released before they are durable at a backup.
//     While the model has no backup (no spare, no starter, or until the
//     new one is synced) the primary keeps computing up to its unapplied
//     bound and keeps its snapshots queued; the frontend holds the
//     replies; the first backup synced gets the queued snapshots and the
//     replies flow again. The model is not run unreplicated.

// ErrReportRefused is wrapped by the refusal of a sidecar's failure report.
var ErrReportRefused = errors.New("manager: failure report refused")

// decideBackupReport decides whether rep, a failure report made by a
// sidecar, is its model's current primary reporting its current backup
// (nil), or why it is refused. Pure in its arguments.
func decideBackupReport(dep *config.Deployment, t *hamsv1.Topology, rep *hamsv1.FailureReport) error {
	model := rep.GetModel()
	mdl := dep.Model(model)
	switch {
	case mdl == nil:
		return fmt.Errorf("%w: model %q is not in deployment %q", ErrReportRefused, model, dep.Name)
	case !mdl.Stateful || !dep.RunMode().Protected() || dep.RunMode().Replays():
		return fmt.Errorf("%w: model %q has no replicated backup (stateful %v, mode %s)", ErrReportRefused, model, mdl.Stateful, dep.Mode)
	case rep.GetReporter() == rep.GetSuspect():
		return fmt.Errorf("%w: %s reports itself", ErrReportRefused, rep.GetReporter())
	}
	var reporter, suspect *hamsv1.Placement
	var maxEpoch uint64
	for _, p := range t.GetPlacements() {
		if p.GetModel() != model {
			continue
		}
		maxEpoch = max(maxEpoch, p.GetEpoch())
		switch p.GetComponentId() {
		case rep.GetReporter():
			reporter = p
		case rep.GetSuspect():
			suspect = p
		}
	}
	switch {
	case reporter == nil:
		return fmt.Errorf("%w: reporter %s is not an instance of %s", ErrReportRefused, rep.GetReporter(), model)
	case reporter.GetRole() != hamsv1.Role_ROLE_PRIMARY || !reporter.GetAlive() || reporter.GetEpoch() < maxEpoch:
		return fmt.Errorf("%w: reporter %s is not the primary of %s (role %s, alive %v, epoch %d of %d): only the primary reports its backup",
			ErrReportRefused, rep.GetReporter(), model, reporter.GetRole(), reporter.GetAlive(), reporter.GetEpoch(), maxEpoch)
	case suspect == nil:
		return fmt.Errorf("%w: suspect %s is not an instance of %s", ErrReportRefused, rep.GetSuspect(), model)
	case suspect.GetRole() != hamsv1.Role_ROLE_BACKUP || !suspect.GetAlive():
		return fmt.Errorf("%w: suspect %s is not the live backup of %s (role %s, alive %v)",
			ErrReportRefused, rep.GetSuspect(), model, suspect.GetRole(), suspect.GetAlive())
	}
	return nil
}

// reportedBySidecar: the report comes from a sidecar (its certificate's
// role; in plaintext, a reporter id registered as a sidecar). Supervisors
// and managers report as before.
func (m *Manager) reportedBySidecar(ctx context.Context, req *hamsv1.FailureReport) bool {
	if m.authz != nil {
		id, err := authz.PeerIdentity(ctx)
		return err == nil && id.Role == pki.RoleSidecar
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.regs[req.GetReporter()]
	return r != nil && r.GetKind() == hamsv1.ComponentKind_COMPONENT_KIND_SIDECAR
}

// backupReported handles a sidecar's report (see the top of this file).
func (m *Manager) backupReported(ctx context.Context, req *hamsv1.FailureReport) (*hamsv1.FailureReportResponse, error) {
	log := m.log.With("reporter", req.GetReporter(), "suspect", req.GetSuspect(), "model", req.GetModel(), "reason", req.GetReason())
	if !m.active.Load() {
		return nil, status.Error(codes.Unavailable, "report failure: this manager is not the active one")
	}
	t, _ := m.hub.get()
	if err := decideBackupReport(m.cfg.Deployment, t, req); err != nil {
		m.metrics.backupReports.WithLabelValues("refused").Inc()
		log.Warn("sidecar's failure report refused", "err", err)
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	id := req.GetSuspect()
	why := fmt.Sprintf("replaced as backup of %s: its primary %s could not ship to it (%s)", req.GetModel(), req.GetReporter(), req.GetReason())
	m.mu.Lock()
	m.retired[id] = why
	if r := m.regs[id]; r != nil {
		m.retiredInc[id] = r.GetIncarnation()
	}
	delete(m.returning, id)
	died := len(m.members.Dead(id)) > 0
	m.updateGaugesLocked()
	m.mu.Unlock()
	m.metrics.backupReports.WithLabelValues("replaced").Inc()
	if died {
		m.metrics.deaths.Inc()
	}
	log.Warn("backup reported unreachable by its primary: retired and replaced", "at", time.Now().Format(time.RFC3339Nano))
	if _, err := m.reconcile(ctx); err != nil {
		// Not replaced yet: the primary reports again after its bound.
		return nil, status.Errorf(codes.Unavailable, "report failure: write deployment state: %v", err)
	}
	m.suspectNow(id, req.GetModel(), hamsv1.Role_ROLE_BACKUP, "reported by its primary "+req.GetReporter()+": "+req.GetReason())
	return &hamsv1.FailureReportResponse{Accepted: true}, nil
}
