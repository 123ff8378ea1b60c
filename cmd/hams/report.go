package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"

	"github.com/hams-go/hams/internal/harness"
)

// runReport prints tables from the JSON reports of earlier runs:
//
//	hams report recovery CHAOS.json...  the shape of the HAMS paper's
//	  Table II: per service, the p50 recovery time at the client of each
//	  mode's kills (one `hams chaos --kinds primary` per service and mode).
//	hams report bench [--plot PNG] BENCH.json...  the overhead table (the
//	  shape of Table I) of one or more `hams bench --json` files, and their
//	  plot in one picture (e.g. batch 1, 16 and 64 side by side).
func runReport(args []string) error {
	const usage = "report: usage: hams report recovery CHAOS.json... | hams report bench [--plot PNG] BENCH.json..."
	if len(args) >= 2 && args[0] == "bench" {
		return reportBench(args[1:])
	}
	if len(args) < 2 || args[0] != "recovery" {
		return usageErr(usage)
	}
	var reps []chaosReport
	for _, p := range args[1:] {
		b, err := os.ReadFile(p)
		if err != nil {
			return usageErr("report: %v", err)
		}
		var r chaosReport
		if err := json.Unmarshal(b, &r); err != nil {
			return usageErr("report: %s: %v", p, err)
		}
		reps = append(reps, r)
	}
	printRecoveryTable(os.Stdout, reps)
	return nil
}

func reportBench(args []string) error {
	var plotPath string
	if len(args) >= 2 && args[0] == "--plot" {
		plotPath, args = args[1], args[2:]
	}
	if len(args) == 0 {
		return usageErr("report bench: no BENCH.json given")
	}
	var rows []benchRow
	for _, p := range args {
		b, err := os.ReadFile(p)
		if err != nil {
			return usageErr("report: %v", err)
		}
		var rs []benchRow
		if err := json.Unmarshal(b, &rs); err != nil {
			return usageErr("report: %s: %v", p, err)
		}
		rows = append(rows, rs...)
	}
	printOverheads(os.Stdout, rows)
	if plotPath != "" {
		if err := plotBench(plotPath, rows); err != nil {
			return fmt.Errorf("report: plot: %w", err)
		}
	}
	return nil
}

// printRecoveryTable: rows services, columns modes; each cell the p50 (and
// count) of recovery_ms of the recovered kills, then the run's conflicts
// and lost requests.
func printRecoveryTable(w io.Writer, reps []chaosReport) {
	var services, modes []string
	cell := map[[2]string]chaosReport{}
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
	tb := harness.NewTable(1, header...)
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
	harness.Render(w, tb, "")
}
