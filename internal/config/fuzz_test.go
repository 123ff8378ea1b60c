package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"gopkg.in/yaml.v3"
)

// FuzzConfigYAML parses arbitrary YAML as a deployment file: no panic; an
// error wraps ErrInvalid; a deployment accepted writes out (what a
// deployment hands its child processes) to YAML that parses to the same
// deployment, and writing that out again gives the same bytes.
func FuzzConfigYAML(f *testing.F) {
	files, _ := filepath.Glob("../../examples/*.yaml")
	for _, p := range files {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(good))
	f.Add([]byte("models: [{name: a, kind: prep}]\nlimits: {max_rows_per_request: 3, reject_non_finite: false}\n"))
	f.Add([]byte("a: &x [*x, *x]\n"))
	f.Add([]byte("models:\n  - name: a\n    kind: lstm\n    stateful: true\n    reject_non_finite: true\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 64<<10 {
			return
		}
		d, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		out, err := yaml.Marshal(d)
		if err != nil {
			t.Fatalf("write an accepted deployment: %v", err)
		}
		d2, err := Parse(out)
		if err != nil {
			t.Fatalf("parse(write(x)): %v\n%s", err, out)
		}
		out2, err := yaml.Marshal(d2)
		if err != nil {
			t.Fatal(err)
		}
		if string(out2) != string(out) {
			t.Fatalf("parse(write(x)) differs:\n%s\nvs\n%s", out, out2)
		}
	})
}
