package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hams-go/hams/examples"
	"github.com/hams-go/hams/integration/checker"
	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/loadgen"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"google.golang.org/grpc/status"
)

// killSpec is one --kill ROLE[:MODEL]@AFTER.
type killSpec struct {
	Role  cluster.ChildRole
	Model string
	After time.Duration
	// Freeze: SIGSTOP for this long instead of SIGKILL (kills.go,
	// freeze:ROLE:MODEL@AFTER+DURATION).
	Freeze time.Duration
	// Partition: cut off the network for Freeze instead of SIGSTOP
	// (partition:ROLE:MODEL@AFTER+DURATION).
	Partition bool
}

func (k killSpec) target() string {
	t := string(k.Role)
	if k.Model != "" {
		t += ":" + k.Model
	}
	switch {
	case k.Partition:
		t = partitionPrefix + t
	case k.Freeze > 0:
		t = freezePrefix + t
	}
	return t
}

func parseKill(s string) (killSpec, error) {
	if strings.HasPrefix(s, freezePrefix) {
		return parseFreeze(s)
	}
	if rest, ok := strings.CutPrefix(s, partitionPrefix); ok {
		k, err := parseFreeze(freezePrefix + rest)
		if err != nil {
			return killSpec{}, fmt.Errorf("%s (partition: as freeze)", err)
		}
		k.Partition = true
		return k, nil
	}
	target, after, ok := strings.Cut(s, "@")
	if !ok {
		return killSpec{}, fmt.Errorf("--kill %q: want ROLE:MODEL@AFTER (e.g. sidecar:ap-motion@3s)", s)
	}
	d, err := time.ParseDuration(after)
	if err != nil || d < 0 {
		return killSpec{}, fmt.Errorf("--kill %q: bad time %q (want e.g. 3s)", s, after)
	}
	roleName, model, _ := strings.Cut(target, ":")
	role := cluster.ChildRole(roleName)
	switch role {
	case cluster.RoleSidecar, cluster.RoleModelServer, cluster.RoleBackupSidecar, cluster.RoleBackupModelServer, cluster.RoleStandbySidecar, cluster.RoleStandbyModelSrv:
		if model == "" {
			return killSpec{}, fmt.Errorf("--kill %q: %s needs a model (%s:MODEL@AFTER)", s, role, role)
		}
	case cluster.RoleNATS:
		if model != "" {
			return killSpec{}, fmt.Errorf("--kill %q: nats takes no model", s)
		}
	case cluster.RoleFrontend, cluster.RoleManager:
		// No model: the leading frontend or the active manager at kill
		// time; a number: that process (frontend:1, manager:0).
		if model != "" {
			if n, err := strconv.Atoi(model); err != nil || n < 0 {
				return killSpec{}, fmt.Errorf("--kill %q: %s takes no model, only a process number (%s:N@AFTER)", s, role, role)
			}
		}
	default:
		return killSpec{}, fmt.Errorf("--kill %q: unknown role %q (one of %s)", s, role, killRoleList())
	}
	return killSpec{Role: role, Model: model, After: d}, nil
}

// modelStats is per-model information gathered from reply lineage.
type modelStats struct {
	Executions int    `json:"executions"`
	MaxSeq     uint64 `json:"max_seq"`
}

// demoReport is the --json report of `hams demo` (docs/design.md).
type demoReport struct {
	Service       string                   `json:"service"`
	Mode          string                   `json:"mode"`
	DurationS     float64                  `json:"duration_s"`
	Requests      int                      `json:"requests"`
	Replies       int                      `json:"replies"`
	Errors        int                      `json:"errors"`
	Incorrect     int                      `json:"incorrect"`
	P50Ms         float64                  `json:"p50_ms"`
	P99Ms         float64                  `json:"p99_ms"`
	MeanMs        float64                  `json:"mean_ms"`
	ThroughputRPS float64                  `json:"throughput_rps"`
	Kills         []killReport             `json:"kills,omitempty"`
	ErrorsByCode  map[string]int           `json:"errors_by_code,omitempty"`
	Services      map[string]loadgen.Stats `json:"services"`
	Models        map[string]modelStats    `json:"models"`
	Check         checker.Summary          `json:"check"`
}

// exampleDeployment loads one embedded example, or all merged.
func exampleDeployment(service, dir string) (*config.Deployment, []string, error) {
	names := examples.Names()
	if service != "all" && service != ParmService && !slices.Contains(names, service) {
		return nil, nil, Usagef("--service %q: unknown (one of %s, all, %s)", service, strings.Join(names, ", "), ParmService)
	}
	if service != "all" {
		names = []string{service}
	}
	var deps []*config.Deployment
	for _, n := range names {
		raw, err := examples.Raw(n)
		if err != nil {
			return nil, nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, n+".yaml"), raw, 0o644); err != nil {
			return nil, nil, err
		}
		d, err := config.Parse(raw)
		if err != nil {
			return nil, nil, fmt.Errorf("example %s: %w", n, err)
		}
		deps = append(deps, d)
	}
	if len(deps) == 1 {
		return deps[0], deps[0].ServiceNames(), nil
	}
	m, err := mergeDeployments("demo-all", deps)
	if err != nil {
		return nil, nil, err
	}
	return m, m.ServiceNames(), nil
}

// mergeDeployments puts several deployments into one (one manager, one
// frontend); their model and service names must not clash.
func mergeDeployments(name string, deps []*config.Deployment) (*config.Deployment, error) {
	out := &config.Deployment{Name: name, Mode: deps[0].Mode, Limits: deps[0].Limits, Replay: deps[0].Replay}
	hosts := map[string]bool{}
	for _, d := range deps {
		for _, h := range d.Hosts {
			if !hosts[h] {
				hosts[h] = true
				out.Hosts = append(out.Hosts, h)
			}
		}
		out.Models = append(out.Models, d.Models...)
		out.Services = append(out.Services, d.Services...)
		out.Limits.MaxMessageBytes = max(out.Limits.MaxMessageBytes, d.Limits.MaxMessageBytes)
		out.Limits.RequestTimeout = max(out.Limits.RequestTimeout, d.Limits.RequestTimeout)
	}
	if err := out.Validate(); err != nil {
		return nil, fmt.Errorf("merge examples: %w", err)
	}
	return out, nil
}

// describeAll asks the model servers for every model's description.
func describeAll(ctx context.Context, d *cluster.Deployment, only ...string) (map[string]*hamsv1.ModelDescription, error) {
	out := map[string]*hamsv1.ModelDescription{}
	var mu sync.Mutex
	names := cluster.SortedModels(d.Config)
	if len(only) > 0 {
		names = only
	}
	err := cluster.Parallel(names, func(m string) error {
		addr := d.ModelServers[m]
		cc, err := grpcx.Dial(addr, d.Config.Limits.MaxMessageBytes, d.AdminDialOpts(d.Config.Model(m))...)
		if err != nil {
			return err
		}
		defer cc.Close()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		desc, err := hamsv1.NewModelRuntimeClient(cc).Describe(cctx, &hamsv1.DescribeRequest{Model: d.Config.Model(m).Backend.Model})
		if err != nil {
			return fmt.Errorf("describe %s at %s: %w", m, addr, err)
		}
		mu.Lock()
		out[m] = desc
		mu.Unlock()
		return nil
	})
	return out, err
}

type killList []killSpec

func (k *killList) String() string { return fmt.Sprint(*k) }

func (k *killList) Set(s string) error {
	ks, err := parseKill(s)
	if err != nil {
		return err
	}
	*k = append(*k, ks)
	return nil
}

// DemoConfig is what the flags of the command set.
type DemoConfig struct {
	Service         string          // --service
	Duration        time.Duration   // --duration
	Kills           killList        // --kill
	JSON            string          // --json
	Mode            string          // --mode
	CheckpointEvery int             // --checkpoint-every
	Audit           string          // --audit
	Concurrency     int             // --concurrency
	Seed            uint64          // --seed
	Timeout         time.Duration   // --timeout
	Rows            int             // --rows
	Suspicion       time.Duration   // --suspicion-timeout
	Dashboard       string          // --dashboard
	Task            Task            // the task flags
	Options         cluster.Options // deployment options of the control flags (--frontends, --managers, --insecure, --nats...)
}

// Demo is a configured hams demo run.
type Demo struct{ c DemoConfig }

// NewDemo validates c (mode, durations, sizes, kill times); it does no
// I/O. Kill targets are checked against the deployment in Run.
func NewDemo(c DemoConfig) (*Demo, error) {
	if err := CheckMode(c.Mode); err != nil {
		return nil, err
	}
	if c.Duration <= 0 || c.Concurrency < 1 || c.Rows < 1 || c.Timeout <= 0 {
		return nil, Usagef("demo: --duration, --timeout, --concurrency and --rows must be positive")
	}
	for _, k := range c.Kills {
		if k.After >= c.Duration {
			return nil, Usagef("demo: --kill %s@%v is not before the end of the run (%v)", k.target(), k.After, c.Duration)
		}
	}
	return &Demo{c: c}, nil
}

// Run starts the deployment, drives load for the configured duration,
// executes the kills, checks every reply and prints (and writes) the
// report; it returns when done or when ctx ends.
func (dm *Demo) Run(ctx context.Context) error {
	c := dm.c
	service := &c.Service
	duration := &c.Duration
	kills := c.Kills
	jsonPath := &c.JSON
	mode := &c.Mode
	ckptEvery := &c.CheckpointEvery
	audit := &c.Audit
	conc := &c.Concurrency
	seed := &c.Seed
	timeout := &c.Timeout
	rows := &c.Rows
	suspicion := &c.Suspicion
	dash := &c.Dashboard
	tf := &c.Task
	nFrontends, nManagers := c.Options.Counts(*mode)
	dir, cleanup, err := tf.Prepare("hams-demo-")
	if err != nil {
		return err
	}
	ok := false
	defer func() { cleanup(ok) }()
	if *service == ParmService {
		if len(kills) > 0 || *ckptEvery != 0 {
			return Usagef("demo: --service parm takes no --kill or --checkpoint-every (a pool instance that dies is routed around; hams chaos kills under load)")
		}
		opt := c.Options
		opt.RunDir, opt.LogLevel, opt.Logger = dir, tf.LogLevel, TaskLogger(tf.Verbose)
		opt.SuspicionTimeout, opt.Audit, opt.Dashboard = cluster.SuspicionFor(*suspicion), *audit, *dash
		if *audit != "" {
			if opt.Audit, err = cluster.PrepareAudit(*audit); err != nil {
				return err
			}
		}
		if err := runParmDemo(ctx, parmDemoOptions{opt: opt, mode: *mode, json: *jsonPath, duration: *duration, timeout: *timeout,
			conc: *conc, rows: *rows, seed: *seed}); err != nil {
			return err
		}
		ok = true
		return nil
	}
	dep, services, err := exampleDeployment(*service, dir)
	if err != nil {
		return err
	}
	dep.Mode = *mode
	if err := setCheckpointEvery(dep, *ckptEvery); err != nil {
		return err
	}
	for _, k := range kills {
		if k.Role == cluster.RoleNATS {
			continue
		}
		if k.Role.Numbered() {
			n := map[cluster.ChildRole]int{cluster.RoleFrontend: nFrontends, cluster.RoleManager: nManagers}[k.Role]
			if i, _ := strconv.Atoi(k.Model); k.Model != "" && i >= n {
				return Usagef("demo: --kill %s: the deployment has %d %ss (0..%d)", k.target(), n, k.Role, n-1)
			}
			continue
		}
		if k.Model != "" && dep.Model(k.Model) == nil {
			return Usagef("demo: --kill %s: model %q is not in service %s (models: %s)", k.target(), k.Model, *service, strings.Join(cluster.SortedModels(dep), ", "))
		}
		if (k.Role == cluster.RoleBackupSidecar || k.Role == cluster.RoleBackupModelServer) && !dep.HasBackup(dep.Model(k.Model)) {
			return Usagef("demo: --kill %s: model %q has no backup in mode %s", k.target(), k.Model, *mode)
		}
		if (k.Role == cluster.RoleStandbySidecar || k.Role == cluster.RoleStandbyModelSrv) && (dep.Model(k.Model).Stateful || !config.Mode(*mode).Protected()) {
			return Usagef("demo: --kill %s: model %q has no hot standby in mode %s (stateless models have one in every mode but bare)", k.target(), k.Model, *mode)
		}
	}
	if *audit != "" {
		if *audit, err = cluster.PrepareAudit(*audit); err != nil {
			return err
		}
	}

	fmt.Fprintf(os.Stderr, "hams demo: starting %s (%d models, mode %s) in %s\n", *service, len(dep.Models), *mode, dir)
	t0 := time.Now()
	opt := c.Options
	opt.RunDir, opt.LogLevel, opt.Logger = dir, tf.LogLevel, TaskLogger(tf.Verbose)
	opt.SuspicionTimeout, opt.Audit, opt.Dashboard = cluster.SuspicionFor(*suspicion), *audit, *dash
	d, err := cluster.Start(ctx, dep, opt)
	if err != nil {
		return err
	}
	defer d.Close()
	fmt.Fprintf(os.Stderr, "hams demo: deployment ready in %v (frontends %s, managers %s)\n", time.Since(t0).Round(time.Millisecond),
		strings.Join(d.Frontends, " "), strings.Join(d.Managers, " "))
	if u := cluster.DashboardURL(d.Dashboards, 0); u != "" {
		fmt.Fprintf(os.Stderr, "hams demo: dashboard %s\n", u)
	}
	descs, err := describeAll(ctx, d)
	if err != nil {
		return err
	}
	var csvcs []checker.Service
	for _, s := range services {
		cs, err := checker.ServiceOf(dep, s, descs)
		if err != nil {
			return err
		}
		csvcs = append(csvcs, cs)
	}
	chk := checker.New(csvcs...)
	gens := make([]*loadgen.Generator, *conc)
	for i := range gens {
		if gens[i], err = loadgen.NewGenerator(dep.Service(services[i%len(services)]), *seed+uint64(i), *rows, loadgen.Fashion()); err != nil {
			return err
		}
	}
	fes, closeFEs, err := d.FrontendClients()
	if err != nil {
		return err
	}
	defer closeFEs()

	rec := loadgen.NewRecorder()
	perSvc := map[string]*loadgen.Recorder{}
	for _, s := range services {
		perSvc[s] = loadgen.NewRecorder()
	}
	kt := newKillTracker()
	var (
		mu       sync.Mutex
		kreports = make([]*killReport, len(kills))
		models   = map[string]modelStats{}
		seenSeq  = map[string]map[uint64]bool{}
		firstBad string
		errCodes = map[string]int{}
	)
	for i, k := range kills {
		kr := &killReport{Target: k.target(), Kind: killKind(dep, k), RecoveryMs: -1, RestartMs: -1, RestoredMs: -1}
		if k.Model != "" && !k.Role.ControlPlane() {
			kr.services = []string{dep.ServiceOf(k.Model).Name}
		} else {
			kr.services = services
		}
		kreports[i] = kr
		kt.add(kr)
	}
	onResult := func(r loadgen.Result) {
		key := r.Request.RequestId
		svc := r.Request.Service
		if r.Err != nil {
			chk.Failed(key, r.Err)
			perSvc[svc].Err(1)
			mu.Lock()
			errCodes[status.Code(r.Err).String()]++
			mu.Unlock()
			return
		}
		perSvc[svc].OK(r.Latency, 1)
		if err := chk.Check(key, r.Reply); err != nil {
			mu.Lock()
			if firstBad == "" {
				firstBad = err.Error()
			}
			mu.Unlock()
		}
		kt.reply(svc, r)
		mu.Lock()
		defer mu.Unlock()
		for _, e := range r.Reply.Lineage {
			if seenSeq[e.Model] == nil {
				seenSeq[e.Model] = map[uint64]bool{}
			}
			if !seenSeq[e.Model][e.Seq] {
				seenSeq[e.Model][e.Seq] = true
				ms := models[e.Model]
				ms.Executions++
				ms.MaxSeq = max(ms.MaxSeq, e.Seq)
				models[e.Model] = ms
			}
		}
	}

	loadStart := time.Now()
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	var bg sync.WaitGroup
	for i, k := range kills {
		bg.Add(1)
		go func() {
			defer bg.Done()
			select {
			case <-time.After(time.Until(loadStart.Add(k.After))):
			case <-runCtx.Done():
				return
			}
			kr := kreports[i]
			var waits chan struct{}
			verb := "killed"
			if k.Partition {
				waits = partitionNow(runCtx, d, kt, kr, k.Role, k.Model, loadStart, k.Freeze)
				verb = "partitioned (cut off the network for " + k.Freeze.String() + ")"
			} else if k.Freeze > 0 {
				waits = freezeNow(runCtx, d, kt, kr, k.Role, k.Model, loadStart, k.Freeze)
				verb = "froze (SIGSTOP for " + k.Freeze.String() + ")"
			} else {
				waits = killNow(runCtx, d, kt, kr, k.Role, k.Model, loadStart)
			}
			kt.mu.Lock()
			fmt.Fprintf(os.Stderr, "\nhams demo: "+verb+" %s (%s, %s) at %v%s\n", kr.Target, kr.Process, kr.Kind, time.Duration(kr.AtMs*float64(time.Millisecond)).Round(time.Millisecond),
				map[bool]string{true: ": " + kr.Error}[kr.Error != ""])
			bare := kr.Error == "" && k.Freeze == 0 && !d.Protected() && (k.Role == cluster.RoleSidecar || k.Role == cluster.RoleModelServer)
			at := kr.killAt
			kt.mu.Unlock()
			if bare {
				// Bare mode restarts the process in place: it numbers
				// requests from 1 again (no recovery protocol), which the
				// checker counts as seq_reuse.
				chk.Restarted(k.Model, at)
			}
			<-waits
		}()
	}
	progressDone := make(chan struct{})
	bg.Add(1)
	go func() {
		defer bg.Done()
		progress(os.Stderr, rec, *duration, progressDone)
	}()
	st, err := loadgen.Run(runCtx, loadgen.RunConfig{
		Frontends:    fes,
		Concurrency:  *conc,
		Duration:     *duration,
		Timeout:      *timeout,
		ErrorBackoff: 10 * time.Millisecond,
		Recorder:     rec,
		NewRequest: func(c int, i uint64) *hamsv1.PredictRequest {
			svc := services[c%len(services)]
			req := &hamsv1.PredictRequest{
				Service:   svc,
				RequestId: fmt.Sprintf("c%d-%d", c, i),
				StreamId:  fmt.Sprintf("stream-%d", c),
				Inputs:    gens[c].Inputs(),
			}
			chk.Sent(req.RequestId, req)
			perSvc[svc].Sent(1)
			return req
		},
		OnResult: onResult,
	})
	close(progressDone)
	cancelRun()
	bg.Wait()
	if err != nil {
		return err
	}
	sum := chk.Finish()
	rep := demoReport{
		Service: *service, Mode: *mode, DurationS: cluster.Round3(st.ElapsedS),
		Requests: st.Requests, Replies: st.Replies, Errors: st.Errors, Incorrect: sum.Violations,
		P50Ms: st.P50Ms, P99Ms: st.P99Ms, MeanMs: st.MeanMs, ThroughputRPS: st.ThroughputRPS,
		Services: map[string]loadgen.Stats{}, Models: models, Check: sum,
	}
	if len(errCodes) > 0 {
		rep.ErrorsByCode = errCodes
	}
	for s, r := range perSvc {
		r.Stop()
		rep.Services[s] = r.Stats()
	}
	rep.Kills = kt.snapshot()
	printDemoSummary(os.Stdout, rep, firstBad)
	if *jsonPath != "" {
		if err := writeJSON(*jsonPath, rep); err != nil {
			return err
		}
	}
	if err := d.Close(); err != nil {
		return err
	}
	switch {
	case sum.Violations > 0:
		return &ExitError{Code: 1, Err: fmt.Errorf("demo: %d incorrect replies (e.g. %s)", sum.Violations, strings.Join(sum.Examples[:min(3, len(sum.Examples))], "; "))}
	case st.Replies == 0:
		return &ExitError{Code: 1, Err: fmt.Errorf("demo: no replies")}
	case unrecovered(rep.Kills) != "":
		return &ExitError{Code: 1, Err: fmt.Errorf("demo: no successful reply after killing %s", unrecovered(rep.Kills))}
	case st.Errors > 0 && len(kills) == 0:
		return &ExitError{Code: 1, Err: fmt.Errorf("demo: %d requests failed without any kill", st.Errors)}
	}
	ok = true
	return nil
}

func unrecovered(ks []killReport) string {
	var out []string
	for _, k := range ks {
		if !k.Recovered {
			out = append(out, k.Target)
		}
	}
	return strings.Join(out, ", ")
}

func killKind(dep *config.Deployment, k killSpec) string {
	switch k.Role {
	case cluster.RoleBackupSidecar:
		return "backup"
	case cluster.RoleSidecar:
	default:
		return string(k.Role)
	}
	if m := dep.Model(k.Model); m != nil && m.Stateful {
		return "primary"
	}
	return "stateless"
}

// progress draws one updating status line until done (progress.go).
func progress(w io.Writer, rec *loadgen.Recorder, total time.Duration, done <-chan struct{}) {
	LoadBar(w, total, done, func() string {
		s := rec.Stats()
		return fmt.Sprintf("replies %d  errors %d  p50 %.2fms", s.Replies, s.Errors, s.P50Ms)
	})
}

func printDemoSummary(w io.Writer, r demoReport, firstBad string) {
	fmt.Fprintf(w, "\nHAMS-Go demo: service %s, mode %s, %.1fs\n", r.Service, r.Mode, r.DurationS)
	fmt.Fprintf(w, "  requests %d  replies %d  errors %d  incorrect %d\n", r.Requests, r.Replies, r.Errors, r.Incorrect)
	if len(r.ErrorsByCode) > 0 {
		fmt.Fprintf(w, "  errors by code: %v\n", r.ErrorsByCode)
	}
	fmt.Fprintf(w, "  latency p50 %.2f ms  p99 %.2f ms  mean %.2f ms   throughput %.1f req/s\n", r.P50Ms, r.P99Ms, r.MeanMs, r.ThroughputRPS)
	if len(r.Services) > 1 {
		fmt.Fprintln(w, "  per service:")
		names := make([]string, 0, len(r.Services))
		for n := range r.Services {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			s := r.Services[n]
			fmt.Fprintf(w, "    %-6s replies %6d  errors %4d  p50 %7.2f ms  p99 %7.2f ms\n", n, s.Replies, s.Errors, s.P50Ms, s.P99Ms)
		}
	}
	fmt.Fprintln(w, "  per model (from reply lineage):")
	names := make([]string, 0, len(r.Models))
	for n := range r.Models {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "    %-14s executions %6d  max seq %6d\n", n, r.Models[n].Executions, r.Models[n].MaxSeq)
	}
	for _, k := range r.Kills {
		if k.Recovered {
			fmt.Fprintf(w, "  kill %s (%s, %s) at %.0f ms: first reply served after %.0f ms, redundancy restored after %.0f ms", k.Target, k.Process, k.Kind, k.AtMs, k.RecoveryMs, k.RestoredMs)
			if k.RestartMs >= 0 {
				fmt.Fprintf(w, ", restarted in place in %.0f ms", k.RestartMs)
			}
			fmt.Fprintln(w)
		} else {
			fmt.Fprintf(w, "  kill %s (%s) at %.0f ms: NO successful reply afterwards%s\n", k.Target, k.Kind, k.AtMs, map[bool]string{true: " (" + k.Error + ")"}[k.Error != ""])
		}
	}
	if r.Incorrect > 0 {
		fmt.Fprintf(w, "  INCORRECT replies: %v (first: %s)\n", r.Check.ByKind, firstBad)
	} else {
		fmt.Fprintf(w, "  every reply checked: outputs, lineage, no (model, seq) in two replies\n")
	}
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}
