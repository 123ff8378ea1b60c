package cluster

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/hams-go/hams/adapters"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/refserver/models"
)

const depManaged = `
name: m
hosts: [h1, h2]
models:
  - name: a
    kind: classifier
    backend: {type: triton}
  - name: b
    kind: classifier
    backend: {type: tfserving, address: "tf:8500"}
  - name: c
    kind: classifier
    backend: {type: clipper}
services:
  - name: s1
    edges: [[frontend, a], [a, frontend]]
  - name: s2
    edges: [[frontend, b], [b, c], [c, frontend]]
`

func TestParseDeploymentManagedBackends(t *testing.T) {
	d, err := ParseDeployment([]byte(depManaged))
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := d.Model("a"), d.Model("b"), d.Model("c")
	if !adapters.Managed(a) || ExternalAddr(a) != "" {
		t.Fatalf("a: %+v", a.Backend)
	}
	if adapters.Managed(b) || ExternalAddr(b) != "tf:8500" {
		t.Fatalf("b: %+v", b.Backend)
	}
	if !adapters.Managed(c) {
		t.Fatalf("c: %+v", c.Backend)
	}
	if args, key := backendArgs(c, nil); args[0] != "clipper-stub" || key != "http" {
		t.Fatalf("clipper backend args %v %s", args, key)
	}
	if args, key := backendArgs(a, nil); args[0] != "modelserver" || key != "grpc" {
		t.Fatalf("triton backend args %v %s", args, key)
	}
	// The effective deployment the children load round-trips.
	path := t.TempDir() + "/dep.yaml"
	if err := WriteDeployment(d, path); err != nil {
		t.Fatal(err)
	}
	back, err := LoadDeployment(path)
	if err != nil || !adapters.Managed(back.Model("a")) {
		t.Fatalf("reload: %v", err)
	}
	// A managed backend runs the model's kind: no kind, no deployment.
	_, err = ParseDeployment([]byte(strings.Replace(depManaged, "  - name: a\n    kind: classifier\n", "  - name: a\n", 1)))
	if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), `model "a"`) {
		t.Fatalf("managed backend without kind: %v", err)
	}
	// Other errors still come from config.Parse.
	if _, err := ParseDeployment([]byte("name: x\nmodels: []\n")); !errors.Is(err, config.ErrInvalid) {
		t.Fatalf("no models: %v", err)
	}
	if _, err := ParseDeployment([]byte("name: [")); err == nil {
		t.Fatal("bad YAML accepted")
	}
}

func TestOnlyService(t *testing.T) {
	d, err := ParseDeployment([]byte(depManaged))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := OnlyService(d, "s2")
	if err != nil {
		t.Fatal(err)
	}
	if len(s2.Services) != 1 || len(s2.Models) != 2 || s2.Model("a") != nil {
		t.Fatalf("s2: %v, %d models", s2.ServiceNames(), len(s2.Models))
	}
	if err := s2.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := OnlyService(d, "nope"); err == nil {
		t.Fatal("unknown service accepted")
	}
}

func TestExampleFilesWithManagedBackends(t *testing.T) {
	for _, f := range []string{"../../examples/triton-lstm.yaml", "../../examples/adapters.yaml"} {
		d, err := LoadDeployment(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for i := range d.Models {
			m := &d.Models[i]
			if !adapters.Managed(m) {
				t.Fatalf("%s: %s has an external backend", f, m.Name)
			}
			if _, err := models.New(m); err != nil {
				t.Fatalf("%s: %s: %v", f, m.Name, err)
			}
		}
	}
	if _, err := LoadDeployment("no-such-file.yaml"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	d, _ := LoadDeployment("../../examples/triton-lstm.yaml")
	m := d.Model("tl-seq")
	if st, err := m.ParamString("state", ""); err != nil || !m.Stateful || m.Backend.Type != "triton" || st != "explicit" {
		t.Fatalf("tl-seq: %+v", m)
	}
}
