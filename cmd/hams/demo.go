package main

import (
	"strings"
	"time"

	"github.com/hams-go/hams/examples"
	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/harness"
)

// runDemo is `hams demo`: its flags, then the library call that does the work.
func runDemo(args []string) error {
	fs := newFlagSet("demo")
	var c harness.DemoConfig
	fs.StringVar(&c.Service, "service", "ap", "example service ("+strings.Join(examples.Names(), ", ")+"), all, or parm (a ParM-protected Fashion-MNIST classifier pool with a straggling replica)")
	fs.DurationVar(&c.Duration, "duration", 10*time.Second, "how long to drive load")
	fs.Var(&c.Kills, "kill", "ROLE:MODEL@AFTER: SIGKILL that process AFTER into the run (repeatable), e.g. sidecar:ap-motion@3s; freeze:ROLE:MODEL@AFTER+DURATION: SIGSTOP it for DURATION instead (a false suspicion when longer than the suspicion timeout), e.g. freeze:sidecar:ap-motion@5s+3s; partition:ROLE:MODEL@AFTER+DURATION: cut it off the network for DURATION (root)")
	fs.StringVar(&c.JSON, "json", "", "write the JSON report to this file")
	fs.StringVar(&c.Mode, "mode", cluster.DefaultMode, "fault-tolerance mode: nspb, bare, remus, nspb-s1, nspb-s2, replay")
	fs.IntVar(&c.CheckpointEvery, "checkpoint-every", 0, "replay mode: checkpoint interval in batches (0: the deployment's replay.checkpoint_every)")
	fs.StringVar(&c.Audit, "audit", "", "directory for JSONL audit logs (durable.jsonl of every backup, replies.jsonl of the frontend, each under its own subdirectory)")
	fs.IntVar(&c.Concurrency, "concurrency", 4, "closed-loop clients")
	fs.Uint64Var(&c.Seed, "seed", 1, "input seed")
	fs.DurationVar(&c.Timeout, "timeout", 5*time.Second, "per-request deadline")
	fs.IntVar(&c.Rows, "rows", 1, "rows per request")
	fs.DurationVar(&c.Suspicion, "suspicion-timeout", 0, "manager's failure-suspicion timeout (0: 1s; this process reports exits of the processes it runs at once)")
	fs.StringVar(&c.Dashboard, "dashboard", defaultDashboard, "listen address of the first manager's live dashboard while the demo runs (plain HTTP; empty: none; docs/dashboard.md)")
	var cf controlFlags
	cf.register(fs)
	registerTaskFlags(&c.Task, fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	c.Task.TraceArgs = traceArgs()
	if err := cf.check(); err != nil {
		return err
	}
	c.Options = cf.options(c.Mode)
	x, err := harness.NewDemo(c)
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	return x.Run(ctx)
}
