package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/hams-go/hams/internal/pki"
)

// hams certs --config issues a loadable certificate per component of the
// deployment, each naming its identity, all under one CA it keeps.
func TestCertsCommand(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "issued.json")
	args := []string{"--dir", filepath.Join(dir, "certs"), "--config", "../../examples/ap.yaml", "--identity", "extra=sidecar/ap-motion/b", "--json", out}
	if err := runCerts(args); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var issued map[string]pki.Files
	if err := json.Unmarshal(b, &issued); err != nil {
		t.Fatal(err)
	}
	want := map[string]pki.Identity{
		"manager":              {Deployment: "ap", Role: pki.RoleManager},
		"sidecar-ap-motion":    {Deployment: "ap", Role: pki.RoleSidecar, Model: "ap-motion"},
		"modelserver-ap-drive": {Deployment: "ap", Role: pki.RoleModelServer, Model: "ap-drive"},
		"extra":                {Deployment: "ap", Role: pki.RoleSidecar, Model: "ap-motion", Instance: "b"},
	}
	for name, id := range want {
		f, ok := issued[name]
		if !ok {
			t.Fatalf("%s not issued (got %v)", name, issued)
		}
		src, err := pki.Load(f)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if src.Identity().String() != id.String() {
			t.Fatalf("%s names %v, want %v", name, src.Identity(), id)
		}
	}
	if fi, err := os.Stat(issued["manager"].Key); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode: %v %v", fi.Mode(), err)
	}
	// A second run keeps the CA (certificates issued before stay valid).
	ca1, _ := os.ReadFile(filepath.Join(dir, "certs", pki.CACertFile))
	if err := runCerts([]string{"--dir", filepath.Join(dir, "certs"), "--deployment", "ap", "--identity", "a=admin"}); err != nil {
		t.Fatal(err)
	}
	ca2, _ := os.ReadFile(filepath.Join(dir, "certs", pki.CACertFile))
	if string(ca1) != string(ca2) {
		t.Fatal("the CA was replaced")
	}
	if _, err := pki.Load(issued["manager"]); err != nil {
		t.Fatalf("an earlier certificate no longer loads: %v", err)
	}
}
