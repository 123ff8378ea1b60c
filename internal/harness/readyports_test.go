package harness

import (
	"slices"
	"testing"

	"github.com/hams-go/hams/internal/launch"
)

// A partition isolates a child's own listeners: the coordination engine's
// URL counts as one only in the engine's own ready line. In a manager's it
// is the server it connects to; isolating it cut every process off NATS.
func TestReadyPortsAreTheChildsOwnListeners(t *testing.T) {
	manager := launch.Ready{Fields: map[string]any{"role": "manager", "grpc": "127.0.0.1:40351",
		"metrics": "127.0.0.1:38541", "nats": "nats://127.0.0.1:39405", "deployment": "ap"}}
	if got := readyPorts(manager); !slices.Equal(got, []int{40351, 38541}) {
		t.Fatalf("manager's ports %v, want its grpc and metrics listeners only", got)
	}
	nats := launch.Ready{Fields: map[string]any{"role": "nats", "nats": "nats://127.0.0.1:39405", "store": "/tmp/js"}}
	if got := readyPorts(nats); !slices.Equal(got, []int{39405}) {
		t.Fatalf("NATS server's ports %v, want its client listener", got)
	}
	frontend := launch.Ready{Fields: map[string]any{"role": "frontend", "grpc": "127.0.0.1:1", "http": "127.0.0.1:2",
		"internal": "127.0.0.1:3", "metrics": "127.0.0.1:4"}}
	if got := readyPorts(frontend); !slices.Equal(got, []int{1, 3, 2, 4}) {
		t.Fatalf("frontend's ports %v", got)
	}
}
