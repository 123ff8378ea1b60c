package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
)

// runReport prints tables from the JSON reports of earlier runs:
//
//	hams report recovery CHAOS.json...  the shape of the HAMS paper's
//	  Table II: per service, the p50 recovery time at the client of each
//	  mode's kills (one `hams chaos --kinds primary` per service and mode).
func runReport(args []string) error {
	if len(args) < 2 || args[0] != "recovery" {
		return usageErr("report: usage: hams report recovery CHAOS.json...")
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
	fmt.Fprintf(w, "recovery time at the client, p50 ms over the kills (kills recovered/made; conflicts, lost) - the shape of the HAMS paper's Table II\n%-8s", "service")
	for _, m := range modes {
		fmt.Fprintf(w, " %30s", m)
	}
	fmt.Fprintln(w)
	for _, s := range services {
		fmt.Fprintf(w, "%-8s", s)
		for _, m := range modes {
			r, ok := cell[[2]string{s, m}]
			if !ok {
				fmt.Fprintf(w, " %30s", "-")
				continue
			}
			var lat []float64
			for _, k := range r.Kills {
				if k.RecoveryMs >= 0 {
					lat = append(lat, k.RecoveryMs)
				}
			}
			p50 := "-"
			if len(lat) > 0 {
				sort.Float64s(lat)
				p50 = fmt.Sprintf("%.0f", lat[len(lat)/2])
			}
			fmt.Fprintf(w, " %30s", fmt.Sprintf("%s (%d/%d; %d, %d)", p50, len(lat), len(r.Kills), r.Conflicts, r.Lost))
		}
		fmt.Fprintln(w)
	}
}
