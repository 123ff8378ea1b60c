package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/hams-go/hams/internal/harness"
	"github.com/spf13/cobra"
)

// version is the release of this binary; a release build sets it with
// -ldflags "-X main.version=v1.2.3". Otherwise it is the module version
// that `go install ...@version` records, else "dev".
var version = "dev"

// stdout and stderr are where the command tree writes help, usage and
// version text (tests replace them).
var (
	stdout io.Writer = os.Stdout
	stderr io.Writer = os.Stderr
)

// versionString is what `hams --version` prints: the version, the VCS
// commit the binary was built from (with "modified" for a dirty tree) and
// the Go toolchain.
func versionString() string {
	v, commit, modified, goVersion := version, "unknown", false, runtime.Version()
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.GoVersion != "" {
			goVersion = bi.GoVersion
		}
		if v == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if modified {
		commit += " (modified)"
	}
	return fmt.Sprintf("hams version %s, commit %s, %s %s/%s", v, commit, goVersion, runtime.GOOS, runtime.GOARCH)
}

// cmdSpec is one subcommand: its texts and the function that parses its
// own flag.FlagSet (the flags of docs/design.md's command-line contract parse
// exactly as before cobra: -flag and --flag, "--flag value" and
// "--flag=value").
type cmdSpec struct {
	use, short, long, example string
	run                       func(args []string) error
	hidden                    bool
}

const rootLong = `HAMS-Go is a high-availability layer for ML serving: it replicates the
state of stateful models in an inference graph (primary and backup, NSPB
state shipping), protects stateless ones (ParM parity models, spares) and
fails over without losing or duplicating a request.

One binary runs every role of a deployment (manager, frontend, sidecar,
modelserver, nats) and the user tasks (up, demo, bench, chaos, report,
parity, certs). docs/design.md's "Command-line contract" is stable: exit status 0
on success, 2 on a usage error, 1 on a failure.`

const rootExample = `  hams demo --service ap --duration 10s
  hams up --config examples/retrofit.yaml
  hams demo -h
  source <(hams completion bash)`

// commandSpecs are the top-level commands (a function: their run
// functions reach back to the tree through parseFlags).
func commandSpecs() []cmdSpec {
	return []cmdSpec{
		{
			use:   "manager",
			short: "run the manager (deployment state, membership; embedded NATS JetStream by default)",
			long: `Run the manager of a deployment: it keeps the deployment's state and
topology, admits and watches the model instances (primaries, backups,
standbys, parity), detects failures and orchestrates recovery. Without
--nats it embeds a nats-server with JetStream; several managers (one
active, standbys) share the state through a NATS KV lease. Prints one JSON
ready line on stdout once it serves; stops on SIGINT/SIGTERM.`,
			example: `  hams certs --config examples/ap.yaml --dir certs
  hams manager --config examples/ap.yaml --listen 127.0.0.1:7100 \
    --tls-cert certs/manager.crt --tls-key certs/manager.key --tls-ca certs/ca.crt
  hams manager --config examples/ap.yaml --insecure --dashboard 127.0.0.1:8080`,
			run: runManager,
		},
		{
			use:   "modelserver",
			short: "run the reference model server for some models of a deployment",
			long: `Run the reference model server (the built-in models of the examples) for
the named models of a deployment, optionally registering with a manager.
A ParM pool's parity servers and stragglers are model servers too
(--parity-of, --straggle).`,
			example: `  hams modelserver --config examples/ap.yaml --models ap-route,ap-motion --insecure
  hams modelserver --config examples/parm.yaml --models fashion --insecure \
    --straggle seed=7,period=100ms,fraction=0.25,delay=40ms,jitter=10ms`,
			run: runModelServer,
		},
		{
			use:   "sidecar",
			short: "run the sidecar of one model in front of its backend",
			long: `Run the sidecar of one model instance in front of its backend (a model
server, TF Serving, Triton, KServe or Clipper): it sequences the model's
requests, ships state snapshots from primary to backup, keeps the output
log and gates replies until they are durable.`,
			example: `  hams sidecar --config examples/ap.yaml --model ap-route --role primary \
    --manager 127.0.0.1:7100 --nats nats://127.0.0.1:4222 --insecure
  hams sidecar --config retrofit-tf.yaml --model fraud --role standby \
    --backend tf-4.internal:8500 --manager mgr.internal:7100 --nats nats://mgr.internal:4222 \
    --tls-cert certs/sidecar-fraud.crt --tls-key certs/sidecar-fraud.key --tls-ca certs/ca.crt`,
			run: runSidecar,
		},
		{
			use:   "frontend",
			short: "run the client-facing frontend",
			long: `Run the client-facing frontend: the TF Serving and KServe v2 gRPC
services, their REST dialects and the project's JSON API on --http; it
follows the active manager's topology and routes requests into the graph.`,
			example: `  hams frontend --config examples/retrofit.yaml --manager 127.0.0.1:7100 \
    --nats nats://127.0.0.1:4222 --listen 0.0.0.0:8500 --http 0.0.0.0:8501 --insecure`,
			run: runFrontend,
		},
		{
			use:   "nats",
			short: "run the coordination engine (nats-server with JetStream) as a process of its own",
			long: `Run the coordination engine, an embedded nats-server with JetStream, as a
process of its own (a manager embeds one by default); several form a
cluster.`,
			example: `  hams nats --listen 127.0.0.1:4222 --store /var/lib/hams/js --insecure`,
			run:     runNATS,
		},
		{
			use:   "up",
			short: "start a whole deployment as local processes and keep it running",
			long: `Start the deployment described by --config as local processes (NATS,
managers, model servers, sidecars, frontends) and keep it running. When
it is ready, print one JSON line on stdout with the endpoints (host:port
strings): frontend_grpc, frontend_http, tfserving_grpc, kserve_grpc,
manager, nats (a nats:// URL). Stops cleanly on SIGTERM.`,
			example: `  hams up --config examples/retrofit.yaml
  hams up --config examples/ap.yaml --mode remus --audit /tmp/audit`,
			run: runUp,
		},
		{
			use:   "demo",
			short: "run an example service under load on this machine, optionally killing components",
			long: `Run an example service (sa, sp, ap, fd, olv, olm, all, or parm) on this
machine as real processes, drive closed-loop load through the frontend,
check every reply, optionally kill components (--kill ROLE[:MODEL]@AFTER)
and measure recovery. Prints a human summary; --json FILE writes the
report (requests, replies, errors, p50_ms, p99_ms, throughput_rps, kills).`,
			example: `  hams demo --service ap --duration 10s
  hams demo --service ap --kill sidecar:ap-route@3s --json demo.json
  hams demo --service parm`,
			run: runDemo,
		},
		{
			use:   "bench",
			short: "measure latency and throughput of services per fault-tolerance mode",
			long: `Measure latency and throughput of services per fault-tolerance mode,
the modes interleaved round by round in one run. --json FILE writes a JSON
array with one object per (service, mode, batch): p50_ms, p99_ms, mean_ms,
throughput_rps, requests. --service parm benchmarks a ParM pool against
equal-resources and hedging redundancy (its own flags: hams bench
--service parm -h).`,
			example: `  hams bench --service ap --modes bare,nspb,remus --batch 16 --requests 400 --json bench.json
  hams bench --service parm --redundancy none,er,hedge,parm --k 2,3,4`,
			run: runBench,
		},
		{
			use:   "chaos",
			short: "random kills under load, then a global-consistency check of the audit logs",
			long: `Kill primaries, backups and stateless models at random under load, then
check global consistency from the audit logs (conflicts, lost and
duplicated requests). --json FILE writes kills [{target, kind,
recovery_ms}] and the totals.`,
			example: `  hams chaos --service ap --duration 30s --seed 1 --audit /tmp/audit --json chaos.json
  hams chaos --service ap --mode remus --kinds primary --json recovery/ap-remus.json`,
			run: runChaos,
		},
		{
			use:   "report recovery|bench [--plot PNG] REPORT.json...",
			short: "print tables from earlier runs' JSON reports",
			long: `Print tables from the JSON reports of earlier runs:

  hams report recovery CHAOS.json...
      the shape of the HAMS paper's Table II: per service, the p50 recovery
      time at the client of each mode's kills (one hams chaos --kinds
      primary per service and mode).
  hams report bench [--plot PNG] BENCH.json...
      the overhead table (the shape of Table I) of one or more hams bench
      --json files, and their plot in one picture (--plot).`,
			example: `  hams report recovery recovery/*.json
  hams report bench --plot bench.png bench-b1.json bench-b16.json`,
			run: runReportCmd,
		},
		{
			use:   "certs",
			short: "create a deployment's CA and per-component certificates (internal mutual TLS identities)",
			long: `Create a deployment's CA (when missing) and the per-component
certificates of internal mutual TLS: SPIFFE identities
spiffe://hams/<deployment>/<role>/... for the manager, frontend, nats,
sidecars and model servers (--config: the default set of a deployment;
--identity: one more).`,
			example: `  hams certs --config examples/ap.yaml --dir certs
  hams certs --deployment ap --identity ops=admin --dir certs`,
			run: runCerts,
		},
		{
			use:     "clipper-stub",
			short:   "a Clipper REST stub over reference models (test support)",
			long:    `Serve reference models as Clipper applications over Clipper's REST API (test support for the clipper adapter).`,
			run:     runClipperStub,
			hidden:  true,
			example: `  hams clipper-stub --config examples/adapters.yaml --models ad-clipper --listen 127.0.0.1:1337`,
		},
	}
}

func paritySpecs() []cmdSpec {
	return []cmdSpec{
		{
			use:   "train",
			short: "train ParM parity models (and deployed classifiers) on Fashion-MNIST",
			long: `Train ParM parity models for a deployed classifier on Fashion-MNIST
(the deployed model labels the data: an embedded weights name, or a running
model reached through an adapter with --deployed-addr), or train a
deployed classifier itself (--classifier).`,
			example: `  hams parity train --k 2 --r 2 --out fashion-parity-sum-k2.bin
  hams parity train --deployed-addr 10.1.2.3:8500 --backend tfserving --deployed-model fashion --k 2`,
			run: runParityTrain,
		},
		{
			use:   "eval",
			short: "Aa, Ad, agreement and Ao of parity models on the test set",
			long: `Evaluate parity models on the Fashion-MNIST test set: the accuracy of
reconstructions (Aa), of the deployed model (Ad), their agreement and the
overall accuracy Ao at 1, 5 and 10% unavailable outputs. --json FILE
writes one object per (k, r, encoder).`,
			example: `  hams parity eval --json parity.json
  hams parity eval --weights my-parity-k2.bin --deployed-addr 10.1.2.3:8500 --backend tfserving`,
			run: runParityEval,
		},
	}
}

// cmdIndex maps a command path ("hams demo", "hams parity train") to its
// cobra command; parseFlags finds the texts of a flag set's command here.
var cmdIndex = map[string]*cobra.Command{}

// newRootCmd builds the command tree. Every leaf disables cobra's flag
// parsing and hands its arguments to the command's own flag.FlagSet.
func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "hams",
		Short:         "HAMS-Go: high availability for ML inference graphs",
		Long:          rootLong,
		Example:       rootExample,
		Version:       versionString(),
		Args:          cobra.ArbitraryArgs,
		SilenceErrors: true,
		SilenceUsage:  true,
		// unknown commands get "did you mean" (RunE below)
		SuggestionsMinimumDistance: 2,
		RunE: func(c *cobra.Command, args []string) error {
			if len(args) == 0 {
				fmt.Fprint(stderr, c.UsageString())
				return harness.Usagef("no command given (usage: hams <command> [flags]; 'hams help' lists the commands)")
			}
			msg := fmt.Sprintf("unknown command %q (usage: hams <command> [flags]; 'hams help' lists the commands)", args[0])
			if s := c.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			return harness.Usagef("%s", msg)
		},
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return harness.Usagef("%s: %v (run '%s -h' for help)", c.CommandPath(), err, c.CommandPath())
	})
	cmdIndex = map[string]*cobra.Command{}
	for _, s := range commandSpecs() {
		root.AddCommand(leafCmd(s))
	}
	parity := &cobra.Command{
		Use:   "parity train|eval [flags]",
		Short: "train and evaluate ParM parity models (hams parity train|eval)",
		Long: `Train and evaluate ParM parity models: learned codes that reconstruct an
unavailable output of a stateless classifier from k - 1 outputs and a
parity output (ParM, SOSP'19).`,
		Example: `  hams parity train --k 2 --out fashion-parity-sum-k2.bin
  hams parity eval --json parity.json`,
		Args: cobra.ArbitraryArgs,
		RunE: func(_ *cobra.Command, args []string) error { return commandErr(runParity(args)) },
	}
	for _, s := range paritySpecs() {
		parity.AddCommand(leafCmd(s))
	}
	root.AddCommand(parity)
	index(root)
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.Args = cobra.ArbitraryArgs
			c.RunE = func(c *cobra.Command, args []string) error {
				if len(args) == 0 {
					return c.Help()
				}
				return harness.Usagef("completion: unknown shell %q (want bash, zsh, fish or powershell)", args[0])
			}
			c.Example = `  source <(hams completion bash)
  hams completion zsh > "${fpath[1]}/_hams"
  hams completion fish > ~/.config/fish/completions/hams.fish`
		}
	}
	return root
}

// index records c and its subcommands in cmdIndex by command path.
func index(c *cobra.Command) {
	cmdIndex[c.CommandPath()] = c
	for _, sub := range c.Commands() {
		index(sub)
	}
}

// leafCmd wraps a command function: its flag.FlagSet parses the
// arguments, prints the help on -h (parseFlags) and shapes the exit code.
func leafCmd(s cmdSpec) *cobra.Command {
	use := s.use
	if !strings.Contains(use, " ") {
		use += " [flags]"
	}
	c := &cobra.Command{
		Use:                use,
		Short:              s.short,
		Long:               s.long,
		Example:            strings.TrimRight(s.example, "\n"),
		Hidden:             s.hidden,
		DisableFlagParsing: true,
		// the flags are the flag set's, listed by printCommandHelp
		DisableFlagsInUseLine: true,
		RunE:                  func(_ *cobra.Command, args []string) error { return commandErr(s.run(args)) },
		ValidArgsFunction: func(_ *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if !strings.HasPrefix(toComplete, "-") {
				return nil, cobra.ShellCompDirectiveDefault
			}
			fs := flagSetOf(s.run)
			if fs == nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var out []cobra.Completion
			fs.VisitAll(func(f *flag.Flag) {
				if name := "--" + f.Name; strings.HasPrefix(name, strings.TrimLeft(toComplete, "-")) || strings.HasPrefix(name, toComplete) {
					usage, _, _ := strings.Cut(f.Usage, "\n")
					out = append(out, cobra.CompletionWithDesc(name, usage))
				}
			})
			return out, cobra.ShellCompDirectiveNoFileComp
		},
	}
	// `hams help NAME` shows what `hams NAME -h` shows.
	c.SetHelpFunc(func(*cobra.Command, []string) { _ = s.run([]string{"-h"}) })
	return c
}

// captureFlags, when set, makes parseFlags record the flag set it was
// given and return without parsing or printing (shell completion reads a
// command's flags this way).
var captureFlags *flag.FlagSet

var capturing bool

// flagSetOf returns the flag set a command function registers.
func flagSetOf(run func([]string) error) *flag.FlagSet {
	capturing, captureFlags = true, nil
	defer func() { capturing = false }()
	_ = run([]string{"-h"})
	return captureFlags
}

// printCommandHelp writes a command's description, usage, examples and
// flags (from its flag.FlagSet, with -h/--help; nil: none).
func printCommandHelp(w io.Writer, c *cobra.Command, fs *flag.FlagSet) {
	if c.Long != "" {
		fmt.Fprintf(w, "%s\n\n", c.Long)
	} else {
		fmt.Fprintf(w, "%s\n\n", c.Short)
	}
	fmt.Fprintf(w, "Usage:\n  %s\n", c.UseLine())
	if c.Example != "" {
		fmt.Fprintf(w, "\nExamples:\n%s\n", c.Example)
	}
	if fs != nil {
		fmt.Fprintf(w, "\nFlags:\n%s", flagDefaults(fs))
		fmt.Fprintln(w, "  -h, --help\n    \tprint this help")
	}
}

// flagDefaults is fs.PrintDefaults with the flags spelled --name (the Go
// flag package accepts both -name and --name).
func flagDefaults(fs *flag.FlagSet) string {
	var b bytes.Buffer
	out := fs.Output()
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(out)
	lines := strings.Split(b.String(), "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "  -") {
			lines[i] = "  --" + l[3:]
		}
	}
	return strings.Join(lines, "\n")
}

// lookupCmd returns the command of a path ("hams demo"; a flag set's
// name), building the tree when no dispatch did (tests of one command).
func lookupCmd(path string) *cobra.Command {
	if len(cmdIndex) == 0 {
		newRootCmd()
	}
	return cmdIndex[path]
}

// isHelpArg says whether a is one of the help flags.
func isHelpArg(a string) bool { return a == "-h" || a == "--help" || a == "-help" }

// runReportCmd gives `hams report` a help (-h, exit 0) before its own
// positional parsing.
func runReportCmd(args []string) error {
	if len(args) > 0 && (isHelpArg(args[0]) || len(args) > 1 && isHelpArg(args[1])) {
		if capturing {
			return &harness.ExitError{Code: 0}
		}
		printCommandHelp(stdout, lookupCmd("hams report"), nil)
		return &harness.ExitError{Code: 0}
	}
	return runReport(args)
}

// execute runs the command tree over args and returns the exit status.
func execute(args []string) int {
	root := newRootCmd()
	if args == nil {
		args = []string{} // nil would make cobra read os.Args
	}
	root.SetArgs(args)
	err := root.Execute()
	var ce *cmdError
	var ee *harness.ExitError
	switch {
	case errors.As(err, &ce):
		err = ce.err // the command's own error: its exit code as it says
	case err != nil && !errors.As(err, &ee) && !errors.Is(err, harness.ErrUsage):
		// cobra's own errors (e.g. completion's arguments) are usage errors.
		err = &harness.ExitError{Code: 2, Err: err}
	}
	return exitCode(err)
}

// cmdError carries a command function's error through cobra, apart from
// cobra's own (usage) errors.
type cmdError struct{ err error }

func (e *cmdError) Error() string { return e.err.Error() }

func commandErr(err error) error {
	if err == nil {
		return nil
	}
	return &cmdError{err}
}
