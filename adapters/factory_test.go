package adapters

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/hams-go/hams/adapters/reference"
	"github.com/hams-go/hams/adapters/tfserving"
	"github.com/hams-go/hams/adapters/triton"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/cuda"
	"github.com/hams-go/hams/sidecar"
)

// The adapters that own a stateful model's state let the sidecar repeat
// an Infer whose answer was lost; the reference adapter, whose server
// holds the state, does not (the sidecar stops instead).
var (
	_ sidecar.RepeatableInfer = (*tfserving.Backend)(nil)
	_ sidecar.RepeatableInfer = (*triton.Stateful)(nil)
)

func TestReferenceInferNotRepeatable(t *testing.T) {
	if _, ok := any((*reference.Backend)(nil)).(sidecar.RepeatableInfer); ok {
		t.Fatal("the reference adapter's server holds the state: its Infer must not be repeatable")
	}
}

// TestNewBackendStateMemory: state_memory reaches the triton adapter; cuda
// without a usable driver fails at start, naming the model and why.
func TestNewBackendStateMemory(t *testing.T) {
	dep, err := config.Parse([]byte(`
name: t
hosts: [h1, h2]
models:
  - name: sys
    kind: lstm
    stateful: true
    backend: {type: triton, address: "127.0.0.1:1"}
    placement: {primary: h1, backup: h2}
  - name: gpu
    kind: lstm
    stateful: true
    backend: {type: triton, address: "127.0.0.1:1", state_memory: cuda}
    placement: {primary: h1, backup: h2}
services:
  - name: s
    edges: [[frontend, sys], [sys, gpu], [gpu, frontend]]
`))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	be, closeBE, err := New(dep, dep.Model("sys"), "127.0.0.1:1", "primary", log, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := be.(*triton.Stateful); !ok || s.StateMemory() != triton.MemorySystem {
		t.Fatalf("sys backend %T", be)
	}
	closeBE()
	be, closeBE, err = New(dep, dep.Model("gpu"), "127.0.0.1:1", "primary", log, nil)
	if cuda.Available() != nil {
		if err == nil || !strings.Contains(err.Error(), `model "gpu": backend state_memory cuda: cuda: driver unavailable`) {
			t.Fatalf("cuda without a driver: %v", err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer closeBE()
	if s, ok := be.(*triton.Stateful); !ok || s.StateMemory() != triton.MemoryCUDA {
		t.Fatalf("gpu backend %T", be)
	}
}
