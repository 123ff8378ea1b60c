package main

import (
	"flag"
	"strings"
	"time"

	"github.com/hams-go/hams/examples"
	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/harness"
)

// runChaos is `hams chaos`: its flags, then the library call that does the work.
func runChaos(args []string) error {
	fs := newFlagSet("chaos")
	var c harness.ChaosConfig
	fs.StringVar(&c.Service, "service", "ap", "example service ("+strings.Join(examples.Names(), ", ")+") or all; with --config, a service of that file or all of them (the default with --config)")
	fs.StringVar(&c.ConfigFile, "config", "", "deployment file to run instead of the examples (as hams up --config; its mode is replaced by --mode); --service then names one of its services, run with only that service's models, or all")
	fs.DurationVar(&c.Duration, "duration", 30*time.Second, "how long to drive load (kills stop early enough to recover before the end)")
	fs.Uint64Var(&c.Seed, "seed", 1, "random seed (kill targets and times; inputs)")
	fs.StringVar(&c.Audit, "audit", "", "directory for JSONL audit logs (default: <run-dir>/audit)")
	fs.StringVar(&c.JSON, "json", "", "write the JSON report to this file")
	fs.StringVar(&c.Mode, "mode", cluster.DefaultMode, "fault-tolerance mode: nspb, remus, nspb-s1, nspb-s2, bare, replay")
	fs.IntVar(&c.CheckpointEvery, "checkpoint-every", 0, "replay mode: checkpoint interval in batches (0: the deployment's replay.checkpoint_every)")
	fs.IntVar(&c.Concurrency, "concurrency", 4, "closed-loop clients")
	fs.DurationVar(&c.Timeout, "timeout", 5*time.Second, "per-request deadline")
	fs.DurationVar(&c.Settle, "settle", time.Second, "quiet time after a recovery before the next kill (the kill comes at a random time in [settle, 2*settle])")
	fs.DurationVar(&c.MaxRecovery, "max-recovery", 20*time.Second, "give up waiting for a kill's recovery after this long (no more kills then)")
	fs.DurationVar(&c.Suspicion, "suspicion-timeout", 0, "manager's failure-suspicion timeout (0: 1s; this process reports exits of the processes it runs at once)")
	fs.StringVar(&c.Kinds, "kinds", strings.Join(harness.ChaosKinds, ","), "kinds to draw from: process kinds SIGKILLed ("+strings.Join(harness.ChaosKinds, ", ")+"; manager: the active one; nats: the coordination engine), and faults applied to one of the listed process kinds (all, when none is listed) for half to three suspicion timeouts: freeze (SIGSTOP, SIGCONT), partition (cut off the network, then healed; root)")
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
	fs.Visit(func(f *flag.Flag) { c.ServiceSet = c.ServiceSet || f.Name == "service" })
	x, err := harness.NewChaos(c)
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	return x.Run(ctx)
}
