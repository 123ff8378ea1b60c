package pki

import (
	"os"
	"testing"
)

// An Issuer issues each name once (the same files afterwards, not
// rewritten), fills in the deployment, and its certificates load and
// verify under the CA it created.
func TestIssuerOncePerName(t *testing.T) {
	dir := t.TempDir()
	is, err := NewIssuer(dir, "ap", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	f1, err := is.Files("sidecar-a", Identity{Role: RoleSidecar, Model: "a"})
	if err != nil {
		t.Fatal(err)
	}
	st1, _ := os.Stat(f1.Cert)
	f2, err := is.Files("sidecar-a", Identity{Role: RoleSidecar, Model: "b"})
	if err != nil {
		t.Fatal(err)
	}
	st2, _ := os.Stat(f2.Cert)
	if f1 != f2 || !st1.ModTime().Equal(st2.ModTime()) {
		t.Fatalf("second issue of one name: %v then %v", f1, f2)
	}
	src, err := is.Source("admin", Identity{Role: RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	if id := src.Identity(); id.Deployment != "ap" || id.Role != RoleAdmin {
		t.Fatalf("issued identity %v", id)
	}
	if _, err := is.Files("bad", Identity{Role: RoleUnknown}); err == nil {
		t.Fatal("an invalid identity was issued")
	}
}
