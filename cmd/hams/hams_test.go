package main

import (
	"testing"

	"github.com/hams-go/hams/internal/config"
)

func TestDispatch(t *testing.T) {
	if dispatch([]string{"nope"}) != 2 || dispatch(nil) != 2 {
		t.Fatal("bad command exit codes")
	}
	if dispatch([]string{"chaos", "--mode", "replay", "--checkpoint-every", "-1"}) != 2 || dispatch([]string{"chaos", "--kinds", "router"}) != 2 || dispatch([]string{"chaos", "--frontends", "-1"}) != 2 ||
		dispatch([]string{"chaos", "--settle", "0s"}) != 2 {
		t.Fatal("chaos must refuse a negative checkpoint interval, unknown kinds and a zero settle time")
	}
	for _, args := range [][]string{
		{"demo", "--mode", "replay", "--checkpoint-every", "2000000"}, {"demo", "--mode", "zab"},
		{"sidecar", "--config", "x.yaml", "--model", "m", "--manager", "127.0.0.1:1", "--role", "witness"},
		{"modelserver", "--config", "x.yaml", "--models", "m", "--role", "witness"},
		{"sidecar", "--config", "x.yaml", "--model", "m", "--manager", "127.0.0.1:1", "--output-log-bytes", "-1"},
	} {
		if dispatch(args) != 2 {
			t.Errorf("%v: want exit 2", args)
		}
	}
}

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
