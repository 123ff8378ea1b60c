package main

import (
	"encoding/json"
	"fmt"
	"os"

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
		return harness.Usagef(usage)
	}
	var reps []harness.ChaosReport
	for _, p := range args[1:] {
		b, err := os.ReadFile(p)
		if err != nil {
			return harness.Usagef("report: %v", err)
		}
		var r harness.ChaosReport
		if err := json.Unmarshal(b, &r); err != nil {
			return harness.Usagef("report: %s: %v", p, err)
		}
		reps = append(reps, r)
	}
	harness.PrintRecoveryTable(os.Stdout, reps)
	return nil
}

func reportBench(args []string) error {
	var plotPath string
	if len(args) >= 2 && args[0] == "--plot" {
		plotPath, args = args[1], args[2:]
	}
	if len(args) == 0 {
		return harness.Usagef("report bench: no BENCH.json given")
	}
	var rows []harness.BenchRow
	for _, p := range args {
		b, err := os.ReadFile(p)
		if err != nil {
			return harness.Usagef("report: %v", err)
		}
		var rs []harness.BenchRow
		if err := json.Unmarshal(b, &rs); err != nil {
			return harness.Usagef("report: %s: %v", p, err)
		}
		rows = append(rows, rs...)
	}
	harness.PrintOverheads(os.Stdout, rows)
	if plotPath != "" {
		if err := harness.PlotBench(plotPath, rows); err != nil {
			return fmt.Errorf("report: plot: %w", err)
		}
	}
	return nil
}
