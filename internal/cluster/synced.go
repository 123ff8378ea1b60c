package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// backupSyncedMetric is 1 on a backup sidecar once it applied a snapshot
// on a base from its current primary (sidecar/metrics.go).
const backupSyncedMetric = "hams_sidecar_backup_synced"

// maxMetricsBytes bounds one /metrics body read by UnsyncedBackups.
const maxMetricsBytes = 8 << 20

// Lacking lists what t lacks for full redundancy, instances first: Missing,
// or, once every model has its instances, UnsyncedBackups. The backups'
// metrics are read only then: a scrape per backup costs the cores the
// deployment serves with, and callers poll this while a fault heals.
func (d *Deployment) Lacking(ctx context.Context, t *hamsv1.Topology) []string {
	if m := d.Missing(t); len(m) > 0 {
		return m
	}
	return d.UnsyncedBackups(ctx, t)
}

// UnsyncedBackups lists the replicated models of t whose live backup has
// not applied a base from the current primary yet (a new backup, or one
// chosen again, that would refuse promotion). A live BACKUP placement is
// not redundancy until then: losing the primary in that window loses the
// model's state. A model with no live backup is Missing's to report; a
// backup this deployment did not start (no metrics address) or whose
// metrics cannot be read counts as unsynced.
func (d *Deployment) UnsyncedBackups(ctx context.Context, t *hamsv1.Topology) []string {
	if d.Supervisor == nil {
		return nil
	}
	metricsOf := map[string]string{} // component id -> metrics address
	for _, name := range d.Supervisor.Names() {
		if r, ok := d.Supervisor.Ready(name); ok && r.String("id") != "" && r.String("metrics") != "" {
			metricsOf[r.String("id")] = r.String("metrics")
		}
	}
	return unsyncedBackups(ctx, d.Config, t, metricsOf)
}

// unsyncedBackups is UnsyncedBackups over metricsOf (component id ->
// metrics address).
func unsyncedBackups(ctx context.Context, cfg *config.Deployment, t *hamsv1.Topology, metricsOf map[string]string) []string {
	var out []string
	for i, m := range cfg.Models {
		if !cfg.Replicated(&cfg.Models[i]) {
			continue
		}
		for _, p := range t.GetPlacements() {
			if p.GetModel() != m.Name || p.GetRole() != hamsv1.Role_ROLE_BACKUP || !p.GetAlive() || p.GetSidecarAddress() == "" {
				continue
			}
			addr := metricsOf[p.GetComponentId()]
			if addr == "" {
				out = append(out, m.Name+" ("+p.GetComponentId()+": no metrics address)")
				continue
			}
			if v, err := gaugeValue(ctx, addr, backupSyncedMetric); err != nil || v != 1 {
				out = append(out, m.Name+" ("+p.GetComponentId()+")")
			}
		}
	}
	return out
}

// gaugeValue reads one gauge, summed over its series, from the /metrics
// of addr.
func gaugeValue(ctx context.Context, addr, name string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	// name[] asks the registry's handler (client_golang 1.21 and later)
	// for the one family: a sidecar's whole exposition is 30-50 KB, and
	// the chaos harness reads it every 20 ms per backup while a fault is
	// being checked, on the cores the deployment serves with.
	u := "http://" + addr + "/metrics?" + url.Values{"name[]": {name}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("scrape %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("scrape %s: %s", addr, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(io.LimitReader(resp.Body, maxMetricsBytes))
	if err != nil {
		return 0, fmt.Errorf("scrape %s: %w", addr, err)
	}
	f, ok := fams[name]
	if !ok {
		return 0, fmt.Errorf("scrape %s: no %s", addr, name)
	}
	v := 0.0
	for _, m := range f.GetMetric() {
		v += m.GetGauge().GetValue()
	}
	return v, nil
}
