package natsd

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/hams-go/hams/internal/coord"
)

// Errors of credentials.
var (
	// ErrName is wrapped by the errors of a deployment or model name that
	// cannot be one token of a NATS subject.
	ErrName = errors.New("natsd: invalid name")
	// ErrRole is wrapped by the errors of an unknown role.
	ErrRole = errors.New("natsd: unknown role")
	// ErrCredentials is wrapped by the errors of unreadable or
	// inconsistent credential files.
	ErrCredentials = errors.New("natsd: bad credentials")
)

// Role is what a NATS user does in a deployment; Permissions says what
// each may publish and subscribe to.
type Role int

// Roles that connect to NATS.
const (
	// RoleManager: the managers (active and standbys) of a deployment.
	RoleManager Role = iota + 1
	// RoleFrontend: the frontends of a deployment.
	RoleFrontend
	// RoleSidecar: the sidecars of one model (primary and backups).
	RoleSidecar
	// RoleAdmin: operator tools (`hams` commands that read state).
	RoleAdmin
)

// Roles lists every role.
var Roles = []Role{RoleManager, RoleFrontend, RoleSidecar, RoleAdmin}

var roleNames = map[Role]string{
	RoleManager:  "manager",
	RoleFrontend: "frontend",
	RoleSidecar:  "sidecar",
	RoleAdmin:    "admin",
}

func (r Role) String() string {
	if n, ok := roleNames[r]; ok {
		return n
	}
	return fmt.Sprintf("Role(%d)", int(r))
}

// ParseRole is the inverse of Role.String.
func ParseRole(s string) (Role, error) {
	for r, n := range roleNames {
		if n == s {
			return r, nil
		}
	}
	return 0, fmt.Errorf("%w %q", ErrRole, s)
}

// MarshalText writes the role's name (users.json).
func (r Role) MarshalText() ([]byte, error) {
	if _, ok := roleNames[r]; !ok {
		return nil, fmt.Errorf("%w %d", ErrRole, int(r))
	}
	return []byte(r.String()), nil
}

// UnmarshalText reads a role's name.
func (r *Role) UnmarshalText(b []byte) error {
	v, err := ParseRole(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// Identity is one NATS user: a role in a deployment, and for a sidecar
// the model whose sidecars share it.
type Identity struct {
	Role       Role   `json:"role"`
	Deployment string `json:"deployment"`
	Model      string `json:"model,omitempty"`
}

func (id Identity) String() string {
	s := id.Role.String() + "/" + id.Deployment
	if id.Model != "" {
		s += "/" + id.Model
	}
	return s
}

// Validate checks that the role is known, that the names are single NATS
// subject tokens, and that exactly the sidecar role names a model.
func (id Identity) Validate() error {
	if _, ok := roleNames[id.Role]; !ok {
		return fmt.Errorf("%w %d", ErrRole, int(id.Role))
	}
	if err := checkToken("deployment", id.Deployment); err != nil {
		return err
	}
	switch {
	case id.Role == RoleSidecar:
		return checkToken("model", id.Model)
	case id.Model != "":
		return fmt.Errorf("%w: role %s names model %q (only sidecars have one)", ErrName, id.Role, id.Model)
	}
	return nil
}

// checkToken refuses a name that is not one subject token: empty, with
// '.', '*', '>', '/', whitespace or control characters. (Subjects and
// inbox prefixes embed the names: "hams.<deployment>.durable.<model>".)
func checkToken(what, s string) error {
	if s == "" {
		return fmt.Errorf("%w: empty %s name", ErrName, what)
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f || strings.ContainsRune(".*>/", r) {
			return fmt.Errorf("%w: %s name %q (no '.', '*', '>', '/', spaces or control characters)", ErrName, what, s)
		}
	}
	return nil
}

// InboxPrefix is the identity's own inbox prefix: replies to its requests
// (JetStream API answers, consumer deliveries, KV reads) go to subjects
// under it, and it may subscribe to nothing else of the kind, so no user
// reads another's replies (a sidecar cannot watch a frontend's request-log
// reads go by). Client.Options sets it (nats.CustomInboxPrefix).
func (id Identity) InboxPrefix() string {
	p := "_INBOX." + id.Deployment + "." + id.Role.String()
	if id.Model != "" {
		p += "." + id.Model
	}
	return p
}

// TopologyBucket is the manager's KV bucket of deployment dep (the
// topology key and the manager lease): coord.TopologyBucket, the one
// definition manager.BucketName uses too.
func TopologyBucket(dep string) string { return coord.TopologyBucket(dep) }

// perms accumulates allowed subjects.
type perms struct{ pub, sub []string }

const jsAPI = "$JS.API."

// info allows reading stream s's configuration and state (not its
// messages): coord.Bind looks every stream up.
func (p *perms) info(s string) { p.pub = append(p.pub, jsAPI+"STREAM.INFO."+s) }

// read allows reading stream s's messages: direct and API gets, and
// consumers (create, pull, info, delete, flow control of push consumers
// such as KV watchers).
func (p *perms) read(s string) {
	p.info(s)
	p.pub = append(p.pub,
		jsAPI+"STREAM.MSG.GET."+s,
		jsAPI+"DIRECT.GET."+s, jsAPI+"DIRECT.GET."+s+".>",
		jsAPI+"CONSUMER.CREATE."+s, jsAPI+"CONSUMER.CREATE."+s+".>",
		jsAPI+"CONSUMER.MSG.NEXT."+s+".>",
		jsAPI+"CONSUMER.INFO."+s+".>",
		jsAPI+"CONSUMER.DELETE."+s+".>",
		"$JS.FC."+s+".>",
	)
}

// admin allows creating and reconfiguring stream s (CreateOrUpdate), not
// reading or deleting it.
func (p *perms) admin(s string) {
	p.info(s)
	p.pub = append(p.pub, jsAPI+"STREAM.CREATE."+s, jsAPI+"STREAM.UPDATE."+s)
}

// purge allows purging stream s (by subject filter: the JetStream API
// cannot restrict the filter).
func (p *perms) purge(s string) { p.pub = append(p.pub, jsAPI+"STREAM.PURGE."+s) }

// Permissions is the permission table: what a user of role in deployment
// may publish and subscribe to (model: the sidecar's model, empty for the
// other roles). Everything is an allow list under the deployment's own
// names; whatever is not listed is refused with a permissions violation.
// docs/security.md ("NATS credentials and permissions") prints the table.
//
//   - every role: its own inbox (Identity.InboxPrefix), and STREAM.INFO of
//     the deployment's coordination streams (coord.Bind looks them up).
//   - manager: owns the topology bucket (topology key and manager lease):
//     creates, reads, writes, watches it. Creates and reconfigures the
//     coordination streams (coord.Open) without reading them.
//   - frontend: durability notices (read, subscribe); completion notices
//     (publish); the request log, reply records and frontends bucket
//     (read, write, subscribe to replies).
//   - sidecar of model M: durability notices (read and subscribe to all;
//     publish M's only); completion notices (read); mode replay: publish
//     M's input log, own (create, read, purge) the input log stream and
//     checkpoint store.
//   - admin: reads the topology bucket, the notices, the frontends bucket
//     and the replay state; writes nothing; no request log.
func Permissions(role Role, deployment, model string) (*server.Permissions, error) {
	id := Identity{Role: role, Deployment: deployment, Model: model}
	if err := id.Validate(); err != nil {
		return nil, err
	}
	d := deployment
	var (
		durable   = coord.DurableStream(d)
		completed = coord.CompletedStream(d)
		requests  = coord.RequestsStream(d)
		replies   = coord.RepliesStream(d)
		frontends = coord.FrontendsBucket(d)
		replay    = coord.ReplayStream(d)
		ckpt      = coord.CheckpointBucket(d)
		topology  = TopologyBucket(d)
	)
	p := &perms{sub: []string{id.InboxPrefix() + ".>"}}
	for _, s := range []string{durable, completed, requests, replies, "KV_" + frontends} {
		p.info(s)
	}
	allDurable := coord.DurableSubject(d, "*")
	allLive := coord.LiveSubject(d, "*")
	switch role {
	case RoleManager:
		p.pub = append(p.pub, jsAPI+"INFO") // account info: KV creation reads it
		p.admin("KV_" + topology)
		p.read("KV_" + topology)
		p.pub = append(p.pub, "$KV."+topology+".>")
		for _, s := range []string{durable, completed, requests, replies, "KV_" + frontends} {
			p.admin(s)
		}
	case RoleFrontend:
		p.read(durable)
		p.sub = append(p.sub, allDurable, allLive)
		p.pub = append(p.pub, coord.CompletedSubject(d))
		p.read(requests)
		p.read(replies)
		p.pub = append(p.pub, coord.RequestsSubject(d)+".>", coord.RepliesSubject(d)+".>")
		p.sub = append(p.sub, coord.RepliesSubject(d)+".r.*")
		p.read("KV_" + frontends)
		p.pub = append(p.pub, "$KV."+frontends+".>")
	case RoleSidecar:
		p.read(durable)
		p.sub = append(p.sub, allDurable, allLive)
		p.pub = append(p.pub, coord.DurableSubject(d, model), coord.LiveSubject(d, model))
		p.read(completed)
		p.pub = append(p.pub, jsAPI+"INFO") // account info: object store creation reads it
		for _, s := range []string{replay, "OBJ_" + ckpt} {
			p.admin(s)
			p.read(s)
			p.purge(s)
		}
		p.pub = append(p.pub, coord.ReplaySubject(d, model)+".>", "$O."+ckpt+".>")
	case RoleAdmin:
		p.read("KV_" + topology)
		p.read(durable)
		p.sub = append(p.sub, allDurable, allLive)
		p.read(completed)
		p.read("KV_" + frontends)
		p.read(replay)
		p.read("OBJ_" + ckpt)
	}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: dedup(p.pub)},
		Subscribe: &server.SubjectPermission{Allow: dedup(p.sub)},
	}, nil
}

func dedup(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}

// User is one NATS user: an identity and its public nkey.
type User struct {
	Identity
	NKey string `json:"nkey"`
}

// Auth is the users a server accepts (Config.Auth); a connection with any
// other key, or none, is refused.
type Auth struct {
	Users []User
}

// NkeyUsers returns the server's users, each with Permissions of its
// identity.
func (a *Auth) NkeyUsers() ([]*server.NkeyUser, error) {
	if a == nil || len(a.Users) == 0 {
		return nil, fmt.Errorf("%w: no users", ErrCredentials)
	}
	seen := map[string]bool{}
	out := make([]*server.NkeyUser, 0, len(a.Users))
	for _, u := range a.Users {
		if !nkeys.IsValidPublicUserKey(u.NKey) {
			return nil, fmt.Errorf("%w: user %s: %q is not a user public nkey", ErrCredentials, u.Identity, u.NKey)
		}
		if seen[u.NKey] {
			return nil, fmt.Errorf("%w: user %s: nkey %s given twice", ErrCredentials, u.Identity, u.NKey)
		}
		seen[u.NKey] = true
		p, err := Permissions(u.Role, u.Deployment, u.Model)
		if err != nil {
			return nil, fmt.Errorf("natsd: permissions of %s: %w", u.Identity, err)
		}
		out = append(out, &server.NkeyUser{Nkey: u.NKey, Permissions: p})
	}
	return out, nil
}

// Merge returns the users of a and all of others (several deployments on
// one server).
func (a *Auth) Merge(others ...*Auth) *Auth {
	m := &Auth{Users: slices.Clone(a.Users)}
	for _, o := range others {
		m.Users = append(m.Users, o.Users...)
	}
	return m
}

// UsersFile is the file in a credentials directory that lists its users'
// identities and public keys (what a server needs; no secrets).
const UsersFile = "users.json"

type usersFile struct {
	Deployment string `json:"deployment"`
	Users      []User `json:"users"`
}

// SeedFile is the seed file of id in credentials directory dir:
// "<role>.nk", or "sidecar-<model>.nk".
func SeedFile(dir string, id Identity) string {
	name := id.Role.String()
	if id.Model != "" {
		name += "-" + id.Model
	}
	return filepath.Join(dir, name+".nk")
}

// GenerateCredentials creates one user nkey per role of deployment (one
// per model for sidecars), writes each seed to SeedFile (mode 0600) and
// the users' identities and public keys to UsersFile in dir (created
// 0700 if missing), and returns the users. It refuses to overwrite
// existing credentials (the error wraps fs.ErrExist): a restarted server
// loads them with LoadAuth instead, so running components keep theirs.
func GenerateCredentials(dir, deployment string, models []string) (*Auth, error) {
	ids := []Identity{{Role: RoleManager, Deployment: deployment}, {Role: RoleFrontend, Deployment: deployment}, {Role: RoleAdmin, Deployment: deployment}}
	seenModel := map[string]bool{}
	for _, m := range models {
		if seenModel[m] {
			continue
		}
		seenModel[m] = true
		ids = append(ids, Identity{Role: RoleSidecar, Deployment: deployment, Model: m})
	}
	for _, id := range ids {
		if err := id.Validate(); err != nil {
			return nil, fmt.Errorf("natsd: credentials of %s: %w", id, err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("natsd: credentials directory: %w", err)
	}
	if _, err := os.Stat(filepath.Join(dir, UsersFile)); err == nil {
		return nil, fmt.Errorf("natsd: credentials in %s: %w", dir, os.ErrExist)
	}
	auth := &Auth{}
	for _, id := range ids {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, fmt.Errorf("natsd: create nkey of %s: %w", id, err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return nil, fmt.Errorf("natsd: public key of %s: %w", id, err)
		}
		seed, err := kp.Seed()
		if err != nil {
			return nil, fmt.Errorf("natsd: seed of %s: %w", id, err)
		}
		err = writeExclusive(SeedFile(dir, id), append(seed, '\n'))
		wipe(seed)
		kp.Wipe()
		if err != nil {
			return nil, fmt.Errorf("natsd: write seed of %s: %w", id, err)
		}
		auth.Users = append(auth.Users, User{Identity: id, NKey: pub})
	}
	b, err := json.MarshalIndent(usersFile{Deployment: deployment, Users: auth.Users}, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("natsd: encode %s: %w", UsersFile, err)
	}
	if err := writeExclusive(filepath.Join(dir, UsersFile), append(b, '\n')); err != nil {
		return nil, fmt.Errorf("natsd: write %s: %w", UsersFile, err)
	}
	return auth, nil
}

func writeExclusive(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func wipe(b []byte) {
	for i := range b {
		b[i] = 'x'
	}
}

// maxUsersFile bounds a users file read (a deployment has a handful of
// users; this is far above any real one).
const maxUsersFile = 4 << 20

// LoadAuth reads the users of the credentials directories written by
// GenerateCredentials (one per deployment the server serves); it reads
// only UsersFile, never a seed.
func LoadAuth(dirs ...string) (*Auth, error) {
	auth := &Auth{}
	for _, dir := range dirs {
		path := filepath.Join(dir, UsersFile)
		b, err := readBounded(path, maxUsersFile)
		if err != nil {
			return nil, fmt.Errorf("natsd: read users: %w", err)
		}
		var uf usersFile
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&uf); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrCredentials, path, err)
		}
		for _, u := range uf.Users {
			if u.Deployment != uf.Deployment {
				return nil, fmt.Errorf("%w: %s: user %s is not of deployment %q", ErrCredentials, path, u.Identity, uf.Deployment)
			}
			if err := u.Validate(); err != nil {
				return nil, fmt.Errorf("%w: %s: user %s: %v", ErrCredentials, path, u.Identity, err)
			}
		}
		auth.Users = append(auth.Users, uf.Users...)
	}
	if _, err := auth.NkeyUsers(); err != nil {
		return nil, err
	}
	return auth, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%w: %s: over %d bytes", ErrCredentials, path, limit)
	}
	return b, nil
}

// EnsureCredentials returns the credentials of deployment in dir,
// generating them (GenerateCredentials) when dir has none: `hams up` and
// `hams demo` call it for their run directory, so a restarted supervisor
// keeps the keys its running children hold. Existing credentials must be
// of deployment and have a sidecar user for each of models.
func EnsureCredentials(dir, deployment string, models []string) (*Auth, error) {
	if _, err := os.Stat(filepath.Join(dir, UsersFile)); errors.Is(err, os.ErrNotExist) {
		return GenerateCredentials(dir, deployment, models)
	}
	a, err := LoadAuth(dir)
	if err != nil {
		return nil, err
	}
	have := map[Identity]bool{}
	for _, u := range a.Users {
		have[u.Identity] = true
	}
	want := []Identity{{Role: RoleManager, Deployment: deployment}, {Role: RoleFrontend, Deployment: deployment}, {Role: RoleAdmin, Deployment: deployment}}
	for _, m := range models {
		want = append(want, Identity{Role: RoleSidecar, Deployment: deployment, Model: m})
	}
	for _, id := range want {
		if !have[id] {
			return nil, fmt.Errorf("%w: %s has no user %s (credentials of another deployment, or a model added since: remove the directory to generate new ones)", ErrCredentials, dir, id)
		}
	}
	return a, nil
}
