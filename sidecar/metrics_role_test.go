package sidecar

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/edge"
)

// roleSeries is hams_sidecar_role of reg: role -> value.
func roleSeries(t *testing.T, reg *prometheus.Registry) map[config.Role]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[config.Role]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "hams_sidecar_role" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var role, model string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "role":
					role = l.GetValue()
				case "model":
					model = l.GetValue()
				}
			}
			if model != "a" {
				t.Fatalf("hams_sidecar_role series of model %q", model)
			}
			out[config.Role(role)] = m.GetGauge().GetValue()
		}
	}
	return out
}

// A hot standby reports role standby until its promotion, then primary;
// the series stay the same four (one per role), only their values move.
func TestRoleMetricFollowsPromotion(t *testing.T) {
	dep, err := config.Parse([]byte(protectedChainGraph))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	sc, err := New(Config{Deployment: dep, Model: "a", Backend: &fakeBackend{}, Resolver: edge.NewStaticResolver(nil),
		GRPCListener: listen(t), Registry: reg, Standby: true})
	if err != nil {
		t.Fatal(err)
	}
	want := func(cur config.Role) {
		t.Helper()
		got := roleSeries(t, reg)
		if len(got) != len(metricRoles) {
			t.Fatalf("hams_sidecar_role series %v, want one per role %v", got, metricRoles)
		}
		for _, r := range metricRoles {
			if w := map[bool]float64{true: 1}[r == cur]; got[r] != w {
				t.Fatalf("hams_sidecar_role{role=%q} = %v, want %v (current role %s)", r, got[r], w, cur)
			}
		}
	}
	want(config.RoleStandby)
	sc.startCollecting() // what Promote does for a stateless standby
	want(config.RolePrimary)
	sc.mu.Lock()
	sc.role = config.RoleBackup
	sc.mu.Unlock()
	want(config.RoleBackup)
}

// The output log's bound and the durability lag of a replicated primary:
// the lag is the age of the oldest snapshot the backup has not applied.
func TestDurabilityLagMetrics(t *testing.T) {
	m := newMetrics(nil, "a")
	sh := newShipper(nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.watched(func() config.Role { return config.RolePrimary }, NewOutputLog(1<<20), sh)...)
	if v := gatheredGauge(t, reg, "hams_sidecar_output_log_limit_bytes"); v != 1<<20 {
		t.Fatalf("output log limit %v, want %d", v, 1<<20)
	}
	n, age := sh.lag(time.Now())
	if n != 0 || age != 0 {
		t.Fatalf("empty shipper: lag %d snapshots, %v", n, age)
	}
	old := time.Now().Add(-3 * time.Second)
	sh.mu.Lock()
	sh.unapplied = append(sh.unapplied, &snapshot{copiedAt: old})
	sh.queue = append(sh.queue, &snapshot{copiedAt: time.Now()})
	sh.mu.Unlock()
	n, age = sh.lag(time.Now())
	if n != 2 || age < 3*time.Second || age > time.Minute {
		t.Fatalf("lag %d snapshots, %v; want 2 and about 3s", n, age)
	}
	if v := gatheredGauge(t, reg, "hams_sidecar_durability_lag_seconds"); v < 3 {
		t.Fatalf("hams_sidecar_durability_lag_seconds = %v, want >= 3", v)
	}
	if v := gatheredGauge(t, reg, "hams_sidecar_unapplied_snapshots"); v != 2 {
		t.Fatalf("hams_sidecar_unapplied_snapshots = %v, want 2", v)
	}
}

// gatheredGauge is the value of reg's single series of gauge name.
func gatheredGauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no single series %s", name)
	return 0
}
