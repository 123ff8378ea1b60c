package harness

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/coord"
	"github.com/hams-go/hams/internal/loadgen"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func TestParseKill(t *testing.T) {
	k, err := parseKill("sidecar:ap-motion@3s")
	if err != nil || k.Role != "sidecar" || k.Model != "ap-motion" || k.After != 3*time.Second || k.target() != "sidecar:ap-motion" {
		t.Fatalf("%+v %v", k, err)
	}
	if k, err := parseKill("frontend@250ms"); err != nil || k.target() != "frontend" {
		t.Fatalf("%+v %v", k, err)
	}
	if k, err := parseKill("backup-sidecar:ap-route@1s"); err != nil || k.Role != cluster.RoleBackupSidecar || k.Model != "ap-route" {
		t.Fatalf("%+v %v", k, err)
	}
	if k, err := parseKill("frontend:1@2s"); err != nil || k.Role != "frontend" || k.Model != "1" || k.target() != "frontend:1" {
		t.Fatalf("%+v %v", k, err)
	}
	if k, err := parseKill("manager:0@2s"); err != nil || k.Role != "manager" || k.Model != "0" {
		t.Fatalf("%+v %v", k, err)
	}
	for _, bad := range []string{"sidecar:m", "sidecar@1s", "modelserver@1s", "backup-sidecar@1s", "frontend:x@1s", "manager:-1@1s", "router:x@1s", "sidecar:m@-1s", "sidecar:m@soon"} {
		if _, err := parseKill(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestCheckMode(t *testing.T) {
	for _, m := range []string{"bare", "nspb", "remus", "nspb-s1", "nspb-s2", "replay"} {
		if err := CheckMode(m); err != nil {
			t.Fatalf("%s: %v", m, err)
		}
	}
	if err := CheckMode("zab"); err == nil || !strings.Contains(err.Error(), "unknown mode") {
		t.Fatalf("zab: %v", err)
	}
}

const depA = `
name: a
models: [{name: a1, kind: prep}]
services: [{name: sa, edges: [[frontend, a1], [a1, frontend]], inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]}]
limits: {max_message_bytes: 1000}
`

const depB = `
name: b
models: [{name: b1, kind: prep}]
services: [{name: sb, edges: [[frontend, b1], [b1, frontend]]}]
limits: {request_timeout: 30s}
`

func TestMergeDeploymentsAndWrite(t *testing.T) {
	a, err := config.Parse([]byte(depA))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := config.Parse([]byte(depB))
	m, err := mergeDeployments("all", []*config.Deployment{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Models) != 2 || len(m.Services) != 2 || m.Limits.RequestTimeout.D() != 30*time.Second || m.Limits.MaxMessageBytes != 64<<20 {
		t.Fatalf("merged %+v", m)
	}
	if _, err := mergeDeployments("dup", []*config.Deployment{a, a}); err == nil {
		t.Fatal("clashing names merged")
	}
	m.Mode = "bare"
	path := t.TempDir() + "/d.yaml"
	if err := cluster.WriteDeployment(m, path); err != nil {
		t.Fatal(err)
	}
	back, err := config.Load(path)
	if err != nil || back.Mode != "bare" || len(back.Models) != 2 {
		t.Fatalf("round trip: %+v %v", back, err)
	}
}

func TestPrintBenchOverheadPerHop(t *testing.T) {
	var buf bytes.Buffer
	printBench(&buf, []BenchRow{
		{Service: "ap", Mode: "direct", Batch: 1, P50Ms: 1, Hops: 3},
		{Service: "ap", Mode: "bare", Batch: 1, P50Ms: 3, Hops: 3},
	})
	if !strings.Contains(buf.String(), "0.500") {
		t.Fatalf("table lacks (3-1)/(3+1) = 0.5:\n%s", buf.String())
	}
}

// A frontend kill's recovery is the first reply, after the kill, to a
// request sent to the killed frontend: one sent before the kill counts
// only if it was retried elsewhere; requests that never went there do not
// count.
func TestKillTrackerFrontendRule(t *testing.T) {
	kill := time.Now()
	kt := newKillTracker()
	kr := &killReport{Kind: "frontend", RecoveryMs: -1, services: []string{"s"}, killAt: kill, frontendKill: true, frontend: 1}
	done := kt.add(kr)
	res := func(sent time.Duration, lat time.Duration, fes ...int) loadgen.Result {
		return loadgen.Result{Sent: kill.Add(sent), Latency: lat, Frontends: fes, Reply: &hamsv1.PredictResponse{}}
	}
	for _, r := range []loadgen.Result{
		res(10*time.Millisecond, 5*time.Millisecond, 0),      // never sent to frontend 1
		res(-50*time.Millisecond, 60*time.Millisecond, 1),    // answered by 1 before it died (not retried)
		res(-50*time.Millisecond, 20*time.Millisecond, 1, 0), // retried, but answered before the kill
	} {
		kt.reply("s", r)
	}
	if kr.Recovered {
		t.Fatalf("recovered by a reply that does not qualify: %+v", kr)
	}
	kt.reply("s", res(-20*time.Millisecond, 320*time.Millisecond, 1, 0)) // in flight at the kill, retried on 0
	select {
	case <-done:
	default:
		t.Fatal("retried request did not end the recovery")
	}
	if !kr.Recovered || kr.RecoveryMs != 300 {
		t.Fatalf("recovery %v ms, want 300", kr.RecoveryMs)
	}
}

func TestReaskOnlyWithinRetention(t *testing.T) {
	now := time.Now()
	rs := []loadgen.Result{
		{Sent: now.Add(-coord.RequestLogMaxAge - time.Minute)},    // past the retention
		{Sent: now.Add(-coord.RequestLogMaxAge + 30*time.Second)}, // inside the margin
		{Sent: now.Add(-time.Minute)},
		{Sent: now},
	}
	kept, skipped := withinRetention(rs, now)
	if skipped != 2 || len(kept) != 2 || !kept[0].Sent.Equal(now.Add(-time.Minute)) {
		t.Fatalf("kept %v, skipped %d; want the last two kept", kept, skipped)
	}
}
