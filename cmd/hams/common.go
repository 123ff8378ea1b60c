package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"

	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/harness"
	"github.com/hams-go/hams/internal/pki"
)

// roleFlags are the flags every long-running role shares.
type roleFlags struct {
	fs      *flag.FlagSet
	config  string
	listen  string
	metrics string
	// metricsDefault is the role's default --metrics (defaultMetricsAddr).
	metricsDefault string
	logLevel       string
	logFormat      string
	tls            tlsFlags
	// plain: a role without internal TLS flags (test stubs of outside
	// servers: clipper-stub).
	plain bool
}

// tlsFlags name a component's certificate files (internal mutual TLS),
// or --insecure.
type tlsFlags struct {
	cert, key, ca string
	insecure      bool
}

func (t *tlsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&t.cert, "tls-cert", "", "PEM certificate of this component's identity (spiffe://hams/<deployment>/<role>/...; `hams certs` issues them); reloaded when the file changes")
	fs.StringVar(&t.key, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&t.ca, "tls-ca", "", "PEM CA certificate(s) that verify internal peers")
	fs.BoolVar(&t.insecure, "insecure", false, "run internal RPCs in plaintext without identities or authorization (explicit opt-out; logged)")
}

// load returns the component's certificate source: nil with --insecure;
// the three files are required otherwise.
func (t *tlsFlags) load(name string, log *slog.Logger) (*pki.Source, error) {
	if t.insecure {
		if t.cert != "" || t.key != "" || t.ca != "" {
			return nil, harness.Usagef("%s: --insecure and --tls-cert/--tls-key/--tls-ca exclude each other", name)
		}
		log.Warn("INSECURE: internal RPCs are plaintext, unauthenticated and unauthorized (--insecure)")
		return nil, nil
	}
	if t.cert == "" || t.key == "" || t.ca == "" {
		return nil, harness.Usagef("%s: internal mutual TLS needs --tls-cert, --tls-key and --tls-ca (create them with `hams certs`), or --insecure to run without", name)
	}
	src, err := pki.Load(pki.Files{CA: t.ca, Cert: t.cert, Key: t.key})
	if err != nil {
		return nil, &harness.ExitError{Code: 2, Err: fmt.Errorf("%s: %w", name, err)}
	}
	log.Info("internal mutual TLS", "identity", src.Identity().String())
	return src, nil
}

func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("hams "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	registerTraceFlags(name, fs) // --otlp, --trace-ratio (tracing.go)
	return fs
}

// defaultMetricsAddr are the roles' default --metrics addresses: a fixed,
// documented block (docs/operations.md), so that a role run by hand is
// scraped where Prometheus expects it. `hams up|demo|chaos|bench` pass
// --metrics 127.0.0.1:0 to their children (they start many of one role on
// a host) and list the addresses in their ready lines instead.
var defaultMetricsAddr = map[string]string{
	"manager":      "127.0.0.1:9410",
	"frontend":     "127.0.0.1:9411",
	"sidecar":      "127.0.0.1:9412",
	"modelserver":  "127.0.0.1:9413",
	"clipper-stub": "127.0.0.1:9414",
}

// metricsFlag registers --metrics with the role's default address.
func (r *roleFlags) metricsFlag(name string) {
	r.metricsDefault = defaultMetricsAddr[name]
	if r.metricsDefault == "" {
		r.metricsDefault = "127.0.0.1:0"
	}
	r.fs.StringVar(&r.metrics, "metrics", r.metricsDefault, "Prometheus /metrics listen address (empty: none; port 0: a free one); the default is this role's fixed port (docs/operations.md), a second instance on the host needs another")
}

func newRoleFlags(name string) *roleFlags {
	r := &roleFlags{fs: newFlagSet(name)}
	r.fs.StringVar(&r.config, "config", "", "deployment YAML file (required)")
	r.fs.StringVar(&r.listen, "listen", "127.0.0.1:0", "gRPC listen address")
	r.metricsFlag(name)
	r.fs.StringVar(&r.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	r.fs.StringVar(&r.logFormat, "log-format", "json", "log format on stderr: json or text")
	r.tls.register(r.fs)
	return r
}

// newPlainRoleFlags are the flags of a role that emulates an outside
// server (no internal identity).
func newPlainRoleFlags(name string) *roleFlags {
	r := &roleFlags{fs: newFlagSet(name), plain: true}
	r.fs.StringVar(&r.config, "config", "", "deployment YAML file (required)")
	r.fs.StringVar(&r.listen, "listen", "127.0.0.1:0", "listen address")
	r.metricsFlag(name)
	r.fs.StringVar(&r.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	r.fs.StringVar(&r.logFormat, "log-format", "json", "log format on stderr: json or text")
	return r
}

// parseFlags parses args; -h prints the command's help (description,
// examples, flags) on stdout and gives a zero-code exit.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if capturing { // shell completion reads the flags (commands.go)
		captureFlags = fs
		return &harness.ExitError{Code: 0}
	}
	help := false
	fs.Usage = func() {
		if !help {
			fmt.Fprintf(fs.Output(), "Run '%s -h' for the flags.\n", fs.Name())
		}
	}
	for _, a := range args {
		if a == "--" {
			break
		}
		help = help || isHelpArg(a)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			if c := lookupCmd(fs.Name()); c != nil {
				printCommandHelp(stdout, c, fs)
			} else {
				fs.SetOutput(stdout)
				fs.PrintDefaults()
			}
			return &harness.ExitError{Code: 0}
		}
		return &harness.ExitError{Code: 2, Err: fmt.Errorf("%s: %v", fs.Name(), err)}
	}
	if fs.NArg() > 0 {
		return &harness.ExitError{Code: 2, Err: fmt.Errorf("%s: unexpected arguments %q", fs.Name(), fs.Args())}
	}
	return nil
}

func (r *roleFlags) parse(args []string) error {
	if err := parseFlags(r.fs, args); err != nil {
		return err
	}
	if r.config == "" {
		return harness.Usagef("%s: --config is required", r.fs.Name())
	}
	return nil
}

func newLogger(level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, harness.Usagef("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	}
	return nil, harness.Usagef("--log-format %q: want json or text", format)
}

// newRegistry is a fresh registry with the Go and process collectors.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// role is what a role command sets up before serving.
type role struct {
	name   string
	log    *slog.Logger
	dep    *config.Deployment
	reg    *prometheus.Registry
	grpc   net.Listener
	mlis   net.Listener // nil when --metrics is empty
	fields map[string]any
	// tls is the component's certificate source (nil: --insecure).
	tls *pki.Source
}

// setupRole loads the config, creates the logger, registry and listeners.
func setupRole(name string, rf *roleFlags) (*role, error) {
	log, err := newLogger(rf.logLevel, rf.logFormat)
	if err != nil {
		return nil, err
	}
	dep, err := cluster.LoadDeployment(rf.config)
	if err != nil {
		return nil, &harness.ExitError{Code: 2, Err: err}
	}
	r := &role{name: name, log: log.With("role", name), dep: dep, reg: newRegistry(), fields: map[string]any{"role": name}}
	if err := startRoleTracing(name, rf.fs, dep, r.log); err != nil { // before any gRPC server or dial (tracing.go)
		return nil, err
	}
	if !rf.plain {
		if r.tls, err = rf.tls.load("hams "+name, r.log); err != nil {
			return nil, err
		}
	}
	if r.tls != nil && r.tls.Identity().Deployment != dep.Name {
		return nil, harness.Usagef("hams %s: certificate %v is not of deployment %q", name, r.tls.Identity(), dep.Name)
	}
	if r.grpc, err = net.Listen("tcp", rf.listen); err != nil {
		return nil, fmt.Errorf("listen %s (gRPC): %w", rf.listen, err)
	}
	r.fields["grpc"] = r.grpc.Addr().String()
	if rf.metrics != "" {
		if r.mlis, err = net.Listen("tcp", rf.metrics); err != nil {
			r.grpc.Close()
			if rf.metrics == rf.metricsDefault {
				return nil, fmt.Errorf("listen %s (metrics, the default port of hams %s; another instance on this host needs --metrics ADDR, e.g. 127.0.0.1:0): %w", rf.metrics, name, err)
			}
			return nil, fmt.Errorf("listen %s (metrics): %w", rf.metrics, err)
		}
		r.fields["metrics"] = r.mlis.Addr().String()
	}
	return r, nil
}

// dialOpts are the options of the role's internal dials (mutual TLS
// with its certificate; none with --insecure).
func (r *role) dialOpts() []grpc.DialOption {
	if r.tls == nil {
		return nil
	}
	return []grpc.DialOption{grpcx.DialTLS(r.tls)}
}

// listen opens an extra listener and closes the role's on failure.
func (r *role) listen(addr, what string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("listen %s (%s): %w", addr, what, err)
	}
	return l, nil
}

func (r *role) close() {
	if r.grpc != nil {
		r.grpc.Close()
	}
	if r.mlis != nil {
		r.mlis.Close()
	}
}

// signalContext ends on SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

// printReady writes the one ready line on stdout.
func printReady(fields map[string]any) {
	fields["pid"] = os.Getpid()
	b, _ := json.Marshal(fields)
	fmt.Fprintln(os.Stdout, string(b))
}

// group runs functions until the first returns an error or all return;
// the first error (or the end of ctx) cancels the others' context, and
// Wait waits for all of them.
type group struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
	err    error
}

func newGroup(ctx context.Context) *group {
	g := &group{}
	g.ctx, g.cancel = context.WithCancel(ctx)
	return g
}

func (g *group) Go(name string, f func(ctx context.Context) error) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		err := f(g.ctx)
		if err != nil && !errors.Is(err, context.Canceled) {
			g.once.Do(func() { g.err = fmt.Errorf("%s: %w", name, err) })
		}
		g.cancel()
	}()
}

func (g *group) Wait() error {
	g.wg.Wait()
	g.cancel()
	return g.err
}

// serveRole runs the component with the metrics listener, prints the ready
// line once ready is closed (nil: at once), and blocks until a signal or
// the first failure.
func (r *role) serve(run func(ctx context.Context) error, ready <-chan struct{}, extra func() map[string]any) error {
	ctx, stop := signalContext()
	defer stop()
	g := newGroup(ctx)
	g.Go(r.name, run)
	if r.mlis != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", grpcx.MetricsHandler(r.reg))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
		if os.Getenv("HAMS_PPROF") == "1" {
			// Profiling on the metrics listener (loopback by default),
			// opted into per process tree: children inherit the variable.
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		g.Go("metrics", func(ctx context.Context) error { return grpcx.ServeHTTP(ctx, mux, r.mlis) })
	}
	if ready != nil {
		select {
		case <-ready:
		case <-g.ctx.Done():
			err := g.Wait()
			if err == nil {
				err = fmt.Errorf("%s stopped before it was ready", r.name)
			}
			return err
		}
	}
	if extra != nil {
		for k, v := range extra() {
			r.fields[k] = v
		}
	}
	printReady(r.fields)
	r.log.Info("serving", "fields", r.fields)
	err := g.Wait()
	if err != nil {
		r.log.Error("stopped with error", "err", err)
		return err
	}
	r.log.Info("stopped")
	return nil
}
