package cluster

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// A live backup is redundancy only once it applied a base from its
// primary: chaos and demo report redundancy restored (and chaos injects
// its next fault) only then. A 30-minute soak killed a primary 1.3 s after
// its new backup started, before the base reached it.
func TestUnsyncedBackups(t *testing.T) {
	cfg, err := config.Parse([]byte(`
name: s
mode: nspb
models:
  - {name: a, kind: fake}
  - {name: b, kind: counter, stateful: true, placement: {primary: h1, backup: h2}}
  - {name: c, kind: counter, stateful: true, placement: {primary: h1, backup: h2}}
services:
  - name: s
    edges: [[frontend, a], [a, b], [b, c], [c, frontend]]
`))
	if err != nil {
		t.Fatal(err)
	}
	gauge := func(v float64) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "# TYPE hams_sidecar_backup_synced gauge\nhams_sidecar_backup_synced{model=\"x\"} %v\n", v)
		}))
		t.Cleanup(s.Close)
		return s
	}
	synced, waiting := gauge(1), gauge(0)
	addr := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	topo := &hamsv1.Topology{Placements: []*hamsv1.Placement{
		{Model: "b", Role: hamsv1.Role_ROLE_PRIMARY, ComponentId: "b/p", SidecarAddress: "h1:1", Alive: true},
		{Model: "b", Role: hamsv1.Role_ROLE_BACKUP, ComponentId: "b/b", SidecarAddress: "h2:1", Alive: true},
		{Model: "c", Role: hamsv1.Role_ROLE_PRIMARY, ComponentId: "c/p", SidecarAddress: "h1:2", Alive: true},
		{Model: "c", Role: hamsv1.Role_ROLE_BACKUP, ComponentId: "c/b", SidecarAddress: "h2:2", Alive: true},
		// A dead backup and a spare are not the model's redundancy.
		{Model: "c", Role: hamsv1.Role_ROLE_BACKUP, ComponentId: "c/old", SidecarAddress: "h3:2", Alive: false},
		{Model: "c", Role: hamsv1.Role_ROLE_STANDBY, ComponentId: "c/spare", SidecarAddress: "h4:2", Alive: true},
	}}
	ctx := context.Background()
	got := unsyncedBackups(ctx, cfg, topo, map[string]string{"b/b": addr(synced), "c/b": addr(synced), "c/spare": addr(waiting)})
	if len(got) != 0 {
		t.Fatalf("every backup synced: unsynced %v", got)
	}
	got = unsyncedBackups(ctx, cfg, topo, map[string]string{"b/b": addr(synced), "c/b": addr(waiting)})
	if !slices.Equal(got, []string{"c (c/b)"}) {
		t.Fatalf("c's backup waits for its base: unsynced %v", got)
	}
	got = unsyncedBackups(ctx, cfg, topo, map[string]string{"c/b": addr(synced)})
	if len(got) != 1 || !strings.HasPrefix(got[0], "b (b/b") {
		t.Fatalf("b's backup has no metrics address: unsynced %v", got)
	}
	synced.Close() // unreadable metrics: not known to be synced
	got = unsyncedBackups(ctx, cfg, topo, map[string]string{"b/b": addr(synced), "c/b": addr(synced)})
	if len(got) != 2 {
		t.Fatalf("unreadable metrics: unsynced %v", got)
	}
}

// The chaos harness reads a backup's synced gauge every 20 ms while a
// fault is checked: it asks the sidecar's registry for that one family
// (name[]), not the whole exposition, and still finds it.
func TestGaugeValueAsksForOneFamily(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: backupSyncedMetric, Help: "h"}, []string{"model"})
	g.WithLabelValues("x").Set(1)
	other := prometheus.NewCounter(prometheus.CounterOpts{Name: "hams_other_total", Help: "h"})
	other.Add(3)
	reg.MustRegister(g, other)
	var bodyBytes atomic.Int64
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Del("Accept-Encoding") // plain text, to look into
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		bodyBytes.Store(int64(rec.Body.Len()))
		if strings.Contains(rec.Body.String(), "hams_other_total") {
			t.Errorf("scrape %s returned families it did not ask for:\n%s", r.URL, rec.Body.String())
		}
		maps.Copy(w.Header(), rec.Header())
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	defer s.Close()
	v, err := gaugeValue(context.Background(), strings.TrimPrefix(s.URL, "http://"), backupSyncedMetric)
	if err != nil || v != 1 {
		t.Fatalf("gaugeValue = %v, %v; want 1", v, err)
	}
	if bodyBytes.Load() == 0 {
		t.Fatal("the handler was not asked")
	}
}
