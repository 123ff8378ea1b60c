package config

import (
	"strings"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Role is what a model instance (a sidecar and its model server) is for:
// the --role of `hams sidecar` and `hams modelserver`, the role the
// manager records for it (hamsv1.Role; Proto and RoleFromProto convert),
// the role the dashboard shows. The zero Role is unset (the manager's
// ROLE_UNSPECIFIED). Process kinds (frontend, manager, nats) are not
// roles.
type Role string

// The instance roles (Roles lists them).
const (
	// RolePrimary: a stateful model's serving instance (it runs the model
	// and, when the model is replicated, ships its state to the backup).
	// As a --role it also starts a stateless model's serving instance,
	// which registers as RoleActive.
	RolePrimary Role = "primary"
	// RoleBackup: a replicated stateful model's backup (it applies the
	// primary's snapshots, Algorithm 2), or replay mode's idle spare.
	RoleBackup Role = "backup"
	// RoleStandby: a spare the manager promotes: a stateless model's hot
	// standby, or a stateful model's spare backup (it follows no primary
	// until the manager makes it the backup).
	RoleStandby Role = "standby"
	// RoleActive: a stateless model's serving instance, as registered.
	RoleActive Role = "active"
)

// Roles lists the instance roles, serving ones first.
var Roles = []Role{RolePrimary, RoleActive, RoleBackup, RoleStandby}

// ParseRole reads a role name (as String writes it). An unknown name is
// an error wrapping ErrInvalid that names it and the allowed ones.
func ParseRole(s string) (Role, error) {
	for _, r := range Roles {
		if string(r) == s {
			return r, nil
		}
	}
	names := make([]string, len(Roles))
	for i, r := range Roles {
		names[i] = string(r)
	}
	return "", invalid("role %q is not one of %s", s, strings.Join(names, ", "))
}

// String is the role's name ("" for the unset role).
func (r Role) String() string { return string(r) }

// Proto is r as the manager's API has it (ROLE_UNSPECIFIED for the unset
// role and for a value that is no role).
func (r Role) Proto() hamsv1.Role {
	switch r {
	case RolePrimary:
		return hamsv1.Role_ROLE_PRIMARY
	case RoleBackup:
		return hamsv1.Role_ROLE_BACKUP
	case RoleStandby:
		return hamsv1.Role_ROLE_STANDBY
	case RoleActive:
		return hamsv1.Role_ROLE_ACTIVE
	}
	return hamsv1.Role_ROLE_UNSPECIFIED
}

// RoleFromProto is the Role of a manager API role: the unset Role for
// ROLE_UNSPECIFIED and for values this build does not know.
// RoleFromProto(r.Proto()) == r for every role of Roles.
func RoleFromProto(p hamsv1.Role) Role {
	switch p {
	case hamsv1.Role_ROLE_PRIMARY:
		return RolePrimary
	case hamsv1.Role_ROLE_BACKUP:
		return RoleBackup
	case hamsv1.Role_ROLE_STANDBY:
		return RoleStandby
	case hamsv1.Role_ROLE_ACTIVE:
		return RoleActive
	}
	return ""
}

// OnDataPath reports whether requests go through an instance of this role
// now: the serving instance (primary or active). A model is down when no
// instance on the data path is alive.
func (r Role) OnDataPath() bool { return r == RolePrimary || r == RoleActive }

// HoldsState reports whether an instance of this role holds a stateful
// model's state: the primary runs on it, the backup applies its
// snapshots. A standby holds none until the manager makes it a backup or
// a primary; an active instance serves a stateless model.
func (r Role) HoldsState() bool { return r == RolePrimary || r == RoleBackup }

// Spare reports whether an instance of this role is a model's redundancy
// (one the manager promotes or re-roles when the serving instance or the
// backup fails): a backup or a standby.
func (r Role) Spare() bool { return r == RoleBackup || r == RoleStandby }
