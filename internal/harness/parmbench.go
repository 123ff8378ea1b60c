package harness

import (
	"context"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gopkg.in/yaml.v3"

	"github.com/hams-go/hams/examples"
	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/loadgen"
	"github.com/hams-go/hams/internal/parmload"
)

// parmBenchRow is one (service, redundancy, k, batch) of hams bench
// --service parm: the bench row's fields plus the tail (p99.9, max), the
// approximate fraction and the accuracy against labels (docs/design.md).
type parmBenchRow struct {
	Service    string `json:"service"`
	Mode       string `json:"mode"`
	Redundancy string `json:"redundancy"`
	// K is the coding group size of parm, and the k whose resources er
	// and hedge match (0 for none: the replicas alone).
	K     int `json:"k"`
	Batch int `json:"batch"`
	// DecodeAfterMs is parm's decode_after (0: first-k); FillAfterMs its
	// fill_after (0: groups fill with new batches only).
	DecodeAfterMs float64 `json:"decode_after_ms"`
	FillAfterMs   float64 `json:"fill_after_ms"`
	// Online: parity models trained from the arm's own traffic; then
	// OnlineRowsBeforeSwap is the queries served before the first swap
	// (0: none happened) and OnlineAgreement the agreement serving at the
	// end of the run.
	Online               bool    `json:"online,omitempty"`
	OnlineRowsBeforeSwap float64 `json:"online_rows_before_first_swap,omitempty"`
	OnlineAgreement      float64 `json:"online_agreement,omitempty"`
	// Instances are the data and parity instances of the arm.
	DataInstances   int `json:"data_instances"`
	ParityInstances int `json:"parity_instances"`
	parmload.Summary
}

// parmArm is one configuration of the pool measured side by side.
type parmArm struct {
	model       string
	redundancy  config.Redundancy
	k           int
	decodeAfter time.Duration
	// online: parm whose parity models train from the arm's own traffic.
	online bool
}

// ParmBenchConfig is what the flags of the command set.
type ParmBenchConfig struct {
	RedFlag     string        // --redundancy
	KFlag       string        // --k
	Batches     string        // --batch
	Requests    int           // --requests
	Warmup      int           // --warmup
	Rounds      int           // --rounds
	Rate        float64       // --rate
	Replicas    int           // --replicas
	Straggle    string        // --straggle
	DecodeAfter string        // --decode-after
	Online      bool          // --online
	FillAfter   time.Duration // --fill-after
	JSON        string        // --json
	Plot        string        // --plot
	Seed        uint64        // --seed
	Timeout     time.Duration // --timeout
	Task        Task          // the task flags
}

// parmBenchRun runs the command configured by c until it is done or ctx ends.
func RunParmBench(ctx context.Context, c ParmBenchConfig) error {
	redFlag := &c.RedFlag
	kFlag := &c.KFlag
	batches := &c.Batches
	requests := &c.Requests
	warmup := &c.Warmup
	rounds := &c.Rounds
	rate := &c.Rate
	replicas := &c.Replicas
	straggle := &c.Straggle
	decodeAfter := &c.DecodeAfter
	online := &c.Online
	fillAfter := &c.FillAfter
	jsonPath := &c.JSON
	plotPath := &c.Plot
	seed := &c.Seed
	timeout := &c.Timeout
	tf := &c.Task
	var reds []config.Redundancy
	for _, r := range cluster.SplitList(*redFlag) {
		red, err := config.ParseRedundancy(r)
		if err != nil {
			return Usagef("bench: --redundancy: %v", err)
		}
		reds = append(reds, red)
	}
	ks, err := intList(*kFlag, 2, 8, "--k")
	if err != nil {
		return err
	}
	bs, err := intList(*batches, 1, 64, "--batch")
	if err != nil {
		return err
	}
	if len(reds) == 0 || *requests < *rounds || *rounds < 1 || *rate <= 0 || *replicas < 1 || *timeout <= 0 {
		return Usagef("bench: --redundancy non-empty; --requests >= --rounds >= 1; --rate, --replicas and --timeout positive")
	}
	var das []time.Duration
	for _, f := range cluster.SplitList(*decodeAfter) {
		if f == "0" {
			das = append(das, 0)
			continue
		}
		v, err := time.ParseDuration(f)
		if err != nil || v < 0 {
			return Usagef("bench: --decode-after %q: a duration >= 0", f)
		}
		das = append(das, v)
	}
	if len(das) == 0 {
		das = []time.Duration{0}
	}
	arms := parmArms(reds, ks, das)
	if *online {
		for _, k := range ks {
			arms = append(arms, parmArm{model: fmt.Sprintf("parm-online-k%d", k), redundancy: config.RedundancyParM, k: k, online: true})
		}
	}
	dep, err := parmBenchDeployment(arms, *replicas, *straggle, *fillAfter)
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	dir, cleanup, err := tf.Prepare("hams-bench-parm-")
	if err != nil {
		return err
	}
	ok := false
	defer func() { cleanup(ok) }()
	data := loadgen.Fashion()
	if data == nil {
		fmt.Fprintln(os.Stderr, "hams bench: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist): random pixels, no accuracy")
	}
	fmt.Fprintf(os.Stderr, "hams bench: starting %d pools (%s) in %s\n", len(arms), armNames(arms), dir)
	opt := cluster.Options{RunDir: filepath.Join(dir, "deployment"), LogLevel: tf.LogLevel, Logger: TaskLogger(tf.Verbose), SuspicionTimeout: 2 * time.Second, TraceArgs: tf.TraceArgs}
	d, err := cluster.Start(ctx, dep, opt)
	if err != nil {
		return err
	}
	defer d.Close()
	fes, closeFEs, err := d.FrontendClients()
	if err != nil {
		return err
	}
	defer closeFEs()
	type key struct {
		arm   int
		batch int
	}
	results := map[key]*parmload.Result{}
	run := func(a parmArm, b, n int, seed uint64) (parmload.Result, error) {
		return parmload.Run(ctx, parmload.Config{Clients: fes, Service: a.model, Data: data, Rows: b, Rate: *rate,
			Requests: n, Timeout: *timeout, Seed: seed})
	}
	for i, a := range arms {
		for _, b := range bs {
			if _, err := run(a, b, *warmup, *seed+1000); err != nil {
				return fmt.Errorf("bench: warm-up of %s: %w", a.model, err)
			}
			results[key{i, b}] = &parmload.Result{}
		}
	}
	per := *requests / *rounds
	for round := range *rounds {
		for i, a := range arms {
			for _, b := range bs {
				fmt.Fprintf(os.Stderr, "\rhams bench: round %d/%d  %-18s batch %d   ", round+1, *rounds, a.model, b)
				r, err := run(a, b, per, *seed+uint64(round)*7919+uint64(b))
				if err != nil {
					return fmt.Errorf("bench: %s: %w", a.model, err)
				}
				results[key{i, b}].Add(r)
			}
		}
	}
	fmt.Fprintln(os.Stderr)
	onlineStats := scrapeMetrics(d.SidecarMetrics(), "hams_pool_")
	var rows []parmBenchRow
	for _, b := range bs {
		for i, a := range arms {
			m := dep.Model(a.model)
			if a.online {
				st := onlineStats[a.model]
				rows = append(rows, parmBenchRow{Service: ParmService, Mode: dep.Mode, Redundancy: "parm-online", K: a.k, Batch: b,
					Online: true, OnlineRowsBeforeSwap: st["hams_pool_online_rows_before_first_swap"], OnlineAgreement: st["hams_pool_online_agreement"],
					FillAfterMs: fillAfterMs(m), DataInstances: m.Replicas.N(), ParityInstances: m.ParitySlots(), Summary: results[key{i, b}].Summary()})
				continue
			}
			rows = append(rows, parmBenchRow{Service: ParmService, Mode: dep.Mode, Redundancy: string(a.redundancy), K: a.k, Batch: b,
				DecodeAfterMs: float64(a.decodeAfter) / float64(time.Millisecond), FillAfterMs: fillAfterMs(m),
				DataInstances: m.Replicas.N() + erExtra(m), ParityInstances: m.ParitySlots() - erExtra(m),
				Summary: results[key{i, b}].Summary()})
		}
	}
	printParmBench(os.Stdout, rows)
	if *plotPath != "" {
		if err := plotParmBench(*plotPath, rows); err != nil {
			return fmt.Errorf("bench: plot: %w", err)
		}
	}
	if *jsonPath != "" {
		if err := writeJSON(*jsonPath, rows); err != nil {
			return err
		}
	}
	ok = true
	return d.Close()
}

// erExtra is the number of parity slots that serve copies of the model
// (er, hedge).
func erExtra(m *config.Model) int {
	if m.Redundancy == config.RedundancyER || m.Redundancy == config.RedundancyHedge {
		return m.ParitySlots()
	}
	return 0
}

func intList(s string, lo, hi int, flagName string) ([]int, error) {
	var out []int
	for _, f := range cluster.SplitList(s) {
		v, err := strconv.Atoi(f)
		if err != nil || v < lo || v > hi {
			return nil, Usagef("bench: %s %q: integers %d..%d", flagName, f, lo, hi)
		}
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return nil, Usagef("bench: %s is empty", flagName)
	}
	return out, nil
}

// parmArms lists the arms: none once, the others once per k.
func parmArms(reds []config.Redundancy, ks []int, decodeAfter []time.Duration) []parmArm {
	var arms []parmArm
	for _, r := range reds {
		if r == config.RedundancyNone {
			arms = append(arms, parmArm{model: "parm-none", redundancy: r})
			continue
		}
		for _, k := range ks {
			if r != config.RedundancyParM {
				arms = append(arms, parmArm{model: fmt.Sprintf("parm-%s-k%d", r, k), redundancy: r, k: k})
				continue
			}
			for _, d := range decodeAfter {
				name := fmt.Sprintf("parm-%s-k%d", r, k)
				if d > 0 {
					name += "-d" + strings.ReplaceAll(d.String(), ".", "p")
				}
				arms = append(arms, parmArm{model: name, redundancy: r, k: k, decodeAfter: d})
			}
		}
	}
	return arms
}

func armNames(arms []parmArm) string {
	var out []string
	for _, a := range arms {
		out = append(out, a.model)
	}
	return strings.Join(out, ", ")
}

// parmBenchDeployment is examples/parm.yaml's model once per arm (each its
// own one-model service), in mode bare: the pool is what is measured.
func parmBenchDeployment(arms []parmArm, replicas int, straggle string, fillAfter time.Duration) (*config.Deployment, error) {
	raw, err := examples.Raw(ParmService)
	if err != nil {
		return nil, err
	}
	base, err := config.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("example parm: %w", err)
	}
	tmpl := base.Models[0]
	dep := &config.Deployment{Name: "bench-parm", Mode: "bare", Limits: base.Limits}
	for _, a := range arms {
		m := tmpl
		m.Name = a.model
		m.Backend.Model = a.model
		m.Placement = config.Placement{}
		m.Replicas = config.Instances{Count: replicas}
		m.Redundancy = a.redundancy
		m.Straggle = nil
		if straggle != "" {
			m.Straggle = &config.Straggle{Replicas: []int{0}, Spec: straggle}
		}
		m.Parity = nil
		if a.redundancy != config.RedundancyNone {
			p := *tmpl.Parity
			p.K = a.k
			p.Backends = config.Instances{Count: max(p.R, (replicas+a.k-1)/a.k)}
			p.Model = a.model + "-parity"
			p.DecodeAfter = config.Duration(a.decodeAfter)
			if fillAfter >= 0 {
				p.FillAfter = config.Duration(fillAfter)
			}
			p.Params = map[string]any{}
			for key, v := range tmpl.Parity.Params {
				p.Params[key] = v
			}
			if a.online {
				p.Train = "online"
				p.Online = &config.OnlineTrain{MinSamples: 2000, Holdout: 1000, Every: config.Duration(5 * time.Second), Epochs: 3, Workers: 1}
			}
			if w, ok := p.Params["weights"].(string); ok {
				// The parity model trained for this k.
				p.Params["weights"] = strings.TrimSuffix(w, "-k2") + "-k" + strconv.Itoa(a.k)
			}
			m.Parity = &p
		}
		dep.Models = append(dep.Models, m)
	}
	b, err := yaml.Marshal(dep)
	if err != nil {
		return nil, fmt.Errorf("encode bench deployment: %w", err)
	}
	return config.Parse(b)
}

func printParmBench(w io.Writer, rows []parmBenchRow) {
	tb := NewTableAlign("rlrrrrrrrrrrrrr", "batch", "redundancy", "k", "D ms", "data", "par", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "rps", "approx", "acc", "acc.ex", "acc.ap")
	for _, r := range rows {
		tb.AppendRow([]any{r.Batch, r.Redundancy, r.K, fmt.Sprintf("%.1f", r.DecodeAfterMs), r.DataInstances, r.ParityInstances,
			fmt.Sprintf("%.2f", r.P50Ms), fmt.Sprintf("%.2f", r.P99Ms), fmt.Sprintf("%.2f", r.P999Ms), fmt.Sprintf("%.2f", r.MaxMs),
			fmt.Sprintf("%.1f", r.ThroughputRPS), fmt.Sprintf("%.2f%%", 100*r.Approximate), pctOrNA(r.Accuracy), pctOrNA(r.AccuracyExact), pctOrNA(r.AccuracyApprox)})
	}
	fmt.Fprintln(w)
	Render(w, tb, "")
	// Ratios against er at the same (k, batch): the paper's comparison.
	fmt.Fprintln(w, "\nagainst er at the same k and batch (one run):")
	for _, r := range rows {
		if r.Redundancy == string(config.RedundancyER) || r.Redundancy == string(config.RedundancyNone) {
			continue
		}
		for _, e := range rows {
			if e.Redundancy == string(config.RedundancyER) && e.K == r.K && e.Batch == r.Batch && e.P999Ms > 0 {
				fmt.Fprintf(w, "  batch %d k %d %-6s D %4.1f ms  p99.9 %+.1f%%  p99 %+.1f%%  p50 %+.2f ms\n", r.Batch, r.K, r.Redundancy, r.DecodeAfterMs,
					100*(r.P999Ms/e.P999Ms-1), 100*(r.P99Ms/e.P99Ms-1), r.P50Ms-e.P50Ms)
			}
		}
	}
}

func pctOrNA(x float64) string {
	if x < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f%%", 100*x)
}

// plotParmBench draws p50, p99 and p99.9 per arm and batch.
func plotParmBench(path string, rows []parmBenchRow) error {
	p := plot.New()
	p.Title.Text = "ParM pool: latency per arm under one straggling replica (one hams bench run)"
	p.Y.Label.Text = "ms"
	names := make([]string, len(rows))
	for i, r := range rows {
		names[i] = fmt.Sprintf("%s k%d b%d", r.Redundancy, r.K, r.Batch)
		if r.DecodeAfterMs > 0 {
			names[i] = fmt.Sprintf("%s k%d D%g b%d", r.Redundancy, r.K, r.DecodeAfterMs, r.Batch)
		}
		if r.K == 0 {
			names[i] = fmt.Sprintf("%s b%d", r.Redundancy, r.Batch)
		}
	}
	w := vg.Points(12)
	series := []struct {
		name string
		val  func(parmBenchRow) float64
		c    color.Color
	}{
		{"p50", func(r parmBenchRow) float64 { return r.P50Ms }, color.RGBA{0x1f, 0x77, 0xb4, 0xff}},
		{"p99", func(r parmBenchRow) float64 { return r.P99Ms }, color.RGBA{0xff, 0x7f, 0x0e, 0xff}},
		{"p99.9", func(r parmBenchRow) float64 { return r.P999Ms }, color.RGBA{0xd6, 0x27, 0x28, 0xff}},
	}
	for i, s := range series {
		vals := make(plotter.Values, len(rows))
		for j, r := range rows {
			vals[j] = s.val(r)
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Color = s.c
		bars.LineStyle.Width = 0
		bars.Offset = w * vg.Length(float64(i)-1)
		p.Add(bars)
		p.Legend.Add(s.name, bars)
	}
	p.Legend.Top, p.Legend.Left = true, true
	p.Y.Min = 0
	p.Y.Max *= 1.2
	p.NominalX(names...)
	return p.Save(vg.Length(max(6, len(rows)))*vg.Inch, 4*vg.Inch, path)
}

func fillAfterMs(m *config.Model) float64 {
	if m.Redundancy != config.RedundancyParM || m.Parity == nil {
		return 0
	}
	return float64(m.Parity.FillAfter.D()) / float64(time.Millisecond)
}
