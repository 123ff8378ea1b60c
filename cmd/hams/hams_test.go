package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/config"
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
	for _, bad := range []string{"sidecar:m", "sidecar@1s", "modelserver@1s", "frontend:x@1s", "router:x@1s", "sidecar:m@-1s", "sidecar:m@soon"} {
		if _, err := parseKill(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestCheckMode(t *testing.T) {
	if err := checkMode("bare"); err != nil {
		t.Fatal(err)
	}
	if err := checkMode("nspb"); err == nil || !strings.Contains(err.Error(), "not implemented yet") {
		t.Fatalf("nspb: %v", err)
	}
	if err := checkMode("zab"); err == nil || !strings.Contains(err.Error(), "unknown mode") {
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
	if err := writeDeployment(m, path); err != nil {
		t.Fatal(err)
	}
	back, err := config.Load(path)
	if err != nil || back.Mode != "bare" || len(back.Models) != 2 {
		t.Fatalf("round trip: %+v %v", back, err)
	}
}

func TestSelectInputsMirrorsSidecar(t *testing.T) {
	x := &hamsv1.Tensor{Name: "x"}
	y := &hamsv1.Tensor{Name: "y"}
	x2 := &hamsv1.Tensor{Name: "x"}
	parts := [][]*hamsv1.Tensor{{x, y}, {x2}}
	all := selectInputs(&hamsv1.ModelDescription{Inputs: []*hamsv1.TensorSpec{{Name: "*"}}}, parts)
	if len(all) != 3 || all[2] != x2 {
		t.Fatalf("* selected %v", all)
	}
	if got := selectInputs(&hamsv1.ModelDescription{}, parts); len(got) != 3 {
		t.Fatalf("no declared inputs selected %v", got)
	}
	got := selectInputs(&hamsv1.ModelDescription{Inputs: []*hamsv1.TensorSpec{{Name: "y"}, {Name: "x"}}}, parts)
	if len(got) != 2 || got[0] != y || got[1] != x {
		t.Fatalf("declared selected %v", got)
	}
}

func TestPrintBenchOverheadPerHop(t *testing.T) {
	var buf bytes.Buffer
	printBench(&buf, []benchRow{
		{Service: "ap", Mode: "direct", Batch: 1, P50Ms: 1, Hops: 3},
		{Service: "ap", Mode: "bare", Batch: 1, P50Ms: 3, Hops: 3},
	})
	if !strings.Contains(buf.String(), "0.500") {
		t.Fatalf("table lacks (3-1)/(3+1) = 0.5:\n%s", buf.String())
	}
}

func TestDispatch(t *testing.T) {
	if dispatch([]string{"nope"}) != 2 || dispatch(nil) != 2 {
		t.Fatal("bad command exit codes")
	}
	if dispatch([]string{"chaos"}) != 2 {
		t.Fatal("chaos must exit 2 (not implemented)")
	}
	if dispatch([]string{"bench", "--modes", "replay"}) != 2 {
		t.Fatal("bench replay must be refused")
	}
}

func TestSuspicionTimeout(t *testing.T) {
	if suspicionFor(0, 5) != 0 || suspicionFor(0, 23) != 300*time.Millisecond || suspicionFor(time.Second, 5) != time.Second {
		t.Fatal("suspicion timeout choice")
	}
}
