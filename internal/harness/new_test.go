package harness

import (
	"errors"
	"testing"
	"time"

	"github.com/hams-go/hams/examples"
)

// The New constructors validate without I/O: a bad configuration is a
// usage error (exit code 2), a good one is accepted with its defaults set.
func TestNewValidates(t *testing.T) {
	bench := BenchConfig{Service: "olv", Modes: "bare,nspb", Batch: 64, Requests: 640, Warmup: -1, Rounds: 4,
		Load: "waves", Set: examples.SetPaper, Timeout: time.Second, Transports: "tls"}
	b, err := NewBench(bench)
	if err != nil {
		t.Fatalf("NewBench(valid): %v", err)
	}
	if b.c.Warmup != 128 {
		t.Errorf("default warm-up = %d, want max(2*64, 20) = 128", b.c.Warmup)
	}
	demo := DemoConfig{Mode: "nspb", Duration: 10 * time.Second, Concurrency: 4, Rows: 1, Timeout: time.Second}
	if _, err := NewDemo(demo); err != nil {
		t.Fatalf("NewDemo(valid): %v", err)
	}
	chaos := ChaosConfig{Mode: "nspb", Duration: 10 * time.Second, Concurrency: 4, Timeout: time.Second, Settle: time.Second}
	if _, err := NewChaos(chaos); err != nil {
		t.Fatalf("NewChaos(valid): %v", err)
	}
	late, err := parseKill("sidecar:ap-motion@20s")
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]func() error{
		"bench modes":     func() error { c := bench; c.Modes = "bare,bogus"; _, err := NewBench(c); return err },
		"bench empty":     func() error { c := bench; c.Modes = " , "; _, err := NewBench(c); return err },
		"bench transport": func() error { c := bench; c.Transports = "udp"; _, err := NewBench(c); return err },
		"bench batch":     func() error { c := bench; c.Batch = 5000; _, err := NewBench(c); return err },
		"bench load":      func() error { c := bench; c.Load = "open"; _, err := NewBench(c); return err },
		"bench examples":  func() error { c := bench; c.Set = "huge"; _, err := NewBench(c); return err },
		"demo mode":       func() error { c := demo; c.Mode = "fast"; _, err := NewDemo(c); return err },
		"demo rows":       func() error { c := demo; c.Rows = 0; _, err := NewDemo(c); return err },
		"demo late kill":  func() error { c := demo; c.Kills = killList{late}; _, err := NewDemo(c); return err },
		"chaos settle":    func() error { c := chaos; c.Settle = 0; _, err := NewChaos(c); return err },
		"chaos mode":      func() error { c := chaos; c.Mode = "fast"; _, err := NewChaos(c); return err },
	} {
		err := f()
		var ee *ExitError
		if !errors.As(err, &ee) || ee.Code != 2 {
			t.Errorf("%s: err %v, want a usage error (exit code 2)", name, err)
		}
	}
}
