package config

import (
	"errors"
	"strings"
	"testing"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func TestRole(t *testing.T) {
	for _, c := range []struct {
		name                          string
		role                          Role
		proto                         hamsv1.Role
		onDataPath, holdsState, spare bool
	}{
		{"primary", RolePrimary, hamsv1.Role_ROLE_PRIMARY, true, true, false},
		{"backup", RoleBackup, hamsv1.Role_ROLE_BACKUP, false, true, true},
		{"standby", RoleStandby, hamsv1.Role_ROLE_STANDBY, false, false, true},
		{"active", RoleActive, hamsv1.Role_ROLE_ACTIVE, true, false, false},
	} {
		r, err := ParseRole(c.name)
		if err != nil || r != c.role {
			t.Errorf("ParseRole(%q) = %q, %v; want %q", c.name, r, err, c.role)
		}
		if r.String() != c.name {
			t.Errorf("%q.String() = %q", c.role, r.String())
		}
		if got := c.role.Proto(); got != c.proto {
			t.Errorf("%q.Proto() = %v, want %v", c.role, got, c.proto)
		}
		if got := RoleFromProto(c.proto); got != c.role {
			t.Errorf("RoleFromProto(%v) = %q, want %q", c.proto, got, c.role)
		}
		if c.role.OnDataPath() != c.onDataPath || c.role.HoldsState() != c.holdsState || c.role.Spare() != c.spare {
			t.Errorf("%q: on data path %v holds state %v spare %v, want %v %v %v", c.role,
				c.role.OnDataPath(), c.role.HoldsState(), c.role.Spare(), c.onDataPath, c.holdsState, c.spare)
		}
	}
}

// The unset role is the manager's ROLE_UNSPECIFIED, and is nothing.
func TestRoleUnset(t *testing.T) {
	var r Role
	if r.Proto() != hamsv1.Role_ROLE_UNSPECIFIED || RoleFromProto(hamsv1.Role_ROLE_UNSPECIFIED) != "" || RoleFromProto(hamsv1.Role(99)) != "" {
		t.Errorf("unset role: Proto %v, from UNSPECIFIED %q, from 99 %q", r.Proto(), RoleFromProto(hamsv1.Role_ROLE_UNSPECIFIED), RoleFromProto(hamsv1.Role(99)))
	}
	if r.OnDataPath() || r.HoldsState() || r.Spare() || Role("leader").Proto() != hamsv1.Role_ROLE_UNSPECIFIED {
		t.Error("the unset role (or a non-role) has a property")
	}
}

// Every role of Roles parses and round-trips through the manager's enum,
// and every enum value but UNSPECIFIED is a role.
func TestRolesRoundTrip(t *testing.T) {
	for _, r := range Roles {
		if p, err := ParseRole(r.String()); err != nil || p != r || RoleFromProto(r.Proto()) != r {
			t.Errorf("%q does not round-trip: parse %q %v, proto %v", r, p, err, r.Proto())
		}
	}
	for v := range hamsv1.Role_name {
		if p := hamsv1.Role(v); p != hamsv1.Role_ROLE_UNSPECIFIED && RoleFromProto(p) == "" {
			t.Errorf("manager role %v has no config.Role", p)
		}
	}
}

func TestParseRoleRefuses(t *testing.T) {
	for _, s := range []string{"", "Primary", "frontend", "manager", "nats", "deposed", " backup"} {
		r, err := ParseRole(s)
		if err == nil {
			t.Errorf("ParseRole(%q) = %q, want an error", s, r)
			continue
		}
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseRole(%q): %v does not wrap ErrInvalid", s, err)
		}
		msg := err.Error()
		if !strings.Contains(msg, `"`+s+`"`) || !strings.Contains(msg, "primary, active, backup, standby") {
			t.Errorf("ParseRole(%q): error %q does not name the value and the allowed ones", s, msg)
		}
	}
}
