package harness

import (
	"fmt"
	"image/color"
	"io"
	"slices"
	"sort"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// PrintOverheads prints the rows in the shape of the HAMS paper's Table I:
// per (service, batch) the p50 of every mode, and each mode's overhead
// over bare measured in the same run.
func PrintOverheads(w io.Writer, rows []BenchRow) {
	type key struct {
		service string
		batch   int
	}
	var keys []key
	byKey := map[key]map[string]BenchRow{}
	var modes []string
	for _, r := range rows {
		k := key{r.Service, r.Batch}
		if byKey[k] == nil {
			byKey[k] = map[string]BenchRow{}
			keys = append(keys, k)
		}
		byKey[k][r.Mode] = r
		if !slices.Contains(modes, r.Mode) {
			modes = append(modes, r.Mode)
		}
	}
	if !slices.Contains(modes, string(armBare)) || len(modes) < 2 {
		return
	}
	header := []any{"service", "batch"}
	for _, m := range modes {
		header = append(header, m)
	}
	tb := NewTable(1, header...)
	for _, k := range keys {
		row := []any{k.service, k.batch}
		bare, ok := byKey[k][string(armBare)]
		for _, m := range modes {
			r, has := byKey[k][m]
			switch {
			case !has:
				row = append(row, "-")
			case benchArm(m) == armBare || !ok || bare.P50Ms <= 0:
				row = append(row, fmt.Sprintf("%.2f", r.P50Ms))
			default:
				row = append(row, fmt.Sprintf("%.2f (%+5.1f%%)", r.P50Ms, 100*(r.P50Ms/bare.P50Ms-1)))
			}
		}
		tb.AppendRow(row)
	}
	fmt.Fprintf(w, "\np50 latency (ms) and overhead over bare, one run (the shape of the HAMS paper's Table I)\n")
	Render(w, tb, "")
}

// printShipping prints, per replicated model and mode, what a snapshot
// costs and the shipping throughput next to this machine's memcpy
// bandwidth.
func printShipping(w io.Writer, rows []BenchRow, memcpyMBs float64) {
	tb := NewTable(3, "service", "mode", "model", "state_bytes", "bytes/snap", "snapshots", "copy_ms", "delivery_ms", "ship_MB/s", "x_memcpy")
	for _, r := range rows {
		names := make([]string, 0, len(r.State))
		for n := range r.State {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			st := r.State[n]
			x := "-"
			if memcpyMBs > 0 && st.ShipMBs > 0 {
				x = fmt.Sprintf("%.3f", st.ShipMBs/memcpyMBs)
			}
			tb.AppendRow([]any{r.Service, r.Mode, n, fmt.Sprintf("%.0f", st.StateBytes), fmt.Sprintf("%.0f", st.BytesPerSnapshot),
				fmt.Sprintf("%.0f", st.Snapshots), fmt.Sprintf("%.4f", st.CopyMsMean), f3(st.DeliveryMsMean), fmt.Sprintf("%.1f", st.ShipMBs), x})
		}
	}
	if tb.Length() > 0 {
		fmt.Fprintf(w, "\nstate shipping (memcpy on this machine: %.0f MB/s)\n", memcpyMBs)
		Render(w, tb, "")
	}
}

// memcpyMBs measures this machine's memcpy bandwidth (64 MiB copies, the
// best of a few), the ceiling state shipping is compared with.
func memcpyMBs() float64 {
	const size = 64 << 20
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	best := time.Duration(1 << 62)
	for range 5 {
		t0 := time.Now()
		copy(dst, src)
		best = min(best, time.Since(t0))
	}
	return float64(size) / best.Seconds() / 1e6
}

// PlotBench draws p50 latency normalised to bare, per service and mode
// (the shape of the HAMS paper's Fig. 10), one group of bars per service
// and batch size, into a PNG.
func PlotBench(path string, rows []BenchRow) error {
	type key struct {
		service string
		batch   int
	}
	var keys []key
	p50 := map[key]map[string]float64{}
	var modes []string
	for _, r := range rows {
		k := key{r.Service, r.Batch}
		if p50[k] == nil {
			p50[k] = map[string]float64{}
			keys = append(keys, k)
		}
		p50[k][r.Mode] = r.P50Ms
		if !slices.Contains(modes, r.Mode) && !benchArm(r.Mode).direct() {
			modes = append(modes, r.Mode)
		}
	}
	p := plot.New()
	p.Title.Text = "p50 latency normalised to bare (one hams bench run)"
	p.Y.Label.Text = "p50 / bare p50"
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = fmt.Sprintf("%s b%d", k.service, k.batch)
	}
	w := vg.Points(80 / float64(max(len(modes), 1)))
	palette := []color.Color{
		color.RGBA{0x44, 0x44, 0x44, 0xff}, color.RGBA{0x1f, 0x77, 0xb4, 0xff}, color.RGBA{0xd6, 0x27, 0x28, 0xff},
		color.RGBA{0x2c, 0xa0, 0x2c, 0xff}, color.RGBA{0xff, 0x7f, 0x0e, 0xff}, color.RGBA{0x94, 0x67, 0xbd, 0xff},
	}
	for i, m := range modes {
		vals := make(plotter.Values, len(keys))
		for j, k := range keys {
			if b := p50[k][string(armBare)]; b > 0 {
				vals[j] = p50[k][m] / b
			}
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return fmt.Errorf("plot %s: %w", m, err)
		}
		bars.Color = palette[i%len(palette)]
		bars.LineStyle.Width = 0
		bars.Offset = w * vg.Length(float64(i)-float64(len(modes)-1)/2)
		p.Add(bars)
		p.Legend.Add(m, bars)
	}
	// The legend sits top left, above a headroom band, so that it never
	// covers the tallest bars (the stateful learners' at the right).
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(30)
	p.Y.Min = 0
	p.Y.Max *= 1.25
	p.NominalX(names...)
	one := plotter.NewFunction(func(float64) float64 { return 1 })
	one.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
	p.Add(one)
	return p.Save(vg.Length(max(6, len(keys)))*vg.Inch, 4*vg.Inch, path)
}

// printCPU prints, per (service, mode, batch), the CPU time per request
// of each process role over the measured runs.
func printCPU(w io.Writer, rows []BenchRow) {
	roles := cpuRoles(rows)
	if len(roles) == 0 {
		return
	}
	header := []any{"service", "mode", "batch"}
	for _, r := range roles {
		header = append(header, r)
	}
	tb := NewTable(2, header...)
	for _, r := range rows {
		row := []any{r.Service, r.Mode, r.Batch}
		for _, role := range roles {
			if v, ok := r.CPUMsPerRequest[role]; ok {
				row = append(row, f3(v))
			} else {
				row = append(row, "-")
			}
		}
		tb.AppendRow(row)
	}
	fmt.Fprintf(w, "\nCPU ms per request by process role (utime+stime from /proc/<pid>/stat over the measured runs; client: the load generator)\n")
	Render(w, tb, "")
}

// printReplicationCPU prints, per replicated model and mode, the CPU the
// primary and the backup sidecar spent per replicated MB beside this
// machine's memcpy cost per MB, and their ratio to it.
func printReplicationCPU(w io.Writer, rows []BenchRow) {
	tb := NewTable(3, "service", "mode", "model", "replicated_MB", "primary_cpu_ms/MB", "backup_cpu_ms/MB", "memcpy_ms/MB", "primary_x_memcpy", "backup_x_memcpy")
	for _, r := range rows {
		names := make([]string, 0, len(r.State))
		for n := range r.State {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			st := r.State[n]
			px, bx := "-", "-"
			if r.MemcpyMsPerMB > 0 && st.ReplicatedMB > 0 {
				px = fmt.Sprintf("%.1f", st.PrimaryCPUMsPerMB/r.MemcpyMsPerMB)
				bx = fmt.Sprintf("%.1f", st.BackupCPUMsPerMB/r.MemcpyMsPerMB)
			}
			tb.AppendRow([]any{r.Service, r.Mode, n, f3(st.ReplicatedMB), f3(st.PrimaryCPUMsPerMB), f3(st.BackupCPUMsPerMB),
				fmt.Sprintf("%.4f", r.MemcpyMsPerMB), px, bx})
		}
	}
	if tb.Length() > 0 {
		fmt.Fprintf(w, "\nreplication CPU per replicated MB (primary and backup sidecar processes, all their work) and the memcpy floor\n")
		Render(w, tb, "")
	}
}
