package harness

import (
	"context"
	"strings"
	"testing"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// shapeShifter is a backend whose answers change width after n batches.
type shapeShifter struct {
	n     int
	calls int
}

func (s *shapeShifter) Describe(context.Context) (*hamsv1.ModelDescription, error) { return nil, nil }

func (s *shapeShifter) Health(context.Context) error { return nil }

func (s *shapeShifter) Close() error { return nil }

func (s *shapeShifter) Infer(_ context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	s.calls++
	rows := req.Inputs[0].Shape[0]
	w := int64(10)
	if s.calls > s.n {
		w = 12
	}
	return &hamsv1.BatchResponse{Outputs: []*hamsv1.Tensor{tensor.FromFloat32("scores", []int64{rows, w}, make([]float32, rows*w))}}, nil
}

// A black-box deployed model that answers with another output shape part
// way through labelling stops training with an error naming the change.
func TestParityDeployedShapeChange(t *testing.T) {
	d := &backendDeployed{be: &shapeShifter{n: 2}, model: "m", input: "images"}
	x := make([]float32, 2000*784)
	_, err := labelSet(context.Background(), d, x, make([]int, 2000), "training set", true)
	if err == nil || !strings.Contains(err.Error(), "rows of 12 values, earlier batches 10") || !strings.Contains(err.Error(), "output shape changed") {
		t.Fatalf("shape change: %v", err)
	}
}
