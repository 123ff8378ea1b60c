package examples

import (
	"fmt"
	"testing"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver/models"
	"github.com/hams-go/hams/refserver/nn"
)

// BenchmarkExampleModels measures Infer (compute + update) per batch of
// every example model at batch 1 and 64 (docs/models.md):
//
//	go test -run '^$' -bench ExampleModels -benchtime 20x ./examples/
func BenchmarkExampleModels(b *testing.B) {
	for _, name := range append(Names(), "retrofit") {
		d, err := Load(name)
		if err != nil {
			b.Fatal(err)
		}
		for i := range d.Models {
			mc := &d.Models[i]
			m, err := models.New(mc)
			if err != nil {
				b.Fatal(err)
			}
			desc := m.Describe()
			for _, n := range []int{1, 64} {
				batch := benchBatch(desc, n)
				b.Run(fmt.Sprintf("%s/batch=%d", mc.Name, n), func(b *testing.B) {
					b.ReportMetric(float64(desc.StateBytes), "state_bytes")
					for i := 0; i < b.N; i++ {
						batch.BatchID = uint64(i + 1)
						if _, err := m.Infer(batch); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}

func benchBatch(d *hamsv1.ModelDescription, n int) *models.Batch {
	rng := nn.NewRand(9)
	bt := &models.Batch{}
	for i := 0; i < n; i++ {
		bt.Rows = append(bt.Rows, 1)
		bt.StreamIDs = append(bt.StreamIDs, fmt.Sprintf("s%d", i))
	}
	for _, s := range d.Inputs {
		switch {
		case s.Name == models.AnyInput:
			for _, w := range []int{16, 4, 2} {
				v := make([]float32, n*w)
				nn.FillNormal(v, 1, rng)
				bt.Inputs = append(bt.Inputs, tensor.FromFloat32(fmt.Sprintf("in%d", w), []int64{int64(n), int64(w)}, v))
			}
		case s.Datatype == tensor.Int64:
			l := make([]int64, n)
			for i := range l {
				l[i] = int64(i % 10)
				if i%2 == 1 {
					l[i] = -1
				}
			}
			bt.Inputs = append(bt.Inputs, tensor.FromInt64(s.Name, []int64{int64(n)}, l))
		default:
			w := int(s.Shape[1])
			v := make([]float32, n*w)
			for i := range v {
				v[i] = float32(rng.Float64())
			}
			bt.Inputs = append(bt.Inputs, tensor.FromFloat32(s.Name, []int64{int64(n), int64(w)}, v))
		}
	}
	return bt
}
