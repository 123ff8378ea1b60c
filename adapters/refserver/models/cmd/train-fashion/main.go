// Command train-fashion trains the reference classifier (a 784-128-10 MLP)
// on Fashion-MNIST with minibatch Adam and writes its weights in the
// format models.DecodeMLP reads:
//
//	go run ./adapters/refserver/models/cmd/train-fashion \
//	    -data /usr/share/datasets/fashion-mnist \
//	    -out adapters/refserver/models/weights/fashion-mlp.bin
package main

import (
	"flag"
	"fmt"
	"log"
	"math"
	"os"
	"sync"

	"github.com/hams-go/hams/adapters/refserver/models"
	"github.com/hams-go/hams/internal/nn"
)

func main() {
	data := flag.String("data", models.FashionDir, "directory of the Fashion-MNIST IDX .gz files")
	out := flag.String("out", "adapters/refserver/models/weights/fashion-mlp.bin", "output weights file")
	hidden := flag.Int("hidden", 128, "hidden width")
	epochs := flag.Int("epochs", 8, "epochs")
	batch := flag.Int("batch", 64, "minibatch size")
	lr := flag.Float64("lr", 1e-3, "Adam learning rate")
	seed := flag.Uint64("seed", 1, "seed")
	flag.Parse()
	if err := run(*data, *out, *hidden, *epochs, *batch, *lr, *seed); err != nil {
		log.Fatal(err)
	}
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

func run(dir, out string, hidden, epochs, bs int, lr float64, seed uint64) error {
	xtr, ytr, err := models.LoadFashion(dir, "train")
	if err != nil {
		return err
	}
	xte, yte, err := models.LoadFashion(dir, "t10k")
	if err != nil {
		return err
	}
	rng := nn.NewRand(seed)
	m := &models.MLP{In: 784, Hidden: hidden, Out: 10,
		W1: make([]float32, 784*hidden), B1: make([]float32, hidden),
		W2: make([]float32, hidden*10), B2: make([]float32, 10)}
	nn.FillNormal(m.W1, math.Sqrt(2.0/784), rng)
	nn.FillNormal(m.W2, math.Sqrt(2.0/float64(hidden)), rng)
	opt := [4]adam{}
	n := len(ytr)
	perm := make([]int, n)
	for i := range perm {
		perm[i] = i
	}
	x := make([]float32, bs*784)
	h := make([]float32, bs*hidden)
	y := make([]float32, bs*10)
	dy := make([]float32, bs*10)
	dh := make([]float32, bs*hidden)
	gW1, gB1 := make([]float32, 784*hidden), make([]float32, hidden)
	gW2, gB2 := make([]float32, hidden*10), make([]float32, 10)
	det := nn.Deterministic
	for ep := 0; ep < epochs; ep++ {
		rng.Shuffle(n, func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
		elr := lr * math.Pow(0.7, float64(ep))
		loss := 0.0
		for s := 0; s+bs <= n; s += bs {
			for i := 0; i < bs; i++ {
				copy(x[i*784:(i+1)*784], xtr[perm[s+i]*784:])
			}
			det.MatMul(h, x, m.W1, bs, 784, hidden)
			nn.AddBias(h, m.B1, bs, hidden)
			nn.ReLU(h)
			det.MatMul(y, h, m.W2, bs, hidden, 10)
			nn.AddBias(y, m.B2, bs, 10)
			nn.Softmax(y, bs, 10)
			clear(gB1)
			clear(gB2)
			for i := 0; i < bs; i++ {
				lbl := ytr[perm[s+i]]
				loss -= math.Log(float64(y[i*10+lbl]) + 1e-12)
				for j := 0; j < 10; j++ {
					g := y[i*10+j]
					if j == lbl {
						g--
					}
					dy[i*10+j] = g / float32(bs)
					gB2[j] += g / float32(bs)
				}
			}
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { defer wg.Done(); nn.MatMulATB(gW2, h, dy, bs, hidden, 10) }()
			nn.MatMulABT(dh, dy, m.W2, bs, 10, hidden)
			for i := range dh {
				if h[i] <= 0 {
					dh[i] = 0
				}
			}
			for i := 0; i < bs; i++ {
				for j := 0; j < hidden; j++ {
					gB1[j] += dh[i*hidden+j]
				}
			}
			nn.MatMulATB(gW1, x, dh, bs, 784, hidden)
			wg.Wait()
			opt[0].step(m.W1, gW1, elr)
			opt[1].step(m.B1, gB1, elr)
			opt[2].step(m.W2, gW2, elr)
			opt[3].step(m.B2, gB2, elr)
		}
		acc := accuracy(m, xte, yte)
		fmt.Fprintf(os.Stderr, "epoch %d: train loss %.4f, test accuracy %.4f\n", ep+1, loss/float64(n), acc)
	}
	if err := os.WriteFile(out, models.EncodeMLP(m), 0o644); err != nil {
		return fmt.Errorf("write weights: %w", err)
	}
	fmt.Fprintf(os.Stderr, "wrote %s\n", out)
	return nil
}

func accuracy(m *models.MLP, x []float32, y []int) float64 {
	p := m.Forward(nn.Deterministic, x, len(y))
	ok := 0
	for i, l := range y {
		if models.Argmax(p[i*10:(i+1)*10]) == l {
			ok++
		}
	}
	return float64(ok) / float64(len(y))
}
