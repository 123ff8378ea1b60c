package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/loadgen"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// chromiumPath finds a Chromium-family browser for chromedp.
func chromiumPath() string {
	for _, n := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	return ""
}

// dashInstance is the part of the dashboard's /api/state the test reads.
type dashState struct {
	Models []struct {
		Name  string `json:"name"`
		Items []struct {
			ID    string `json:"id"`
			Kind  string `json:"kind"`
			Role  string `json:"role"`
			Alive bool   `json:"alive"`
			Pid   int    `json:"pid"`
		} `json:"instances"`
	} `json:"models"`
}

func getDashState(t *testing.T, base string) dashState {
	t.Helper()
	resp, err := http.Get(base + "api/state")
	if err != nil {
		t.Fatalf("GET %sapi/state: %v", base, err)
	}
	defer resp.Body.Close()
	var st dashState
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("decode %sapi/state: %v", base, err)
	}
	return st
}

// TestDashboardInBrowser opens the manager's dashboard of `hams up` (ap)
// in headless Chromium under load: every model of the service renders in
// the graph with live numbers; after a SIGKILL of ap-motion's primary
// sidecar the timeline shows the failover within seconds. The screenshot
// goes to $HAMS_DASHBOARD_SCREENSHOT when set (docs/img/dashboard.png is
// made so), else to the test's temporary directory.
func TestDashboardInBrowser(t *testing.T) {
	chrome := chromiumPath()
	if chrome == "" {
		t.Skip("no chromium on PATH (Debian: apt-get install -y chromium): the dashboard's browser test needs a headless browser")
	}
	start := time.Now()
	cfgPath, _ := filepath.Abs("../examples/ap.yaml")
	dep, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	const svc = "ap"
	up := startHams(t, 90*time.Second, "up", "--config", cfgPath, "--run-dir", t.TempDir(), "--suspicion-timeout", suspicion)
	dash := up.str(t, "dashboard")
	if !strings.HasPrefix(dash, "http://127.0.0.1:") {
		t.Fatalf("dashboard %q: want a loopback http URL", dash)
	}

	// Load, so the graph shows throughput and latency.
	cc, err := grpcx.Dial(up.str(t, "frontend_grpc"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	lctx, lcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { lcancel(); wg.Wait() }()
	wg.Add(1)
	go func() {
		defer wg.Done()
		gens := make([]*loadgen.Generator, 2)
		for i := range gens {
			gens[i], _ = loadgen.NewGenerator(dep.Service(svc), uint64(i+1), 1, nil)
		}
		_, _ = loadgen.Run(lctx, loadgen.RunConfig{
			Client: hamsv1.NewFrontendClient(cc), Concurrency: 2, Requests: 1 << 30, Timeout: 10 * time.Second,
			NewRequest: func(c int, n uint64) *hamsv1.PredictRequest {
				return &hamsv1.PredictRequest{Service: svc, RequestId: fmt.Sprintf("c%d-%d", c, n), StreamId: fmt.Sprintf("s%d", c), Inputs: gens[c].Inputs()}
			},
		})
	}()

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chrome), chromedp.WindowSize(1500, 1100), chromedp.DisableGPU)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox)
	}
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	step := func(what string, timeout time.Duration, a chromedp.Action[chromedp.Void]) {
		t.Helper()
		ctx, cancel := context.WithTimeout(bctx, timeout)
		defer cancel()
		if _, err := chromedp.Run(ctx, a); err != nil {
			t.Fatalf("browser: %s: %v", what, err)
		}
	}
	// The first Run starts the browser: no timeout on it (it would stop
	// the browser when it fires).
	if err := chromedp.Do(bctx, chromedp.Navigate(dash)); err != nil {
		t.Fatalf("browser: open %s: %v", dash, err)
	}
	opened := time.Now()
	step("live over SSE", 20*time.Second, chromedp.WaitVisible("#conn.conn-live"))

	// Every model of the service is a node of the graph, with its
	// instances; and a row of the models table.
	var want []string
	for _, e := range dep.Service(svc).Edges {
		for _, n := range e {
			if n != "frontend" && !contains(want, n) {
				want = append(want, n)
			}
		}
	}
	sort.Strings(want)
	js := func(sel string) string {
		return fmt.Sprintf(`Array.from(document.querySelectorAll(%q)).map(e => e.getAttribute("data-model")).sort().join(",")`, sel)
	}
	wantJoined := strings.Join(want, ",")
	step("every model in the graph", 20*time.Second, chromedp.Poll[chromedp.Void](js(`[data-service="ap"] g.node[data-model]`)+` === `+jsString(wantJoined)+
		` && document.querySelectorAll('g.node[data-model] text[data-instance]').length >= `+fmt.Sprint(len(want)), chromedp.WithPollingTimeout(20*time.Second)))
	step("every model in the table", 5*time.Second, chromedp.Poll[chromedp.Void](js(`#models tr[data-model]`)+` === `+jsString(wantJoined), chromedp.WithPollingTimeout(5*time.Second)))
	// Live numbers: throughput of the entry model over zero.
	step("throughput shown", 30*time.Second, chromedp.Poll[chromedp.Void](
		`(() => { const r = document.querySelector('#models tr[data-model="ap-inception"]'); return r && parseFloat(r.children[3].textContent) > 0; })()`,
		chromedp.WithPollingTimeout(30*time.Second)))
	t.Logf("dashboard %s rendered %d models with live numbers %v after opening", dash, len(want), time.Since(opened).Round(time.Millisecond))

	// SIGKILL ap-motion's primary sidecar (its pid: the registration, on
	// the dashboard's JSON).
	const victim = "ap-motion"
	pid := 0
	for _, m := range getDashState(t, dash).Models {
		if m.Name != victim {
			continue
		}
		for _, in := range m.Items {
			if in.Kind == "sidecar" && in.Role == "primary" && in.Alive {
				pid = in.Pid
			}
		}
	}
	if pid <= 0 {
		t.Fatalf("no pid of %s's primary sidecar on the dashboard", victim)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill %d: %v", pid, err)
	}
	killed := time.Now()
	step("failover on the timeline", 15*time.Second, chromedp.Poll[chromedp.Void](
		`document.querySelector('#timeline li[data-kind="failover"][data-model*="`+victim+`"]') !== null`,
		chromedp.WithPollingTimeout(15*time.Second), chromedp.WithPollingInterval(20*time.Millisecond)))
	shown := time.Since(killed)
	t.Logf("failover of %s on the timeline %v after the SIGKILL of pid %d", victim, shown.Round(time.Millisecond), pid)
	if shown > 5*time.Second {
		t.Errorf("the failover took %v to show, want within seconds", shown)
	}
	step("suspicion and promotion on the timeline", 5*time.Second, chromedp.Poll[chromedp.Void](
		`document.querySelector('#timeline li[data-kind="suspicion"][data-model="`+victim+`"]') !== null && document.querySelector('#timeline li[data-kind="promotion"][data-model="`+victim+`"]') !== null`,
		chromedp.WithPollingTimeout(5*time.Second)))
	// Redundancy restored (a spare synced as the new backup), and the
	// numbers of the next scrapes, for the screenshot.
	step("redundancy restored on the timeline", 20*time.Second, chromedp.Poll[chromedp.Void](
		`document.querySelector('#timeline li[data-kind="redundancy-restored"][data-model="`+victim+`"]') !== null`,
		chromedp.WithPollingTimeout(20*time.Second)))
	step("throughput after the failover", 20*time.Second, chromedp.Poll[chromedp.Void](
		`(() => { const r = document.querySelector('#models tr[data-model="`+victim+`"]'); return r && parseFloat(r.children[3].textContent) > 0 && r.children[1].textContent === "ok"; })()`,
		chromedp.WithPollingTimeout(20*time.Second)))

	sctx, scancel := context.WithTimeout(bctx, 20*time.Second)
	png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
	scancel()
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	out := os.Getenv("HAMS_DASHBOARD_SCREENSHOT")
	if out == "" {
		out = filepath.Join(t.TempDir(), "dashboard.png")
	}
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatalf("write screenshot: %v", err)
	}
	t.Logf("screenshot %s (%d bytes); test ran %v", out, len(png), time.Since(start).Round(time.Millisecond))
	// The deployment's process group is killed by startHams' cleanup.
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
