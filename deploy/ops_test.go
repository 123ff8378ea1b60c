package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"gopkg.in/yaml.v3"

	"github.com/hams-go/hams/frontend"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/manager"
	"github.com/hams-go/hams/refserver"
	"github.com/hams-go/hams/sidecar"
	"github.com/hams-go/hams/sidecar/pool"
)

// recorder is a prometheus.Registerer that keeps what is registered.
type recorder []prometheus.Collector

func (r *recorder) Register(c prometheus.Collector) error   { *r = append(*r, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) { *r = append(*r, cs...) }
func (r *recorder) Unregister(prometheus.Collector) bool    { return false }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// registered is the set of metric names the components register: the
// components' own collectors (each package's MetricCollectors, the
// collectors its constructors register) and the gRPC servers' (grpcx).
// Each component's set is also registered in a registry of its own, as a
// process does, so an inconsistent one fails here.
func registered(t *testing.T) map[string]bool {
	t.Helper()
	var grpcServer recorder
	grpcx.NewServerMetrics(&grpcServer)
	components := map[string][]prometheus.Collector{
		"sidecar":     append(sidecar.MetricCollectors(), pool.MetricCollectors()...),
		"frontend":    frontend.MetricCollectors(),
		"manager":     manager.MetricCollectors(),
		"modelserver": refserver.MetricCollectors(),
		"grpc":        grpcServer,
	}
	names := map[string]bool{}
	for comp, cs := range components {
		reg := prometheus.NewRegistry()
		for _, c := range cs {
			if err := reg.Register(c); err != nil {
				t.Fatalf("%s: register %T: %v", comp, c, err)
			}
			ch := make(chan *prometheus.Desc, 64)
			go func() { c.Describe(ch); close(ch) }()
			for d := range ch {
				m := fqName.FindStringSubmatch(d.String())
				if m == nil {
					t.Fatalf("%s: no name in %v", comp, d)
				}
				names[m[1]] = true
			}
		}
	}
	if len(names) < 50 {
		t.Fatalf("only %d metric names registered: %v", len(names), names)
	}
	return names
}

// Metric names in PromQL: the project's (hams_) and the gRPC servers'
// (grpc_server_); Prometheus' own (up) and functions are not checked.
var metricRef = regexp.MustCompile(`\b(?:hams|grpc_server)_[a-zA-Z0-9_:]*`)

// codeMatch finds equality and regex matchers on a code label.
var codeMatch = regexp.MustCompile(`\b(?:grpc_)?code\s*(?:=~|!~|!=|=)\s*"([^"]*)"`)

// checkExpr reports metric names of expr that no component registers and
// code label values that are not gRPC code names.
func checkExpr(t *testing.T, where, expr string, names map[string]bool) {
	t.Helper()
	for _, ref := range metricRef.FindAllString(expr, -1) {
		base := ref
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(ref, suf); ok && names[b] {
				base = b
			}
		}
		if !names[base] {
			t.Errorf("%s: metric %s is registered by no component (expr %s)", where, ref, expr)
		}
	}
	valid := map[string]bool{}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		valid[c.String()] = true
	}
	for _, m := range codeMatch.FindAllStringSubmatch(expr, -1) {
		for _, v := range strings.Split(m[1], "|") {
			if !valid[v] {
				t.Errorf("%s: code value %q is not a gRPC code name as grpc-go prints it (expr %s)", where, v, expr)
			}
		}
	}
}

// dashboardExprs returns every PromQL expression of the dashboard (panel
// targets and template variable queries), keyed by where it is.
func dashboardExprs(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("grafana", "hams.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("grafana/hams.json: %v", err)
	}
	out := map[string]string{}
	ids := map[int]bool{}
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for i, tg := range p.Targets {
			if tg.Expr == "" {
				t.Errorf("panel %q target %d has no expr", p.Title, i)
			}
			out[fmt.Sprintf("panel %q target %d", p.Title, i)] = tg.Expr
		}
	}
	for _, v := range dash.Templating.List {
		if v.Definition != "" {
			out["variable "+v.Name] = v.Definition
		}
	}
	if dash.UID == "" || len(out) < 20 {
		t.Fatalf("dashboard uid %q with %d queries", dash.UID, len(out))
	}
	return out
}

// alertRules reads prometheus/alerts.yml.
func alertRules(t *testing.T) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []map[string]any `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("prometheus/alerts.yml: %v", err)
	}
	var rules []map[string]any
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	return rules
}

// The dashboard and the alert rules name only metrics some component
// registers, and code label values as the components spell them.
func TestOperationsKitNamesRegisteredMetrics(t *testing.T) {
	names := registered(t)
	for where, expr := range dashboardExprs(t) {
		checkExpr(t, "grafana/hams.json "+where, expr, names)
	}
	for _, r := range alertRules(t) {
		checkExpr(t, fmt.Sprintf("prometheus/alerts.yml %v", r["alert"]), fmt.Sprint(r["expr"]), names)
	}
}

// Every alert rule has a for duration, a severity and a description; the
// ones the operations guide promises exist.
func TestAlertRulesComplete(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range alertRules(t) {
		name := fmt.Sprint(r["alert"])
		seen[name] = true
		labels, _ := r["labels"].(map[string]any)
		ann, _ := r["annotations"].(map[string]any)
		if r["for"] == nil || labels["severity"] == nil || ann["description"] == nil || ann["summary"] == nil {
			t.Errorf("alert %s: want for, labels.severity, annotations.summary and .description; have %v", name, r)
		}
		if s := fmt.Sprint(labels["severity"]); s != "critical" && s != "warning" {
			t.Errorf("alert %s: severity %q, want critical or warning", name, s)
		}
	}
	for _, want := range []string{"HamsBackendDown", "HamsDurabilityLagHigh", "HamsOutputLogNearBound", "HamsRecoverySlow", "HamsNoActiveManager", "HamsRepliesFailing"} {
		if !seen[want] {
			t.Errorf("no alert %s", want)
		}
	}
}

// promtool checks the alert rules, runs their unit tests
// (alerts_test.yml: alerts that fire and one that stays quiet), and
// parses every dashboard query (as recording rules, Grafana's variables
// replaced). Skipped only without promtool (Debian: apt-get install
// prometheus).
func TestPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian: apt-get install prometheus)")
	}
	run := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
	}
	run("prometheus", "check", "rules", "alerts.yml")
	run("prometheus", "test", "rules", "alerts_test.yml")

	exprs := dashboardExprs(t)
	keys := make([]string, 0, len(exprs))
	for k := range exprs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	vars := strings.NewReplacer("$__rate_interval", "5m", "$service", ".*", "$model", ".*")
	type rule struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []rule
	for i, k := range keys {
		e := exprs[k]
		if strings.HasPrefix(e, "label_values(") {
			continue // a Grafana function, not PromQL
		}
		rules = append(rules, rule{Record: fmt.Sprintf("dashboard:query_%d", i), Expr: vars.Replace(e)})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard.yml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	run(dir, "check", "rules", "dashboard.yml")
}
