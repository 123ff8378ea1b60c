package harness

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/loadgen"
	"github.com/hams-go/hams/internal/parmload"
)

// ParmService is the demo and bench service of the ParM pool
// (examples/parm.yaml).
const ParmService = "parm"

// parmDemoReport is hams demo --service parm's JSON report: the demo
// report's fields plus tail latency, the approximate fraction and the
// accuracy of exact and approximate replies against the dataset's labels.
type parmDemoReport struct {
	Service   string  `json:"service"`
	Mode      string  `json:"mode"`
	DurationS float64 `json:"duration_s"`
	parmload.Summary
	Labelled bool `json:"labelled"`
}

// runParmDemo is hams demo --service parm: the embedded ParM pool (4
// replicas of the Fashion-MNIST classifier, k = 2, replica 0 straggling),
// closed-loop load of labelled images, and a summary.
func runParmDemo(ctx context.Context, o parmDemoOptions) error {
	dep, _, err := exampleDeployment(ParmService, o.opt.RunDir)
	if err != nil {
		return err
	}
	dep.Mode = o.mode
	data := loadgen.Fashion()
	if data == nil {
		fmt.Fprintln(os.Stderr, "hams demo: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist): random pixels, no accuracy")
	}
	fmt.Fprintf(os.Stderr, "hams demo: starting %s (ParM pool: %d replicas, k = %d, %d parity instances, mode %s) in %s\n",
		ParmService, dep.Models[0].Replicas.N(), dep.Models[0].Parity.K, dep.Models[0].Parity.Backends.N(), o.mode, o.opt.RunDir)
	t0 := time.Now()
	d, err := cluster.Start(ctx, dep, o.opt)
	if err != nil {
		return err
	}
	defer d.Close()
	fmt.Fprintf(os.Stderr, "hams demo: deployment ready in %v (frontends %s)\n", time.Since(t0).Round(time.Millisecond), strings.Join(d.Frontends, " "))
	fes, closeFEs, err := d.FrontendClients()
	if err != nil {
		return err
	}
	defer closeFEs()
	var last atomic.Pointer[parmload.Result]
	done := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		parmProgress(os.Stderr, &last, o.duration, done)
	}()
	res, err := parmload.Run(ctx, parmload.Config{
		Clients: fes, Service: dep.Services[0].Name, Data: data, Rows: o.rows,
		Concurrency: o.conc, Duration: o.duration, Timeout: o.timeout, Seed: o.seed,
		Progress: func(r parmload.Result) { last.Store(&r) },
	})
	close(done)
	<-progressDone
	if err != nil {
		return err
	}
	rep := parmDemoReport{Service: ParmService, Mode: o.mode, DurationS: cluster.Round3(res.Elapsed.Seconds()), Summary: res.Summary(), Labelled: data != nil}
	printParmSummary(os.Stdout, rep)
	if o.json != "" {
		if err := writeJSON(o.json, rep); err != nil {
			return err
		}
	}
	if err := d.Close(); err != nil {
		return err
	}
	switch {
	case rep.Replies == 0:
		return &ExitError{Code: 1, Err: fmt.Errorf("demo: no replies")}
	case rep.Errors > 0:
		return &ExitError{Code: 1, Err: fmt.Errorf("demo: %d requests failed", rep.Errors)}
	}
	return nil
}

type parmDemoOptions struct {
	opt               cluster.Options
	mode, json        string
	duration, timeout time.Duration
	conc, rows        int
	seed              uint64
}

// parmProgress draws one status line (replies, approximate, p99.9 so far)
// until done (progress.go).
func parmProgress(w io.Writer, last *atomic.Pointer[parmload.Result], total time.Duration, done <-chan struct{}) {
	LoadBar(w, total, done, func() string {
		var s parmload.Summary
		if r := last.Load(); r != nil {
			s = r.Summary()
		}
		return fmt.Sprintf("replies %d  approximate %d (%.1f%%)  errors %d  p50 %.2fms  p99.9 %.2fms",
			s.Replies, s.ApproxReplies, 100*s.Approximate, s.Errors, s.P50Ms, s.P999Ms)
	})
}

func printParmSummary(w io.Writer, r parmDemoReport) {
	fmt.Fprintf(w, "\nHAMS-Go demo: service %s (ParM pool), mode %s, %.1fs\n", r.Service, r.Mode, r.DurationS)
	fmt.Fprintf(w, "  requests %d  replies %d  errors %d   throughput %.1f req/s\n", r.Requests, r.Replies, r.Errors, r.ThroughputRPS)
	fmt.Fprintf(w, "  latency p50 %.2f ms  p99 %.2f ms  p99.9 %.2f ms  max %.2f ms  mean %.2f ms\n", r.P50Ms, r.P99Ms, r.P999Ms, r.MaxMs, r.MeanMs)
	fmt.Fprintf(w, "  approximate replies %d (%.2f%% of replies): reconstructed by the parity model, marked on every API\n", r.ApproxReplies, 100*r.Approximate)
	if !r.Labelled {
		fmt.Fprintln(w, "  accuracy: no labelled dataset (install dataset-fashion-mnist)")
		return
	}
	pct := func(x float64) string {
		if x < 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.2f%%", 100*x)
	}
	fmt.Fprintf(w, "  accuracy against labels: all %s, exact replies %s, approximate replies %s\n", pct(r.Accuracy), pct(r.AccuracyExact), pct(r.AccuracyApprox))
}
