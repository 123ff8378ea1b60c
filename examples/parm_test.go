package examples

import (
	"testing"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/refserver/models"
)

// TestParmExample: parm.yaml is the contract's ParM pool (model fashion,
// images FP32 [N,784] in, scores FP32 [N,10] out, 4 replicas, k = 2, one
// straggling replica), and its deployed and parity models build.
func TestParmExample(t *testing.T) {
	d, err := Load("parm")
	if err != nil {
		t.Fatal(err)
	}
	m := d.Model("fashion")
	if m == nil || !m.Pooled() || m.Replicas.N() != 4 || m.Redundancy != config.RedundancyParM || m.Parity.K != 2 {
		t.Fatalf("model fashion: %+v", m)
	}
	if m.Straggle == nil || len(m.Straggle.Replicas) != 1 {
		t.Fatalf("straggle %+v: want one straggling replica", m.Straggle)
	}
	svc := d.Service("fashion")
	if svc == nil || len(svc.Inputs) != 1 || svc.Inputs[0].Name != "images" || svc.Outputs[0].Name != "scores" {
		t.Fatalf("service fashion: %+v", svc)
	}
	if _, err := models.New(m); err != nil {
		t.Fatalf("deployed model: %v", err)
	}
	pm := *m
	pm.Name, pm.Kind, pm.Params = m.Parity.Model, m.Parity.Kind, m.Parity.Params
	pmod, err := models.New(&pm)
	if err != nil {
		t.Fatalf("parity model: %v", err)
	}
	if out := pmod.Describe().GetOutputs(); len(out) != 1 || out[0].GetName() != "scores" {
		t.Fatalf("parity model outputs %v, want scores", out)
	}
}
