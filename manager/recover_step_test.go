package manager

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/protocol/recovery"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// strayEvent is an event of no machine the manager drives.
type strayEvent struct{}

func (strayEvent) String() string { return "stray event" }
func (strayEvent) ProtocolEvent() {}

// An event the recovery machine refuses is a bug of the driver: step logs
// it at error level with the event and counts it in
// hams_manager_recovery_driver_errors_total, does not panic, and the
// machine (unchanged) takes the next event.
func TestRecoveryStepRefusedEventLoggedAndCounted(t *testing.T) {
	var logs bytes.Buffer
	dep, err := config.Parse([]byte(chainYAML))
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{log: slog.New(slog.NewTextHandler(&logs, nil)), metrics: newMetrics(nil)}
	rec, err := recovery.New(recovery.Config{Graph: recovery.NewGraph(dep)})
	if err != nil {
		t.Fatal(err)
	}
	d := &driver{m: m, rec: rec, ctx: context.Background(), conns: map[string]*grpc.ClientConn{}}
	errCount := func() float64 { t.Helper(); return counterValue(t, m.metrics.driverErrors) }

	d.step(strayEvent{})
	if got := errCount(); got != 1 {
		t.Errorf("after a stray event hams_manager_recovery_driver_errors_total = %v, want 1", got)
	}
	// An answer to an action the machine never issued.
	d.step(recovery.ActionDone{ID: 7})
	d.step(recovery.MaxSeqAnswered{ID: 8, MaxSeq: 3})
	if got := errCount(); got != 3 {
		t.Errorf("after two stray answers hams_manager_recovery_driver_errors_total = %v, want 3", got)
	}
	out := logs.String()
	for _, want := range []string{"stray event", "done #7", "maxseq #8 seq=3"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks an error naming %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "level=ERROR"); n != 3 {
		t.Errorf("%d error lines, want 3:\n%s", n, out)
	}
	if !rec.Idle() {
		t.Fatal("a refused event changed the machine (a round runs)")
	}

	// The machine goes on: a topology, then a suspicion of a component it
	// does not know (no round, nothing to do), are stepped without error.
	d.step(recovery.TopologyChanged{Topology: &hamsv1.Topology{Placements: []*hamsv1.Placement{
		{ComponentId: "sidecar/a", Model: "a", Role: hamsv1.Role_ROLE_ACTIVE, Epoch: 1, Alive: true},
	}}})
	d.step(recovery.Suspected{Model: "nosuch", Role: hamsv1.Role_ROLE_ACTIVE, Component: "sidecar/x"})
	if got := errCount(); got != 3 {
		t.Errorf("events the machine takes were counted: hams_manager_recovery_driver_errors_total = %v, want 3", got)
	}
	if !rec.Idle() {
		t.Fatal("a suspicion of an unknown model started a round")
	}
}

// The new counter is registered with the manager's metrics (the
// operations kit checks dashboards and alerts against MetricCollectors).
func TestRecoveryDriverErrorsMetricRegistered(t *testing.T) {
	reg := prometheus.NewRegistry()
	newMetrics(reg)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "hams_manager_recovery_driver_errors_total" {
			if v := mf.GetMetric()[0].GetCounter().GetValue(); v != 0 {
				t.Fatalf("fresh counter = %v", v)
			}
			return
		}
	}
	t.Fatal("hams_manager_recovery_driver_errors_total not registered")
}
