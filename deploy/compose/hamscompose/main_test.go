package main

import (
	"os"
	"slices"
	"testing"

	"github.com/hams-go/hams/internal/config"
)

// The committed docker-compose.yml is the generator's output for
// examples/ap.yaml (make compose-gen rewrites it).
func TestComposeFileUpToDate(t *testing.T) {
	dep, err := config.Load("../../../examples/ap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	l, err := layoutOf(dep)
	if err != nil {
		t.Fatal(err)
	}
	l.cfgFile = cfgPath + "ap.yaml"
	have, err := os.ReadFile("../../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	if string(have) != l.compose("ap.yaml") {
		t.Fatal("docker-compose.yml is not the generator's output: run make compose-gen")
	}
	if len(l.pods) != 12 {
		t.Fatalf("%d pods for ap, want 12 (a primary per model, backup and spare per stateful model, a standby per stateless one)", len(l.pods))
	}
}

// A restarted instance joins as a spare under a new id; a manager keeps
// its role and takes a new lease id.
func TestRestartedArgs(t *testing.T) {
	sc := []string{"sidecar", "--model", "m", "--role", "primary", "--id", "sidecar/m/primary", "--epoch", "1"}
	got := restarted(sc, 2)
	want := []string{"sidecar", "--model", "m", "--role", "standby", "--id", "sidecar/m/primary.r2", "--epoch", "1"}
	if !slices.Equal(got, want) {
		t.Fatalf("sidecar: %q, want %q", got, want)
	}
	if sc[4] != "primary" {
		t.Fatal("restarted modified its input")
	}
	mgr := restarted([]string{"manager", "--id", "manager-0", "--role", "x"}, 1)
	if !slices.Equal(mgr, []string{"manager", "--id", "manager-0.r1", "--role", "x"}) {
		t.Fatalf("manager: %q", mgr)
	}
}
