package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/harness"
	"github.com/hams-go/hams/internal/tracing"
)

// traceFlagCommands are the commands that take the tracing flags.
var traceFlagCommands = map[string]bool{
	"manager": true, "modelserver": true, "sidecar": true, "frontend": true, "clipper-stub": true,
	"up": true, "demo": true, "chaos": true, "bench": true,
}

var traceOpt struct {
	endpoint string
	ratio    float64

	mu       sync.Mutex
	shutdown func(context.Context) error
}

// registerTraceFlags adds --otlp and --trace-ratio to the flag set of
// command name (if it takes them).
func registerTraceFlags(name string, fs *flag.FlagSet) {
	if !traceFlagCommands[name] {
		return
	}
	fs.StringVar(&traceOpt.endpoint, "otlp", "", "export OpenTelemetry traces over OTLP to this endpoint: http://host:4318 (OTLP/HTTP) or host:4317 (OTLP/gRPC); empty: $"+tracing.EnvEndpoint+" if set, else tracing is off (docs/tracing.md); passed on to child processes")
	fs.Float64Var(&traceOpt.ratio, "trace-ratio", 1, "fraction of new requests traced when tracing is on (parent-based: a request whose client sampled it is always traced)")
}

// traceArgs are the tracing flags of child processes.
func traceArgs() []string {
	if traceOpt.endpoint == "" {
		return nil
	}
	return []string{"--otlp", traceOpt.endpoint, "--trace-ratio", strconv.FormatFloat(traceOpt.ratio, 'g', -1, 64)}
}

// startRoleTracing installs the tracer provider of role name (no-op
// without an endpoint), before the role builds its gRPC servers and
// clients. Resource attributes come from the parsed flags: the model(s)
// and the instance (--role / --id / --name).
func startRoleTracing(name string, fs *flag.FlagSet, dep *config.Deployment, log *slog.Logger) error {
	if traceOpt.ratio < 0 || traceOpt.ratio > 1 {
		return harness.Usagef("hams %s: --trace-ratio %v: want a fraction in [0, 1]", name, traceOpt.ratio)
	}
	if !tracing.Configured(traceOpt.endpoint) {
		return nil
	}
	flagOf := func(n string) string {
		if f := fs.Lookup(n); f != nil {
			return f.Value.String()
		}
		return ""
	}
	model := flagOf("model")
	if model == "" {
		model = flagOf("models")
	}
	instance := flagOf("id")
	if instance == "" {
		instance = flagOf("name")
	}
	if instance == "" && model != "" {
		instance = name + "/" + model + "/" + flagOf("role")
	}
	if instance == "" {
		instance = fmt.Sprintf("%s/%d", name, os.Getpid())
	}
	shutdown, err := tracing.Setup(context.Background(), tracing.Config{Endpoint: traceOpt.endpoint, Ratio: traceOpt.ratio,
		Service: "hams-" + name, Deployment: dep.Name, Model: model, Instance: instance, Logger: log})
	if err != nil {
		return fmt.Errorf("hams %s: tracing: %w", name, err)
	}
	traceOpt.mu.Lock()
	traceOpt.shutdown = shutdown
	traceOpt.mu.Unlock()
	return nil
}

// stopTracing flushes and stops the exporter, if one was started (on the
// way out of every command).
func stopTracing() {
	traceOpt.mu.Lock()
	shutdown := traceOpt.shutdown
	traceOpt.shutdown = nil
	traceOpt.mu.Unlock()
	if shutdown == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "hams: %v\n", err)
	}
}
