package dashboard

import (
	"testing"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// The page reads the shown role strings: they are the ones it always got
// (ACTIVE is shown as primary, UNSPECIFIED as none).
func TestShownRole(t *testing.T) {
	for p, want := range map[hamsv1.Role]string{
		hamsv1.Role_ROLE_UNSPECIFIED: "none",
		hamsv1.Role_ROLE_PRIMARY:     "primary",
		hamsv1.Role_ROLE_ACTIVE:      "primary",
		hamsv1.Role_ROLE_BACKUP:      "backup",
		hamsv1.Role_ROLE_STANDBY:     "standby",
	} {
		if got := shownRole(config.RoleFromProto(p)); got != want {
			t.Errorf("%v shown as %q, want %q", p, got, want)
		}
	}
}

// Health and order decide on the typed role: a model is down without a
// live instance on the data path (primary or active), degraded when it
// had a spare (backup or standby) and none is alive.
func TestHealthAndRankByRole(t *testing.T) {
	sc := func(r config.Role, alive bool) Instance {
		return Instance{Kind: "sidecar", Role: shownRole(r), role: r, Alive: alive}
	}
	for _, c := range []struct {
		name  string
		items []Instance
		want  string
	}{
		{"active alone", []Instance{sc(config.RoleActive, true)}, "ok"},
		{"primary, live standby", []Instance{sc(config.RolePrimary, true), sc(config.RoleStandby, true)}, "ok"},
		{"primary, dead standby", []Instance{sc(config.RolePrimary, true), sc(config.RoleStandby, false)}, "degraded"},
		{"primary, dead backup", []Instance{sc(config.RolePrimary, true), sc(config.RoleBackup, false)}, "degraded"},
		{"dead primary, live backup", []Instance{sc(config.RolePrimary, false), sc(config.RoleBackup, true)}, "down"},
		{"unset role only", []Instance{sc("", true)}, "down"},
	} {
		if got := modelHealth(nil, c.items); got != c.want {
			t.Errorf("%s: health %q, want %q", c.name, got, c.want)
		}
	}
	order := []Instance{
		sc(config.RoleActive, true), sc(config.RoleBackup, true), sc(config.RoleStandby, true),
		{Kind: "model-server", Role: "model server"}, sc("", true),
	}
	for i := 1; i < len(order); i++ {
		if rank(order[i-1]) >= rank(order[i]) {
			t.Errorf("%s (%d) does not rank before %s (%d)", order[i-1].Role, rank(order[i-1]), order[i].Role, rank(order[i]))
		}
	}
}
