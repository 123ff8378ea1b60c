package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/config"
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
	cfgPath := fs.String("config", "", "deployment YAML file (required)")
	mode := fs.String("mode", "", "fault-tolerance mode, overriding the file's mode: nspb, bare, remus, nspb-s1, nspb-s2, replay (its checkpoint interval: the file's replay.checkpoint_every) (default: the file's mode, else "+cluster.DefaultMode+")")
	audit := fs.String("audit", "", "directory for JSONL audit logs (durable.jsonl of every backup, replies.jsonl of the frontend, each under its own subdirectory)")
	suspicion := fs.Duration("suspicion-timeout", 0, "manager's failure-suspicion timeout (0: 1s; this process reports exits of the processes it runs at once)")
	feListen := fs.String("frontend-listen", "", "gRPC listen address of the first frontend (its own API, TF Serving and KServe v2), e.g. 0.0.0.0:8500 in a container (default: a free loopback port)")
	feHTTP := fs.String("frontend-http", "", "HTTP/JSON listen address of the first frontend (default: a free loopback port)")
	dash := fs.String("dashboard", defaultDashboard, "listen address of the first manager's live dashboard (plain HTTP; the other managers take a free port of the same host; empty: none; docs/dashboard.md)")
	var cf controlFlags
	cf.register(fs)
	var tf harness.Task
	registerTaskFlags(&tf, fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *cfgPath == "" {
		return harness.Usagef("up: --config is required")
	}
	if *mode != "" {
		if err := harness.CheckMode(*mode); err != nil {
			return err
		}
	}
	if err := cf.check(); err != nil {
		return err
	}
	dep, err := cluster.LoadDeployment(*cfgPath)
	if err != nil {
		return &harness.ExitError{Code: 2, Err: err}
	}
	applyModeFlag(dep, *mode)
	if *audit != "" {
		if *audit, err = cluster.PrepareAudit(*audit); err != nil {
			return err
		}
	}
	dir, cleanup, err := tf.Prepare("hams-up-")
	if err != nil {
		return err
	}
	ok := false
	defer func() { cleanup(ok) }()
	ctx, stop := signalContext()
	defer stop()
	log := harness.TaskLogger(tf.Verbose)
	opt := cf.options(dep.Mode)
	opt.RunDir, opt.LogLevel, opt.Logger = dir, tf.LogLevel, log
	opt.SuspicionTimeout, opt.Audit = cluster.SuspicionFor(*suspicion), *audit
	opt.FrontendListen, opt.FrontendHTTP, opt.Dashboard = *feListen, *feHTTP, *dash
	d, err := cluster.Start(ctx, dep, opt)
	if err != nil {
		return err
	}
	defer d.Close()
	tfs, ks := cluster.CompatEndpoints(ctx, d.FrontendGRPC)
	notReady := cluster.WaitBackends(ctx, d.FrontendGRPC, dep)
	if len(notReady) > 0 {
		log.Warn("backends not ready: their models answer Unavailable until their backends answer their health checks", "models", notReady)
	}
	b, _ := json.Marshal(cluster.UpReady{BackendsNotReady: notReady, FrontendGRPC: d.FrontendGRPC, FrontendHTTP: d.FrontendHTTP, TFServingGRPC: tfs, KServeGRPC: ks, Manager: d.Manager, NATS: d.NATS,
		Frontends: d.Frontends, FrontendsHTTP: d.FrontendHTTPs, Managers: d.Managers,
		FrontendInternal: d.FrontendInternals[0], FrontendsInternal: d.FrontendInternals, Metrics: d.MetricsAddrs(),
		Dashboard: cluster.DashboardURL(d.Dashboards, 0), Dashboards: cluster.DashboardURLs(d.Dashboards)})
	fmt.Println(string(b))
	<-ctx.Done()
	fmt.Fprintln(os.Stderr, "hams up: stopping")
	err = d.Close()
	ok = err == nil
	return err
}

// applyModeFlag sets the deployment's mode from --mode when it was given
// (already checked): the flag overrides the file's mode: key, which
// otherwise stands (config defaults it to nspb).
func applyModeFlag(dep *config.Deployment, flag string) {
	if flag != "" {
		dep.Mode = flag
	}
}
