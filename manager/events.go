package manager

import (
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/manager/dashboard/timeline"
	"github.com/hams-go/hams/protocol/recovery"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// What the dashboard (manager/dashboard) reads from a Manager, and the
// events it emits into Config.Events.

// Active reports whether this manager holds the active-manager lease.
func (m *Manager) Active() bool { return m.active.Load() }

// Registrations returns a copy of the components' registrations.
func (m *Manager) Registrations() []*hamsv1.RegisterRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*hamsv1.RegisterRequest, 0, len(m.regs))
	for _, r := range m.regs {
		out = append(out, proto.Clone(r).(*hamsv1.RegisterRequest))
	}
	return out
}

// emit hands e to Config.Events, if any.
func (m *Manager) emit(e timeline.Event) {
	if m.cfg.Events != nil {
		m.cfg.Events.Emit(e)
	}
}

// emitDone records the successful end of a recovery order started at t0:
// a promotion, or restored redundancy (a backup synced, a standby
// started). Failed orders and other kinds are not events.
func (m *Manager) emitDone(a recovery.Action, t0 time.Time, err error) {
	if err != nil || m.cfg.Events == nil {
		return
	}
	e := timeline.Event{Model: a.Model, Component: a.Component, Role: roleName(a.Role), Epoch: a.Epoch, Duration: time.Since(t0)}
	switch {
	case a.Kind == recovery.Promote:
		e.Kind = timeline.Promotion
	case a.Kind == recovery.SyncBackup:
		e.Kind, e.Role, e.Detail = timeline.RedundancyRestored, "backup", "new backup syncing: it is redundancy once it applied the primary's next full state (hams_sidecar_backup_synced)"
	case a.Kind == recovery.StartInstance && a.Role == hamsv1.Role_ROLE_STANDBY:
		e.Kind, e.Detail = timeline.RedundancyRestored, "new standby started"
	default:
		return
	}
	m.emit(e)
}

// roleName is a role as the dashboard shows it ("primary", "standby"; ""
// when unspecified).
func roleName(r hamsv1.Role) string {
	if r == hamsv1.Role_ROLE_UNSPECIFIED {
		return ""
	}
	return strings.ToLower(strings.TrimPrefix(r.String(), "ROLE_"))
}
