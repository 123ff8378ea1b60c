package integration

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpSpan is one exported span with its process's service.name.
type otlpSpan struct {
	service, instance string
	span              *tracepb.Span
}

// otlpCollector stands in for an OpenTelemetry collector: it takes
// OTLP/HTTP protobuf exports on /v1/traces and keeps the spans.
type otlpCollector struct {
	mu    sync.Mutex
	spans []otlpSpan
}

func (c *otlpCollector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/traces" {
		http.NotFound(w, r)
		return
	}
	b, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	for _, rs := range req.GetResourceSpans() {
		var svc, inst string
		for _, a := range rs.GetResource().GetAttributes() {
			switch a.GetKey() {
			case "service.name":
				svc = a.GetValue().GetStringValue()
			case "hams.instance":
				inst = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				c.spans = append(c.spans, otlpSpan{service: svc, instance: inst, span: sp})
			}
		}
	}
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Write(out)
}

// TestDemoTraceAcrossProcesses runs `hams demo --service ap --otlp` against
// the collector stand-in and checks that one request's trace spans every
// process of the service: the frontend, each model's sidecar and model
// server, and the stateful models' backups. It logs the span list.
func TestDemoTraceAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process demo")
	}
	col := &otlpCollector{}
	srv := httptest.NewServer(col)
	defer srv.Close()
	r := runHams(t, 3*time.Minute, "demo", "--service", "ap", "--duration", "2s", "--otlp", srv.URL)
	if r.code != 0 {
		t.Fatalf("demo exited %d\nstderr:\n%s", r.code, r.stderr)
	}
	col.mu.Lock()
	spans := col.spans
	col.mu.Unlock()
	byTrace := map[string][]otlpSpan{}
	for _, s := range spans {
		k := fmt.Sprintf("%x", s.span.GetTraceId())
		byTrace[k] = append(byTrace[k], s)
	}
	// The most complete trace: the most processes, then the most spans.
	var best []otlpSpan
	procs := func(ss []otlpSpan) int {
		m := map[string]bool{}
		for _, s := range ss {
			m[s.service+"|"+s.instance] = true
		}
		return len(m)
	}
	for _, ss := range byTrace {
		if procs(ss) > procs(best) || (procs(ss) == procs(best) && len(ss) > len(best)) {
			best = ss
		}
	}
	if len(best) == 0 {
		t.Fatalf("no spans exported (%d traces)", len(byTrace))
	}
	sort.Slice(best, func(i, j int) bool { return best[i].span.GetStartTimeUnixNano() < best[j].span.GetStartTimeUnixNano() })
	t.Logf("%d spans in %d traces; one request's trace (%d spans, %d processes):\n%s", len(spans), len(byTrace), len(best), procs(best), renderOTLP(best))

	names, services, models := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, s := range best {
		names[s.span.GetName()] = true
		services[s.service] = true
		if s.span.GetName() == "sidecar.batch" {
			for _, a := range s.span.GetAttributes() {
				if a.GetKey() == "hams.model" {
					models[a.GetValue().GetStringValue()] = true
				}
			}
		}
	}
	for _, n := range []string{"frontend.predict", "sidecar.batch", "backend.call", "snapshot.ship", "backup.apply", "frontend.gate"} {
		if !names[n] {
			t.Errorf("the trace has no %s span", n)
		}
	}
	for _, s := range []string{"hams-frontend", "hams-sidecar", "hams-modelserver"} {
		if !services[s] {
			t.Errorf("the trace has no span of %s", s)
		}
	}
	for _, m := range []string{"ap-inception", "ap-motion", "ap-route", "ap-astar", "ap-drive"} {
		if !models[m] {
			t.Errorf("the trace has no sidecar.batch of %s", m)
		}
	}
}

// renderOTLP lists spans in start order, indented by depth, with their
// start offset, duration and process.
func renderOTLP(spans []otlpSpan) string {
	depth := map[string]int{}
	t0 := spans[0].span.GetStartTimeUnixNano()
	var b strings.Builder
	for _, s := range spans {
		d := 0
		if pd, ok := depth[fmt.Sprintf("%x", s.span.GetParentSpanId())]; ok {
			d = pd + 1
		}
		depth[fmt.Sprintf("%x", s.span.GetSpanId())] = d
		fmt.Fprintf(&b, "%9.3fms %8.3fms  %-40s %s %s\n", float64(s.span.GetStartTimeUnixNano()-t0)/1e6,
			float64(s.span.GetEndTimeUnixNano()-s.span.GetStartTimeUnixNano())/1e6,
			strings.Repeat("  ", d)+s.span.GetName(), s.service, s.instance)
	}
	return b.String()
}
