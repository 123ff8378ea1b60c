package examples

import (
	"fmt"
	"testing"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver/models"
	"github.com/hams-go/hams/refserver/nn"
)

// TestExamples: every example parses and validates, holds one service
// named like its file, model names are unique across files, stateful
// models have a backup on another host, every model builds in the models
// package, and one request flows through each graph (each model's inputs
// come from its predecessors' outputs).
func TestExamples(t *testing.T) {
	seen := map[string]string{}
	for _, name := range append(Names(), "retrofit") {
		t.Run(name, func(t *testing.T) {
			d, err := Load(name)
			if err != nil {
				t.Fatal(err)
			}
			svc := name
			if name == "retrofit" {
				svc = "fashion"
			}
			if len(d.Services) != 1 || d.Services[0].Name != svc {
				t.Fatalf("services %v, want one named %q", d.ServiceNames(), svc)
			}
			built := map[string]models.Model{}
			for i := range d.Models {
				mc := &d.Models[i]
				if other, dup := seen[mc.Name]; dup {
					t.Fatalf("model %q also in %s", mc.Name, other)
				}
				seen[mc.Name] = name
				if mc.Stateful && (mc.Placement.Backup == "" || mc.Placement.Backup == mc.Placement.Primary) {
					t.Fatalf("model %q: placement %+v", mc.Name, mc.Placement)
				}
				m, err := models.New(mc)
				if err != nil {
					t.Fatal(err)
				}
				if m.Describe().Stateful != mc.Stateful {
					t.Fatalf("model %q: config stateful=%v, kind %s stateful=%v", mc.Name, mc.Stateful, mc.Kind, m.Describe().Stateful)
				}
				built[mc.Name] = m
			}
			flow(t, d, built)
		})
	}
}

// flow pushes one 2-row request through the service graph in topological
// order, feeding each model its predecessors' outputs (join order = edge
// order), and checks every model accepts them.
func flow(t *testing.T, d *config.Deployment, built map[string]models.Model) {
	s := &d.Services[0]
	g := s.Graph()
	outs := map[string][]*hamsv1.Tensor{}
	for i, in := range s.Inputs {
		w := int(in.Shape[1%len(in.Shape)])
		switch in.Datatype {
		case tensor.FP32:
			if len(in.Shape) < 2 {
				w = 1
			}
			v := make([]float32, 2*w)
			nn.FillNormal(v, 1, nn.NewRand(uint64(i+1)))
			for j := range v {
				v[j] = v[j]*0.1 + 0.5
			}
			outs[config.Frontend] = append(outs[config.Frontend], tensor.FromFloat32(in.Name, []int64{2, int64(w)}, v))
		case tensor.Int64:
			outs[config.Frontend] = append(outs[config.Frontend], tensor.FromInt64(in.Name, []int64{2}, []int64{3, -1}))
		}
	}
	for _, mn := range g.Models() {
		var ins []*hamsv1.Tensor
		for _, p := range g.Pred(mn) {
			ins = append(ins, outs[p]...)
		}
		desc := built[mn].Describe()
		ins = keepDeclared(ins, desc)
		r, err := built[mn].Infer(&models.Batch{Inputs: ins, Rows: []uint32{1, 1}, StreamIDs: []string{"a", "b"}, BatchID: 1})
		if err != nil {
			t.Fatalf("model %s with inputs %v: %v", mn, tensorNames(ins), err)
		}
		outs[mn] = r.Outputs
	}
	for _, sink := range g.Pred(config.Frontend) {
		if len(outs[sink]) == 0 {
			t.Fatalf("sink %s produced nothing", sink)
		}
	}
}

func keepDeclared(ins []*hamsv1.Tensor, d *hamsv1.ModelDescription) []*hamsv1.Tensor {
	if len(d.Inputs) == 1 && d.Inputs[0].Name == models.AnyInput {
		return ins
	}
	var out []*hamsv1.Tensor
	for _, t := range ins {
		for _, s := range d.Inputs {
			if s.Name == t.Name {
				out = append(out, t)
			}
		}
	}
	return out
}

func tensorNames(ts []*hamsv1.Tensor) string {
	s := ""
	for _, t := range ts {
		s += fmt.Sprintf("%s%v ", t.Name, t.Shape)
	}
	return s
}

func TestLoadErrors(t *testing.T) {
	if _, err := Load("nope"); err == nil {
		t.Fatal("unknown example loaded")
	}
	if len(Names()) != 6 || Names()[0] != "sa" || Names()[5] != "olm" {
		t.Fatalf("names %v", Names())
	}
}

// The paper-scale set has the default set's services with the same graph
// (models, kinds, edges, stateful ones), only heavier models, and one
// request flows through each.
func TestPaperScaleExamples(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			def, err := Load(name)
			if err != nil {
				t.Fatal(err)
			}
			b, err := RawSet(SetPaper, name)
			if err != nil {
				t.Fatal(err)
			}
			d, err := config.Parse(b)
			if err != nil {
				t.Fatalf("paper/%s.yaml: %v", name, err)
			}
			if len(d.Models) != len(def.Models) || fmt.Sprint(d.Services[0].Edges) != fmt.Sprint(def.Services[0].Edges) {
				t.Fatalf("paper/%s.yaml: graph differs from %s.yaml", name, name)
			}
			built := map[string]models.Model{}
			for i := range d.Models {
				mc, dm := &d.Models[i], &def.Models[i]
				if mc.Name != dm.Name || mc.Kind != dm.Kind || mc.Stateful != dm.Stateful {
					t.Fatalf("model %d: %s %s stateful=%v, default %s %s stateful=%v", i, mc.Name, mc.Kind, mc.Stateful, dm.Name, dm.Kind, dm.Stateful)
				}
				m, err := models.New(mc)
				if err != nil {
					t.Fatalf("%s: %v", mc.Name, err)
				}
				built[mc.Name] = m
			}
			flow(t, d, built)
		})
	}
	if _, err := RawSet("huge", "ap"); err == nil {
		t.Fatal("unknown set accepted")
	}
}
