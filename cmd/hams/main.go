package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
)

// exitError carries a process exit code through the command functions.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// errUsage marks a command-line mistake (exit code 2).
var errUsage = errors.New("usage")

type command struct {
	summary string
	run     func(args []string) error
}

var commands map[string]command

func init() {
	commands = map[string]command{
		"manager":     {"run the manager (deployment state, membership; embedded NATS JetStream by default)", runManager},
		"modelserver": {"run the reference model server for some models of a deployment", runModelServer},
		"sidecar":     {"run the sidecar of one model in front of its backend", runSidecar},
		"frontend":    {"run the client-facing frontend", runFrontend},
		"nats":        {"run the coordination engine (nats-server with JetStream) as a process of its own", runNATS},
		"up":          {"start a whole deployment as local processes and keep it running", runUp},
		"demo":        {"run an example service under load on this machine, optionally killing components", runDemo},
		"bench":       {"measure latency and throughput of services per fault-tolerance mode", runBench},
		"chaos":       {"random kills under load, then a global-consistency check of the audit logs", runChaos},
		"report":      {"print tables from earlier runs' JSON reports (recovery: Table II from hams chaos reports; bench: Table I and the plot from hams bench reports)", runReport},
		"certs":       {"create a deployment's CA and per-component certificates (internal mutual TLS identities)", runCerts},
		"parity":      {"train and evaluate ParM parity models (hams parity train|eval)", runParity},
		"help":        {"list commands", nil},
		// Test support (not listed): a Clipper REST stub over reference models.
		"clipper-stub": {"", runClipperStub},
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: hams <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if commands[n].summary == "" {
			continue // test support
		}
		fmt.Fprintf(w, "  %-12s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'hams <command> -h' for the flags of a command.")
}

func main() {
	os.Exit(dispatch(os.Args[1:]))
}

func dispatch(args []string) int {
	defer stopTracing() // flush the spans of a role (tracing.go)
	if len(args) == 0 {
		usage(os.Stderr)
		return 2
	}
	name := args[0]
	if name == "help" || name == "-h" || name == "--help" {
		if len(args) > 1 {
			if c, ok := commands[args[1]]; ok && c.run != nil {
				return exitCode(c.run([]string{"-h"}))
			}
		}
		usage(os.Stdout)
		return 0
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "hams: unknown command %q\n\n", name)
		usage(os.Stderr)
		return 2
	}
	return exitCode(c.run(args[1:]))
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(os.Stderr, "hams: %v\n", ee.err)
		}
		return ee.code
	}
	if errors.Is(err, errUsage) {
		fmt.Fprintf(os.Stderr, "hams: %v\n", err)
		return 2
	}
	fmt.Fprintf(os.Stderr, "hams: %v\n", err)
	return 1
}
