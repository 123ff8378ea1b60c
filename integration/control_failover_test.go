package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestControlPlaneKillStall checks the takeover paths of docs/recovery.md
// ("Frontend and manager failover") against the target of issue 18 item
// 6: five SIGKILLs of the leading frontend and one of the active manager
// in one demo run; the median client-visible stall of the frontend kills
// (the report's recovery_ms: the first reply to a client of the killed
// frontend after the kill) must be at most 100 ms, and the manager kill's
// at most 250 ms (one sample on a loaded 2-core machine; the data path
// never calls the manager, so this is the next request's latency).
// Measured with the fast takeover: 20-60 ms per frontend kill; without it
// (the next frontend scans the log back a request timeout, or waits for
// the restarted one) 250-880 ms, median 846.
//
// The targets are held with HAMS_STRICT_TIMING=1 (make chaos-timing, on
// a quiet machine). The default suite runs beside other test binaries on
// CI's two cores, where a scheduling stall alone can take 100 ms, so it
// holds the bounds that still tell the fast takeover from the slow one
// (p50 200 ms, manager 500 ms): the slow path's median was 846 ms.
func TestControlPlaneKillStall(t *testing.T) {
	frontendP50Ms, managerMs := 200.0, 500.0
	if os.Getenv("HAMS_STRICT_TIMING") != "" {
		frontendP50Ms, managerMs = 100, 250
	}
	const frontendKills = 5
	out := filepath.Join(t.TempDir(), "out.json")
	args := []string{"demo", "--service", "ap", "--duration", "12s", "--suspicion-timeout", suspicion}
	for i := range frontendKills {
		args = append(args, "--kill", fmt.Sprintf("frontend@%dms", 2500+1500*i))
	}
	args = append(args, "--kill", "manager@10500ms", "--json", out)
	r := runHams(t, 150*time.Second, args...)
	if r.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	d := readDemo(t, out)
	if *d.Errors != 0 || d.Incorrect != 0 || *d.Replies == 0 {
		t.Fatalf("errors %d, incorrect %d, replies %d\nstdout:\n%s", *d.Errors, d.Incorrect, *d.Replies, r.stdout)
	}
	var frontend, manager []float64
	for _, k := range d.Kills {
		if !k.Recovered || k.RecoveryMs < 0 {
			t.Fatalf("kill %+v: no reply after it\nstdout:\n%s", k, r.stdout)
		}
		switch k.Kind {
		case "frontend":
			frontend = append(frontend, k.RecoveryMs)
		case "manager":
			manager = append(manager, k.RecoveryMs)
		default:
			t.Fatalf("kill %+v: unexpected kind", k)
		}
	}
	if len(frontend) != frontendKills || len(manager) != 1 {
		t.Fatalf("kills %+v: want %d frontend kills and 1 manager kill", d.Kills, frontendKills)
	}
	slices.Sort(frontend)
	if p50 := frontend[len(frontend)/2]; p50 > frontendP50Ms {
		t.Errorf("leading-frontend kills: client-visible stall p50 %.0f ms (all %v), want at most %.0f ms", p50, frontend, frontendP50Ms)
	}
	if manager[0] > managerMs {
		t.Errorf("active-manager kill: client-visible stall %.0f ms, want at most %.0f ms", manager[0], managerMs)
	}
	t.Logf("client-visible stall: frontend kills %v ms (p50 %.0f), manager kill %v ms", frontend, frontend[len(frontend)/2], manager)
}
