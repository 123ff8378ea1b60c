package pki

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestIdentityURIRoundTrip(t *testing.T) {
	for _, id := range []Identity{
		{Deployment: "ap", Role: RoleManager},
		{Deployment: "ap", Role: RoleSidecar, Model: "ap-motion", Instance: "b"},
		{Deployment: "d1", Role: RoleModelServer, Model: "m1", Models: []string{"m2", "m3"}},
		{Deployment: "d1", Role: RoleFrontend, Instance: "fe@127.0.0.1:80"},
	} {
		u := id.URI()
		back, err := ParseURI(u)
		if err != nil {
			t.Fatalf("%v: %v", u, err)
		}
		if back.String() != id.String() {
			t.Fatalf("round trip: %v -> %v", id, back)
		}
	}
	bad := []string{"https://hams/ap/manager/-/-", "spiffe://other/ap/manager/-/-", "spiffe://hams/ap/king/-/-", "spiffe://hams/ap/manager", "spiffe://hams/a%2Fb/manager/-/-", "spiffe://hams//manager/-/-"}
	for _, s := range bad {
		u, err := url.Parse(s)
		if err != nil {
			continue
		}
		if _, err := ParseURI(u); !errors.Is(err, ErrIdentity) {
			t.Errorf("%s: got %v, want ErrIdentity", s, err)
		}
	}
	if err := (Identity{Deployment: "a/b", Role: RoleAdmin}).Validate(); err == nil {
		t.Error("a deployment with a slash validated")
	}
}

func issue(t *testing.T, ca *CA, dir, name string, id Identity) *Source {
	t.Helper()
	f, err := ca.IssueFiles(dir, name, id, []string{"127.0.0.1", "localhost"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s, err := Load(f)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// handshake runs a TLS handshake between a client and a server config
// and returns the identity each saw, or the errors.
func handshake(t *testing.T, client, server *tls.Config) (seenByServer Identity, cerr, serr error) {
	t.Helper()
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := tls.Server(c2, server)
		serr = sc.Handshake()
		if serr == nil {
			seenByServer, serr = IdentityOf(sc.ConnectionState())
			_, _ = io.ReadAll(io.LimitReader(sc, 1)) // until the client closes
		} else {
			c2.Close()
		}
	}()
	cc := tls.Client(c1, client)
	cerr = cc.Handshake()
	c1.Close()
	<-done
	return seenByServer, cerr, serr
}

func TestMutualTLSByIdentity(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadOrCreateCA(dir, "ap", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	mgr := issue(t, ca, dir, "manager", Identity{Deployment: "ap", Role: RoleManager})
	sc := issue(t, ca, dir, "sidecar-m-a", Identity{Deployment: "ap", Role: RoleSidecar, Model: "m", Instance: "a"})
	seen, cerr, serr := handshake(t, mgr.ClientConfig(), sc.ServerConfig())
	if cerr != nil || serr != nil {
		t.Fatalf("handshake: client %v, server %v", cerr, serr)
	}
	if seen.Role != RoleManager || seen.Deployment != "ap" {
		t.Fatalf("server saw %v", seen)
	}

	// A client without a certificate is refused.
	noCert := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}
	if _, _, serr := handshake(t, noCert, sc.ServerConfig()); serr == nil {
		t.Fatal("server accepted a client without a certificate")
	}

	// A certificate of another CA is refused both ways.
	other := t.TempDir()
	ca2, err := LoadOrCreateCA(other, "ap", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	rogue := issue(t, ca2, other, "manager", Identity{Deployment: "ap", Role: RoleManager})
	rc := rogue.ClientConfig()
	rc.VerifyPeerCertificate = nil // the rogue client trusts anyone; the server must still refuse it
	if _, _, serr := handshake(t, rc, sc.ServerConfig()); serr == nil || !strings.Contains(serr.Error(), "unknown authority") {
		t.Fatalf("server accepted a rogue CA's client: %v", serr)
	}
	if _, cerr, _ := handshake(t, mgr.ClientConfig(), rogue.ServerConfig()); cerr == nil {
		t.Fatal("client accepted a rogue CA's server")
	}

	// Same CA, another deployment: refused.
	otherDep := issue(t, ca, dir, "manager-x", Identity{Deployment: "x", Role: RoleManager})
	oc := otherDep.ClientConfig()
	oc.VerifyPeerCertificate = nil
	if _, _, serr := handshake(t, oc, sc.ServerConfig()); serr == nil || !strings.Contains(serr.Error(), "deployment") {
		t.Fatalf("server accepted another deployment's client: %v", serr)
	}
}

func TestReloadOnChange(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadOrCreateCA(dir, "ap", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	id := Identity{Deployment: "ap", Role: RoleFrontend, Instance: "0"}
	s := issue(t, ca, dir, "fe", id)
	now := time.Now()
	s.now = func() time.Time { return now }
	before, _ := s.current()

	// Rotate: a new pair for the same identity, with a later mtime.
	if _, err := ca.IssueFiles(dir, "fe", id, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(2 * time.Second)
	for _, p := range []string{s.files.Cert, s.files.Key} {
		if err := os.Chtimes(p, later, later); err != nil {
			t.Fatal(err)
		}
	}
	if c, _ := s.current(); c != before {
		t.Fatal("reloaded before reloadEvery passed")
	}
	now = now.Add(reloadEvery)
	after, _ := s.current()
	if after == before {
		t.Fatal("certificate not reloaded after its files changed")
	}
	if err, n := s.LastReloadError(); err != nil || n != 1 {
		t.Fatalf("reload: err %v, count %d", err, n)
	}

	// A rotation to another identity is refused; the old one is kept.
	if _, err := ca.IssueFiles(dir, "fe", Identity{Deployment: "ap", Role: RoleManager}, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	later = later.Add(2 * time.Second)
	for _, p := range []string{s.files.Cert, s.files.Key} {
		_ = os.Chtimes(p, later, later)
	}
	now = now.Add(reloadEvery)
	if c, _ := s.current(); c != after {
		t.Fatal("identity change was loaded")
	}
	if err, _ := s.LastReloadError(); !errors.Is(err, ErrIdentity) {
		t.Fatalf("identity change: got %v", err)
	}
	if s.Identity().Role != RoleFrontend {
		t.Fatal("identity changed")
	}
}

func TestLoadRefusesMismatch(t *testing.T) {
	dir := t.TempDir()
	ca, _ := LoadOrCreateCA(dir, "ap", time.Now())
	a, err := ca.IssueFiles(dir, "a", Identity{Deployment: "ap", Role: RoleAdmin}, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ca.IssueFiles(dir, "b", Identity{Deployment: "ap", Role: RoleAdmin}, nil, time.Now())
	if _, err := Load(Files{CA: a.CA, Cert: a.Cert, Key: b.Key}); err == nil {
		t.Fatal("a certificate with another key loaded")
	}
	other := t.TempDir()
	LoadOrCreateCA(other, "ap", time.Now())
	if _, err := Load(Files{CA: filepath.Join(other, CACertFile), Cert: a.Cert, Key: a.Key}); err == nil || !strings.Contains(err.Error(), "not valid") {
		t.Fatalf("a certificate of another CA loaded: %v", err)
	}
}
