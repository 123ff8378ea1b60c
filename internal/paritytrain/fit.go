package paritytrain

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/hams-go/hams/refserver/nn"
)

// EpochReport is one epoch's outcome, for progress display.
type EpochReport struct {
	Epoch, Epochs int
	// Loss is the mean minibatch training loss of the epoch.
	Loss float64
	// Val scores the weights after the epoch on the validation set.
	Val Score
	// Best marks an epoch whose validation score beat every earlier one.
	Best bool
	// Items trained this epoch (coding groups, or samples for a
	// classifier) and the training throughput in items per second.
	Items       int
	ItemsPerSec float64
	Elapsed     time.Duration
}

// Result is the outcome of Fit: the best epoch's weights.
type Result struct {
	Net       *nn.Net
	BestEpoch int
	BestVal   Score
	History   []EpochReport
	// Items is the number of items trained over all epochs; Train the
	// time spent in training steps (validation excluded).
	Items   int
	Train   time.Duration
	Elapsed time.Duration
}

// ItemsPerSec is the training throughput over the whole run.
func (r *Result) ItemsPerSec() float64 { return float64(r.Items) / r.Train.Seconds() }

// selectionMetric is what best-epoch selection maximises: degraded
// accuracy when the validation set has labels, agreement otherwise.
func selectionMetric(s Score) float64 {
	if !math.IsNaN(s.Ad) {
		return s.Ad
	}
	return s.Agreement
}

// Validator scores the network under training on held-out data.
type Validator func(net *nn.Net) (Score, error)

// ParityValidator validates parity model j of spec on val over coding
// groups drawn once with seed (the same groups every epoch).
func ParityValidator(spec Spec, val *Set, seed uint64, workers int) Validator {
	groups := Groups(val.N, spec.K, nn.NewRand(seed))
	return func(net *nn.Net) (Score, error) { return EvaluateSingle(spec, net, val, groups, workers) }
}

// ClassifierValidator scores a classifier's top-1 accuracy on val (as
// Aa and Ad; agreement with val's recorded outputs).
func ClassifierValidator(val *Set, workers int) Validator {
	return func(net *nn.Net) (Score, error) {
		y := ForwardRows(net, val.Query, val.N, workers)
		s := Score{Groups: val.N, Reconstructions: val.N}
		right, agree := 0, 0
		for i := range val.N {
			top := argmax(y[i*val.OutSize : (i+1)*val.OutSize])
			if top == val.Label[i] {
				right++
			}
			if top == argmax(val.O(i)) {
				agree++
			}
		}
		s.Aa = float64(right) / float64(val.N)
		s.Ad, s.Agreement = s.Aa, float64(agree)/float64(val.N)
		return s, nil
	}
}

// Fit trains for epochs epochs over train (items redrawn every epoch from
// rng), validates after each, and returns a copy of the weights of the
// best epoch (ties keep the earlier one; epoch 0 is the initial weights).
// progress, if not nil, is called after every epoch. When ctx ends, Fit
// returns its error.
func Fit(ctx context.Context, t *Trainer, train *Set, validate Validator, epochs int, rng interface{ Uint64() uint64 }, progress func(EpochReport)) (*Result, error) {
	if epochs < 1 {
		return nil, fmt.Errorf("paritytrain: fit: %d epochs, want >= 1", epochs)
	}
	began := time.Now()
	best, err := validate(t.Net())
	if err != nil {
		return nil, err
	}
	res := &Result{Net: t.Net().Clone(), BestVal: best}
	for ep := 1; ep <= epochs; ep++ {
		t0 := time.Now()
		loss, items, err := t.Epoch(ctx, train, nn.NewRand(rng.Uint64()))
		if err != nil {
			return nil, err
		}
		dt := time.Since(t0)
		res.Items += items
		res.Train += dt
		v, err := validate(t.Net())
		if err != nil {
			return nil, err
		}
		rep := EpochReport{Epoch: ep, Epochs: epochs, Loss: loss, Val: v, Items: items, ItemsPerSec: float64(items) / dt.Seconds(), Elapsed: time.Since(began)}
		if selectionMetric(v) > selectionMetric(res.BestVal) {
			rep.Best = true
			res.BestVal, res.BestEpoch = v, ep
			res.Net.CopyParams(t.Net())
		}
		res.History = append(res.History, rep)
		if progress != nil {
			progress(rep)
		}
	}
	res.Elapsed = time.Since(began)
	return res, nil
}

// Provenance is what a weights file records about how it was trained
// (nn.Net.Meta): enough to evaluate it again and to check it still
// reaches its recorded accuracy.
type Provenance struct {
	// Role is "parity" or "deployed".
	Role string `json:"role"`
	// Deployed names the deployed model a parity model serves (an
	// embedded weights name, a reference model kind, or backend:addr).
	Deployed string `json:"deployed,omitempty"`
	Arch     string `json:"arch"`
	K        int    `json:"k,omitempty"`
	R        int    `json:"r,omitempty"`
	J        int    `json:"j"`
	Encoder  string `json:"encoder,omitempty"`
	Loss     string `json:"loss"`
	Image    Image  `json:"image"`
	// Training settings and outcome.
	Seed        uint64  `json:"seed"`
	Epochs      int     `json:"epochs"`
	BestEpoch   int     `json:"best_epoch"`
	Batch       int     `json:"batch"`
	Shards      int     `json:"shards"`
	LR          float64 `json:"lr"`
	WeightDecay float64 `json:"weight_decay"`
	TrainImages int     `json:"train_images"`
	ValAd       float64 `json:"val_ad"`
	ValAgree    float64 `json:"val_agreement"`
	TrainSecs   float64 `json:"train_seconds"`
	// Test is the recorded accuracy on the test set (single erasure,
	// this parity alone, groups from EvalSeed), checked by tests.
	Test *Recorded `json:"test,omitempty"`
}

// Recorded is a score as stored in a weights file.
type Recorded struct {
	Groups    int     `json:"groups"`
	Aa        float64 `json:"aa"`
	Ad        float64 `json:"ad"`
	Agreement float64 `json:"agreement"`
}

// EvalSeed draws the coding groups of reported test accuracy (the same
// groups as refserver/models.ParityEvalSeed).
const EvalSeed = 1

// ReadProvenance decodes a network's Meta (nil, nil when it has none).
func ReadProvenance(n *nn.Net) (*Provenance, error) {
	if len(n.Meta) == 0 {
		return nil, nil
	}
	var p Provenance
	if err := json.Unmarshal(n.Meta, &p); err != nil {
		return nil, fmt.Errorf("paritytrain: weights metadata: %w", err)
	}
	return &p, nil
}

// WriteWeights stores n with provenance p at path: it writes a temporary
// file in the same directory and renames it over path, so an error never
// leaves a partial weights file.
func WriteWeights(path string, n *nn.Net, p *Provenance) error {
	c := n.Clone()
	if p != nil {
		meta, err := json.Marshal(p)
		if err != nil {
			return fmt.Errorf("paritytrain: write weights %s: %w", path, err)
		}
		c.Meta = meta
	}
	b, err := nn.EncodeNet(c)
	if err != nil {
		return fmt.Errorf("paritytrain: write weights %s: %w", path, err)
	}
	return WriteFileAtomic(path, b)
}

// WriteFileAtomic writes b to a temporary file beside path and renames it
// to path (removing the temporary file on any error).
func WriteFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("paritytrain: write %s: %w", path, err)
	}
	tmp := f.Name()
	werr := f.Chmod(0o644) // CreateTemp makes 0600; weights and reports are for everyone to read
	if werr == nil {
		_, werr = f.Write(b)
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		os.Remove(tmp)
		return fmt.Errorf("paritytrain: write %s: %w", path, werr)
	}
	return nil
}
