package paritytrain

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hams-go/hams/protocol/parity"
	"github.com/hams-go/hams/refserver/nn"
)

// Both losses against central differences of their value.
func TestLossGradients(t *testing.T) {
	rng := nn.NewRand(1)
	rows, width, batch := 3, 5, 7
	y := make([]float32, rows*width)
	nn.FillNormal(y, 1, rng)
	mseT := make([]float32, rows*width)
	nn.FillNormal(mseT, 1, rng)
	ceT := make([]float32, rows*width)
	for r := range rows { // distributions
		ceT[r*width+r] += 0.5
		ceT[r*width+(r+2)%width] += 0.5
	}
	for _, c := range []struct {
		l Loss
		t []float32
	}{{MSE, mseT}, {CrossEntropy, ceT}} {
		dy := make([]float32, len(y))
		c.l.lossGrad(dy, y, c.t, rows, width, batch)
		scratch := make([]float32, len(y))
		f := func() float64 { return c.l.lossGrad(scratch, y, c.t, rows, width, batch) }
		const eps = 1e-2
		for i := range y {
			old := y[i]
			y[i] = old + eps
			lp := f()
			y[i] = old - eps
			lm := f()
			y[i] = old
			num := (lp - lm) / (2 * eps)
			if math.Abs(num-float64(dy[i])) > 1e-4+1e-3*math.Abs(num) {
				t.Fatalf("%v: dL/dy[%d] = %v, finite difference %v", c.l, i, dy[i], num)
			}
		}
	}
	// MSE is the mean over the minibatch's elements: rows of a shard
	// contribute their share.
	if got := MSE.lossGrad(make([]float32, 2), []float32{1, 3}, []float32{0, 0}, 1, 2, 2); got != 2.5 {
		t.Fatalf("mse of (1,3) as half of a batch of 2 rows: %v, want (1+9)/4", got)
	}
}

// One Adam step against a hand computation (PyTorch's formula, weight
// decay added to the gradient).
func TestAdamStep(t *testing.T) {
	w := [][]float32{{1, -2}}
	g := [][]float32{{0.5, 0.25}}
	a := NewAdam(w, 0.1, 0.01)
	a.Step(w, g)
	// step 1: g' = g + 0.01·w = (0.51, 0.23); m = 0.1·g'; v = 0.001·g'²;
	// m̂ = g', √v̂ = |g'|, so w -= 0.1·g'/(|g'|+1e-8) = ∓0.1 (to 1e-7).
	want := []float32{0.9, -2.1}
	for i := range want {
		if math.Abs(float64(w[0][i]-want[i])) > 1e-6 {
			t.Fatalf("after step 1 w = %v, want %v", w[0], want)
		}
	}
	// step 2 with gradient 0: g' = 0.01·w; m, v decay; computed by hand.
	g[0][0], g[0][1] = 0, 0
	w0 := []float64{0.9, -2.1}
	gp1 := []float64{0.51, 0.23}
	a.Step(w, g)
	for i := range w0 {
		gp2 := 0.01 * w0[i]
		m := 0.9*0.1*gp1[i] + 0.1*gp2
		v := 0.999*0.001*gp1[i]*gp1[i] + 0.001*gp2*gp2
		den := math.Sqrt(v)/math.Sqrt(1-0.999*0.999) + 1e-8
		want := w0[i] - (0.1/(1-0.9*0.9))*m/den
		if math.Abs(float64(w[0][i])-want) > 1e-5 {
			t.Fatalf("after step 2 w[%d] = %v, want %v", i, w[0][i], want)
		}
	}
	if a.Steps() != 2 {
		t.Fatalf("steps %d", a.Steps())
	}
}

// linearData is a deployed model F(x) = x·W without bias over seeded
// queries: linear, so a linear parity model can be exact.
func linearData(n, in, out int, seed uint64) (*Set, []float32) {
	rng := nn.NewRand(seed)
	w := make([]float32, in*out)
	nn.FillNormal(w, 1/math.Sqrt(float64(in)), rng)
	x := make([]float32, n*in)
	for i := range x {
		x[i] = float32(rng.Float64())
	}
	y := make([]float32, n*out)
	nn.Gemm(y, x, w, n, in, out, false)
	// Keep only queries whose top score leads by 0.02 or more: an exact
	// code up to float rounding cannot promise the order of a near-tie.
	keep := 0
	for i := range n {
		row := y[i*out : (i+1)*out]
		top := argmax(row)
		second := float32(math.Inf(-1))
		for c, v := range row {
			if c != top {
				second = max(second, v)
			}
		}
		if row[top]-second >= 0.02 {
			copy(x[keep*in:(keep+1)*in], x[i*in:(i+1)*in])
			copy(y[keep*out:(keep+1)*out], row)
			keep++
		}
	}
	n, x, y = keep, x[:keep*in], y[:keep*out]
	labels := make([]int, n)
	for i := range labels {
		labels[i] = argmax(y[i*out : (i+1)*out])
	}
	s, _ := FromArrays(x, in, y, out, labels)
	return s, w
}

// A linear deployed model without bias: its parity models (one linear
// layer each, for parity 0 and parity 1 of a (2,2) code) learn the code
// exactly, so every reconstruction agrees with the deployed model, from
// one parity and from both with both outputs erased.
func TestLinearParityIsExact(t *testing.T) {
	const in, out = 16, 6
	img := Image{H: 4, W: 4, C: 1}
	all, _ := linearData(5000, in, out, 1)
	train, test := all.Subset(seq(0, all.N-600)), all.Subset(seq(all.N-600, all.N))
	nets := make([]*nn.Net, 2)
	for j := range 2 {
		spec := Spec{K: 2, R: 2, J: j, Encoder: parity.EncoderSum, Image: img, Loss: MSE}
		net := &nn.Net{Layers: []nn.Layer{nn.NewDense(in, out)}}
		nn.InitPaper(net, nn.NewRand(uint64(j)))
		tr, err := NewTrainer(spec, net, Options{LR: 1e-2, WeightDecay: 1e-9})
		if err != nil {
			t.Fatal(err)
		}
		// Adam at 1e-2, then 1e-3 to settle the last digits (near-ties
		// of the deployed model's top two scores need them).
		if _, err := Fit(context.Background(), tr, train, ParityValidator(spec, test, 3, 0), 20, nn.NewRand(5), nil); err != nil {
			t.Fatal(err)
		}
		tr.adam.LR = 1e-3
		res, err := Fit(context.Background(), tr, train, ParityValidator(spec, test, 3, 0), 20, nn.NewRand(6), nil)
		if err != nil {
			t.Fatal(err)
		}
		nets[j] = res.Net
		if res.BestVal.Agreement != 1 {
			t.Fatalf("parity %d: agreement %v after %d epochs, want 1 (exact code)", j, res.BestVal.Agreement, res.BestEpoch)
		}
	}
	code, _ := parity.NewCode(2, 2)
	enc, _ := parity.NewSumEncoder(code, in)
	groups := Groups(test.N, 2, nn.NewRand(9))
	pouts, err := ParityOutputs(nets, enc, test, groups, 0)
	if err != nil {
		t.Fatal(err)
	}
	both, err := Reconstruct(code, test, groups, pouts, 2)
	if err != nil {
		t.Fatal(err)
	}
	if both.Agreement != 1 || both.Ad != both.Aa || both.Reconstructions != 2*len(groups) {
		t.Fatalf("both outputs erased: %v", both)
	}
}

func seq(lo, hi int) []int {
	s := make([]int, 0, hi-lo)
	for i := lo; i < hi; i++ {
		s = append(s, i)
	}
	return s
}

// clusterData is a small labelled classification set: 10 classes of
// noisy prototypes in 64 dims, the deployed model a fixed linear scorer
// with a softmax (probability outputs, like the served classifier).
func clusterData(n, in int, seed uint64) *Set {
	rng := nn.NewRand(99) // prototypes and scorer are the same for every seed
	const out = 10
	proto := make([]float32, out*in)
	for i := range proto {
		proto[i] = float32(rng.Float64())
	}
	r := nn.NewRand(seed)
	x := make([]float32, n*in)
	labels := make([]int, n)
	for i := range n {
		c := r.IntN(out)
		labels[i] = c
		for d := range in {
			x[i*in+d] = max(0, min(1, proto[c*in+d]+float32(r.NormFloat64()*0.35)))
		}
	}
	// Deployed: scores = x·protoᵀ - |proto|²/2 (nearest prototype), softmax.
	y := make([]float32, n*out)
	pt := make([]float32, in*out)
	nn.Transpose(pt, proto, out, in)
	nn.Gemm(y, x, pt, n, in, out, false)
	for c := range out {
		s := float32(0)
		for d := range in {
			s += proto[c*in+d] * proto[c*in+d]
		}
		for i := range n {
			y[i*out+c] = 4 * (y[i*out+c] - s/2)
		}
	}
	nn.Softmax(y, n, out)
	set, _ := FromArrays(x, in, y, out, labels)
	return set
}

// A short training run of an MLP parity model (k = 2, sum) on a small
// labelled set: validation Ad rises far above the 10% of a default
// answer within a few epochs.
func TestShortTrainingBeatsDefault(t *testing.T) {
	all := clusterData(4000, 64, 1)
	train, val, err := all.Split(1000, 1)
	if err != nil {
		t.Fatal(err)
	}
	spec := Spec{K: 2, R: 1, Encoder: parity.EncoderSum, Image: Image{H: 8, W: 8, C: 1}, Loss: MSE}
	net, err := NewArch("mlp:64,32", spec.Image, 10, false, nn.NewRand(1))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTrainer(spec, net, Options{Batch: 16})
	if err != nil {
		t.Fatal(err)
	}
	var epochs []EpochReport
	res, err := Fit(context.Background(), tr, train, ParityValidator(spec, val, 2, 0), 12, nn.NewRand(3), func(r EpochReport) { epochs = append(epochs, r) })
	if err != nil {
		t.Fatal(err)
	}
	if len(epochs) != 12 || res.BestVal.Aa < 0.9 {
		t.Fatalf("%d epoch reports, Aa %v", len(epochs), res.BestVal.Aa)
	}
	t.Logf("epoch 1 Ad %.3f, best epoch %d Ad %.3f agreement %.3f", epochs[0].Val.Ad, res.BestEpoch, res.BestVal.Ad, res.BestVal.Agreement)
	if res.BestVal.Ad < 0.6 {
		t.Fatalf("validation Ad %.3f after a short run, want well above the 0.10 default", res.BestVal.Ad)
	}
	// The returned weights are the best epoch's: re-validating them
	// gives the recorded score.
	again, _ := ParityValidator(spec, val, 2, 0)(res.Net)
	if again.Ad != res.BestVal.Ad {
		t.Fatalf("best net re-validated: %v, recorded %v", again.Ad, res.BestVal.Ad)
	}
}

// The same seed gives bit-identical weights, whatever the number of
// worker goroutines; another seed does not.
func TestDeterministicForSeed(t *testing.T) {
	all := clusterData(600, 144, 2)
	run := func(workers int, seed uint64, enc parity.EncoderKind, arch string) []float32 {
		spec := Spec{K: 2, R: 2, J: 1, Encoder: enc, Image: Image{H: 12, W: 12, C: 1}, Loss: MSE}
		net, err := NewArch(arch, spec.Image, 10, false, nn.NewRand(seed))
		if err != nil {
			t.Fatal(err)
		}
		tr, err := NewTrainer(spec, net, Options{Workers: workers})
		if err != nil {
			t.Fatal(err)
		}
		rng := nn.NewRand(seed + 1)
		for range 2 {
			if _, _, err := tr.Epoch(context.Background(), all, rng); err != nil {
				t.Fatal(err)
			}
		}
		var w []float32
		for _, p := range tr.Net().Params() {
			w = append(w, p...)
		}
		return w
	}
	for _, c := range []struct {
		enc  parity.EncoderKind
		arch string
	}{{parity.EncoderSum, "mlp:32"}, {parity.EncoderConcat, "lenet"}} {
		a, b := run(1, 7, c.enc, c.arch), run(3, 7, c.enc, c.arch)
		if !slices.Equal(a, b) {
			t.Fatalf("%v %s: seed 7 on 1 and 3 workers gave different weights", c.enc, c.arch)
		}
		if slices.Equal(a, run(2, 8, c.enc, c.arch)) {
			t.Fatalf("%v %s: seeds 7 and 8 gave the same weights", c.enc, c.arch)
		}
	}
}

// Training encodes with the serving encoder: a concat parity query of a
// group is exactly what parity.NewConcatEncoder builds, and a spec out of
// the code's range is refused naming the problem.
func TestSpecAndEncoder(t *testing.T) {
	for _, c := range []struct {
		spec Spec
		want string
	}{
		{Spec{K: 1, R: 1, Encoder: parity.EncoderSum, Image: FashionImage, Loss: MSE}, "k=1"},
		{Spec{K: 2, R: 5, Encoder: parity.EncoderSum, Image: FashionImage, Loss: MSE}, "r=5"},
		{Spec{K: 2, R: 2, J: 2, Encoder: parity.EncoderSum, Image: FashionImage, Loss: MSE}, "j=2"},
		{Spec{K: 2, R: 2, J: 1, Encoder: parity.EncoderSum, Image: FashionImage, Loss: CrossEntropy}, "loss ce for parity j=1"},
		{Spec{K: 2, R: 1, Encoder: 0, Image: FashionImage, Loss: MSE}, "encoder"},
	} {
		net, _ := NewArch("mlp:8", FashionImage, 10, false, nn.NewRand(1))
		if _, err := NewTrainer(c.spec, net, Options{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %q", c.spec, err, c.want)
		}
	}
	softmax, _ := NewArch("mlp:8", FashionImage, 10, true, nn.NewRand(1))
	if _, err := NewTrainer(Spec{K: 2, R: 1, Encoder: parity.EncoderSum, Image: FashionImage, Loss: MSE}, softmax, Options{}); err == nil || !strings.Contains(err.Error(), "linear outputs") {
		t.Errorf("softmax parity model: %v", err)
	}
	if _, err := NewArch("resnet", FashionImage, 10, false, nn.NewRand(1)); err == nil || !strings.Contains(err.Error(), `unknown arch "resnet"`) {
		t.Errorf("unknown arch: %v", err)
	}
	set := clusterData(8, 64, 1)
	spec := Spec{K: 4, R: 1, Encoder: parity.EncoderConcat, Image: Image{H: 8, W: 8, C: 1}, Loss: CrossEntropy}
	enc, err := spec.NewEncoder()
	if err != nil {
		t.Fatal(err)
	}
	code, _ := parity.NewCode(4, 1)
	ref, _ := parity.NewConcatEncoder(code, 8, 8, 1)
	got, _ := EncodeGroups(enc, set, [][]int{{0, 1, 2, 3}}, 0)
	want := make([]float32, 64)
	ref.Encode(want, [][]float32{set.Q(0), set.Q(1), set.Q(2), set.Q(3)}, 0)
	if !slices.Equal(got, want) {
		t.Fatal("training's concat parity query differs from the serving encoder's")
	}
	// The CE target is the group's normalised one-hot labels.
	b := &parityBatch{spec: spec, enc: enc}
	x, tg := make([]float32, 64), make([]float32, 10)
	if err := b.fill(x, tg, set, [][]int{{0, 1, 2, 3}}, make([][]float32, 4)); err != nil {
		t.Fatal(err)
	}
	wantT := make([]float32, 10)
	for i := range 4 {
		wantT[set.Label[i]] += 0.25
	}
	if !slices.Equal(tg, wantT) || !slices.Equal(x, want) {
		t.Fatalf("ce target %v, want %v", tg, wantT)
	}
}

// The buffer keeps at most its capacity, a uniform sample of the stream,
// refuses a sample of another width, and takes concurrent adds.
func TestBuffer(t *testing.T) {
	b, err := NewBuffer(50, 3, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 250 {
				v := float32(g*250 + i)
				if err := b.Add(Sample{Query: []float32{v, v, v}, Output: []float32{v, -v}, Label: -1}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if b.Len() != 50 || b.Seen() != 1000 {
		t.Fatalf("len %d seen %d", b.Len(), b.Seen())
	}
	s := b.Snapshot()
	late := 0
	for i := range s.N {
		if s.Q(i)[0] != -s.O(i)[1] {
			t.Fatalf("sample %d mixed up: %v %v", i, s.Q(i), s.O(i))
		}
		if int(s.Q(i)[0])%250 >= 125 {
			late++
		}
	}
	if late < 10 || late > 40 { // uniform: about half from the second halves
		t.Fatalf("%d of 50 kept samples from the later half of each stream", late)
	}
	if err := b.Add(Sample{Query: []float32{1, 2, 3}, Output: []float32{1, 2, 3}}); err == nil || !strings.Contains(err.Error(), "output shape") {
		t.Fatalf("wrong width: %v", err)
	}
}

type fakeDeployed struct{ widths []int }

func (f *fakeDeployed) Infer(_ context.Context, x []float32, rows int) ([]float32, int, error) {
	w := f.widths[0]
	if len(f.widths) > 1 {
		f.widths = f.widths[1:]
	}
	return make([]float32, rows*w), w, nil
}

// A black-box deployed model whose output shape changes part way through
// labelling is an error naming the batch and both widths.
func TestLabelShapeChange(t *testing.T) {
	x := make([]float32, 10*4)
	out, w, err := Label(context.Background(), &fakeDeployed{widths: []int{3}}, x, 4, 3, nil)
	if err != nil || w != 3 || len(out) != 30 {
		t.Fatalf("steady model: %d values of width %d, %v", len(out), w, err)
	}
	_, _, err = Label(context.Background(), &fakeDeployed{widths: []int{3, 3, 5}}, x, 4, 3, nil)
	if err == nil || !strings.Contains(err.Error(), "rows 6..8") || !strings.Contains(err.Error(), "rows of 5 values, earlier batches 3") {
		t.Fatalf("shape change: %v", err)
	}
}

// WriteWeights leaves the file whole or not at all, and the provenance
// round-trips through the weights file.
func TestWriteWeights(t *testing.T) {
	dir := t.TempDir()
	net, _ := NewArch("mlp:4", Image{H: 2, W: 2, C: 1}, 3, false, nn.NewRand(1))
	p := &Provenance{Role: "parity", Deployed: "x", Arch: "mlp:4", K: 2, R: 1, Encoder: "sum", Loss: "mse", Test: &Recorded{Groups: 5, Ad: 0.5}}
	path := filepath.Join(dir, "w.bin")
	if err := WriteWeights(path, net, p); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	d, err := nn.DecodeNet(b)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadProvenance(d)
	if err != nil || got.Deployed != "x" || got.Test.Ad != 0.5 || got.K != 2 {
		t.Fatalf("provenance %+v, %v", got, err)
	}
	err = WriteWeights(filepath.Join(dir, "missing", "w.bin"), net, p)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("write into a missing directory: %v", err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("left behind: %v", ents)
	}
}

// BenchmarkTrainK2 is the training throughput of the paper's MLP parity
// model (784-200-100-10) at k = 2 with the sum encoder, in coding groups
// per second on all cores (go test -bench TrainK2 ./internal/paritytrain/).
func BenchmarkTrainK2(b *testing.B) {
	rng := nn.NewRand(1)
	n := 4096
	x := make([]float32, n*784)
	for i := range x {
		x[i] = float32(rng.Float64())
	}
	y := make([]float32, n*10)
	nn.FillNormal(y, 1, rng)
	set, _ := FromArrays(x, 784, y, 10, nil)
	spec := Spec{K: 2, R: 1, Encoder: parity.EncoderSum, Image: FashionImage, Loss: MSE}
	net, _ := NewArch("mlp", FashionImage, 10, false, nn.NewRand(2))
	tr, err := NewTrainer(spec, net, Options{})
	if err != nil {
		b.Fatal(err)
	}
	groups := Groups(n, 2, rng)
	b.ResetTimer()
	done := 0
	for i := range b.N {
		lo := (i * 64) % (len(groups) - 64)
		if _, err := tr.Step(set, groups[lo:lo+64]); err != nil {
			b.Fatal(err)
		}
		done += 64
	}
	b.ReportMetric(float64(done)/b.Elapsed().Seconds(), "groups/s")
}
