// Command train-parity trains ParM parity models (SOSP'19, §4.4) for the
// reference Fashion-MNIST classifier (models.FashionMLP, 784-128-10 with a
// softmax output) and the sum encoder: a parity model has the classifier's
// architecture without the softmax; for coding groups of k training
// images, its input is X_1+...+X_k and its target F(X_1)+...+F(X_k), F the
// deployed classifier's softmax output; loss MSE, Adam. The groups are
// redrawn every epoch from a seeded generator; 5,000 training images are
// held out, and the epoch with the best validation degraded accuracy Ad
// (every position of every validation group erased and reconstructed by
// subtraction, top-1 against the true label) is kept. Minibatches are
// split into shards computed in parallel and summed in shard order, so a
// run is reproducible for a seed and shard count on any number of cores.
//
//	go run ./adapters/refserver/models/cmd/train-parity -k 2,3,4 \
//	    -data /usr/share/datasets/fashion-mnist \
//	    -out adapters/refserver/models/weights
//
// writes fashion-parity-sum-k{K}.bin (models.EncodeMLP, linear output) to
// the -out directory and prints one JSON object per k with its test-set
// scores (aa, ad, agreement over the 10,000 test images in coding groups
// drawn with models.ParityEvalSeed), the best epoch and the training time.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hams-go/hams/adapters/refserver/models"
	"github.com/hams-go/hams/internal/nn"
)

type options struct {
	data, out      string
	ks             []int
	hidden         int
	epochs, passes int
	batch, shards  int
	lr, l2         float64
	seed           uint64
	val            int
	init           string
	maxTime        time.Duration
	reportFile     string
}

func main() {
	var o options
	ks := flag.String("k", "2,3,4", "comma-separated coding group sizes k")
	flag.StringVar(&o.data, "data", models.FashionDir, "directory of the Fashion-MNIST IDX .gz files")
	flag.StringVar(&o.out, "out", "adapters/refserver/models/weights", "directory for fashion-parity-sum-k{K}.bin")
	flag.IntVar(&o.hidden, "hidden", 128, "hidden width (the deployed classifier's)")
	flag.IntVar(&o.epochs, "epochs", 20, "epochs (each redraws the coding groups)")
	flag.IntVar(&o.passes, "passes", 0, "coding-group draws over the training pool per epoch (0: k, so every epoch has about as many parity samples as images)")
	flag.IntVar(&o.batch, "batch", 64, "minibatch of parity samples")
	flag.IntVar(&o.shards, "shards", 2, "minibatch shards computed in parallel (part of the result's identity: same seed and shards, same weights)")
	flag.Float64Var(&o.lr, "lr", 1e-3, "Adam learning rate")
	flag.Float64Var(&o.l2, "l2", 1e-5, "L2 regularisation (added to the weight gradients, as the paper's)")
	flag.Uint64Var(&o.seed, "seed", 1, "seed (initial weights, held-out split, coding groups)")
	flag.IntVar(&o.val, "val", 5000, "training images held out for validation")
	flag.StringVar(&o.init, "init", "random", "initial weights: random (He normal) or deployed (the classifier's; it starts from softmax logits and trained worse)")
	flag.DurationVar(&o.maxTime, "max-time", 0, "stop a k's training after the epoch that passes this long (0: no limit; a limit makes the result depend on the machine's speed)")
	flag.StringVar(&o.reportFile, "json", "", "also write the JSON array of results to this file")
	flag.Parse()
	for _, s := range strings.Split(*ks, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || k < 2 || k > 16 {
			log.Fatalf("train-parity: -k %q: want integers 2..16", *ks)
		}
		o.ks = append(o.ks, k)
	}
	if err := run(o); err != nil {
		log.Fatal(err)
	}
}

// result is one k's outcome.
type result struct {
	K         int     `json:"k"`
	R         int     `json:"r"`
	Encoder   string  `json:"encoder"`
	Aa        float64 `json:"aa"`
	Ad        float64 `json:"ad"`
	Agreement float64 `json:"agreement"`
	ValAd     float64 `json:"val_ad"`
	BestEpoch int     `json:"best_epoch"`
	Epochs    int     `json:"epochs"`
	Seconds   float64 `json:"train_seconds"`
	File      string  `json:"file"`
}

func run(o options) error {
	if o.batch < o.shards || o.shards < 1 {
		return fmt.Errorf("train-parity: -batch %d with -shards %d", o.batch, o.shards)
	}
	xtr, ytr, err := models.LoadFashion(o.data, "train")
	if err != nil {
		return fmt.Errorf("train-parity: %w", err)
	}
	xte, yte, err := models.LoadFashion(o.data, "t10k")
	if err != nil {
		return fmt.Errorf("train-parity: %w", err)
	}
	dm, err := models.FashionMLP()
	if err != nil {
		return fmt.Errorf("train-parity: %w", err)
	}
	if o.val <= 0 || o.val >= len(ytr) {
		return fmt.Errorf("train-parity: -val %d of %d training images", o.val, len(ytr))
	}
	// The deployed model's outputs are the targets' terms: computed once.
	ftr := dm.Forward(nn.Deterministic, xtr, len(ytr))
	split := nn.NewRand(o.seed ^ 0x5eed).Perm(len(ytr))
	valIdx, pool := split[:o.val], split[o.val:]
	xval, yval, fval := gather(xtr, 784, valIdx), gatherInt(ytr, valIdx), gather(ftr, 10, valIdx)
	var results []result
	for _, k := range o.ks {
		r, err := trainK(o, k, dm, xtr, ftr, pool, xval, yval, fval, xte, yte)
		if err != nil {
			return err
		}
		results = append(results, r)
		line, _ := json.Marshal(r)
		fmt.Println(string(line))
	}
	if o.reportFile != "" {
		b, _ := json.MarshalIndent(results, "", "  ")
		if err := os.WriteFile(o.reportFile, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("train-parity: write report: %w", err)
		}
	}
	return nil
}

func gather(x []float32, w int, idx []int) []float32 {
	out := make([]float32, 0, len(idx)*w)
	for _, i := range idx {
		out = append(out, x[i*w:(i+1)*w]...)
	}
	return out
}

func gatherInt(y []int, idx []int) []int {
	out := make([]int, len(idx))
	for j, i := range idx {
		out[j] = y[i]
	}
	return out
}

func newParity(o options, dm *models.MLP, rng interface{ NormFloat64() float64 }) (*models.MLP, error) {
	h := o.hidden
	m := &models.MLP{In: 784, Hidden: h, Out: 10, Linear: true,
		W1: make([]float32, 784*h), B1: make([]float32, h), W2: make([]float32, h*10), B2: make([]float32, 10)}
	switch o.init {
	case "deployed":
		if dm.Hidden != h {
			return nil, fmt.Errorf("train-parity: -init deployed with -hidden %d: the classifier's hidden width is %d", h, dm.Hidden)
		}
		copy(m.W1, dm.W1)
		copy(m.B1, dm.B1)
		copy(m.W2, dm.W2)
		copy(m.B2, dm.B2)
	case "random":
		fill := func(w []float32, std float64) {
			for i := range w {
				w[i] = float32(rng.NormFloat64() * std)
			}
		}
		fill(m.W1, math.Sqrt(2.0/784))
		fill(m.W2, math.Sqrt(2.0/float64(h)))
	default:
		return nil, fmt.Errorf("train-parity: -init %q: want deployed or random", o.init)
	}
	return m, nil
}

func cloneMLP(m *models.MLP) *models.MLP {
	c := *m
	c.W1, c.B1, c.W2, c.B2 = slices.Clone(m.W1), slices.Clone(m.B1), slices.Clone(m.W2), slices.Clone(m.B2)
	return &c
}

// trainK trains, selects and writes the parity model for k.
func trainK(o options, k int, dm *models.MLP, xtr, ftr []float32, pool []int, xval []float32, yval []int, fval, xte []float32, yte []int) (result, error) {
	began := time.Now()
	rng := nn.NewRand(o.seed*1000003 + uint64(k))
	m, err := newParity(o, dm, rng)
	if err != nil {
		return result{}, err
	}
	passes := o.passes
	if passes <= 0 {
		passes = k
	}
	// Validation groups are fixed for the whole run.
	vgroups := models.ParityGroups(len(yval), k, o.seed+7)
	vx := models.SumEncode(xval, 784, vgroups)
	validate := func(m *models.MLP) models.ParityScore {
		return models.ScoreParity(fval, m.Forward(nn.Deterministic, vx, len(vgroups)), 10, yval, vgroups)
	}
	tr := newTrainer(m, o.batch, o.shards)
	best, bestEpoch := validate(m), 0
	bestM := cloneMLP(m)
	fmt.Fprintf(os.Stderr, "k=%d epoch 0 (%s init): validation %v\n", k, o.init, best)
	epochs := 0
	for ep := 1; ep <= o.epochs; ep++ {
		var loss float64
		var steps int
		for range passes {
			// Redraw the coding groups over the training pool.
			rng.Shuffle(len(pool), func(i, j int) { pool[i], pool[j] = pool[j], pool[i] })
			groups := models.ParityGroups(len(pool), k, rng.Uint64())
			for g := range groups {
				for j, i := range groups[g] {
					groups[g][j] = pool[i]
				}
			}
			for s := 0; s+o.batch <= len(groups); s += o.batch {
				loss += tr.step(xtr, ftr, groups[s:s+o.batch], o.lr, o.l2)
				steps++
			}
		}
		epochs = ep
		v := validate(m)
		mark := ""
		if v.Ad > best.Ad {
			best, bestEpoch, bestM = v, ep, cloneMLP(m)
			mark = " *"
		}
		fmt.Fprintf(os.Stderr, "k=%d epoch %d: train mse %.5f, validation Ad %.4f agreement %.4f (%.0fs)%s\n",
			k, ep, loss/float64(steps), v.Ad, v.Agreement, time.Since(began).Seconds(), mark)
		if o.maxTime > 0 && time.Since(began) > o.maxTime {
			fmt.Fprintf(os.Stderr, "k=%d: -max-time %v reached\n", k, o.maxTime)
			break
		}
	}
	secs := time.Since(began).Seconds()
	test, err := models.EvalParity(dm, bestM, xte, yte, k, models.ParityEvalSeed)
	if err != nil {
		return result{}, err
	}
	file := filepath.Join(o.out, models.FashionParityWeights(k)+".bin")
	if err := os.WriteFile(file, models.EncodeMLP(bestM), 0o644); err != nil {
		return result{}, fmt.Errorf("train-parity: write weights: %w", err)
	}
	fmt.Fprintf(os.Stderr, "k=%d: best epoch %d (validation Ad %.4f); test %v; wrote %s\n", k, bestEpoch, best.Ad, test, file)
	return result{K: k, R: 1, Encoder: "sum", Aa: test.Aa, Ad: test.Ad, Agreement: test.Agreement, ValAd: best.Ad,
		BestEpoch: bestEpoch, Epochs: epochs, Seconds: math.Round(secs*10) / 10, File: file}, nil
}

// trainer holds the gradient buffers of each shard and Adam's moments.
type trainer struct {
	m      *models.MLP
	shards []*shard
	opt    [4]adam
	// summed gradients
	gW1, gB1, gW2, gB2 []float32
}

type shard struct {
	rows               int
	x, t, h, y, dy, dh []float32
	gW1, gB1, gW2, gB2 []float32
	loss               float64
	r                  *nn.Reducer
}

func newTrainer(m *models.MLP, batch, shards int) *trainer {
	tr := &trainer{m: m, gW1: make([]float32, len(m.W1)), gB1: make([]float32, len(m.B1)), gW2: make([]float32, len(m.W2)), gB2: make([]float32, len(m.B2))}
	for s := range shards {
		rows := (s+1)*batch/shards - s*batch/shards
		h := m.Hidden
		tr.shards = append(tr.shards, &shard{rows: rows,
			x: make([]float32, rows*m.In), t: make([]float32, rows*m.Out), h: make([]float32, rows*h), y: make([]float32, rows*m.Out),
			dy: make([]float32, rows*m.Out), dh: make([]float32, rows*h),
			gW1: make([]float32, len(m.W1)), gB1: make([]float32, h), gW2: make([]float32, len(m.W2)), gB2: make([]float32, m.Out),
			r: &nn.Reducer{Deterministic: true, MaxChunks: 1}})
	}
	return tr
}

// step runs one minibatch of parity samples (one per group) and returns
// its mean squared error.
func (tr *trainer) step(xtr, ftr []float32, groups [][]int, lr, l2 float64) float64 {
	m := tr.m
	batch := len(groups)
	var wg sync.WaitGroup
	off := 0
	for _, sh := range tr.shards {
		gs := groups[off : off+sh.rows]
		off += sh.rows
		wg.Add(1)
		go func() {
			defer wg.Done()
			sh.run(m, xtr, ftr, gs, batch)
		}()
	}
	wg.Wait()
	loss := 0.0
	for i, sh := range tr.shards {
		loss += sh.loss
		for _, p := range [][2][]float32{{tr.gW1, sh.gW1}, {tr.gB1, sh.gB1}, {tr.gW2, sh.gW2}, {tr.gB2, sh.gB2}} {
			if i == 0 {
				copy(p[0], p[1])
			} else {
				for j, v := range p[1] {
					p[0][j] += v
				}
			}
		}
	}
	if l2 > 0 {
		for _, p := range [][2][]float32{{tr.gW1, m.W1}, {tr.gW2, m.W2}} {
			for j, w := range p[1] {
				p[0][j] += float32(l2) * w
			}
		}
	}
	// The four Adam updates are independent: two goroutines.
	wg.Add(1)
	go func() {
		defer wg.Done()
		tr.opt[0].step(m.W1, tr.gW1, lr)
	}()
	tr.opt[1].step(m.B1, tr.gB1, lr)
	tr.opt[2].step(m.W2, tr.gW2, lr)
	tr.opt[3].step(m.B2, tr.gB2, lr)
	wg.Wait()
	return loss / float64(batch*m.Out)
}

// run computes the shard's gradients of the batch's mean squared error
// (mean over batch rows and outputs).
func (sh *shard) run(m *models.MLP, xtr, ftr []float32, groups [][]int, batch int) {
	in, hid, out := m.In, m.Hidden, m.Out
	clear(sh.x)
	clear(sh.t)
	for r, g := range groups {
		xr, tr := sh.x[r*in:(r+1)*in], sh.t[r*out:(r+1)*out]
		for _, i := range g {
			src := xtr[i*in : (i+1)*in]
			for j := range xr {
				xr[j] += src[j]
			}
			fs := ftr[i*out : (i+1)*out]
			for j := range tr {
				tr[j] += fs[j]
			}
		}
	}
	n := sh.rows
	sh.r.MatMul(sh.h, sh.x, m.W1, n, in, hid)
	nn.AddBias(sh.h, m.B1, n, hid)
	nn.ReLU(sh.h)
	sh.r.MatMul(sh.y, sh.h, m.W2, n, hid, out)
	nn.AddBias(sh.y, m.B2, n, out)
	scale := float32(2) / float32(batch*out)
	sh.loss = 0
	clear(sh.gB1)
	clear(sh.gB2)
	for i := range sh.y {
		d := sh.y[i] - sh.t[i]
		sh.loss += float64(d) * float64(d)
		sh.dy[i] = d * scale
		sh.gB2[i%out] += d * scale
	}
	nn.MatMulATB(sh.gW2, sh.h, sh.dy, n, hid, out)
	nn.MatMulABT(sh.dh, sh.dy, m.W2, n, out, hid)
	for i := range sh.dh {
		if sh.h[i] <= 0 {
			sh.dh[i] = 0
		}
	}
	for i := 0; i < n; i++ {
		for j := 0; j < hid; j++ {
			sh.gB1[j] += sh.dh[i*hid+j]
		}
	}
	nn.MatMulATB(sh.gW1, sh.x, sh.dh, n, in, hid)
}

type adam struct {
	m, v []float32
	t    int
}

func (a *adam) step(w, g []float32, lr float64) {
	if a.m == nil {
		a.m, a.v = make([]float32, len(w)), make([]float32, len(w))
	}
	a.t++
	const b1, b2, eps = 0.9, 0.999, 1e-8
	c1 := 1 - math.Pow(b1, float64(a.t))
	c2 := 1 - math.Pow(b2, float64(a.t))
	for i := range w {
		a.m[i] = b1*a.m[i] + (1-b1)*g[i]
		a.v[i] = b2*a.v[i] + (1-b2)*g[i]*g[i]
		mh := float64(a.m[i]) / c1
		vh := float64(a.v[i]) / c2
		w[i] -= float32(lr * mh / (math.Sqrt(vh) + eps))
	}
}
