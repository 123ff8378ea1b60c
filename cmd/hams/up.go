package main

import (
	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/harness"
)

// registerTaskFlags defines the task flags of fs into t.
func registerTaskFlags(t *harness.Task, fs interface {
	StringVar(*string, string, string, string)
	BoolVar(*bool, string, bool, string)
}) {
	fs.StringVar(&t.RunDir, "run-dir", "", "directory for the deployment file, child logs and JetStream store (default: a new temporary directory)")
	fs.BoolVar(&t.Keep, "keep", false, "keep the run directory after a successful run")
	fs.StringVar(&t.LogLevel, "log-level", "info", "log level of the child processes (their logs go to <run-dir>/logs)")
	fs.BoolVar(&t.Verbose, "v", false, "log the supervisor's events on stderr")
}

// runUp is `hams up`: its flags, then the library call that does the work.
func runUp(args []string) error {
	fs := newFlagSet("up")
	var c harness.UpConfig
	fs.StringVar(&c.ConfigFile, "config", "", "deployment YAML file (required)")
	fs.StringVar(&c.Mode, "mode", "", "fault-tolerance mode, overriding the file's mode: nspb, bare, remus, nspb-s1, nspb-s2, replay (its checkpoint interval: the file's replay.checkpoint_every) (default: the file's mode, else "+cluster.DefaultMode+")")
	fs.StringVar(&c.Audit, "audit", "", "directory for JSONL audit logs (durable.jsonl of every backup, replies.jsonl of the frontend, each under its own subdirectory)")
	fs.DurationVar(&c.Suspicion, "suspicion-timeout", 0, "manager's failure-suspicion timeout (0: 1s; this process reports exits of the processes it runs at once)")
	fs.StringVar(&c.FrontendListen, "frontend-listen", "", "gRPC listen address of the first frontend (its own API, TF Serving and KServe v2), e.g. 0.0.0.0:8500 in a container (default: a free loopback port)")
	fs.StringVar(&c.FrontendHTTP, "frontend-http", "", "HTTP/JSON listen address of the first frontend (default: a free loopback port)")
	fs.StringVar(&c.Dashboard, "dashboard", defaultDashboard, "listen address of the first manager's live dashboard (plain HTTP; the other managers take a free port of the same host; empty: none; docs/dashboard.md)")
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
	u, err := harness.NewUp(c)
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	return u.Run(ctx)
}
