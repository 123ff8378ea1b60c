package models

import (
	"math"
	"os"
	"strings"
	"testing"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/paritytrain"
	"github.com/hams-go/hams/protocol/parity"
	"github.com/hams-go/hams/refserver/nn"
)

// committedFloor is what the committed weights must reach on the test set
// whatever their recorded numbers (the target: at k = 2 with the
// sum encoder, Ad no more than 5 points below Aa; every reconstruction far
// above the 10% of a default answer).
var committedFloor = map[string]float64{
	"fashion-parity-sum-k2": 0.8763 - 0.05,
}

// Every committed weights file decodes in its format, loads in the model
// kinds that serve it, names a provenance, and (when Fashion-MNIST is
// installed) still reaches the test accuracy it records: Aa of a deployed
// model, Aa/Ad/agreement of a parity model (single erasure, this parity
// alone, the serving encoder and decoder, coding groups of EvalSeed).
func TestCommittedWeights(t *testing.T) {
	x, y, err := LoadFashion(FashionDir, "t10k")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("dataset missing in CI: %v", err)
		}
		t.Logf("Fashion-MNIST not installed at %s: formats checked, recorded accuracy not: %v", FashionDir, err)
		x = nil
	}
	outputs := map[string]*paritytrain.Set{} // deployed name -> test set labelled by it
	testSet := func(t *testing.T, deployed string) *paritytrain.Set {
		if s := outputs[deployed]; s != nil {
			return s
		}
		dn, err := EmbeddedNet(deployed)
		if err != nil {
			t.Fatalf("deployed model %q: %v", deployed, err)
		}
		s, err := paritytrain.FromArrays(x, 784, dn.Forward(nn.Deterministic, x, len(y)), dn.OutSize(), y)
		if err != nil {
			t.Fatal(err)
		}
		outputs[deployed] = s
		return s
	}
	names := WeightNames()
	parities := 0
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			net, err := EmbeddedNet(name)
			if err != nil {
				t.Fatal(err)
			}
			kind := "mlp"
			if net.InSize() == 784 && net.OutSize() == 10 {
				kind = "classifier"
			}
			if _, err := New(&config.Model{Name: "w", Kind: kind, Params: map[string]any{"weights": name}}); err != nil {
				t.Fatalf("kind %s cannot load it: %v", kind, err)
			}
			if name == FashionWeights {
				return // the original classifier: HAMSMLP1, no provenance (TestFashionAccuracy)
			}
			prov, err := paritytrain.ReadProvenance(net)
			if err != nil || prov == nil || prov.Test == nil {
				t.Fatalf("no provenance with a recorded test score: %+v, %v", prov, err)
			}
			if IsParityWeights(name) != (prov.Role == "parity") {
				t.Fatalf("name %q with role %q", name, prov.Role)
			}
			var got paritytrain.Score
			switch prov.Role {
			case "parity":
				parities++
				if want := ParityWeightsName(prov.Deployed, prov.Encoder, prov.K, prov.J); want != name {
					t.Fatalf("a parity %d of %s (%s, k=%d) is named %s, the scheme says %s", prov.J, prov.Deployed, prov.Encoder, prov.K, name, want)
				}
				if x == nil {
					return
				}
				enc, err := parity.ParseEncoder(prov.Encoder)
				if err != nil {
					t.Fatal(err)
				}
				loss, err := paritytrain.ParseLoss(prov.Loss)
				if err != nil {
					t.Fatal(err)
				}
				spec := paritytrain.Spec{K: prov.K, R: prov.R, J: prov.J, Encoder: enc, Image: prov.Image, Loss: loss}
				test := testSet(t, prov.Deployed)
				got, err = paritytrain.EvaluateSingle(spec, net, test, paritytrain.Groups(test.N, prov.K, nn.NewRand(paritytrain.EvalSeed)), 0)
				if err != nil {
					t.Fatal(err)
				}
				if got.Ad < 0.5 {
					t.Errorf("Ad %.4f: not far above a default answer", got.Ad)
				}
			case "deployed":
				if x == nil {
					return
				}
				s, _ := paritytrain.FromArrays(x, 784, make([]float32, len(y)*net.OutSize()), net.OutSize(), y)
				got, _ = paritytrain.ClassifierValidator(s, 0)(net)
			default:
				t.Fatalf("role %q", prov.Role)
			}
			rec := prov.Test
			if prov.Role == "deployed" {
				t.Logf("deployed: Aa %.4f (recorded %.4f)", got.Aa, rec.Aa)
			} else {
				t.Logf("parity: Aa %.4f Ad %.4f agreement %.4f (recorded %.4f %.4f %.4f)", got.Aa, got.Ad, got.Agreement, rec.Aa, rec.Ad, rec.Agreement)
			}
			const tol = 0.002
			if math.Abs(got.Aa-rec.Aa) > tol || (prov.Role == "parity" && (math.Abs(got.Ad-rec.Ad) > tol || math.Abs(got.Agreement-rec.Agreement) > tol)) {
				t.Errorf("measured Aa %.4f Ad %.4f agreement %.4f, the file records %.4f %.4f %.4f", got.Aa, got.Ad, got.Agreement, rec.Aa, rec.Ad, rec.Agreement)
			}
			if floor, ok := committedFloor[name]; ok && got.Ad < floor {
				t.Errorf("Ad %.4f below %.4f", got.Ad, floor)
			}
		})
	}
	if parities == 0 {
		t.Fatalf("no parity weights among %v", names)
	}
	// examples/parm.yaml and hams bench --service parm use these names.
	for _, k := range FashionParityKs {
		if !strings.Contains(strings.Join(names, " "), FashionParityWeights(k)) {
			t.Errorf("%s is not embedded", FashionParityWeights(k))
		}
	}
}
