package dashboard

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/manager/dashboard/timeline"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

type fakeSource struct {
	mu   sync.Mutex
	topo *hamsv1.Topology
	regs []*hamsv1.RegisterRequest
}

func (f *fakeSource) Topology() *hamsv1.Topology {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.topo
}
func (f *fakeSource) Active() bool { return true }
func (f *fakeSource) Registrations() []*hamsv1.RegisterRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.regs
}

// metricsServer serves a sidecar's /metrics with a requests counter that
// grows by 100 per scrape and a backend histogram of 1 ms calls.
func metricsServer(t *testing.T) *httptest.Server {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := n.Add(1)
		fmt.Fprintf(w, `# TYPE hams_sidecar_requests_total counter
hams_sidecar_requests_total{model="m1"} %d
# TYPE hams_sidecar_backend_seconds histogram
hams_sidecar_backend_seconds_bucket{model="m1",le="0.0005"} 0
hams_sidecar_backend_seconds_bucket{model="m1",le="0.002"} %d
hams_sidecar_backend_seconds_bucket{model="m1",le="+Inf"} %d
hams_sidecar_backend_seconds_sum{model="m1"} 1
hams_sidecar_backend_seconds_count{model="m1"} %d
# TYPE hams_sidecar_durability_lag_seconds gauge
hams_sidecar_durability_lag_seconds{model="m1"} 0.003
# TYPE hams_sidecar_output_log_bytes gauge
hams_sidecar_output_log_bytes{model="m1"} 4096
# TYPE hams_pool_batches_total counter
hams_pool_batches_total{model="m1",outcome="reconstructed"} 7
`, 100*k, 10*k, 10*k, 10*k)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func testDeployment() *config.Deployment {
	return &config.Deployment{
		Name: "d", Mode: "nspb",
		Models:   []config.Model{{Name: "m1", Kind: "lstm", Stateful: true}, {Name: "m2", Kind: "cnn"}},
		Services: []config.Service{{Name: "s", Edges: [][2]string{{"frontend", "m1"}, {"m1", "m2"}, {"m2", "frontend"}}}},
	}
}

func startServer(t *testing.T, src Source, ring *timeline.Ring) (*Server, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Deployment: testDeployment(), Source: src, Timeline: ring, Listener: lis, ManagerID: "mgr-0",
		ScrapeInterval: 50 * time.Millisecond, Window: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return s, "http://" + lis.Addr().String()
}

func getState(t *testing.T, base string) State {
	t.Helper()
	resp, err := http.Get(base + "/api/state")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st State
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestStateFromTopologyMetricsAndTimeline(t *testing.T) {
	ms := metricsServer(t)
	src := &fakeSource{
		topo: &hamsv1.Topology{Revision: 9, Placements: []*hamsv1.Placement{
			{Model: "m1", Role: hamsv1.Role_ROLE_PRIMARY, ComponentId: "sidecar/m1/primary", SidecarAddress: "127.0.0.1:1", Epoch: 2, Alive: true},
			{Model: "m1", Role: hamsv1.Role_ROLE_BACKUP, ComponentId: "sidecar/m1/backup", SidecarAddress: "127.0.0.1:2", Epoch: 2, Alive: false},
			{Model: "m2", Role: hamsv1.Role_ROLE_ACTIVE, ComponentId: "sidecar/m2/primary", SidecarAddress: "127.0.0.1:3", Epoch: 1, Alive: true},
		}},
		regs: []*hamsv1.RegisterRequest{{Kind: hamsv1.ComponentKind_COMPONENT_KIND_SIDECAR, Id: "sidecar/m1/primary", Model: "m1",
			MetricsAddress: strings.TrimPrefix(ms.URL, "http://")}},
	}
	ring := timeline.NewRing(4)
	_, base := startServer(t, src, ring)
	ring.Emit(timeline.Event{Kind: timeline.Suspicion, Model: "m1", Component: "sidecar/m1/primary"})
	ring.Emit(timeline.Event{Kind: timeline.Suspicion, Model: "m1", Component: "sidecar/m1/primary"}) // merged
	ring.Emit(timeline.Event{Kind: timeline.Promotion, Model: "m1", Component: "sidecar/m1/backup", Duration: time.Millisecond})

	deadline := time.Now().Add(5 * time.Second)
	var st State
	for {
		st = getState(t, base)
		if len(st.Models) == 2 && st.Models[0].Stats.P99Ms != nil && st.Models[0].Stats.ThroughputRPS > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no scraped stats in time: %+v", st.Models)
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
	m1 := st.Models[0]
	if st.Revision != 9 || st.Manager.Role != "active" || m1.Name != "m1" || m1.Epoch != 2 {
		t.Fatalf("state: %+v", st)
	}
	if m1.Health != "degraded" || st.Models[1].Health != "ok" {
		t.Errorf("health m1=%s m2=%s, want degraded (backup dead) and ok", m1.Health, st.Models[1].Health)
	}
	if len(m1.Items) != 2 || m1.Items[0].Role != "primary" || !m1.Items[0].Scraped || m1.Items[1].Alive {
		t.Errorf("instances: %+v", m1.Items)
	}
	if p := *m1.Stats.P99Ms; p < 0.5 || p > 2 {
		t.Errorf("p99 %v ms, want within the (0.5, 2] ms bucket", p)
	}
	if m1.Stats.DurabilityLagS == nil || *m1.Stats.DurabilityLagS != 0.003 || *m1.Stats.OutputLogBytes != 4096 {
		t.Errorf("lag/outlog: %+v", m1.Stats)
	}
	if len(st.Timeline) != 2 || st.Timeline[0].Count != 2 || st.Timeline[1].Kind != timeline.Promotion || st.Timeline[1].FromFailure <= 0 {
		t.Errorf("timeline: %+v", st.Timeline)
	}
	if len(st.Services) != 1 || len(st.Services[0].Edges) != 3 {
		t.Errorf("services: %+v", st.Services)
	}
}

func TestEventsStreamPushesTimeline(t *testing.T) {
	src := &fakeSource{topo: &hamsv1.Topology{Revision: 1}}
	ring := timeline.NewRing(0)
	_, base := startServer(t, src, ring)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	emitted := false
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var st State
		if err := json.Unmarshal([]byte(line), &st); err != nil {
			t.Fatal(err)
		}
		if len(st.Timeline) > 0 && st.Timeline[0].Kind == timeline.Failover {
			return
		}
		if !emitted {
			ring.Emit(timeline.Event{Kind: timeline.Failover, Model: "m1", Duration: 40 * time.Millisecond})
			emitted = true
		}
	}
	t.Fatalf("stream ended without the failover: %v", sc.Err())
}

func TestPageAndAssetsEmbedded(t *testing.T) {
	_, base := startServer(t, &fakeSource{}, nil)
	for _, p := range []string{"/", "/app.js", "/style.css"} {
		resp, err := http.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Security-Policy") == "" {
			t.Errorf("GET %s: %s, CSP %q", p, resp.Status, resp.Header.Get("Content-Security-Policy"))
		}
	}
}

func TestQuantile(t *testing.T) {
	h := hist{count: 100, buckets: []bucket{{0.001, 50}, {0.002, 90}, {0.004, 100}, {math.Inf(1), 100}}}
	if q := quantile(0.5, h); q != 0.001 {
		t.Errorf("p50 %v", q)
	}
	if q := quantile(0.99, h); math.Abs(q-0.0038) > 1e-9 {
		t.Errorf("p99 %v", q)
	}
	if q := quantile(0.5, hist{}); !math.IsNaN(q) {
		t.Errorf("empty: %v", q)
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Fatal("New accepted an empty config")
	}
}
