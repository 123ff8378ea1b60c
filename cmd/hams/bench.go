package main

import (
	"strings"
	"time"

	"github.com/hams-go/hams/examples"
	"github.com/hams-go/hams/internal/harness"
)

// runBench is `hams bench`: its flags, then the library call that does the work.
func runBench(args []string) error {
	if harness.ServiceArg(args) == harness.ParmService {
		return runParmBench(args)
	}
	fs := newFlagSet("bench")
	var c harness.BenchConfig
	fs.StringVar(&c.Service, "service", "all", "example service ("+strings.Join(examples.Names(), ", ")+") or all; with --config, a service of that file or all of them; parm: the ParM pool benchmark (its own flags: hams bench --service parm -h)")
	fs.StringVar(&c.ConfigFile, "config", "", "deployment file to bench instead of the examples (each service is run with only its own models; triton, tfserving and clipper backends without an address get a started backend, see docs/adapters.md)")
	fs.StringVar(&c.Modes, "modes", "direct,bare", "comma-separated modes, interleaved in rounds: "+strings.Join(harness.BenchModes, ", "))
	fs.IntVar(&c.Batch, "batch", 1, "batch size of every model (bare: also the number of concurrent clients; direct: requests per call)")
	fs.IntVar(&c.Requests, "requests", 400, "measured requests per (service, mode)")
	fs.IntVar(&c.Warmup, "warmup", -1, "unmeasured requests per (service, mode) before the rounds (default: max(2*batch, 20))")
	fs.BoolVar(&c.SteadyWarmup, "warmup-until-steady", true, "after --warmup, keep warming up (runs of eight batches, or --warmup requests if more) until every replicated model's backup holds its base and two runs in a row take within 20% of each other, at most 90 s: a large state's first base sync is a one-time cost of starting a backup, reported as warmup_ms, not measured in the rounds")
	fs.IntVar(&c.Rounds, "rounds", 4, "rounds per mode (modes alternate round by round)")
	fs.StringVar(&c.Load, "load", "closed", "load shape: closed (--batch closed-loop clients: saturates the deployment, latency is batch/throughput) or waves (--batch requests sent together, the next wave after the last reply: the latency of one batch crossing the graph, as the HAMS paper measures)")
	fs.StringVar(&c.JSON, "json", "", "write the JSON array to this file")
	fs.StringVar(&c.Set, "examples", examples.SetDefault, "example set of --service: default, or paper (the same graphs with paper-scale models: tens to hundreds of ms per batch of 64; examples/paper)")
	fs.StringVar(&c.Plot, "plot", "", "draw p50 normalised to bare per service and mode into this PNG")
	fs.BoolVar(&c.Isolate, "isolate-replicas", false, "pin the serving path (frontend, serving sidecars and model servers) to half of the CPUs and backups, standbys, the manager and the load generator to the other half, in every mode (the paper's separate hosts; see pin.go)")
	fs.Uint64Var(&c.Seed, "seed", 1, "input seed")
	fs.DurationVar(&c.Timeout, "timeout", 10*time.Second, "per-request deadline")
	fs.StringVar(&c.Transports, "transport", "tls", "comma-separated internal transports, each a deployment of every mode, interleaved: tls (mutual TLS with per-process certificates, the default) and insecure (plaintext, --insecure): tls,insecure measures what mutual TLS costs")
	fs.DurationVar(&c.Suspicion, "suspicion-timeout", time.Second, "failure-suspicion timeout of each deployment's manager (bench measures the failure-free case; every mode's deployment shares the cores, so scheduling delays must not pass for failures)")
	registerTaskFlags(&c.Task, fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	c.Task.TraceArgs = traceArgs()
	x, err := harness.NewBench(c)
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	return x.Run(ctx)
}

// runParmBench is hams bench --service parm: one deployment holding a
// pool per arm (none, and er, hedge, parm per k), the same replicas and
// the same straggler schedule on replica 0 in every arm, open-loop Poisson
// arrivals, arms interleaved round by round.
func runParmBench(args []string) error {
	fs := newFlagSet("bench")
	var c harness.ParmBenchConfig
	fs.String("service", harness.ParmService, "parm")
	fs.StringVar(&c.RedFlag, "redundancy", "none,er,hedge,parm", "comma-separated arms: none, er, hedge, parm")
	fs.StringVar(&c.KFlag, "k", "2", "comma-separated coding group sizes (er and hedge get the same extra instances as parm at each k)")
	fs.StringVar(&c.Batches, "batch", "1", "comma-separated batch sizes: images per request, so queries per coded batch")
	fs.IntVar(&c.Requests, "requests", 2000, "measured requests per (redundancy, k, batch)")
	fs.IntVar(&c.Warmup, "warmup", 100, "unmeasured requests per arm before the rounds")
	fs.IntVar(&c.Rounds, "rounds", 4, "rounds (arms alternate round by round)")
	fs.Float64Var(&c.Rate, "rate", 150, "open-loop Poisson arrival rate, requests/s")
	fs.IntVar(&c.Replicas, "replicas", 4, "data replicas of the deployed model (m)")
	fs.StringVar(&c.Straggle, "straggle", "seed=7,period=100ms,fraction=0.25,delay=40ms,jitter=10ms", "straggler schedule of replica 0 in every arm (the model server's --straggle; empty: none)")
	fs.StringVar(&c.DecodeAfter, "decode-after", "0", "comma-separated decode_after values of parm, one arm each (0: first-k, the paper's rule; e.g. 0,5ms)")
	fs.BoolVar(&c.Online, "online", false, "also run, per k, a parm arm whose parity models are trained online from its own traffic (parity.train online), reporting queries served before the first swap and the agreement reached")
	fs.DurationVar(&c.FillAfter, "fill-after", -1, "parm's fill_after: close a coding group short of k batches with recently answered ones after this long (-1: examples/parm.yaml's; 0: off, the paper's rule)")
	fs.StringVar(&c.JSON, "json", "", "write the JSON array to this file")
	fs.StringVar(&c.Plot, "plot", "", "draw p50, p99 and p99.9 per arm into this PNG")
	fs.Uint64Var(&c.Seed, "seed", 1, "arrival and input seed")
	fs.DurationVar(&c.Timeout, "timeout", 10*time.Second, "per-request deadline")
	registerTaskFlags(&c.Task, fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	c.Task.TraceArgs = traceArgs()
	ctx, stop := signalContext()
	defer stop()
	return harness.RunParmBench(ctx, c)
}
