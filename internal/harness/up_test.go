package harness

import (
	"testing"

	"github.com/hams-go/hams/internal/config"
)

// hams up keeps the file's mode: key unless --mode is given (before, the
// flag's default nspb replaced a file's bare, remus or replay silently).
func TestUpModeFromFileUnlessFlag(t *testing.T) {
	const y = `
name: t
mode: bare
models:
  - {name: a, kind: prep}
services:
  - name: s
    edges: [[frontend, a], [a, frontend]]
`
	for _, c := range []struct{ flag, want string }{{"", "bare"}, {"remus", "remus"}} {
		dep, err := config.Parse([]byte(y))
		if err != nil {
			t.Fatal(err)
		}
		applyModeFlag(dep, c.flag)
		if dep.Mode != c.want {
			t.Fatalf("--mode %q over a file with mode: bare: %q, want %q", c.flag, dep.Mode, c.want)
		}
	}
}
