package harness

import (
	"bytes"
	"math"
	"os"
	"strings"
	"testing"
)

// A /proc/<pid>/stat line whose command name holds spaces and a ')':
// the fields are counted after the last ')' (utime 1234, stime 566 ticks).
const statLine = "4242 (hams (x) y) S 1 4242 4242 0 -1 4194560 1500 0 0 0 1234 566 0 0 20 0 12 0 100 2000000 500 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"

func TestParseProcStat(t *testing.T) {
	got, err := parseProcStat([]byte(statLine))
	if err != nil {
		t.Fatal(err)
	}
	if want := (1234.0 + 566.0) / clockTicks; got != want {
		t.Errorf("parseProcStat = %v s, want %v s", got, want)
	}
	for _, bad := range []string{"", "4242 hams S 1", "4242 (hams) S 1 2 3", "4242 (hams) S 1 4242 4242 0 -1 4194560 1500 0 0 0 x 566 0"} {
		if _, err := parseProcStat([]byte(bad)); err == nil {
			t.Errorf("parseProcStat(%q): no error", bad)
		}
	}
}

// TestProcCPUSecondsOfSelf reads this process's own /proc stat: it must
// parse, and grow (never shrink) after some work.
func TestProcCPUSecondsOfSelf(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	before, err := procCPUSeconds(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	b := bytes.Repeat([]byte{1}, 1<<20)
	for range 200 {
		_ = bytes.Count(b, []byte{2})
	}
	after, err := procCPUSeconds(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after < before {
		t.Errorf("CPU time went down: %v -> %v", before, after)
	}
}

func TestCPUAccPerRoleAndPerMB(t *testing.T) {
	a := cpuAcc{}
	a.add(cpuSample{"sidecar:m": 1.0, "sidecar:n": 2.0, "backup-sidecar:m": 0.5, "frontend:0": 3, clientProc: 10, "gone": 1},
		cpuSample{"sidecar:m": 1.6, "sidecar:n": 2.2, "backup-sidecar:m": 0.9, "frontend:0": 3.2, clientProc: 10.4, "new": 7})
	// A restarted process (time went down) adds nothing.
	a.add(cpuSample{"sidecar:m": 1.6, "frontend:0": 9}, cpuSample{"sidecar:m": 2.0, "frontend:0": 0.1})
	near := func(x, y float64) bool { return math.Abs(x-y) < 1e-9 }
	if !near(a["sidecar:m"], 1.0) || !near(a["frontend:0"], 0.2) || a["new"] != 0 || a["gone"] != 0 {
		t.Fatalf("accumulated %v", a)
	}
	got := a.msPerRequest(100)
	want := map[string]float64{"sidecar": 12, "backup-sidecar": 4, "frontend": 2, clientProc: 4, "total": 22}
	for k, v := range want {
		if !near(got[k], v) {
			t.Errorf("msPerRequest[%s] = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
	if a.msPerRequest(0) != nil {
		t.Error("msPerRequest(0) must be nil")
	}
	if !near(a.ofChild("sidecar", "m"), 1.0) || !near(a.ofChild("backup-sidecar", "m"), 0.4) {
		t.Errorf("ofChild: %v %v", a.ofChild("sidecar", "m"), a.ofChild("backup-sidecar", "m"))
	}
	// 1 CPU second over 500 MB is 2 ms per MB; a 6 667 MB/s memcpy costs 0.15 ms per MB.
	if v := cpuMsPerMB(1, 500e6); !near(v, 2) {
		t.Errorf("cpuMsPerMB = %v, want 2", v)
	}
	if cpuMsPerMB(1, 0) != 0 || memcpyMsPerMB(0) != 0 {
		t.Error("no bytes or no bandwidth: want 0")
	}
	if v := memcpyMsPerMB(8000); !near(v, 0.125) {
		t.Errorf("memcpyMsPerMB(8000) = %v, want 0.125", v)
	}
}

func TestPrintCPUAndReplication(t *testing.T) {
	rows := []BenchRow{
		{Service: "olv", Mode: "bare", Batch: 64, CPUMsPerRequest: map[string]float64{"sidecar": 1, "total": 3, "weird": 1}, MemcpyMsPerMB: 0.15},
		{Service: "olv", Mode: "nspb", Batch: 64, CPUMsPerRequest: map[string]float64{"sidecar": 2, "backup-sidecar": 1, "total": 5}, MemcpyMsPerMB: 0.15,
			State: map[string]stateStats{"olv-learner": {ReplicatedMB: 100, PrimaryCPUMsPerMB: 2.4, BackupCPUMsPerMB: 0.9}}},
	}
	if got := strings.Join(cpuRoles(rows), ","); got != "sidecar,backup-sidecar,total,weird" {
		t.Errorf("cpuRoles = %s", got)
	}
	var b strings.Builder
	printCPU(&b, rows)
	printReplicationCPU(&b, rows)
	out := b.String()
	for _, want := range []string{"backup-sidecar", "olv-learner", "2.400", "16.0", "6.0", "0.1500"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestCounterIncreaseAcrossReset(t *testing.T) {
	for _, c := range []struct{ before, after, want float64 }{
		{10, 25, 15},
		{10, 10, 0},
		{40e6, 3e6, 3e6}, // the process restarted: 3 MB since
	} {
		if got := counterIncrease(c.before, c.after); got != c.want {
			t.Errorf("counterIncrease(%v, %v) = %v, want %v", c.before, c.after, got, c.want)
		}
	}
}
