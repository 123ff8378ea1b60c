package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/config"
)

// UpConfig is what the flags of hams up set.
type UpConfig struct {
	ConfigFile     string        // --config (required)
	Mode           string        // --mode (empty: the file's mode)
	Audit          string        // --audit
	Suspicion      time.Duration // --suspicion-timeout
	FrontendListen string        // --frontend-listen
	FrontendHTTP   string        // --frontend-http
	Dashboard      string        // --dashboard
	Task           Task          // the task flags
	// Options are the deployment options of the control flags
	// (--frontends, --managers, --insecure, --nats...); Run sets the
	// request log from the effective mode.
	Options cluster.Options
}

// Up is a configured hams up.
type Up struct{ c UpConfig }

// NewUp validates c; it does no I/O (the deployment file is read by Run).
func NewUp(c UpConfig) (*Up, error) {
	if c.ConfigFile == "" {
		return nil, Usagef("up: --config is required")
	}
	if err := checkModeFlag(c.Mode); err != nil {
		return nil, err
	}
	return &Up{c: c}, nil
}

// Run starts the deployment of the configuration file, prints the ready
// line with its endpoints on stdout and keeps it running until ctx ends;
// then it stops every process.
func (u *Up) Run(ctx context.Context) error {
	c := u.c
	dep, err := cluster.LoadDeployment(c.ConfigFile)
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	applyModeFlag(dep, c.Mode)
	audit := c.Audit
	if audit != "" {
		if audit, err = cluster.PrepareAudit(audit); err != nil {
			return err
		}
	}
	dir, cleanup, err := c.Task.Prepare("hams-up-")
	if err != nil {
		return err
	}
	ok := false
	defer func() { cleanup(ok) }()
	log := TaskLogger(c.Task.Verbose)
	opt := c.Options
	// In the protected modes even a lone frontend gets the request log
	// (restarted in place, it completes what it accepted): decided by the
	// effective mode, the file's unless --mode overrides it.
	opt.RequestLog = config.Mode(dep.Mode).Protected()
	opt.TraceArgs = c.Task.TraceArgs
	opt.RunDir, opt.LogLevel, opt.Logger = dir, c.Task.LogLevel, log
	opt.SuspicionTimeout, opt.Audit = cluster.SuspicionFor(c.Suspicion), audit
	opt.FrontendListen, opt.FrontendHTTP, opt.Dashboard = c.FrontendListen, c.FrontendHTTP, c.Dashboard
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
