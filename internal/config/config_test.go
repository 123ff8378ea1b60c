package config

import (
	"errors"
	"strings"
	"testing"
)

const good = `
name: t
mode: bare
hosts: [h1, h2]
models:
  - name: a
    kind: prep
  - name: b
    kind: lstm
    stateful: true
    batch: {size: 8, max_wait: 2ms}
    placement: {primary: h1, backup: h2}
  - name: c
    kind: knn
  - name: d
    kind: concat
    fan_in: join
services:
  - name: s
    inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]
    edges: [[frontend, a], [a, b], [a, c], [b, d], [c, d], [d, frontend]]
`

// A model that no service names is served by its one line: an implicit
// one-model service of its name.
func TestModelWithoutServiceGetsItsOwn(t *testing.T) {
	d, err := Parse([]byte(strings.SplitN(good, "services:", 2)[0] + "  - {name: solo, kind: prep, ha: off, backend: {type: tfserving, address: tf:8500}}\n" +
		"services:\n  - {name: s, edges: [[frontend, a], [a, b], [b, frontend]]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range d.Services {
		names = append(names, s.Name)
	}
	if got := strings.Join(names, ","); got != "s,c,d,solo" {
		t.Fatalf("services %s, want s,c,d,solo", got)
	}
	g := d.Service("solo").Graph()
	if got := strings.Join(g.Entries(), ","); got != "solo" || strings.Join(g.Sinks(), ",") != "solo" {
		t.Fatalf("solo's service: entries %v sinks %v", g.Entries(), g.Sinks())
	}
	if !d.PassThrough("solo") {
		t.Fatal("solo is not pass-through")
	}
}

func TestParseGoodAppliesDefaults(t *testing.T) {
	d, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if d.Limits.MaxMessageBytes != 64<<20 || d.Limits.RequestTimeout.D().Seconds() != 10 {
		t.Fatalf("limits defaults: %+v", d.Limits)
	}
	a := d.Model("a")
	if a.Batch.Size != 1 || a.Backend.Type != "reference" || a.Backend.Model != "a" || a.FanIn != FanInJoin || a.HA != "stateless" {
		t.Fatalf("model defaults: %+v", a)
	}
	if b := d.Model("b"); b.HA != "stateful" || b.Batch.MaxWait.D().Milliseconds() != 2 {
		t.Fatalf("model b: %+v", b)
	}
	g := d.Service("s").Graph()
	if got := strings.Join(g.Models(), ","); got != "a,b,c,d" {
		t.Fatalf("topological order %s", got)
	}
	if got := strings.Join(g.Pred("d"), ","); got != "b,c" {
		t.Fatalf("pred order %s", got)
	}
	if g.Hops() != 3 {
		t.Fatalf("hops %d", g.Hops())
	}
	if got := strings.Join(g.Sinks(), ","); got != "d" {
		t.Fatalf("sinks %s", got)
	}
	if d.ServiceOf("c").Name != "s" || d.ServiceOf("zz") != nil {
		t.Fatal("ServiceOf")
	}
	if got := d.StatefulModels(); len(got) != 1 || got[0] != "b" {
		t.Fatalf("stateful %v", got)
	}
}

func TestValidationErrors(t *testing.T) {
	cases := []struct {
		name, yaml, want string
	}{
		{"bad yaml", "models: [", "yaml"},
		{"unknown field", good + "\nbogus: 1\n", "bogus"},
		{"bad mode", strings.Replace(good, "mode: bare", "mode: fast", 1), `mode "fast"`},
		{"cycle", strings.Replace(good, "[d, frontend]", "[d, frontend], [d, a]", 1), "cycle"},
		{"unknown model", strings.Replace(good, "[c, d]", "[c, zz]", 1), `unknown model "zz"`},
		{"missing name", strings.Replace(good, "- name: c\n", "- name: \"\"\n", 1), "missing name"},
		{"missing kind", strings.Replace(good, "kind: knn", "", 1), "missing kind"},
		{"stateful without backup", strings.Replace(good, "placement: {primary: h1, backup: h2}", "placement: {primary: h1}", 1), "without a backup placement"},
		{"backup on primary host", strings.Replace(good, "backup: h2", "backup: h1", 1), "backup placed on its primary"},
		{"unknown host", strings.Replace(good, "backup: h2", "backup: h9", 1), `unknown host "h9"`},
		{"duplicate model", strings.Replace(good, "- name: c\n    kind: knn", "- name: a\n    kind: knn", 1), "defined twice"},
		{"batch size", strings.Replace(good, "size: 8", "size: 0", 1) + "", ""},
		{"bad duration", strings.Replace(good, "max_wait: 2ms", "max_wait: soon", 1), `duration "soon"`},
		{"bad fan_in", strings.Replace(good, "fan_in: join", "fan_in: zip", 1), `fan_in "zip"`},
		{"no frontend entry", strings.Replace(good, "[frontend, a]", "[c, a]", 1), "no edge leaves the frontend"},
		{"dangling model", strings.Replace(good, "[c, d], ", "", 1), `model "c" has no outgoing edge`},
		{"reserved name", strings.Replace(good, "- name: c\n", "- name: frontend\n", 1), "reserved"},
		{"duplicate edge", strings.Replace(good, "[a, b],", "[a, b], [a, b],", 1), "listed twice"},
		{"ha stateful on stateless", strings.Replace(good, "kind: knn", "kind: knn\n    ha: stateful", 1), "not marked stateful"},
		{"backend without address or kind", strings.Replace(good, "kind: knn", "backend: {type: tfserving}", 1), "needs an address"},
		{"typed inputs on the reference backend", strings.Replace(good, "kind: knn", "kind: knn\n    backend: {typed_inputs: true}", 1), "typed_inputs is for backend types tfserving and triton"},
		{"typed inputs on clipper", strings.Replace(good, "kind: knn", "kind: knn\n    backend: {type: clipper, typed_inputs: true}", 1), "typed_inputs is for backend types tfserving and triton"},
		{"typed inputs on triton", strings.Replace(good, "kind: knn", "kind: knn\n    backend: {type: triton, typed_inputs: true}", 1), ""},
		{"clipper tensors on a tfserving backend", strings.Replace(good, "kind: knn", "kind: knn\n    backend: {type: tfserving, clipper: {input: x}}", 1), "backend.clipper is for backend type clipper"},
		{"clipper output datatype", strings.Replace(good, "kind: knn", "kind: knn\n    backend: {type: clipper, clipper: {output_datatype: FP16}}", 1), `output_datatype "FP16"`},
		{"clipper probe of BYTES", strings.Replace(good, "kind: knn", "kind: knn\n    backend: {type: clipper, clipper: {input_datatype: BYTES, health_probe: [1]}}", 1), "needs a numeric input_datatype"},
		{"clipper tensors", strings.Replace(good, "kind: knn", "kind: knn\n    backend: {type: clipper, clipper: {input: x, input_datatype: FP64, output: y, output_datatype: INT64, health_probe: [0.5, 1]}}", 1), ""},
		{"model in no service, its name taken by another service", strings.Replace(good, "  - name: d\n", "  - name: s2\n    kind: prep\n  - name: d\n", 1) +
			"  - {name: s2, edges: [[frontend, c], [c, frontend]]}\n", `model "s2" is in no service`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.yaml))
			if c.want == "" {
				// size 0 is defaulted to 1: valid.
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted invalid config; want error containing %q", c.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not mention %q", err, c.want)
			}
		})
	}
}

func TestModelSharedByTwoServicesRejected(t *testing.T) {
	y := good + `  - name: s2
    edges: [[frontend, c], [c, frontend]]
`
	_, err := Parse([]byte(y))
	if err == nil || !strings.Contains(err.Error(), `model "c" already belongs to service "s"`) {
		t.Fatalf("got %v", err)
	}
}

func TestParams(t *testing.T) {
	m := &Model{Name: "m", Params: map[string]any{"i": 3, "f": 0.5, "s": "x", "bad": "y"}}
	if v, err := m.ParamInt("i", 0); err != nil || v != 3 {
		t.Fatal(v, err)
	}
	if v, err := m.ParamInt("missing", 7); err != nil || v != 7 {
		t.Fatal(v, err)
	}
	if v, err := m.ParamFloat("f", 0); err != nil || v != 0.5 {
		t.Fatal(v, err)
	}
	if v, err := m.ParamString("s", ""); err != nil || v != "x" {
		t.Fatal(v, err)
	}
	if _, err := m.ParamInt("bad", 0); err == nil || !strings.Contains(err.Error(), "param bad") {
		t.Fatalf("want param error, got %v", err)
	}
}

func TestPassThroughAndStandby(t *testing.T) {
	d, err := Parse([]byte(`
name: t
models:
  - {name: tf, ha: off, backend: {type: tfserving, address: "h:8500"}}
  - {name: tr, ha: off, backend: {type: triton, address: "h:8001"}}
  - {name: ref, kind: classifier, ha: off}
  - {name: cl, ha: off, backend: {type: clipper, address: "h:1337"}}
  - {name: st, kind: lstm, stateful: true, ha: off}
  - {name: g1, kind: prep, ha: off}
  - {name: g2, kind: prep}
  - {name: on, kind: prep}
services:
  - {name: tf, edges: [[frontend, tf], [tf, frontend]]}
  - {name: tr, edges: [[frontend, tr], [tr, frontend]]}
  - {name: ref, edges: [[frontend, ref], [ref, frontend]]}
  - {name: cl, edges: [[frontend, cl], [cl, frontend]]}
  - {name: st, edges: [[frontend, st], [st, frontend]]}
  - {name: graph, edges: [[frontend, g1], [g1, g2], [g2, frontend]]}
  - {name: on, edges: [[frontend, on], [on, frontend]]}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		model         string
		pass, standby bool
	}{
		{"tf", true, false}, {"tr", true, false}, {"ref", true, false},
		{"cl", false, false}, // clipper's REST API is not served by the frontend: sidecar, no standby
		{"st", false, false}, // stateful: the sidecar's adapter owns the state
		{"g1", false, false}, // ha: off in a graph: sidecar, no standby
		{"g2", false, true},
		{"on", false, true},
		{"nope", false, false},
	} {
		if got := d.PassThrough(c.model); got != c.pass {
			t.Errorf("PassThrough(%s) = %v, want %v", c.model, got, c.pass)
		}
		if got := d.HasStandby(c.model); got != c.standby {
			t.Errorf("HasStandby(%s) = %v, want %v", c.model, got, c.standby)
		}
	}
}

func TestStateMemory(t *testing.T) {
	// model b of good, stateful or not, behind backend
	with := func(backend string, stateful bool) string {
		flags := "    stateful: true\n"
		if !stateful {
			flags = "    stateful: false\n    ha: stateless\n"
		}
		return strings.Replace(good, "    kind: lstm\n    stateful: true\n", "    kind: lstm\n"+flags+"    backend: "+backend+"\n", 1)
	}
	ok := []string{
		`{type: triton, address: "x:1", state_memory: cuda}`,
		`{type: triton, address: "x:1", state_memory: cuda, cuda_device: 2}`,
		`{type: triton, address: "x:1", state_memory: system}`,
		`{type: triton, address: "x:1"}`,
	}
	for _, b := range ok {
		d, err := Parse([]byte(with(b, true)))
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if strings.Contains(b, "cuda_device: 2") && (d.Model("b").Backend.StateMemory != "cuda" || d.Model("b").Backend.CUDADevice != 2) {
			t.Fatalf("%s parsed as %+v", b, d.Model("b").Backend)
		}
	}
	for _, c := range []struct {
		backend  string
		stateful bool
		want     string
	}{
		{`{type: triton, address: "x:1", state_memory: gpu}`, true, `state_memory "gpu" is not one of system, cuda`},
		{`{type: tfserving, address: "x:1", state_memory: cuda}`, true, "state_memory cuda needs backend type triton (got tfserving)"},
		{`{type: triton, address: "x:1", state_memory: cuda}`, false, "state_memory cuda is for a stateful model"},
		{`{type: triton, address: "x:1", state_memory: cuda, cuda_device: -1}`, true, "cuda_device -1 is negative"},
		{`{type: triton, address: "x:1", cuda_device: 1}`, true, "cuda_device 1 without state_memory: cuda"},
	} {
		_, err := Parse([]byte(with(c.backend, c.stateful)))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `model "b": backend `+strings.SplitN(c.want, " ", 2)[0]) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s (stateful %v): %v, want %q", c.backend, c.stateful, err, c.want)
		}
	}
}
