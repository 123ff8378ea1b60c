// Package pki holds HAMS-Go's internal identities and the certificates
// that carry them: a deployment CA, per-component certificates whose URI
// SAN is a SPIFFE-style ID naming the deployment, role, model and
// instance, the TLS configurations of every internal hop (mutual TLS,
// peers verified against the CA and by identity rather than host name,
// since internal addresses are loopback ports and pod IPs), and
// certificate files reloaded when they change (cert-manager, SPIRE).
package pki

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Sentinel errors.
var (
	ErrIdentity = errors.New("pki: bad identity")
	ErrNoPeer   = errors.New("pki: no verified peer identity")
)

// TrustDomain is the SPIFFE trust domain of every HAMS-Go identity; the
// deployment is the first path segment, so one CA may serve several
// deployments and a peer of another deployment is still told apart.
const TrustDomain = "hams"

// Role is what a component is, as its certificate says. Whether a sidecar
// is a primary or a backup changes at run time and is not part of its
// identity; the manager's topology decides that.
type Role uint8

const (
	RoleUnknown Role = iota
	// RoleManager: a manager (active or standby).
	RoleManager
	// RoleFrontend: a frontend (client APIs, sink edges).
	RoleFrontend
	// RoleSidecar: the sidecar of one model instance.
	RoleSidecar
	// RoleModelServer: a model server (the sidecar's backend).
	RoleModelServer
	// RoleSupervisor: the process that starts instances for recovery
	// (the instance agent of `hams up|demo|chaos`).
	RoleSupervisor
	// RoleNATS: a NATS server of the deployment.
	RoleNATS
	// RoleAdmin: operator tools (`hams bench`, `hams status`, tests).
	RoleAdmin
)

var roleNames = [...]string{
	RoleUnknown:     "unknown",
	RoleManager:     "manager",
	RoleFrontend:    "frontend",
	RoleSidecar:     "sidecar",
	RoleModelServer: "modelserver",
	RoleSupervisor:  "supervisor",
	RoleNATS:        "nats",
	RoleAdmin:       "admin",
}

func (r Role) String() string {
	if int(r) < len(roleNames) {
		return roleNames[r]
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// ParseRole is the inverse of Role.String (RoleUnknown is refused).
func ParseRole(s string) (Role, error) {
	for i, n := range roleNames {
		if i > 0 && n == s {
			return Role(i), nil
		}
	}
	return RoleUnknown, fmt.Errorf("%w: unknown role %q", ErrIdentity, s)
}

// Identity is who a certificate speaks for.
type Identity struct {
	Deployment string
	Role       Role
	// Model is the model a sidecar or model server serves (empty for
	// managers, frontends, supervisors, NATS servers and admins; a model
	// server hosting several models names the first and lists the rest
	// in Models).
	Model string
	// Models lists further models of a model server (encoded as
	// additional path segments after the instance: see URI).
	Models []string
	// Instance tells instances of one role apart ("a", "b", "0", a pod
	// name); may be empty.
	Instance string
}

// noSegment stands in for an empty model or instance in a URI.
const noSegment = "-"

func validSegment(s string) bool {
	if s == "" || s == noSegment || len(s) > 128 {
		return false
	}
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.', c == '@', c == ':':
		default:
			return false
		}
	}
	return true
}

// Validate checks that id can be written as a URI and read back.
func (id Identity) Validate() error {
	if !validSegment(id.Deployment) {
		return fmt.Errorf("%w: deployment %q (want 1-128 of [A-Za-z0-9._:@-])", ErrIdentity, id.Deployment)
	}
	if id.Role == RoleUnknown || int(id.Role) >= len(roleNames) {
		return fmt.Errorf("%w: role %v", ErrIdentity, id.Role)
	}
	if id.Model != "" && !validSegment(id.Model) {
		return fmt.Errorf("%w: model %q", ErrIdentity, id.Model)
	}
	if id.Instance != "" && !validSegment(id.Instance) {
		return fmt.Errorf("%w: instance %q", ErrIdentity, id.Instance)
	}
	if len(id.Models) > 0 && id.Model == "" {
		return fmt.Errorf("%w: further models without a first model", ErrIdentity)
	}
	for _, m := range id.Models {
		if !validSegment(m) {
			return fmt.Errorf("%w: model %q", ErrIdentity, m)
		}
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return noSegment
	}
	return s
}

// URI is id's SPIFFE ID:
// spiffe://hams/<deployment>/<role>/<model|->/<instance|->[/<model>...].
func (id Identity) URI() *url.URL {
	p := "/" + id.Deployment + "/" + id.Role.String() + "/" + orDash(id.Model) + "/" + orDash(id.Instance)
	for _, m := range id.Models {
		p += "/" + m
	}
	return &url.URL{Scheme: "spiffe", Host: TrustDomain, Path: p}
}

func (id Identity) String() string { return id.URI().String() }

// ServesModel reports whether id is a sidecar or model server of model.
func (id Identity) ServesModel(model string) bool {
	if id.Model == model {
		return true
	}
	for _, m := range id.Models {
		if m == model {
			return true
		}
	}
	return false
}

// ParseURI reads an identity from its SPIFFE ID.
func ParseURI(u *url.URL) (Identity, error) {
	if u == nil || u.Scheme != "spiffe" || u.Host != TrustDomain || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return Identity{}, fmt.Errorf("%w: %v is not a spiffe://%s ID", ErrIdentity, u, TrustDomain)
	}
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	if len(parts) < 4 {
		return Identity{}, fmt.Errorf("%w: %v: want /<deployment>/<role>/<model>/<instance>", ErrIdentity, u)
	}
	role, err := ParseRole(parts[1])
	if err != nil {
		return Identity{}, err
	}
	id := Identity{Deployment: parts[0], Role: role}
	if parts[2] != noSegment {
		id.Model = parts[2]
	}
	if parts[3] != noSegment {
		id.Instance = parts[3]
	}
	if len(parts) > 4 {
		id.Models = parts[4:]
	}
	if err := id.Validate(); err != nil {
		return Identity{}, fmt.Errorf("%v: %w", u, err)
	}
	return id, nil
}

// FromCertificate reads the identity of a certificate: its one spiffe URI
// SAN (a certificate with none or several has no identity).
func FromCertificate(c *x509.Certificate) (Identity, error) {
	var found *url.URL
	for _, u := range c.URIs {
		if u.Scheme != "spiffe" {
			continue
		}
		if found != nil {
			return Identity{}, fmt.Errorf("%w: certificate %q has several spiffe IDs", ErrIdentity, c.Subject.CommonName)
		}
		found = u
	}
	if found == nil {
		return Identity{}, fmt.Errorf("%w: certificate %q has no spiffe ID", ErrIdentity, c.Subject.CommonName)
	}
	return ParseURI(found)
}
