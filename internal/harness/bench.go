package harness

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/hams-go/hams/adapters"
	"github.com/hams-go/hams/examples"
	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/loadgen"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// BenchModes are the modes `hams bench` knows (its arms, benchArm);
// benchImplemented the ones this build runs.
var (
	BenchModes       = append([]string{string(armDirect)}, config.Modes...)
	benchImplemented = append([]string{string(armDirect)}, cluster.ImplementedModes...)
)

// benchArm is one configuration `hams bench` measures, as --modes and
// BenchRow.Mode name it: a fault-tolerance mode (config.Modes), or
// armDirect.
type benchArm string

const (
	// armDirect is the baseline without HAMS: a bare deployment's model
	// servers, which the bench client chains itself (no sidecar, no
	// frontend on the path).
	armDirect benchArm = "direct"
	// armBare is mode bare, the baseline the tables compare the other
	// modes with.
	armBare = benchArm(config.ModeBare)
)

// direct reports whether a is the baseline without HAMS.
func (a benchArm) direct() bool { return a == armDirect }

// mode is the mode of the deployment a runs on (bare for direct).
func (a benchArm) mode() config.Mode {
	if a.direct() {
		return config.ModeBare
	}
	return config.Mode(a)
}

// BenchRow is one element of the --json array (docs/design.md).
type BenchRow struct {
	Service       string  `json:"service"`
	Mode          string  `json:"mode"`
	Batch         int     `json:"batch"`
	Requests      int     `json:"requests"`
	P50Ms         float64 `json:"p50_ms"`
	P99Ms         float64 `json:"p99_ms"`
	MeanMs        float64 `json:"mean_ms"`
	ThroughputRPS float64 `json:"throughput_rps"`
	Errors        int     `json:"errors"`
	Hops          int     `json:"hops"`
	// Transport of the internal hops: tls (mutual TLS, the default) or
	// insecure (--transport insecure).
	Transport string `json:"transport,omitempty"`
	// WarmupRequests and WarmupMs: the unmeasured requests sent before the
	// rounds and how long they took; WarmupEnded why the warm-up ended
	// (warmupRun). A large state's first base sync lands here, not in
	// the rounds.
	WarmupRequests int     `json:"warmup_requests,omitempty"`
	WarmupMs       float64 `json:"warmup_ms,omitempty"`
	WarmupEnded    string  `json:"warmup_ended,omitempty"`
	// SettleMs: how long, over its rounds, the mode waited for every
	// deployment of the run to go quiet before a round (settle): the
	// previous mode's trailing work (a remus backup writing a 512 MiB
	// state to its model server) otherwise lands in this mode's round.
	SettleMs float64 `json:"settle_ms,omitempty"`
	// Backends are the backend types of the service's models (sorted,
	// distinct): reference, tfserving, triton, clipper.
	Backends []string `json:"backends,omitempty"`
	// Mean time the sidecars spent on lineage per batch, from their
	// hams_sidecar_lineage_seconds histograms.
	LineageMsPerBatch *float64 `json:"lineage_ms_per_batch,omitempty"`
	// GatingMsMean: mean time the frontend held a gated reply, from its
	// last sink item to its release (the wait for durability).
	GatingMsMean *float64 `json:"gating_ms_mean,omitempty"`
	// State replication per replicated stateful model (modes other than
	// direct and bare), from the primary sidecars' metrics over the
	// measured rounds.
	State map[string]stateStats `json:"state,omitempty"`
	// StagesMs: per sidecar (and "frontend"), the mean in ms of each of
	// its latency histograms (hams_sidecar_*_seconds, name shortened to
	// the part between prefix and suffix) over the measured rounds: where
	// a batch's time goes (backend call, update, capture, send, the
	// backup's apply wait and apply, the durability notice, gating).
	StagesMs map[string]map[string]float64 `json:"stages_ms,omitempty"`
	// CPUMsPerRequest: CPU time (utime+stime of /proc/<pid>/stat, sampled
	// at the start and end of every measured run of this mode) per
	// request in ms, summed by process role (sidecar, modelserver,
	// frontend, backup-sidecar, manager, nats, ...; client: the bench
	// process, i.e. the load generator; total: all of them).
	CPUMsPerRequest map[string]float64 `json:"cpu_ms_per_request,omitempty"`
	// MemcpyMsPerMB: this machine's memcpy cost per MB (1e6 bytes),
	// measured in the same run (the best of five 64 MiB copies): the
	// physical floor the replication CPU figures are compared with.
	MemcpyMsPerMB float64 `json:"memcpy_ms_per_mb,omitempty"`
}

// stateStats is one replicated model's snapshot cost in a bench row.
type stateStats struct {
	// StateBytes of the model state in the last snapshot.
	StateBytes float64 `json:"state_bytes"`
	// Snapshots acknowledged by the backup during the measured rounds.
	Snapshots float64 `json:"snapshots"`
	// CopyMsMean: mean time to copy the state into a snapshot (ReadState).
	CopyMsMean float64 `json:"copy_ms_mean"`
	// DeliveryMsMean: mean time from a snapshot's copy to the backup's ack.
	DeliveryMsMean float64 `json:"delivery_ms_mean"`
	// BytesPerSnapshot: state bytes shipped per snapshot (a delta
	// snapshot's ranges, or the whole state).
	BytesPerSnapshot float64 `json:"bytes_per_snapshot"`
	// ShipMBs: shipped bytes over the time spent in ShipSnapshot calls.
	ShipMBs float64 `json:"ship_mb_per_s"`
	// ReplicatedMB: state MB (1e6 bytes) the backup acknowledged during
	// the measured rounds (hams_sidecar_snapshot_shipped_bytes_total of
	// the primary sidecar; the backup receives and applies those bytes).
	ReplicatedMB float64 `json:"replicated_mb"`
	// PrimaryCPUMsPerMB and BackupCPUMsPerMB: the CPU time of the
	// model's primary and backup sidecar processes during the measured
	// runs, in ms per replicated MB (all of their work, serving included).
	PrimaryCPUMsPerMB float64 `json:"primary_cpu_ms_per_mb"`
	BackupCPUMsPerMB  float64 `json:"backup_cpu_ms_per_mb"`
}

// modeRun accumulates one mode's rounds.
type modeRun struct {
	lat     []time.Duration
	elapsed time.Duration
	sent    int
	errs    int
}

func (m *modeRun) add(rec *loadgen.Recorder, elapsed time.Duration) {
	s := rec.Stats()
	m.lat = append(m.lat, rec.Latencies()...)
	m.elapsed += elapsed
	m.sent += s.Requests
	m.errs += s.Errors
}

func (m *modeRun) row(service, mode string, batch, hops int) BenchRow {
	st := loadgen.Stats{Replies: len(m.lat), ElapsedS: m.elapsed.Seconds()}
	loadgen.Summarize(m.lat, &st)
	return BenchRow{Service: service, Mode: mode, Batch: batch, Requests: m.sent, P50Ms: st.P50Ms, P99Ms: st.P99Ms,
		MeanMs: st.MeanMs, ThroughputRPS: st.ThroughputRPS, Errors: m.errs, Hops: hops}
}

// BenchConfig is what the flags of the command set.
type BenchConfig struct {
	Service    string        // --service
	ConfigFile string        // --config
	Modes      string        // --modes
	Batch      int           // --batch
	Requests   int           // --requests
	Warmup     int           // --warmup
	Rounds     int           // --rounds
	Load       string        // --load
	JSON       string        // --json
	Set        string        // --examples
	Plot       string        // --plot
	Isolate    bool          // --isolate-replicas
	Seed       uint64        // --seed
	Timeout    time.Duration // --timeout
	Transports string        // --transport
	Suspicion  time.Duration // --suspicion-timeout
	Task       Task          // the task flags
	// SteadyWarmup (--warmup-until-steady): after the first warm-up run,
	// more runs of max(Warmup, 8 batches) until the deployment is steady
	// (see steady), at most MaxSteadyWarmup.
	SteadyWarmup bool
}

// Bench is a configured hams bench run.
type Bench struct{ c BenchConfig }

// NewBench validates c (the modes, transports, sizes and shapes it
// names); it does no I/O. A zero-or-negative Warmup becomes the default,
// max(2*Batch, 20).
func NewBench(c BenchConfig) (*Bench, error) {
	modes := cluster.SplitList(c.Modes)
	if len(modes) == 0 {
		return nil, Usagef("bench: --modes is empty")
	}
	for _, m := range modes {
		if !slices.Contains(BenchModes, m) {
			return nil, Usagef("bench: unknown mode %q (one of %s)", m, strings.Join(BenchModes, ", "))
		}
		if !slices.Contains(benchImplemented, m) {
			return nil, Usagef("bench: mode %s is not implemented yet (this build runs %s)", m, strings.Join(benchImplemented, ", "))
		}
	}
	transports := cluster.SplitList(c.Transports)
	if len(transports) == 0 {
		return nil, Usagef("bench: --transport is empty")
	}
	for _, t := range transports {
		if t != "tls" && t != "insecure" {
			return nil, Usagef("bench: --transport %q: tls or insecure", t)
		}
	}
	if c.Batch < 1 || c.Batch > 4096 || c.Requests < 1 || c.Rounds < 1 || c.Timeout <= 0 {
		return nil, Usagef("bench: --batch must be 1..4096; --requests, --rounds and --timeout positive")
	}
	if c.Warmup < 0 {
		c.Warmup = max(2*c.Batch, 20)
	}
	if c.Set != examples.SetDefault && c.Set != examples.SetPaper {
		return nil, Usagef("bench: --examples %q: %s or %s", c.Set, examples.SetDefault, examples.SetPaper)
	}
	if c.Load != "closed" && c.Load != "waves" {
		return nil, Usagef("bench: --load %q: closed or waves", c.Load)
	}
	return &Bench{c: c}, nil
}

// Run benches every service of the configuration, prints the tables and
// writes the JSON and plot it asks for; it returns when done or when ctx
// ends.
func (b *Bench) Run(ctx context.Context) error {
	c := b.c
	service := &c.Service
	cfgFile := &c.ConfigFile
	modesFlag := &c.Modes
	batch := &c.Batch
	requests := &c.Requests
	warmup := &c.Warmup
	rounds := &c.Rounds
	load := &c.Load
	jsonPath := &c.JSON
	set := &c.Set
	plotPath := &c.Plot
	isolate := &c.Isolate
	seed := &c.Seed
	timeout := &c.Timeout
	transportsFlag := &c.Transports
	suspicion := &c.Suspicion
	tf := &c.Task
	modes, transports := cluster.SplitList(*modesFlag), cluster.SplitList(*transportsFlag)
	services := examples.Names()
	var fileRaw []byte
	if *cfgFile != "" {
		b, err := os.ReadFile(*cfgFile)
		if err != nil {
			return Usagef("bench: --config: %v", err)
		}
		d, err := cluster.ParseDeployment(b)
		if err != nil {
			return &ExitError{Code: 2, Err: fmt.Errorf("bench: %s: %w", *cfgFile, err)}
		}
		fileRaw, services = b, d.ServiceNames()
	}
	if *service != "all" {
		if !slices.Contains(services, *service) {
			return Usagef("bench: --service %q: unknown (one of %s, all)", *service, strings.Join(services, ", "))
		}
		services = []string{*service}
	}
	dir, cleanup, err := tf.Prepare("hams-bench-")
	if err != nil {
		return err
	}
	ok := false
	defer func() { cleanup(ok) }()

	var serving, replicas []int
	if *isolate {
		if serving, replicas, err = cluster.CPUHalves(); err != nil {
			return Usagef("bench: --isolate-replicas: %v", err)
		}
		fmt.Fprintf(os.Stderr, "hams bench: serving path on CPUs %v; backups, standbys, manager and load generator on CPUs %v\n", serving, replicas)
	}
	var rows []BenchRow
	for _, svc := range services {
		r, err := benchService(ctx, benchOpts{
			service: svc, raw: fileRaw, modes: modes, batch: *batch, requests: *requests, warmup: *warmup, rounds: *rounds, steadyWarmup: c.SteadyWarmup,
			seed: *seed, timeout: *timeout, suspicion: *suspicion, dir: filepath.Join(dir, svc), tf: *tf, waves: *load == "waves",
			serving: serving, replicas: replicas, set: *set, transports: transports,
		})
		if err != nil {
			return fmt.Errorf("bench %s: %w", svc, err)
		}
		rows = append(rows, r...)
	}
	// The memcpy floor, measured here after every deployment of the run
	// has stopped (an idle machine).
	mcMBs := memcpyMBs()
	for i := range rows {
		rows[i].MemcpyMsPerMB = math.Round(memcpyMsPerMB(mcMBs)*1e4) / 1e4
	}
	printBench(os.Stdout, rows)
	printTLSCost(os.Stdout, rows)
	PrintOverheads(os.Stdout, rows)
	printShipping(os.Stdout, rows, mcMBs)
	printCPU(os.Stdout, rows)
	printReplicationCPU(os.Stdout, rows)
	if *plotPath != "" {
		if err := PlotBench(*plotPath, rows); err != nil {
			return fmt.Errorf("bench: plot: %w", err)
		}
	}
	if *jsonPath != "" {
		if err := writeJSON(*jsonPath, rows); err != nil {
			return err
		}
	}
	ok = true
	return nil
}

type benchOpts struct {
	service string
	// raw is the deployment file of --config (nil: the example named
	// service).
	raw                             []byte
	modes                           []string
	batch, requests, warmup, rounds int
	steadyWarmup                    bool
	seed                            uint64
	timeout, suspicion              time.Duration
	dir                             string
	waves                           bool
	// serving, replicas: CPU halves (--isolate-replicas), nil otherwise.
	serving, replicas []int
	// set: the example set (--examples).
	set string
	tf  Task
	// transports: tls, insecure (--transport).
	transports []string
}

func benchService(ctx context.Context, o benchOpts) ([]BenchRow, error) {
	raw := o.raw
	if raw == nil {
		var err error
		if raw, err = examples.RawSet(o.set, o.service); err != nil {
			return nil, err
		}
	}
	svcCfg := func() (*config.Deployment, error) {
		d, err := cluster.ParseDeployment(raw)
		if err != nil || o.raw == nil {
			return d, err
		}
		return cluster.OnlyService(d, o.service)
	}
	base, err := svcCfg()
	if err != nil {
		return nil, err
	}
	svc := base.Service(o.service)
	if svc == nil {
		svc = &base.Services[0]
	}
	hops := svc.Graph().Hops()
	fmt.Fprintf(os.Stderr, "hams bench: %s (%d models, %d hops), batch %d, modes %s\n", o.service, len(base.Models), hops, o.batch, strings.Join(o.modes, ","))
	var backends []string
	for _, m := range svc.Graph().Models() {
		mc := base.Model(m)
		if !slices.Contains(backends, mc.Backend.Type) {
			backends = append(backends, mc.Backend.Type)
		}
		if adapters.Managed(mc) && mc.Backend.Type == "clipper" {
			fmt.Fprintf(os.Stderr, "hams bench: %s: the Clipper backend is `hams clipper-stub` (a Clipper REST stub running the reference model, started here), not Clipper\n", m)
		} else if adapters.Managed(mc) && mc.Backend.Type != "reference" {
			fmt.Fprintf(os.Stderr, "hams bench: %s: the %s backend is the reference model server (its %s API), started here\n", m, mc.Backend.Type, map[string]string{"triton": "KServe v2", "tfserving": "TF Serving Predict"}[mc.Backend.Type])
		}
	}
	sort.Strings(backends)

	// One deployment per mode, all started before the first round.
	type runner struct {
		arm       benchArm
		transport string
		label     string // mode, or mode/insecure
		d         *cluster.Deployment
		run       func(ctx context.Context, n int) (*loadgen.Recorder, time.Duration, error)
		acc       modeRun
		warm      warmupRun     // what the warm-up took
		settle    time.Duration // waited for quiet before its rounds
		m0        metricSnap
		cpu       cpuAcc // CPU seconds per process over the measured runs
	}
	var runners []*runner
	defer func() {
		for _, r := range runners {
			r.d.Close()
		}
	}()
	for _, mode := range o.modes {
		arm := benchArm(mode)
		for _, transport := range o.transports {
			label := mode
			if len(o.transports) > 1 {
				label = mode + "/" + transport
			}
			dep, err := svcCfg()
			if err != nil {
				return nil, err
			}
			dep.Mode = string(arm.mode())
			for i := range dep.Models {
				dep.Models[i].Batch.Size = o.batch
			}
			d, err := cluster.Start(ctx, dep, cluster.Options{TraceArgs: o.tf.TraceArgs, RunDir: filepath.Join(o.dir, strings.ReplaceAll(label, "/", "-")), LogLevel: o.tf.LogLevel, Logger: TaskLogger(o.tf.Verbose), Direct: arm.direct(), SuspicionTimeout: o.suspicion,
				// One frontend without a request log, one manager and no
				// spare backups: bench measures the data path, which neither
				// a second frontend, a standby manager nor a spare is on.
				Frontends: 1, Managers: 1, NoSpares: true, Insecure: transport == "insecure"})
			if err != nil {
				return nil, fmt.Errorf("start %s deployment: %w", label, err)
			}
			r := &runner{arm: arm, transport: transport, label: label, d: d, cpu: cpuAcc{}}
			runners = append(runners, r)
			if o.serving != nil {
				if err := cluster.IsolateReplicas(d, o.serving, o.replicas); err != nil {
					return nil, fmt.Errorf("%s: isolate replicas: %w", mode, err)
				}
			}
			switch {
			case arm.direct():
				ch, err := newDirectChain(ctx, d, svc.Name)
				if err != nil {
					return nil, err
				}
				defer func() {
					for _, c := range ch.closers {
						c()
					}
				}()
				gen, err := loadgen.NewGenerator(dep.Service(svc.Name), o.seed, 1, loadgen.Fashion())
				if err != nil {
					return nil, err
				}
				r.run = func(ctx context.Context, n int) (*loadgen.Recorder, time.Duration, error) {
					return ch.drive(ctx, gen, o.batch, n, o.timeout)
				}
			default:
				cc, err := grpcx.Dial(d.FrontendGRPC, dep.Limits.MaxMessageBytes)
				if err != nil {
					return nil, err
				}
				defer cc.Close()
				client := hamsv1.NewFrontendClient(cc)
				gens := make([]*loadgen.Generator, o.batch)
				for i := range gens {
					if gens[i], err = loadgen.NewGenerator(dep.Service(svc.Name), o.seed+uint64(i), 1, loadgen.Fashion()); err != nil {
						return nil, err
					}
				}
				var mu sync.Mutex
				var firstErr error
				r.run = func(ctx context.Context, n int) (*loadgen.Recorder, time.Duration, error) {
					rec := loadgen.NewRecorder()
					start := time.Now()
					_, err := loadgen.Run(ctx, loadgen.RunConfig{
						Client: client, Concurrency: o.batch, Requests: n, Timeout: o.timeout, Recorder: rec, Waves: o.waves,
						NewRequest: func(c int, i uint64) *hamsv1.PredictRequest {
							return &hamsv1.PredictRequest{Service: svc.Name, StreamId: fmt.Sprintf("bench-%d", c), Inputs: gens[c].Inputs()}
						},
						OnResult: func(res loadgen.Result) {
							if res.Err != nil {
								mu.Lock()
								if firstErr == nil {
									firstErr = res.Err
									fmt.Fprintf(os.Stderr, "hams bench: %s %s: request failed: %v\n", svc.Name, mode, res.Err)
								}
								mu.Unlock()
							}
						},
					})
					return rec, time.Since(start), err
				}
			}
		}
	}
	if o.replicas != nil {
		if err := cluster.PinPID(os.Getpid(), o.replicas); err != nil {
			return nil, fmt.Errorf("pin the load generator: %w", err)
		}
	}
	// Warm-up, then the lineage counters' baseline.
	for _, r := range runners {
		if o.warmup > 0 {
			var synced func() bool
			if !r.arm.direct() {
				synced = func() bool {
					t, err := r.d.Topology(ctx)
					return err == nil && len(r.d.Lacking(ctx, t)) == 0
				}
			}
			w, err := warmUp(ctx, o.warmup, max(o.warmup, steadyWaves*o.batch), o.steadyWarmup, MaxSteadyWarmup, synced, r.run)
			if err != nil {
				return nil, fmt.Errorf("%s warm-up: %w", r.label, err)
			}
			r.warm = w
			fmt.Fprintf(os.Stderr, "  warm-up  %-6s %5d requests in %v (%s)\n", r.label, w.Requests, w.Elapsed.Round(time.Millisecond), w.Ended)
		}
		if !r.arm.direct() {
			r.m0 = scrapeMetrics(benchMetrics(r.d))
		}
	}
	// Every deployment of the run, for the quiet before each round.
	var deps []*cluster.Deployment
	for _, r := range runners {
		if !r.arm.direct() {
			deps = append(deps, r.d)
		}
	}
	per := (o.requests + o.rounds - 1) / o.rounds
	for round := range o.rounds {
		n := min(per, o.requests-round*per)
		if n <= 0 {
			break
		}
		for _, r := range runners {
			settled := settle(ctx, deps, settleLimit)
			r.settle += settled
			c0 := sampleCPU(r.d)
			rec, el, err := r.run(ctx, n)
			if err != nil {
				return nil, fmt.Errorf("%s round %d: %w", r.label, round+1, err)
			}
			r.cpu.add(c0, sampleCPU(r.d))
			r.acc.add(rec, el)
			fmt.Fprintf(os.Stderr, "  round %d/%d %-6s %5d requests in %v (after %v settling)\n", round+1, o.rounds, r.label, n, el.Round(time.Millisecond), settled.Round(time.Millisecond))
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	var out []BenchRow
	for _, r := range runners {
		row := r.acc.row(o.service, string(r.arm), o.batch, hops)
		row.Backends = backends
		row.Transport = r.transport
		row.CPUMsPerRequest = r.cpu.msPerRequest(row.Requests)
		row.WarmupRequests, row.WarmupEnded = r.warm.Requests, r.warm.Ended
		row.WarmupMs = cluster.Round3(float64(r.warm.Elapsed) / float64(time.Millisecond))
		row.SettleMs = cluster.Round3(float64(r.settle) / float64(time.Millisecond))
		if !r.arm.direct() {
			m1 := scrapeMetrics(benchMetrics(r.d))
			if c := m1["frontend"]["hams_frontend_gating_wait_seconds_count"] - r.m0["frontend"]["hams_frontend_gating_wait_seconds_count"]; c > 0 && r.arm.mode().Protected() {
				v := cluster.Round3((m1["frontend"]["hams_frontend_gating_wait_seconds_sum"] - r.m0["frontend"]["hams_frontend_gating_wait_seconds_sum"]) / c * 1000)
				row.GatingMsMean = &v
			}
			sum, cnt := m1.total("hams_sidecar_lineage_seconds_sum")-r.m0.total("hams_sidecar_lineage_seconds_sum"),
				m1.total("hams_sidecar_lineage_seconds_count")-r.m0.total("hams_sidecar_lineage_seconds_count")
			if cnt > 0 {
				v := cluster.Round3(sum / cnt * 1000)
				row.LineageMsPerBatch = &v
			}
			row.StagesMs = stageMeans(r.m0, m1)
			for i := range r.d.Config.Models {
				m := &r.d.Config.Models[i]
				if !r.d.Config.Replicated(m) {
					continue
				}
				d := func(name string) float64 { return counterIncrease(r.m0[m.Name][name], m1[m.Name][name]) }
				st := stateStats{StateBytes: m1[m.Name]["hams_sidecar_state_bytes"], Snapshots: d("hams_sidecar_snapshots_shipped_total")}
				if c := d("hams_sidecar_snapshot_copy_seconds_count"); c > 0 {
					st.CopyMsMean = cluster.Round3(d("hams_sidecar_snapshot_copy_seconds_sum") / c * 1000)
				}
				if c := d("hams_sidecar_snapshot_delivery_seconds_count"); c > 0 {
					st.DeliveryMsMean = cluster.Round3(d("hams_sidecar_snapshot_delivery_seconds_sum") / c * 1000)
				}
				if st.Snapshots > 0 {
					st.BytesPerSnapshot = cluster.Round3(d("hams_sidecar_snapshot_shipped_bytes_total") / st.Snapshots)
				}
				if sec := d("hams_sidecar_snapshot_send_seconds_sum"); sec > 0 {
					st.ShipMBs = cluster.Round3(d("hams_sidecar_snapshot_shipped_bytes_total") / sec / 1e6)
				}
				shipped := d("hams_sidecar_snapshot_shipped_bytes_total")
				st.ReplicatedMB = cluster.Round3(shipped / 1e6)
				st.PrimaryCPUMsPerMB = cluster.Round3(cpuMsPerMB(r.cpu.ofChild(cluster.RoleSidecar, m.Name), shipped))
				st.BackupCPUMsPerMB = cluster.Round3(cpuMsPerMB(r.cpu.ofChild(cluster.RoleBackupSidecar, m.Name), shipped))
				if row.State == nil {
					row.State = map[string]stateStats{}
				}
				row.State[m.Name] = st
			}
		}
		out = append(out, row)
	}
	return out, nil
}

// counterIncrease is a counter's increase from before to after. A counter
// that went down was reset (its process restarted) and counts from zero
// again, as Prometheus' increase() reads it; the plain difference was
// negative there, and so were the figures derived from it.
func counterIncrease(before, after float64) float64 {
	if after < before {
		return after
	}
	return after - before
}

// stageMeans is, per scraped process, the mean (ms) of every latency
// histogram that counted samples between m0 and m1.
func stageMeans(m0, m1 metricSnap) map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	for proc, vals := range m1 {
		for name, sum := range vals {
			base, ok := strings.CutSuffix(name, "_seconds_sum")
			if !ok {
				continue
			}
			c := vals[base+"_seconds_count"] - m0[proc][base+"_seconds_count"]
			if c <= 0 {
				continue
			}
			short := strings.TrimPrefix(strings.TrimPrefix(base, "hams_sidecar_"), "hams_frontend_")
			if out[proc] == nil {
				out[proc] = map[string]float64{}
			}
			out[proc][short] = cluster.Round3((sum - m0[proc][name]) / c * 1000)
		}
	}
	return out
}

// benchMetrics is sidecarMetrics plus "frontend": the first frontend's.
func benchMetrics(d *cluster.Deployment) map[string]string {
	out := d.SidecarMetrics()
	if r, ok := d.Supervisor.Ready(cluster.ChildName("frontend", "0")); ok && r.String("metrics") != "" {
		out["frontend"] = r.String("metrics")
	} else if r, ok := d.Supervisor.Ready("frontend"); ok && r.String("metrics") != "" {
		out["frontend"] = r.String("metrics")
	}
	return out
}

// metricSnap is model -> metric name (with _sum/_count suffix, labels
// dropped, summed over label sets) -> value, from the sidecars' /metrics.
type metricSnap map[string]map[string]float64

// total sums one metric over every model.
func (m metricSnap) total(name string) float64 {
	t := 0.0
	for _, v := range m {
		t += v[name]
	}
	return t
}

// scrapeMetrics reads the samples whose names start with one of prefixes
// (default hams_sidecar_ and hams_frontend_) of every sidecar in addrs
// (model -> metrics address), summed over label sets, histogram buckets
// left out; unreachable sidecars are left out.
func scrapeMetrics(addrs map[string]string, prefixes ...string) metricSnap {
	if len(prefixes) == 0 {
		prefixes = []string{"hams_sidecar_", "hams_frontend_"}
	}
	out := metricSnap{}
	// A sidecar busy with a large state on a loaded machine can take
	// seconds to answer: a scrape is retried, and one that fails is
	// reported, since its figures are then missing from the row.
	hc := &http.Client{Timeout: 10 * time.Second}
	for model, a := range addrs {
		var resp *http.Response
		var err error
		for range 3 {
			if resp, err = hc.Get("http://" + a + "/metrics"); err == nil {
				break
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "hams bench: scrape the metrics of %s at %s: %v (its figures are missing)\n", model, a, err)
			continue
		}
		vals := map[string]float64{}
		s := bufio.NewScanner(resp.Body)
		s.Buffer(make([]byte, 1<<20), 1<<20)
		for s.Scan() {
			line := s.Text()
			if !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(line, p) }) {
				continue
			}
			name := line
			if k := strings.IndexAny(line, "{ "); k >= 0 {
				name = line[:k]
			}
			if strings.HasSuffix(name, "_bucket") {
				continue
			}
			f := strings.Fields(line)
			if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
				vals[name] += v
			}
		}
		resp.Body.Close()
		out[model] = vals
	}
	return out
}

// directChain calls the model servers of a service in topological order,
// joining predecessors' outputs the way the sidecar does.
type directChain struct {
	dep   *config.Deployment
	g     *config.Graph
	order []string
	rt    map[string]func(context.Context, *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error)
	// A non-reference model is called through its adapter in this
	// process (the backend's native API: KServe v2, TF Serving Predict,
	// Clipper REST); closers release the connections.
	closers []func()
	desc    map[string]*hamsv1.ModelDescription
	batch   map[string]uint64
}

func newDirectChain(ctx context.Context, d *cluster.Deployment, service string) (*directChain, error) {
	s := d.Config.Service(service)
	c := &directChain{dep: d.Config, g: s.Graph(), rt: map[string]func(context.Context, *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error){},
		desc: map[string]*hamsv1.ModelDescription{}, batch: map[string]uint64{}}
	c.order = c.g.Models()
	var refs []string
	for _, m := range c.order {
		mc := d.Config.Model(m)
		// The direct chain stands in for the model's sidecar: it calls
		// the model server with a sidecar identity of that model.
		src, err := d.DirectSource(m)
		if err != nil {
			return nil, err
		}
		if mc.Backend.Type == "reference" {
			refs = append(refs, m)
			var opts []grpc.DialOption
			if src != nil {
				opts = append(opts, grpcx.DialTLS(src))
			}
			cc, err := grpcx.Dial(d.ModelServers[m], d.Config.Limits.MaxMessageBytes, opts...)
			if err != nil {
				return nil, err
			}
			c.closers = append(c.closers, func() { cc.Close() })
			rt := hamsv1.NewModelRuntimeClient(cc)
			c.rt[m] = func(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
				return rt.Infer(ctx, req)
			}
			continue
		}
		be, closeBE, err := adapters.New(d.Config, mc, d.ModelServers[m], "direct", d.Log, src)
		if err != nil {
			return nil, err
		}
		c.closers = append(c.closers, closeBE)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c.desc[m], err = be.Describe(cctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("describe %s through its %s adapter: %w", m, mc.Backend.Type, err)
		}
		c.rt[m] = func(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
			return be.Infer(ctx, req)
		}
	}
	if len(refs) > 0 {
		descs, err := describeAll(ctx, d, refs...)
		if err != nil {
			return nil, err
		}
		maps.Copy(c.desc, descs)
	}
	return c, nil
}

// call runs one batch of requests through the chain.
func (c *directChain) call(ctx context.Context, inputs []*hamsv1.Tensor, rows []uint32, streams []string) error {
	outs := map[string][]*hamsv1.Tensor{config.Frontend: inputs}
	for _, m := range c.order {
		var parts []tensor.List
		for _, p := range c.g.Pred(m) {
			parts = append(parts, outs[p])
		}
		ins, err := tensor.PickInputs(c.desc[m].GetInputs(), parts)
		if err != nil {
			return fmt.Errorf("inputs of %s: %w", m, err)
		}
		c.batch[m]++
		resp, err := c.rt[m](ctx, &hamsv1.BatchRequest{
			Model: c.dep.Model(m).Backend.Model, Inputs: ins, Rows: rows, StreamIds: streams, BatchId: c.batch[m],
		})
		if err != nil {
			return fmt.Errorf("infer %s: %w", m, err)
		}
		outs[m] = resp.Outputs
	}
	return nil
}

// drive sends n requests as ceil(n/batch) chained batch calls, one after
// the other (closed loop); every request of a call gets the call's latency.
func (c *directChain) drive(ctx context.Context, gen *loadgen.Generator, batch, n int, timeout time.Duration) (*loadgen.Recorder, time.Duration, error) {
	rec := loadgen.NewRecorder()
	start := time.Now()
	for done := 0; done < n && ctx.Err() == nil; {
		k := min(batch, n-done)
		perReq := make([][]*hamsv1.Tensor, k)
		for i := range perReq {
			perReq[i] = gen.Inputs()
		}
		inputs := make([]*hamsv1.Tensor, len(perReq[0]))
		for j := range inputs {
			col := make([]*hamsv1.Tensor, k)
			for i := range col {
				col[i] = perReq[i][j]
			}
			t, err := tensor.Concat(col)
			if err != nil {
				return nil, 0, err
			}
			inputs[j] = t
		}
		rows := make([]uint32, k)
		streams := make([]string, k)
		for i := range rows {
			rows[i] = uint32(tensor.Rows(perReq[i][0]))
			streams[i] = fmt.Sprintf("bench-%d", i)
		}
		rec.Sent(k)
		cctx, cancel := context.WithTimeout(ctx, timeout)
		t0 := time.Now()
		err := c.call(cctx, inputs, rows, streams)
		lat := time.Since(t0)
		cancel()
		if err != nil {
			rec.Err(k)
			return rec, time.Since(start), err
		}
		rec.OK(lat, k)
		done += k
	}
	rec.Stop()
	return rec, time.Since(start), ctx.Err()
}

// printTLSCost prints, per service and mode measured with both
// transports, what mutual TLS added: the p50 difference, and per hop
// (the frontend's and each model's internal hops: hops + 1).
func printTLSCost(w io.Writer, rows []BenchRow) {
	type key struct{ service, mode string }
	tls, plain := map[key]*BenchRow{}, map[key]*BenchRow{}
	var order []key
	for i := range rows {
		r := &rows[i]
		k := key{r.Service, r.Mode}
		switch r.Transport {
		case "tls":
			if tls[k] == nil && plain[k] == nil {
				order = append(order, k)
			}
			tls[k] = r
		case "insecure":
			if tls[k] == nil && plain[k] == nil {
				order = append(order, k)
			}
			plain[k] = r
		}
	}
	tb := NewTable(2, "service", "mode", "p50_ms_diff", "p99_ms_diff", "p50_us_per_hop")
	for _, k := range order {
		t, p := tls[k], plain[k]
		if t == nil || p == nil || benchArm(k.mode).direct() {
			continue
		}
		hops := float64(t.Hops + 1)
		tb.AppendRow([]any{k.service, k.mode, f3(t.P50Ms - p.P50Ms), f3(t.P99Ms - p.P99Ms), fmt.Sprintf("%.1f", (t.P50Ms-p.P50Ms)*1000/hops)})
	}
	if tb.Length() > 0 {
		fmt.Fprintf(w, "\nmutual TLS cost (tls - insecure, same run):\n")
		Render(w, tb, "")
	}
}

func printBench(w io.Writer, rows []BenchRow) {
	tb := NewTable(2, "service", "mode", "batch", "requests", "p50_ms", "p99_ms", "mean_ms", "thr_rps", "errors", "lin_ms/b", "gate_ms")
	for _, r := range rows {
		lin, gate := "-", "-"
		if r.LineageMsPerBatch != nil {
			lin = fmt.Sprintf("%.4f", *r.LineageMsPerBatch)
		}
		if r.GatingMsMean != nil {
			gate = fmt.Sprintf("%.3f", *r.GatingMsMean)
		}
		mode := r.Mode
		if r.Transport == "insecure" {
			mode += "/insecure"
		}
		tb.AppendRow([]any{r.Service, mode, r.Batch, r.Requests, f3(r.P50Ms), f3(r.P99Ms), f3(r.MeanMs), fmt.Sprintf("%.1f", r.ThroughputRPS), r.Errors, lin, gate})
	}
	fmt.Fprintln(w)
	Render(w, tb, "")
	// Sidecar overhead per hop: (bare p50 - direct p50) / (hops + 1).
	type pair struct{ direct, bare *BenchRow }
	by := map[string]*pair{}
	var order []string
	for i := range rows {
		r := &rows[i]
		p := by[r.Service]
		if p == nil {
			p = &pair{}
			by[r.Service] = p
			order = append(order, r.Service)
		}
		switch benchArm(r.Mode) {
		case armDirect:
			p.direct = r
		case armBare:
			p.bare = r
		}
	}
	hop := NewTable(1, "service", "hops", "direct_p50", "bare_p50", "added_p50_ms", "added_p50/hop_ms")
	for _, s := range order {
		p := by[s]
		if p.direct == nil || p.bare == nil {
			continue
		}
		per := (p.bare.P50Ms - p.direct.P50Ms) / float64(p.bare.Hops+1)
		hop.AppendRow([]any{s, p.bare.Hops, f3(p.direct.P50Ms), f3(p.bare.P50Ms), f3(p.bare.P50Ms - p.direct.P50Ms), f3(per)})
	}
	if hop.Length() > 0 {
		fmt.Fprintln(w)
		Render(w, hop, "")
	}
}

// f3 formats a number of milliseconds as the tables print them.
func f3(x float64) string { return fmt.Sprintf("%.3f", x) }

// ServiceArg is the value of --service in args ("" when absent).
func ServiceArg(args []string) string {
	for i, a := range args {
		for _, p := range []string{"--service=", "-service="} {
			if strings.HasPrefix(a, p) {
				return strings.TrimPrefix(a, p)
			}
		}
		if (a == "--service" || a == "-service") && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}
