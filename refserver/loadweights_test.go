package refserver

import (
	"math"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver/models"
	"github.com/hams-go/hams/refserver/nn"
)

// LoadWeights replaces a network's weights while it serves: later calls
// answer with the new weights; weights of another shape or output kind
// are refused (InvalidArgument) and the old ones keep serving; a kind
// without weights is Unimplemented.
// closeTo compares outputs up to the rounding of the parallel reducer:
// the classifier sums partial products in completion order (the
// non-determinism of a GPU model), so two calls with the same weights and
// input agree to about 1e-6, not bit for bit.
func closeTo(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(float64(a[i]-b[i])) > 1e-5*(1+math.Abs(float64(b[i]))) {
			return false
		}
	}
	return true
}

func TestLoadWeights(t *testing.T) {
	e := start(t)
	ctx := ctxT(t)
	x := make([]float32, 784)
	for i := range x {
		x[i] = float32(i%17) / 17
	}
	infer := func() []float32 {
		t.Helper()
		resp, err := e.rt.Infer(ctx, &hamsv1.BatchRequest{Model: "fashion", Inputs: []*hamsv1.Tensor{tensor.FromFloat32("images", []int64{1, 784}, x)}, Rows: []uint32{1}})
		if err != nil {
			t.Fatal(err)
		}
		y, _ := tensor.Float32(resp.GetOutputs()[0])
		return y
	}
	before := infer()
	other, err := models.EmbeddedNet(models.FashionWeights)
	if err != nil {
		t.Fatal(err)
	}
	// Same shape, other weights: perturb the first layer.
	other = other.Clone()
	for _, p := range other.Layers[0].Params() {
		for i := range p {
			p[i] *= -1
		}
	}
	b, err := nn.EncodeNet(other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.LoadWeights(ctx, &hamsv1.LoadWeightsRequest{Model: "fashion", Weights: b, Version: 1}); err != nil {
		t.Fatal(err)
	}
	after := infer()
	if closeTo(before, after) {
		t.Fatal("the model answers the same after LoadWeights")
	}
	// Wrong shape: refused, the loaded weights keep serving.
	small := nn.MLP(4, []int{3}, 2, true)
	sb, _ := nn.EncodeNet(small)
	_, err = e.rt.LoadWeights(ctx, &hamsv1.LoadWeightsRequest{Model: "fashion", Weights: sb, Version: 2})
	wantCode(t, "wrong shape", err, codes.InvalidArgument, "4 -> 2")
	_, err = e.rt.LoadWeights(ctx, &hamsv1.LoadWeightsRequest{Model: "fashion", Weights: []byte("garbage"), Version: 3})
	wantCode(t, "garbage", err, codes.InvalidArgument, "load weights")
	if got := infer(); !closeTo(got, after) {
		t.Fatalf("a refused LoadWeights changed the model: %v, want %v", got, after)
	}
	_, err = e.rt.LoadWeights(ctx, &hamsv1.LoadWeightsRequest{Model: "join", Weights: b, Version: 4})
	wantCode(t, "kind without weights", err, codes.Unimplemented, "no replaceable weights")
}
