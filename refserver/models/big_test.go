package models

import (
	"os"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// TestOlearnLargeState builds the 512 MB learner (set HAMS_BIG=1; it needs
// ~1.2 GB of memory) and runs a labelled batch.
func TestOlearnLargeState(t *testing.T) {
	if os.Getenv("HAMS_BIG") != "1" {
		t.Skip("set HAMS_BIG=1 to build the 512 MB olearn state")
	}
	start := time.Now()
	m := mk(t, "olearn", map[string]any{"state_mb": 512})
	t.Logf("built %d state bytes in %v", m.Describe().StateBytes, time.Since(start))
	x := randT("x", 8, 784, 1)
	lab := tensor.FromInt64("labels", []int64{8}, []int64{1, 2, 3, 4, 5, 6, 7, 8})
	start = time.Now()
	if _, err := m.Infer(&Batch{Inputs: []*hamsv1.Tensor{x, lab}}); err != nil {
		t.Fatal(err)
	}
	t.Logf("batch of 8 labelled rows: %v", time.Since(start))
}
