package harness

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/integration/consistency"
	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/coord"
	"github.com/hams-go/hams/internal/loadgen"
	"github.com/hams-go/hams/internal/netfault"
	"github.com/hams-go/hams/internal/run"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// ChaosReport is the --json report of `hams chaos` (docs/design.md): kills and
// the totals of the consistency check over the audit logs.
type ChaosReport struct {
	Service    string       `json:"service"`
	Mode       string       `json:"mode"`
	Seed       uint64       `json:"seed"`
	DurationS  float64      `json:"duration_s"`
	Kills      []killReport `json:"kills"`
	Requests   int          `json:"requests"`
	Replies    int          `json:"replies"`
	Errors     int          `json:"errors"`
	Conflicts  int          `json:"conflicts"`
	Lost       int          `json:"lost"`
	Duplicates int          `json:"duplicates"`
	// Approximate counts the replies marked approximate (a replica
	// pool's parity reconstruction, docs/design.md "Parity models").
	Approximate int `json:"approximate"`
	// RecoveryP50Ms and RecoveryMaxMs summarise recovery_ms over the kills
	// that recovered.
	RecoveryP50Ms float64 `json:"recovery_p50_ms"`
	RecoveryMaxMs float64 `json:"recovery_max_ms"`
	// RecoveryMsByKind: p50 and max recovery_ms per kill kind.
	RecoveryMsByKind map[string]recoveryStats `json:"recovery_ms_by_kind"`
	// Frontends and Managers are the deployment's control-plane sizes.
	Frontends int `json:"frontends"`
	Managers  int `json:"managers"`
	// Retried counts requests a client sent again, with the same
	// request_id, to another frontend (its frontend died).
	Retried int `json:"retried"`
	// Reasked counts answered requests sent again after the run, with the
	// same request_id, to another frontend than the one that answered
	// (every retried one and a sample of the others); ReaskMismatches
	// those whose answer differed (req_id or reply digest).
	Reasked         int `json:"reasked"`
	ReaskMismatches int `json:"reask_mismatches"`
	// ErrorsByCode counts the requests that ended in an error by gRPC
	// code; ErrorExamples has the first few distinct messages.
	ErrorsByCode  map[string]int `json:"errors_by_code,omitempty"`
	ErrorExamples []string       `json:"error_examples,omitempty"`
	// FailedRequests are the first maxFailedListed requests that ended
	// in an error, with when they were sent (ms since the load started,
	// the clock of the kills' at_ms): what a lost request is set
	// against in the fault timeline.
	FailedRequests []FailedRequest     `json:"failed_requests,omitempty"`
	Consistency    *consistency.Report `json:"consistency"`
}

// FailedRequest is one request of a chaos run that ended in an error.
type FailedRequest struct {
	RequestID string  `json:"request_id"`
	SentAtMs  float64 `json:"sent_at_ms"`
	LatencyMs float64 `json:"latency_ms"`
	// Frontends are the frontends it was sent to, in order.
	Frontends []int  `json:"frontends"`
	Code      string `json:"code"`
	Error     string `json:"error"`
}

// maxFailedListed bounds ChaosReport.FailedRequests.
const maxFailedListed = 100

// recoveryStats summarises recovery_ms of the kills of one kind.
type recoveryStats struct {
	Kills     int     `json:"kills"`
	Recovered int     `json:"recovered"`
	P50Ms     float64 `json:"p50_ms"`
	MaxMs     float64 `json:"max_ms"`
}

// chaosTarget is one kill candidate: a --kill role and model.
type chaosTarget struct {
	role        cluster.ChildRole
	model, kind string
}

// chaosTargets lists the candidates per kind: primaries and backups of
// replicated models, stateless models' serving instances (sidecar or
// model server), the leading frontend and every frontend process (so the
// leading one, which injects every request, is drawn more often), and the
// active manager.
func chaosTargets(dep *config.Deployment, protected bool, frontends int) map[string][]chaosTarget {
	out := map[string][]chaosTarget{}
	for i, m := range dep.Models {
		// A model server of the model's own (a pooled model's sidecar
		// runs a pool of servers started beside it and restarted in place
		// on their addresses: only the sidecar is failed over).
		own := cluster.ExternalAddr(&dep.Models[i]) == ""
		procs := func(sc, ms cluster.ChildRole) []cluster.ChildRole {
			if own {
				return []cluster.ChildRole{sc, ms}
			}
			return []cluster.ChildRole{sc}
		}
		switch {
		case dep.HasBackup(&dep.Models[i]):
			for _, r := range procs(cluster.RoleSidecar, cluster.RoleModelServer) {
				out["primary"] = append(out["primary"], chaosTarget{r, m.Name, "primary"})
			}
			for _, r := range procs(cluster.RoleBackupSidecar, cluster.RoleBackupModelServer) {
				out["backup"] = append(out["backup"], chaosTarget{r, m.Name, "backup"})
			}
		case !m.Stateful || !protected:
			for _, r := range procs(cluster.RoleSidecar, cluster.RoleModelServer) {
				out["stateless"] = append(out["stateless"], chaosTarget{r, m.Name, "stateless"})
			}
		}
	}
	out["manager"] = []chaosTarget{{cluster.RoleManager, "", "manager"}}
	out["nats"] = []chaosTarget{{cluster.RoleNATS, "", "nats"}}
	out["frontend"] = []chaosTarget{{cluster.RoleFrontend, "", "frontend"}}
	for i := range frontends {
		out["frontend"] = append(out["frontend"], chaosTarget{cluster.RoleFrontend, strconv.Itoa(i), "frontend"})
	}
	return out
}

// ChaosKinds are the kill kinds of hams chaos (the default); "nats" (the
// coordination engine, restarted in place) can be asked for too.
var ChaosKinds = []string{"primary", "backup", "stateless", "frontend", "manager"}

// chaosFaultKinds are the --kinds that are not process kinds but faults
// applied to one: freeze (SIGSTOP, then SIGCONT) and partition (the
// process cut off the network, then healed), each for a drawn time.
var chaosFaultKinds = []string{"freeze", "partition"}

// ChaosConfig is what the flags of the command set.
type ChaosConfig struct {
	// ServiceSet: --service was given (with --config, the default is all
	// of the file's services).
	ServiceSet      bool
	Service         string          // --service
	ConfigFile      string          // --config
	Duration        time.Duration   // --duration
	Seed            uint64          // --seed
	Audit           string          // --audit
	JSON            string          // --json
	Mode            string          // --mode
	CheckpointEvery int             // --checkpoint-every
	Concurrency     int             // --concurrency
	Timeout         time.Duration   // --timeout
	Settle          time.Duration   // --settle
	MaxRecovery     time.Duration   // --max-recovery
	Suspicion       time.Duration   // --suspicion-timeout
	Kinds           string          // --kinds
	Task            Task            // the task flags
	Options         cluster.Options // deployment options of the control flags (--frontends, --managers, --insecure, --nats...)
}

// Chaos is a configured hams chaos run.
type Chaos struct{ c ChaosConfig }

// NewChaos validates c (mode, durations, sizes); it does no I/O. The
// deployment file and the audit directory are checked in Run.
func NewChaos(c ChaosConfig) (*Chaos, error) {
	if err := CheckMode(c.Mode); err != nil {
		return nil, err
	}
	if c.Duration <= 0 || c.Concurrency < 1 || c.Timeout <= 0 || c.Settle <= 0 {
		return nil, Usagef("chaos: --duration, --concurrency, --timeout and --settle must be positive")
	}
	return &Chaos{c: c}, nil
}

// Run starts the deployment, drives load while killing components at
// random, checks every reply and the audit logs, and prints (and writes)
// the report; it returns when done or when ctx ends.
func (ch *Chaos) Run(ctx context.Context) error {
	c := ch.c
	service := &c.Service
	cfgFile := &c.ConfigFile
	duration := &c.Duration
	seed := &c.Seed
	audit := &c.Audit
	jsonPath := &c.JSON
	mode := &c.Mode
	ckptEvery := &c.CheckpointEvery
	conc := &c.Concurrency
	timeout := &c.Timeout
	settle := &c.Settle
	maxRecovery := &c.MaxRecovery
	suspicion := &c.Suspicion
	kinds := &c.Kinds
	tf := &c.Task
	var (
		dep      *config.Deployment
		services []string
	)
	if *cfgFile != "" {
		// Read before the run dir exists: a bad file leaves nothing behind.
		if !c.ServiceSet {
			*service = "all"
		}
		var err error
		if dep, services, err = fileDeployment(*cfgFile, *service); err != nil {
			return err
		}
	}
	dir, cleanup, err := tf.Prepare("hams-chaos-")
	if err != nil {
		return err
	}
	ok := false
	defer func() { cleanup(ok) }()
	if dep == nil {
		if dep, services, err = exampleDeployment(*service, dir); err != nil {
			return err
		}
	}
	dep.Mode = *mode
	if err := setCheckpointEvery(dep, *ckptEvery); err != nil {
		return err
	}
	if *audit == "" {
		*audit = filepath.Join(dir, "audit")
	}
	if *audit, err = cluster.PrepareAudit(*audit); err != nil {
		return err
	}
	if entries, _ := os.ReadDir(*audit); len(entries) > 0 {
		return Usagef("chaos: --audit %s is not empty (the check reads every log under it)", *audit)
	}
	opt := c.Options
	nFrontends, nManagers := opt.Counts(*mode)
	cands := chaosTargets(dep, dep.RunMode().Protected(), nFrontends)
	// pool: the kinds drawn from; a target kind is SIGKILLed, a fault
	// kind (freeze, partition) hits a target of one of the pool's
	// process kinds (not nats) for a drawn time.
	var pool, targetKinds []string
	for _, k := range cluster.SplitList(*kinds) {
		if !slices.Contains(ChaosKinds, k) && k != "nats" && !slices.Contains(chaosFaultKinds, k) {
			return Usagef("chaos: --kinds: unknown kind %q (%s, nats, %s)", k, strings.Join(ChaosKinds, ", "), strings.Join(chaosFaultKinds, ", "))
		}
		if slices.Contains(chaosFaultKinds, k) {
			pool = append(pool, k)
			continue
		}
		if len(cands[k]) > 0 {
			pool = append(pool, k)
			if k != "nats" {
				targetKinds = append(targetKinds, k)
			}
		}
	}
	for _, k := range pool {
		if slices.Contains(chaosFaultKinds, k) && len(targetKinds) == 0 {
			// Faults without a target kind hit any process kind.
			for _, tk := range ChaosKinds {
				if len(cands[tk]) > 0 {
					targetKinds = append(targetKinds, tk)
				}
			}
			break
		}
	}
	if len(pool) == 0 || len(targetKinds) == 0 && slices.ContainsFunc(pool, func(k string) bool { return slices.Contains(chaosFaultKinds, k) }) {
		return Usagef("chaos: no kill targets of kinds %s in service %s (mode %s)", *kinds, *service, *mode)
	}
	if slices.Contains(pool, "partition") {
		if err := netfault.Supported(); err != nil {
			return Usagef("chaos: --kinds partition: %v", err)
		}
	}
	faultBase := cluster.SuspicionFor(*suspicion)

	fmt.Fprintf(os.Stderr, "hams chaos: starting %s (%d models, mode %s, seed %d) in %s\n", *service, len(dep.Models), *mode, *seed, dir)
	opt.RunDir, opt.LogLevel, opt.Logger = dir, tf.LogLevel, TaskLogger(tf.Verbose)
	opt.SuspicionTimeout, opt.Audit = cluster.SuspicionFor(*suspicion), *audit
	d, err := cluster.Start(ctx, dep, opt)
	if err != nil {
		return err
	}
	defer d.Close()
	gens := make([]*loadgen.Generator, *conc)
	for i := range gens {
		if gens[i], err = loadgen.NewGenerator(dep.Service(services[i%len(services)]), *seed*1000+uint64(i), 1, loadgen.Fashion()); err != nil {
			return err
		}
	}
	fes, closeFEs, err := d.FrontendClients()
	if err != nil {
		return err
	}
	defer closeFEs()

	kt := newKillTracker()
	var (
		mu       sync.Mutex
		accepted []consistency.Accepted
		retried  int
		reask    []loadgen.Result // answered requests to send again after the run
		answered int
		approx   int
		errCodes = map[string]int{}
		errMsgs  []string
		failed   []FailedRequest
	)
	rec := loadgen.NewRecorder()
	loadStart := time.Now()
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	var bg sync.WaitGroup
	killsDone := make(chan struct{})
	bg.Add(1)
	go func() {
		defer bg.Done()
		defer close(killsDone)
		rng := rand.New(rand.NewPCG(*seed, 0x6861_6d73))
		// Stop killing when a recovery could not finish before the end.
		last := loadStart.Add(*duration - min(*duration/4, 5*time.Second))
		for {
			wait := *settle + time.Duration(rng.Int64N(int64(*settle)+1))
			if time.Now().Add(wait).After(last) || !run.Sleep(runCtx, wait) {
				return
			}
			kind := pool[rng.IntN(len(pool))]
			fault, faultDur := faultKill, time.Duration(0)
			if slices.Contains(chaosFaultKinds, kind) {
				fault = map[string]faultKind{"freeze": faultFreeze, "partition": faultPartition}[kind]
				// Half to three times the suspicion timeout: some faults
				// end before the manager suspects anything, others are
				// falsely suspected and the process comes back deposed.
				faultDur = faultBase/2 + time.Duration(rng.Int64N(int64(faultBase)*5/2+1))
				kind = targetKinds[rng.IntN(len(targetKinds))]
			}
			tg := cands[kind][rng.IntN(len(cands[kind]))]
			kr := &killReport{Target: string(tg.role), Kind: tg.kind, RecoveryMs: -1, RestartMs: -1, RestoredMs: -1, services: services}
			if tg.model != "" {
				kr.Target += ":" + tg.model
			}
			if tg.model != "" && tg.kind != "frontend" {
				kr.services = []string{dep.ServiceOf(tg.model).Name}
			}
			recovered := kt.add(kr)
			wctx, cancel := context.WithTimeout(runCtx, *maxRecovery)
			waits := faultNow(wctx, d, kt, kr, tg.role, tg.model, loadStart, fault, faultDur)
			kt.mu.Lock()
			fmt.Fprintf(os.Stderr, "hams chaos: %7.0f ms  kill %s (%s, %s%s)%s\n", kr.AtMs, kr.Target, kr.Process, kr.Kind, map[bool]string{true: ", " + kr.Note}[kr.Note != ""],
				map[bool]string{true: ": " + kr.Error}[kr.Error != ""])
			failed := kr.Error != ""
			kt.mu.Unlock()
			if failed {
				cancel()
				continue
			}
			select {
			case <-recovered:
			case <-wctx.Done():
			}
			<-waits
			cancel()
			kt.mu.Lock()
			fmt.Fprintf(os.Stderr, "hams chaos:            recovered after %.0f ms, redundancy restored after %.0f ms\n", kr.RecoveryMs, kr.RestoredMs)
			gaveUp := !kr.Recovered || kr.RestoredMs < 0
			lacking := kr.Unrestored
			kt.mu.Unlock()
			if gaveUp {
				fmt.Fprintf(os.Stderr, "hams chaos: %s did not recover within %v (lacking %v); no more kills\n", kr.Target, *maxRecovery, lacking)
				return
			}
		}
	}()
	st, err := loadgen.Run(runCtx, loadgen.RunConfig{
		Frontends:    fes,
		Concurrency:  *conc,
		Duration:     *duration,
		Timeout:      *timeout,
		ErrorBackoff: 10 * time.Millisecond,
		Recorder:     rec,
		NewRequest: func(c int, i uint64) *hamsv1.PredictRequest {
			return &hamsv1.PredictRequest{
				Service:   services[c%len(services)],
				RequestId: fmt.Sprintf("c%d-%d", c, i),
				StreamId:  fmt.Sprintf("stream-%d", c),
				Inputs:    gens[c].Inputs(),
			}
		},
		OnResult: func(r loadgen.Result) {
			a := consistency.Accepted{ClientRequestID: r.Request.RequestId}
			if r.Err == nil {
				a.ReqID = strconv.FormatUint(r.Reply.GetReqId(), 10)
				a.ReplyDigest = replyDigest(r.Reply)
				kt.reply(r.Request.Service, r)
			}
			mu.Lock()
			accepted = append(accepted, a)
			if len(r.Frontends) > 1 {
				retried++
			}
			if r.Err != nil {
				errCodes[status.Code(r.Err).String()]++
				if msg := r.Err.Error(); len(errMsgs) < 3 && !slices.Contains(errMsgs, msg) {
					errMsgs = append(errMsgs, msg)
				}
				if len(failed) < maxFailedListed {
					failed = append(failed, FailedRequest{RequestID: r.Request.GetRequestId(), SentAtMs: cluster.MsSince(loadStart, r.Sent),
						LatencyMs: float64(r.Latency.Microseconds()) / 1e3, Frontends: r.Frontends, Code: status.Code(r.Err).String(), Error: r.Err.Error()})
				}
			}
			if r.Err == nil {
				if len(r.Frontends) > 1 || answered%reaskEvery == 0 {
					reask = append(reask, r)
				}
				answered++
				if r.Reply.GetApproximate() {
					approx++
				}
			}
			mu.Unlock()
		},
	})
	// Load has drained (every request answered or past its deadline).
	cancelRun()
	bg.Wait()
	if err != nil {
		return err
	}
	// Retried request ids get the same answer: send answered requests
	// again to another frontend than the one that answered.
	if !opt.RequestLog && nFrontends == 1 {
		reask = nil // no request log: a restarted frontend forgot its answers
	}
	var skipped int
	if reask, skipped = withinRetention(reask, time.Now()); skipped > 0 {
		fmt.Fprintf(os.Stderr, "hams chaos: %d answered requests older than the request log's retention (%v) not re-asked\n", skipped, coord.RequestLogMaxAge)
	}
	mismatches, mexamples := reaskAll(ctx, fes, reask, *timeout)
	if len(mexamples) > 0 {
		fmt.Fprintf(os.Stderr, "hams chaos: re-asked requests answered differently: %s\n", strings.Join(mexamples, "; "))
	}
	// Quiescence: give backups a moment to apply what they received (in
	// replay mode: wait until the primaries checkpointed their idle tail),
	// then stop every process with SIGTERM so the audit logs are complete.
	time.Sleep(300 * time.Millisecond)
	if err := cluster.WaitReplayCheckpointed(ctx, d, 15*time.Second); err != nil {
		fmt.Fprintf(os.Stderr, "hams chaos: replay: %v\n", err)
	}
	if err := d.Close(); err != nil {
		return fmt.Errorf("chaos: stop deployment: %w", err)
	}
	var stateful []string
	for _, m := range dep.Models {
		if m.Stateful {
			stateful = append(stateful, m.Name)
		}
	}
	crep, err := consistency.CheckWith(*audit, accepted, consistency.Options{Quiescent: true, Stateful: stateful})
	if err != nil {
		return fmt.Errorf("chaos: consistency check: %w", err)
	}
	rep := ChaosReport{
		Service: *service, Mode: *mode, Seed: *seed, DurationS: cluster.Round3(st.ElapsedS), Kills: kt.snapshot(),
		Requests: st.Requests, Replies: st.Replies, Errors: st.Errors,
		Conflicts: crep.Conflicts, Lost: crep.Lost, Duplicates: crep.Duplicates, Approximate: approx, Consistency: crep,
		Frontends: nFrontends, Managers: nManagers, Retried: retried, Reasked: len(reask), ReaskMismatches: mismatches,
		RecoveryMsByKind: byKind(kt.snapshot()), ErrorsByCode: errCodes, ErrorExamples: errMsgs, FailedRequests: failed,
	}
	if rep.Kills == nil {
		rep.Kills = []killReport{}
	}
	var recs []float64
	for _, k := range rep.Kills {
		if k.Recovered {
			recs = append(recs, k.RecoveryMs)
		}
	}
	if len(recs) > 0 {
		slices.Sort(recs)
		rep.RecoveryP50Ms = recs[(len(recs)-1)/2]
		rep.RecoveryMaxMs = recs[len(recs)-1]
	}
	fmt.Printf("\nHAMS-Go chaos: service %s, mode %s, seed %d, %.1fs, %d kills\n", rep.Service, rep.Mode, rep.Seed, rep.DurationS, len(rep.Kills))
	if len(rep.Kills) > 0 {
		tb := NewTableAlign("rlllrrl", "at_ms", "target", "kind", "note", "recovery_ms", "restored_ms", "")
		for _, k := range rep.Kills {
			tb.AppendRow([]any{fmt.Sprintf("%.0f", k.AtMs), k.Target, k.Kind, k.Note, fmt.Sprintf("%.0f", k.RecoveryMs), fmt.Sprintf("%.0f", k.RestoredMs),
				strings.TrimSpace(map[bool]string{true: "(now active: " + k.NewActive + ")"}[k.NewActive != ""] + map[bool]string{true: "  (" + k.Error + ")"}[k.Error != ""])})
		}
		Render(os.Stdout, tb, "  ")
	}
	fmt.Printf("  requests %d  replies %d  errors %d  recovery p50 %.0f ms  max %.0f ms\n", rep.Requests, rep.Replies, rep.Errors, rep.RecoveryP50Ms, rep.RecoveryMaxMs)
	if rep.Approximate > 0 {
		fmt.Printf("  approximate replies %d (parity reconstructions, marked)\n", rep.Approximate)
	}
	if len(errMsgs) > 0 {
		fmt.Printf("  errors by code %v, e.g. %s\n", errCodes, strings.Join(errMsgs, "; "))
		for _, f := range failed {
			fmt.Printf("  failed %s sent at %.0f ms, %s after %.0f ms (frontends %v)\n", f.RequestID, f.SentAtMs, f.Code, f.LatencyMs, f.Frontends)
		}
	}
	fmt.Printf("  frontends %d  managers %d  retried on another frontend %d  re-asked %d (%d answered differently)\n", rep.Frontends, rep.Managers, rep.Retried, rep.Reasked, rep.ReaskMismatches)
	fmt.Printf("  consistency: conflicts %d  lost %d  duplicates %d  (%s)\n", rep.Conflicts, rep.Lost, rep.Duplicates, *audit)
	if *jsonPath != "" {
		if err := writeJSON(*jsonPath, rep); err != nil {
			return err
		}
	}
	if rep.ReaskMismatches > 0 {
		return &ExitError{Code: 1, Err: fmt.Errorf("chaos: %d re-asked requests answered differently (e.g. %s)", rep.ReaskMismatches, strings.Join(mexamples, "; "))}
	}
	if rep.Conflicts > 0 || rep.Lost > 0 {
		var ex []string
		for _, is := range crep.Examples[:min(3, len(crep.Examples))] {
			ex = append(ex, is.String())
		}
		return &ExitError{Code: 1, Err: fmt.Errorf("chaos: %d conflicts, %d lost (e.g. %s)", rep.Conflicts, rep.Lost, strings.Join(ex, "; "))}
	}
	ok = true
	return nil
}

// fileDeployment reads the deployment file of --config and keeps only
// service's models (every model for "all"); it returns the services the
// load goes to.
func fileDeployment(path, service string) (*config.Deployment, []string, error) {
	d, err := cluster.LoadDeployment(path)
	if err != nil {
		return nil, nil, &ExitError{Code: 2, Err: fmt.Errorf("chaos: --config %s: %w", path, err)}
	}
	if service == "all" {
		return d, d.ServiceNames(), nil
	}
	if d.Service(service) == nil {
		return nil, nil, Usagef("chaos: --service %q: unknown in %s (one of %s, all)", service, path, strings.Join(d.ServiceNames(), ", "))
	}
	if d, err = cluster.OnlyService(d, service); err != nil {
		return nil, nil, &ExitError{Code: 2, Err: fmt.Errorf("chaos: --config %s: %w", path, err)}
	}
	return d, []string{service}, nil
}

// reaskEvery: besides every retried request, every reaskEvery-th answered
// request is asked again after the run.
const reaskEvery = 25

// replyDigest is the digest the frontend's audit record gives a reply:
// every output tensor in reply order.
func replyDigest(r *hamsv1.PredictResponse) string {
	var ts []*hamsv1.Tensor
	for _, o := range r.GetOutputs() {
		ts = append(ts, o.GetTensors()...)
	}
	return tensor.Digest(ts...)
}

// withinRetention keeps the results of rs sent inside the request log's
// retention (coord.RequestLogMaxAge, less a minute's margin) as of now and
// counts the others. Asked again after it, an answered request is a new
// one and runs again (docs/coordination.md): a 30-minute soak re-asked its
// first requests at its end and counted their new answers as mismatches.
func withinRetention(rs []loadgen.Result, now time.Time) (kept []loadgen.Result, skipped int) {
	cutoff := now.Add(-coord.RequestLogMaxAge + time.Minute)
	n := len(rs)
	kept = slices.DeleteFunc(rs, func(r loadgen.Result) bool { return r.Sent.Before(cutoff) })
	return kept, n - len(kept)
}

// reaskAll sends every answered request of rs again (same request_id and
// inputs) to another frontend than the one that answered it, and counts
// the answers that differ from the first one (req_id or reply digest).
func reaskAll(ctx context.Context, fes []hamsv1.FrontendClient, rs []loadgen.Result, timeout time.Duration) (mismatches int, examples []string) {
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	sem := make(chan struct{}, 8)
	for k, r := range rs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			to := 0
			if n := len(fes); n > 1 && len(r.Frontends) > 0 {
				to = (r.Frontends[len(r.Frontends)-1] + 1 + k%(n-1)) % n
			}
			// Unavailable (the request log could not be read in time on
			// an overloaded machine) is asked again until the timeout.
			cctx, cancel := context.WithTimeout(ctx, timeout)
			got, err := fes[to].Predict(cctx, r.Request)
			for status.Code(err) == codes.Unavailable && run.Sleep(cctx, 20*time.Millisecond) {
				got, err = fes[to].Predict(cctx, r.Request)
			}
			cancel()
			var why string
			switch {
			case err != nil:
				why = err.Error()
			case got.GetReqId() != r.Reply.GetReqId():
				why = fmt.Sprintf("req_id %d, first answer req_id %d", got.GetReqId(), r.Reply.GetReqId())
			case replyDigest(got) != replyDigest(r.Reply):
				why = "another reply digest"
			}
			if why != "" {
				mu.Lock()
				mismatches++
				if len(examples) < 3 {
					examples = append(examples, fmt.Sprintf("%s on frontend %d: %s", r.Request.GetRequestId(), to, why))
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return mismatches, examples
}

// byKind summarises recovery_ms per kill kind.
func byKind(kills []killReport) map[string]recoveryStats {
	recs := map[string][]float64{}
	out := map[string]recoveryStats{}
	for _, k := range kills {
		s := out[k.Kind]
		s.Kills++
		if k.Recovered {
			s.Recovered++
			recs[k.Kind] = append(recs[k.Kind], k.RecoveryMs)
		}
		out[k.Kind] = s
	}
	for kind, rs := range recs {
		slices.Sort(rs)
		s := out[kind]
		s.P50Ms, s.MaxMs = rs[(len(rs)-1)/2], rs[len(rs)-1]
		out[kind] = s
	}
	return out
}
