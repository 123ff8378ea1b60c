package harness

import (
	"fmt"
	"io"
	"slices"
	"sort"
)

// PrintRecoveryTable: rows services, columns modes; each cell the p50 (and
// count) of recovery_ms of the recovered kills, then the run's conflicts
// and lost requests.
func PrintRecoveryTable(w io.Writer, reps []ChaosReport) {
	var services, modes []string
	cell := map[[2]string]ChaosReport{}
	for _, r := range reps {
		if !slices.Contains(services, r.Service) {
			services = append(services, r.Service)
		}
		if !slices.Contains(modes, r.Mode) {
			modes = append(modes, r.Mode)
		}
		cell[[2]string{r.Service, r.Mode}] = r
	}
	sort.Strings(services)
	header := []any{"service"}
	for _, m := range modes {
		header = append(header, m)
	}
	tb := NewTable(1, header...)
	for _, s := range services {
		row := []any{s}
		for _, m := range modes {
			r, ok := cell[[2]string{s, m}]
			if !ok {
				row = append(row, "-")
				continue
			}
			// The p50 is the run's own (recovery_p50_ms), so the table
			// and the JSON it reads never disagree.
			recovered := 0
			for _, k := range r.Kills {
				if k.RecoveryMs >= 0 {
					recovered++
				}
			}
			p50 := "-"
			if recovered > 0 {
				p50 = fmt.Sprintf("%.0f", r.RecoveryP50Ms)
			}
			row = append(row, fmt.Sprintf("%s (%d/%d; %d, %d)", p50, recovered, len(r.Kills), r.Conflicts, r.Lost))
		}
		tb.AppendRow(row)
	}
	fmt.Fprintln(w, "recovery time at the client, p50 ms over the kills (kills recovered/made; conflicts, lost) - the shape of the HAMS paper's Table II")
	Render(w, tb, "")
}
