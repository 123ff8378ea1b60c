package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/hams-go/hams/adapters"
	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/paritytrain"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/protocol/parity"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver/models"
	"github.com/hams-go/hams/refserver/nn"
	"github.com/hams-go/hams/sidecar"
)

// parityFs are the fractions of unavailable outputs at which hams parity
// reports the overall accuracy Ao (paper section 5).
var parityFs = []float64{0.01, 0.05, 0.10}

// deployedFlags name the deployed model whose outputs label the data.
// deployedFlags name the deployed model parity models are trained for and
// evaluated against: a local one (Name) or a black box at Addr.
type DeployedModel struct {
	Name, Addr, Backend, Model, Input, Output string
	Timeout                                   time.Duration
}

// open returns the deployed model and its name for the weights'
// provenance; the returned close releases a backend's connection.
func (d *DeployedModel) open() (paritytrain.Deployed, string, func(), error) {
	if d.Addr == "" {
		dep, err := localDeployed(d.Name)
		return dep, d.Name, func() {}, err
	}
	if !slices.Contains(config.BackendTypes, d.Backend) {
		return nil, "", nil, Usagef("parity: --backend %q: want one of %v", d.Backend, config.BackendTypes)
	}
	dep := &config.Deployment{Name: "parity"}
	m := &config.Model{Name: d.Model, Backend: config.Backend{Type: d.Backend, Address: d.Addr, Model: d.Model, Timeout: config.Duration(d.Timeout)}}
	be, closeBE, err := adapters.New(dep, m, d.Addr, "primary", slog.New(slog.DiscardHandler), nil)
	if err != nil {
		return nil, "", nil, fmt.Errorf("parity: deployed model %s at %s: %w", d.Backend, d.Addr, err)
	}
	return &backendDeployed{be: be, model: d.Model, input: d.Input, output: d.Output}, d.Backend + ":" + d.Addr + "/" + d.Model, closeBE, nil
}

// localDeployed is an embedded network or a reference model kind.
func localDeployed(name string) (paritytrain.Deployed, error) {
	if kind, ok := strings.CutPrefix(name, "kind:"); ok {
		m, err := models.New(&config.Model{Name: "deployed", Kind: kind, Params: map[string]any{"deterministic": 1}})
		if err != nil {
			return nil, fmt.Errorf("parity: deployed %q: %w", name, err)
		}
		return &refDeployed{m: m}, nil
	}
	net, err := models.EmbeddedNet(name)
	if err != nil {
		return nil, fmt.Errorf("parity: deployed %q: %w", name, err)
	}
	if models.IsParityWeights(name) {
		return nil, fmt.Errorf("parity: deployed %q is a parity model, not a deployed model", name)
	}
	return &netDeployed{net: net}, nil
}

type netDeployed struct{ net *nn.Net }

func (d *netDeployed) Infer(_ context.Context, x []float32, rows int) ([]float32, int, error) {
	if len(x) != rows*d.net.InSize() {
		return nil, 0, fmt.Errorf("the deployed network takes rows of %d values, queries have %d", d.net.InSize(), len(x)/max(rows, 1))
	}
	return d.net.Forward(nn.Deterministic, x, rows), d.net.OutSize(), nil
}

type refDeployed struct{ m models.Model }

func (d *refDeployed) Infer(_ context.Context, x []float32, rows int) ([]float32, int, error) {
	desc := d.m.Describe()
	if len(desc.Inputs) == 0 {
		return nil, 0, errors.New("the deployed kind declares no input")
	}
	res, err := d.m.Infer(&models.Batch{Inputs: []*hamsv1.Tensor{tensor.FromFloat32(desc.Inputs[0].Name, []int64{int64(rows), int64(len(x) / max(rows, 1))}, x)}, BatchID: 1})
	if err != nil {
		return nil, 0, err
	}
	return outputRows(res.Outputs, "", rows)
}

// backendDeployed reaches a deployed model through a sidecar adapter.
type backendDeployed struct {
	be                   sidecar.Backend
	model, input, output string
	batches              uint64
}

func (d *backendDeployed) Infer(ctx context.Context, x []float32, rows int) ([]float32, int, error) {
	d.batches++
	rs := make([]uint32, rows)
	for i := range rs {
		rs[i] = 1
	}
	req := &hamsv1.BatchRequest{Model: d.model, BatchId: d.batches, Rows: rs,
		Inputs: []*hamsv1.Tensor{tensor.FromFloat32(d.input, []int64{int64(rows), int64(len(x) / max(rows, 1))}, x)}}
	resp, err := d.be.Infer(ctx, req)
	if err != nil {
		return nil, 0, err
	}
	return outputRows(resp.GetOutputs(), d.output, rows)
}

// outputRows picks the named output (or the first) as FP32 [rows, w].
func outputRows(outs []*hamsv1.Tensor, name string, rows int) ([]float32, int, error) {
	var o *hamsv1.Tensor
	for _, t := range outs {
		if name == "" || t.GetName() == name {
			o = t
			break
		}
	}
	if o == nil {
		return nil, 0, fmt.Errorf("the deployed model answered no output %q (%d outputs)", name, len(outs))
	}
	v, err := tensor.Float32(o)
	if err != nil {
		return nil, 0, fmt.Errorf("output %q: %w", o.GetName(), err)
	}
	if sh := o.GetShape(); len(sh) != 2 || sh[0] != int64(rows) {
		return nil, 0, fmt.Errorf("output %q has shape %v for %d queries, want [%d, width]", o.GetName(), sh, rows, rows)
	}
	return v, int(o.GetShape()[1]), nil
}

// fashionData loads a Fashion-MNIST split, naming the dataset in errors.
func fashionData(dir, set string, limit int) ([]float32, []int, error) {
	x, y, err := models.LoadFashion(dir, set)
	if err != nil {
		return nil, nil, fmt.Errorf("parity: Fashion-MNIST %s set under %s (Debian package dataset-fashion-mnist, or --data DIR): %w", set, dir, err)
	}
	if limit > 0 && limit < len(y) {
		x, y = x[:limit*784], y[:limit]
	}
	return x, y, nil
}

// labelSet runs the deployed model over x and wraps the result.
func labelSet(ctx context.Context, d paritytrain.Deployed, x []float32, y []int, what string, quiet bool) (*paritytrain.Set, error) {
	var last time.Time
	out, w, err := paritytrain.Label(ctx, d, x, 784, 500, func(done, total int) {
		if !quiet && (time.Since(last) > 2*time.Second || done == total) {
			last = time.Now()
			fmt.Fprintf(os.Stderr, "labelling %s: %d/%d queries\n", what, done, total)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("parity: %w", err)
	}
	return paritytrain.FromArrays(x, 784, out, w, y)
}

// parityRow is one (k, r, encoder) row of hams parity train/eval --json
// (docs/design.md's command-line contract): fractions 0..1, Ao at each f.
type parityRow struct {
	Deployed  string             `json:"deployed"`
	Arch      string             `json:"arch"`
	K         int                `json:"k"`
	R         int                `json:"r"`
	Encoder   string             `json:"encoder"`
	Aa        float64            `json:"aa"`
	Ad        float64            `json:"ad"`
	Agreement float64            `json:"agreement"`
	Ao        map[string]float64 `json:"ao"`
	// Erased is the number of outputs erased at once for Ad (1 for r = 1;
	// r for r > 1: every pattern the code tolerates, from all parities).
	Erased int `json:"erased"`
	Groups int `json:"groups"`
	// Single is, for r > 1, each parity model alone reconstructing one
	// erased output.
	Single []singleScore `json:"single,omitempty"`
	// DefaultAd is the degraded accuracy of a default answer (1/classes)
	// and DefaultAo its overall accuracy: the baseline without redundancy.
	DefaultAd float64            `json:"default_ad"`
	DefaultAo map[string]float64 `json:"default_ao"`
	Weights   []string           `json:"weights"`
}

type singleScore struct {
	J         int     `json:"j"`
	Ad        float64 `json:"ad"`
	Agreement float64 `json:"agreement"`
}

func aoMap(aa, ad float64) map[string]float64 {
	m := map[string]float64{}
	for _, f := range parityFs {
		m[strconv.FormatFloat(f, 'f', -1, 64)] = round4((1-f)*aa + f*ad)
	}
	return m
}

func round4(v float64) float64 { return math.Round(v*1e4) / 1e4 }

func newRow(deployed, arch string, k, r int, enc string, s paritytrain.Score, classes int, weights []string) parityRow {
	def := 1 / float64(classes)
	return parityRow{Deployed: deployed, Arch: arch, K: k, R: r, Encoder: enc, Aa: round4(s.Aa), Ad: round4(s.Ad), Agreement: round4(s.Agreement),
		Ao: aoMap(s.Aa, s.Ad), Erased: s.Erased, Groups: s.Groups, DefaultAd: round4(def), DefaultAo: aoMap(s.Aa, def), Weights: weights}
}

func writeParityJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return paritytrain.WriteFileAtomic(path, append(b, '\n'))
}

// progress shows one line or bar update per epoch on stderr.
type epochProgress struct {
	bar   *progressbar.ProgressBar
	lines bool
	label string
}

func newProgress(mode, label string, epochs int) (*epochProgress, error) {
	p := &epochProgress{label: label}
	switch mode {
	case "auto":
		if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			mode = "bar"
		} else {
			mode = "lines"
		}
	case "bar", "lines", "none":
	default:
		return nil, Usagef("parity train: --progress %q: want auto, bar, lines or none", mode)
	}
	switch mode {
	case "bar":
		p.bar = progressbar.NewOptions(epochs, progressbar.OptionSetWriter(os.Stderr), progressbar.OptionSetDescription(label),
			progressbar.OptionShowCount(), progressbar.OptionSetElapsedTime(true), progressbar.OptionSetPredictTime(true),
			progressbar.OptionSetWidth(20), progressbar.OptionClearOnFinish())
	case "lines":
		p.lines = true
	}
	return p, nil
}

func (p *epochProgress) epoch(r paritytrain.EpochReport, best paritytrain.Score, bestEpoch int) {
	msg := fmt.Sprintf("%s epoch %d/%d: loss %.5f, validation Ad %.4f agreement %.4f (best Ad %.4f at epoch %d), %.0f groups/s",
		p.label, r.Epoch, r.Epochs, r.Loss, r.Val.Ad, r.Val.Agreement, best.Ad, bestEpoch, r.ItemsPerSec)
	switch {
	case p.bar != nil:
		p.bar.Add(1)
		p.bar.Describe(fmt.Sprintf("%s loss %.5f val Ad %.4f (best %.4f@%d)", p.label, r.Loss, r.Val.Ad, best.Ad, bestEpoch))
	case p.lines:
		fmt.Fprintln(os.Stderr, msg)
	}
}

func (p *epochProgress) done() {
	if p.bar != nil {
		p.bar.Finish()
		fmt.Fprintln(os.Stderr)
	}
}

// parityOutPath is where parity j's weights go: out for j = 0, out with
// -p<j> before its extension otherwise (the embedded naming scheme).
func parityOutPath(out string, j int) string {
	if j == 0 {
		return out
	}
	ext := filepath.Ext(out)
	return strings.TrimSuffix(out, ext) + fmt.Sprintf("-p%d", j) + ext
}

// ParityTrainConfig is what the flags of the command set.
type ParityTrainConfig struct {
	Deployed   DeployedModel // the deployed model flags
	Data       string        // --data
	K          int           // --k
	R          int           // --r
	Only       int           // --parity
	EncName    string        // --encoder
	Arch       string        // --arch
	LossName   string        // --loss
	Epochs     int           // --epochs
	Seed       uint64        // --seed
	Lr         float64       // --lr
	Wd         float64       // --weight-decay
	Batch      int           // --batch
	Shards     int           // --shards
	Workers    int           // --workers
	Val        int           // --val
	Limit      int           // --train-images
	TestLimit  int           // --test-images
	Classifier bool          // --classifier
	LinearOut  bool          // --logits
	Out        string        // --out
	JsonOut    string        // --json
	Prog       string        // --progress
}

// parityTrainRun runs the command configured by c until it is done or ctx ends.
func RunParityTrain(ctx context.Context, c ParityTrainConfig) error {
	dep := &c.Deployed
	data := &c.Data
	k := &c.K
	r := &c.R
	only := &c.Only
	encName := &c.EncName
	arch := &c.Arch
	lossName := &c.LossName
	epochs := &c.Epochs
	seed := &c.Seed
	lr := &c.Lr
	wd := &c.Wd
	batch := &c.Batch
	shards := &c.Shards
	workers := &c.Workers
	val := &c.Val
	limit := &c.Limit
	testLimit := &c.TestLimit
	classifier := &c.Classifier
	linearOut := &c.LinearOut
	out := &c.Out
	jsonOut := &c.JsonOut
	prog := &c.Prog
	if *epochs < 1 {
		return Usagef("parity train: --epochs %d: want >= 1", *epochs)
	}
	opts := paritytrain.Options{LR: *lr, WeightDecay: *wd, Batch: *batch, Shards: *shards, Workers: *workers}
	if *classifier {
		return trainClassifier(ctx, *data, *arch, *epochs, *seed, *val, *limit, *testLimit, *linearOut, *out, *prog, opts)
	}
	enc, err := parity.ParseEncoder(*encName)
	if err != nil {
		return Usagef("parity train: --encoder: %v", err)
	}
	if _, err := parity.NewCode(*k, *r); err != nil {
		return Usagef("parity train: --k %d --r %d: %v", *k, *r, err)
	}
	js := []int{}
	for j := range *r {
		if *only < 0 || *only == j {
			js = append(js, j)
		}
	}
	if len(js) == 0 {
		return Usagef("parity train: --parity %d: out of range 0..%d for --r %d", *only, *r-1, *r)
	}
	d, depName, closeDep, err := dep.open()
	if err != nil {
		return err
	}
	defer closeDep()
	x, y, err := fashionData(*data, "train", *limit)
	if err != nil {
		return err
	}
	xt, yt, err := fashionData(*data, "t10k", *testLimit)
	if err != nil {
		return err
	}
	quiet := *prog == "none"
	all, err := labelSet(ctx, d, x, y, "training set", quiet)
	if err != nil {
		return err
	}
	test, err := labelSet(ctx, d, xt, yt, "test set", quiet)
	if err != nil {
		return err
	}
	if test.OutSize != all.OutSize {
		return fmt.Errorf("parity train: the deployed model answered %d values per test query and %d per training query: its output shape changed", test.OutSize, all.OutSize)
	}
	train, valSet, err := all.Split(*val, *seed)
	if err != nil {
		return Usagef("parity train: --val %d: %v", *val, err)
	}
	if *out == "" {
		*out = models.ParityWeightsName(depName, enc.String(), *k, 0) + ".bin"
		if dep.Addr != "" {
			*out = fmt.Sprintf("parity-%s-k%d.bin", enc, *k)
		}
	}
	nets := make([]*nn.Net, *r)
	var singles []singleScore
	var weights []string
	var first paritytrain.Score
	for _, j := range js {
		loss := paritytrain.MSE
		if *lossName != "" {
			if loss, err = paritytrain.ParseLoss(*lossName); err != nil {
				return Usagef("parity train: --loss: %v", err)
			}
		} else if enc == parity.EncoderConcat && j == 0 {
			loss = paritytrain.CrossEntropy
		}
		spec := paritytrain.Spec{K: *k, R: *r, J: j, Encoder: enc, Image: paritytrain.FashionImage, Loss: loss}
		net, err := paritytrain.NewArch(*arch, paritytrain.FashionImage, all.OutSize, false, nn.NewRand(*seed*1000003+uint64(j)))
		if err != nil {
			return Usagef("parity train: --arch: %v", err)
		}
		tr, err := paritytrain.NewTrainer(spec, net, opts)
		if err != nil {
			return fmt.Errorf("parity train: %w", err)
		}
		label := fmt.Sprintf("k=%d %s parity %d", *k, enc, j)
		p, err := newProgress(*prog, label, *epochs)
		if err != nil {
			return err
		}
		var best paritytrain.Score
		bestEpoch := 0
		res, err := paritytrain.Fit(ctx, tr, train, paritytrain.ParityValidator(spec, valSet, *seed+7, *workers), *epochs, nn.NewRand(*seed^uint64(j+1)<<32), func(rep paritytrain.EpochReport) {
			if rep.Best || rep.Epoch == 1 && best.Groups == 0 {
				best, bestEpoch = rep.Val, rep.Epoch
			}
			p.epoch(rep, best, bestEpoch)
		})
		p.done()
		if err != nil {
			return fmt.Errorf("parity train: %s: %w", label, err)
		}
		testScore, err := paritytrain.EvaluateSingle(spec, res.Net, test, paritytrain.Groups(test.N, *k, nn.NewRand(paritytrain.EvalSeed)), *workers)
		if err != nil {
			return fmt.Errorf("parity train: %w", err)
		}
		eff := tr.Options()
		prov := &paritytrain.Provenance{Role: "parity", Deployed: depName, Arch: *arch, K: *k, R: *r, J: j, Encoder: enc.String(), Loss: loss.String(),
			Image: paritytrain.FashionImage, Seed: *seed, Epochs: *epochs, BestEpoch: res.BestEpoch, Batch: eff.Batch, Shards: eff.Shards,
			LR: eff.LR, WeightDecay: eff.WeightDecay, TrainImages: train.N, ValAd: round4(res.BestVal.Ad), ValAgree: round4(res.BestVal.Agreement),
			TrainSecs: math.Round(res.Train.Seconds()*10) / 10,
			Test:      &paritytrain.Recorded{Groups: testScore.Groups, Aa: round4(testScore.Aa), Ad: round4(testScore.Ad), Agreement: round4(testScore.Agreement)}}
		path := parityOutPath(*out, j)
		if err := paritytrain.WriteWeights(path, res.Net, prov); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "%s: best epoch %d of %d (validation Ad %.4f); test Aa %.4f Ad %.4f agreement %.4f; %.0f s training, %.0f groups/s; wrote %s\n",
			label, res.BestEpoch, *epochs, res.BestVal.Ad, testScore.Aa, testScore.Ad, testScore.Agreement, res.Train.Seconds(), res.ItemsPerSec(), path)
		nets[j] = res.Net
		singles = append(singles, singleScore{J: j, Ad: round4(testScore.Ad), Agreement: round4(testScore.Agreement)})
		weights = append(weights, path)
		if j == js[0] {
			first = testScore
		}
	}
	if *jsonOut == "" {
		return nil
	}
	rows := []parityRow{newRow(depName, *arch, *k, 1, enc.String(), first, all.OutSize, weights[:1])}
	if len(js) == *r && *r > 1 {
		row, err := codeRow(depName, *arch, enc, *k, *r, nets, test, weights)
		if err != nil {
			return err
		}
		row.Single = singles
		rows = append(rows, row)
	}
	return writeParityJSON(*jsonOut, rows)
}

// codeRow scores a (k, r) code of parity models with r outputs erased
// (min(r, k)) in every pattern.
func codeRow(deployed, arch string, enc parity.EncoderKind, k, r int, nets []*nn.Net, test *paritytrain.Set, weights []string) (parityRow, error) {
	code, err := parity.NewCode(k, r)
	if err != nil {
		return parityRow{}, err
	}
	spec := paritytrain.Spec{K: k, R: r, Encoder: enc, Image: paritytrain.FashionImage, Loss: paritytrain.MSE}
	e, err := spec.NewEncoder()
	if err != nil {
		return parityRow{}, err
	}
	groups := paritytrain.Groups(test.N, k, nn.NewRand(paritytrain.EvalSeed))
	pouts, err := paritytrain.ParityOutputs(nets, e, test, groups, 0)
	if err != nil {
		return parityRow{}, err
	}
	s, err := paritytrain.Reconstruct(code, test, groups, pouts, min(r, k))
	if err != nil {
		return parityRow{}, err
	}
	return newRow(deployed, arch, k, r, enc.String(), s, test.OutSize, weights), nil
}

// trainClassifier trains a deployed classifier on the true labels.
func trainClassifier(ctx context.Context, data, arch string, epochs int, seed uint64, val, limit, testLimit int, logits bool, out, prog string, opts paritytrain.Options) error {
	x, y, err := fashionData(data, "train", limit)
	if err != nil {
		return err
	}
	xt, yt, err := fashionData(data, "t10k", testLimit)
	if err != nil {
		return err
	}
	oneHot := func(y []int) []float32 {
		o := make([]float32, len(y)*10)
		for i, l := range y {
			o[i*10+l] = 1
		}
		return o
	}
	all, err := paritytrain.FromArrays(x, 784, oneHot(y), 10, y)
	if err != nil {
		return err
	}
	test, _ := paritytrain.FromArrays(xt, 784, oneHot(yt), 10, yt)
	train, valSet, err := all.Split(val, seed)
	if err != nil {
		return Usagef("parity train: --val %d: %v", val, err)
	}
	net, err := paritytrain.NewArch(arch, paritytrain.FashionImage, 10, true, nn.NewRand(seed*1000003))
	if err != nil {
		return Usagef("parity train: --arch: %v", err)
	}
	tr, err := paritytrain.NewClassifierTrainer(net, opts)
	if err != nil {
		return err
	}
	p, err := newProgress(prog, "classifier "+arch, epochs)
	if err != nil {
		return err
	}
	var best paritytrain.Score
	bestEpoch := 0
	res, err := paritytrain.Fit(ctx, tr, train, paritytrain.ClassifierValidator(valSet, opts.Workers), epochs, nn.NewRand(seed+1), func(rep paritytrain.EpochReport) {
		if rep.Best {
			best, bestEpoch = rep.Val, rep.Epoch
		}
		p.epoch(rep, best, bestEpoch)
	})
	p.done()
	if err != nil {
		return fmt.Errorf("parity train: classifier: %w", err)
	}
	ts, _ := paritytrain.ClassifierValidator(test, opts.Workers)(res.Net)
	res.Net.Softmax = !logits
	if out == "" {
		out = "classifier-" + strings.ReplaceAll(arch, ":", "-") + ".bin"
	}
	eff := tr.Options()
	prov := &paritytrain.Provenance{Role: "deployed", Arch: arch, Loss: "ce", Image: paritytrain.FashionImage, Seed: seed, Epochs: epochs,
		BestEpoch: res.BestEpoch, Batch: eff.Batch, Shards: eff.Shards, LR: eff.LR, WeightDecay: eff.WeightDecay, TrainImages: train.N,
		ValAd: round4(res.BestVal.Aa), TrainSecs: math.Round(res.Train.Seconds()*10) / 10,
		Test: &paritytrain.Recorded{Groups: test.N, Aa: round4(ts.Aa), Ad: round4(ts.Aa), Agreement: 1}}
	if err := paritytrain.WriteWeights(out, res.Net, prov); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "classifier %s: best epoch %d of %d (validation accuracy %.4f); test accuracy (Aa) %.4f; %.0f s; wrote %s\n",
		arch, res.BestEpoch, epochs, res.BestVal.Aa, ts.Aa, res.Train.Seconds(), out)
	return nil
}

// evalModel is one parity weights file to evaluate.
type evalModel struct {
	name string
	net  *nn.Net
	prov *paritytrain.Provenance
}

func loadEvalModel(name string) (*evalModel, error) {
	var net *nn.Net
	var err error
	if strings.ContainsAny(name, "/.") {
		b, rerr := os.ReadFile(name)
		if rerr != nil {
			return nil, fmt.Errorf("parity eval: weights %s: %w", name, rerr)
		}
		net, err = models.DecodeWeights(b)
	} else {
		net, err = models.EmbeddedNet(name)
	}
	if err != nil {
		return nil, fmt.Errorf("parity eval: weights %s: %w", name, err)
	}
	prov, err := paritytrain.ReadProvenance(net)
	if err != nil {
		return nil, fmt.Errorf("parity eval: weights %s: %w", name, err)
	}
	if prov == nil || prov.Role != "parity" {
		return nil, fmt.Errorf("parity eval: weights %s: not a parity model trained by hams parity train (no parity provenance)", name)
	}
	return &evalModel{name: name, net: net, prov: prov}, nil
}

// ParityEvalConfig is what the flags of the command set.
type ParityEvalConfig struct {
	Deployed  DeployedModel // the deployed model flags
	Data      string        // --data
	Weights   string        // --weights
	TestLimit int           // --test-images
	JsonOut   string        // --json
}

// parityEvalRun runs the command configured by c until it is done or ctx ends.
func RunParityEval(ctx context.Context, c ParityEvalConfig) error {
	dep := &c.Deployed
	data := &c.Data
	weights := &c.Weights
	testLimit := &c.TestLimit
	jsonOut := &c.JsonOut
	names := cluster.SplitList(*weights)
	if len(names) == 0 {
		for _, n := range models.WeightNames() {
			if models.IsParityWeights(n) {
				names = append(names, n)
			}
		}
	}
	var ms []*evalModel
	for _, n := range names {
		m, err := loadEvalModel(n)
		if err != nil {
			return err
		}
		ms = append(ms, m)
	}
	xt, yt, err := fashionData(*data, "t10k", *testLimit)
	if err != nil {
		return err
	}
	// Group the files by code family: (deployed, arch, encoder, k); parity
	// j of a family at index j.
	type family struct {
		deployed, arch, encoder string
		k                       int
		byJ                     map[int]*evalModel
	}
	fams := map[string]*family{}
	var order []string
	for _, m := range ms {
		p := m.prov
		if dep.Name != "" || dep.Addr != "" {
			p.Deployed = "override"
		}
		key := fmt.Sprintf("%s|%s|%s|%03d", p.Deployed, p.Arch, p.Encoder, p.K)
		f := fams[key]
		if f == nil {
			f = &family{deployed: p.Deployed, arch: p.Arch, encoder: p.Encoder, k: p.K, byJ: map[int]*evalModel{}}
			fams[key] = f
			order = append(order, key)
		}
		if prev := f.byJ[p.J]; prev != nil {
			return fmt.Errorf("parity eval: %s and %s are both parity %d of deployed %s, %s k=%d", prev.name, m.name, p.J, p.Deployed, p.Encoder, p.K)
		}
		f.byJ[p.J] = m
	}
	sort.Strings(order)
	tests := map[string]*paritytrain.Set{}
	var rows []parityRow
	display := "" // the deployed model's name in rows when --deployed or --deployed-addr overrides the files' own
	for _, key := range order {
		f := fams[key]
		test := tests[f.deployed]
		if f.deployed == "override" && display == "" {
			display = dep.Name
		}
		if test == nil {
			var d paritytrain.Deployed
			name := f.deployed
			if f.deployed == "override" {
				dd, n, closeDep, err := dep.open()
				if err != nil {
					return err
				}
				defer closeDep()
				d, name, display = dd, n, n
			} else if d, err = localDeployed(f.deployed); err != nil {
				return fmt.Errorf("parity eval: %s: %w (pass --deployed or --deployed-addr to name it)", f.byJ[0].name, err)
			}
			if test, err = labelSet(ctx, d, xt, yt, "test set for "+name, true); err != nil {
				return err
			}
			tests[f.deployed] = test
		}
		enc, err := parity.ParseEncoder(f.encoder)
		if err != nil {
			return fmt.Errorf("parity eval: %s: %w", key, err)
		}
		r := 0
		for r < 4 && f.byJ[r] != nil {
			r++
		}
		if r == 0 {
			continue // only parities j >= 1 without parity 0: no code to report
		}
		for rr := 1; rr <= r; rr++ {
			nets := make([]*nn.Net, rr)
			var ws []string
			for j := range rr {
				nets[j] = f.byJ[j].net
				ws = append(ws, f.byJ[j].name)
			}
			shown := f.deployed
			if shown == "override" {
				shown = display
			}
			row, err := codeRow(shown, f.arch, enc, f.k, rr, nets, test, ws)
			if err != nil {
				return fmt.Errorf("parity eval: %s: %w", strings.Join(ws, ","), err)
			}
			if rr > 1 {
				for j := range rr {
					spec := paritytrain.Spec{K: f.k, R: rr, J: j, Encoder: enc, Image: paritytrain.FashionImage, Loss: paritytrain.MSE}
					s, err := paritytrain.EvaluateSingle(spec, nets[j], test, paritytrain.Groups(test.N, f.k, nn.NewRand(paritytrain.EvalSeed)), 0)
					if err != nil {
						return err
					}
					row.Single = append(row.Single, singleScore{J: j, Ad: round4(s.Ad), Agreement: round4(s.Agreement)})
				}
			}
			rows = append(rows, row)
		}
	}
	printParityTable(os.Stdout, rows)
	if *jsonOut != "" {
		return writeParityJSON(*jsonOut, rows)
	}
	return nil
}

// printParityTable writes the rows and, per deployed model, the
// default-answer baseline.
func printParityTable(w io.Writer, rows []parityRow) {
	fmt.Fprintf(w, "%-18s %-8s %-7s %2s %2s %6s %6s %7s %6s %9s %9s %9s  %s\n", "deployed", "arch", "encoder", "k", "r", "Aa", "Ad", "Aa-Ad", "agree", "Ao@0.01", "Ao@0.05", "Ao@0.10", "notes")
	for _, r := range rows {
		note := ""
		if r.R > 1 {
			note = fmt.Sprintf("Ad with %d outputs erased;", r.Erased)
			for _, s := range r.Single {
				note += fmt.Sprintf(" parity %d alone Ad %.4f;", s.J, s.Ad)
			}
		}
		fmt.Fprintf(w, "%-18s %-8s %-7s %2d %2d %6.4f %6.4f %7.4f %6.4f %9.4f %9.4f %9.4f  %s\n", r.Deployed, r.Arch, r.Encoder, r.K, r.R, r.Aa, r.Ad, r.Aa-r.Ad, r.Agreement,
			r.Ao["0.01"], r.Ao["0.05"], r.Ao["0.1"], note)
	}
	done := map[string]bool{}
	for _, r := range rows {
		if done[r.Deployed] {
			continue
		}
		done[r.Deployed] = true
		fmt.Fprintf(w, "%-18s %-8s %-7s %2s %2s %6.4f %6.4f %7.4f %6s %9.4f %9.4f %9.4f  %s\n", r.Deployed, "-", "default", "-", "-", r.Aa, r.DefaultAd, r.Aa-r.DefaultAd, "-",
			r.DefaultAo["0.01"], r.DefaultAo["0.05"], r.DefaultAo["0.1"], "no redundancy: a default answer (1/classes)")
	}
}
