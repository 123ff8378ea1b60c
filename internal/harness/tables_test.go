package harness

import (
	"bytes"
	"strings"
	"testing"
)

// The human tables keep their content: every header and cell, one row
// per line, columns aligned.
func TestTables(t *testing.T) {
	var b bytes.Buffer
	printBench(&b, []BenchRow{
		{Service: "ap", Mode: "bare", Batch: 1, Requests: 400, P50Ms: 2.25, Hops: 3},
		{Service: "ap", Mode: "direct", Batch: 1, Requests: 400, P50Ms: 1.25, P99Ms: 2, MeanMs: 1.3, ThroughputRPS: 800, Hops: 3},
		{Service: "ap", Mode: "nspb", Batch: 1, Requests: 400, P50Ms: 3.5, P99Ms: 7.25, MeanMs: 3.75, ThroughputRPS: 250.55, Errors: 2, Hops: 3},
	})
	PrintOverheads(&b, []BenchRow{
		{Service: "ap", Mode: "bare", Batch: 16, P50Ms: 2},
		{Service: "ap", Mode: "nspb", Batch: 16, P50Ms: 3},
	})
	PrintRecoveryTable(&b, []ChaosReport{{Service: "ap", Mode: "nspb", Kills: []killReport{{RecoveryMs: 120}, {RecoveryMs: -1}}, RecoveryP50Ms: 120, Conflicts: 0, Lost: 1}})
	out := b.String()
	for _, want := range []string{
		"service  mode    batch  requests  p50_ms  p99_ms  mean_ms  thr_rps  errors  lin_ms/b  gate_ms\n",
		"ap       nspb        1       400   3.500   7.250    3.750    250.6       2         -        -\n",
		"added_p50/hop_ms", "0.250\n", "Table I", "3.00 (+50.0%)", "Table II", "120 (1/2; 0, 1)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("tables lack %q", want)
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimRight(l, " ") != l {
			t.Errorf("trailing blanks: %q", l)
		}
	}
}
