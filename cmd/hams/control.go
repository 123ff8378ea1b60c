package main

import (
	"flag"

	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/harness"
)

// controlFlags are the control-plane sizes of demo, chaos and up.
type controlFlags struct {
	frontends, managers int
	insecure            bool
	// nats: an external cluster's URLs, or the embedded one's size, and
	// the replicas of what the components create in it.
	nats                      string
	natsCluster, natsReplicas int
}

func (c *controlFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&c.insecure, "insecure", false, "run internal RPCs in plaintext without identities or authorization (default: a CA and a certificate per process under the run directory, mutual TLS on every internal hop)")
	fs.IntVar(&c.frontends, "frontends", 0, "number of frontends (0: 2 in the protected modes, 1 in bare); they share the JetStream request log, and a surviving one completes what a dead one accepted")
	fs.IntVar(&c.managers, "managers", 0, "number of managers, one active and the others standing by (0: 2 in the protected modes, 1 in bare)")
	fs.StringVar(&c.nats, "nats", "", "comma-separated client URLs of an external NATS cluster (JetStream) to use instead of starting hams nats (docs/coordination.md)")
	fs.IntVar(&c.natsCluster, "nats-cluster", 1, "number of NATS servers (hams nats) to start as one JetStream cluster on loopback (1: a single server)")
	fs.IntVar(&c.natsReplicas, "nats-replicas", 0, "replicas of the coordination streams and buckets (0: 3 with several NATS servers, else 1)")
}

// options returns the deployOptions fields the flags set; in the
// protected modes even a lone frontend gets the request log (restarted
// in place, it completes what it accepted).
func (c controlFlags) options(mode string) cluster.Options {
	return cluster.Options{Frontends: c.frontends, Managers: c.managers, RequestLog: config.Mode(mode).Protected(), Insecure: c.insecure,
		NATS: c.nats, NATSCluster: c.natsCluster, NATSReplicas: c.natsReplicas, TraceArgs: traceArgs()}
}

// check refuses negative sizes.
func (c controlFlags) check() error {
	if c.frontends < 0 || c.managers < 0 {
		return harness.Usagef("--frontends and --managers must not be negative")
	}
	if c.natsCluster < 1 || c.natsReplicas < 0 || c.natsReplicas > 5 {
		return harness.Usagef("--nats-cluster must be at least 1, --nats-replicas 0..5")
	}
	if c.nats != "" && c.natsCluster > 1 {
		return harness.Usagef("--nats (an external cluster) and --nats-cluster exclude each other")
	}
	if n := max(c.natsCluster, len(cluster.SplitList(c.nats))); c.natsReplicas > n && c.nats == "" {
		return harness.Usagef("--nats-replicas %d needs at least as many NATS servers (--nats-cluster %d)", c.natsReplicas, n)
	}
	return nil
}
