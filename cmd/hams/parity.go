package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/harness"
	"github.com/hams-go/hams/refserver/models"
)

// runParity dispatches `hams parity train|eval`.
func runParity(args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(os.Stderr, "usage: hams parity train|eval [flags]\n\n  train  train ParM parity models (and deployed classifiers) on Fashion-MNIST\n  eval   Aa, Ad, agreement and Ao of parity models on the test set\n\nRun 'hams parity train -h' or 'hams parity eval -h' for their flags.")
		if len(args) == 0 {
			return &harness.ExitError{Code: 2}
		}
		return &harness.ExitError{Code: 0}
	}
	switch args[0] {
	case "train":
		return runParityTrain(args[1:])
	case "eval":
		return runParityEval(args[1:])
	}
	return harness.Usagef("parity: unknown subcommand %q (want train or eval)", args[0])
}

// registerDeployedFlags defines the deployed-model flags of fs into d
// (def: the --deployed default).
func registerDeployedFlags(d *harness.DeployedModel, fs interface {
	StringVar(*string, string, string, string)
	DurationVar(*time.Duration, string, time.Duration, string)
}, def string) {
	fs.StringVar(&d.Name, "deployed", def, "deployed model: an embedded weights name (fashion-mlp, fashion-paper-mlp, fashion-lenet, ...) or kind:KIND (a reference model kind with default params, e.g. kind:linear)")
	fs.StringVar(&d.Addr, "deployed-addr", "", "host:port of a running deployed model (a black box reached through --backend's adapter); overrides --deployed")
	fs.StringVar(&d.Backend, "backend", "reference", "adapter for --deployed-addr: "+strings.Join(config.BackendTypes, ", "))
	fs.StringVar(&d.Model, "deployed-model", "fashion", "the model's name at --deployed-addr")
	fs.StringVar(&d.Input, "input", "images", "input tensor name at --deployed-addr (FP32 [N,784])")
	fs.StringVar(&d.Output, "output", "", "output tensor name at --deployed-addr (default: the first output)")
	fs.DurationVar(&d.Timeout, "deployed-timeout", 30*time.Second, "timeout of one labelling call to --deployed-addr")
}

// runParityTrain is `hams parity train`: its flags, then the library call that does the work.
func runParityTrain(args []string) error {
	fs := newFlagSet("parity train")
	var c harness.ParityTrainConfig
	registerDeployedFlags(&c.Deployed, fs, models.FashionWeights)
	fs.StringVar(&c.Data, "data", models.FashionDir, "directory of the Fashion-MNIST IDX .gz files")
	fs.IntVar(&c.K, "k", 2, "coding group size k (2..16)")
	fs.IntVar(&c.R, "r", 1, "parity models per group r (1..4): parity j learns Σ_i (i+1)^j F(X_i)")
	fs.IntVar(&c.Only, "parity", -1, "train only parity j (default: every j < r)")
	fs.StringVar(&c.EncName, "encoder", "sum", "encoder: sum or concat")
	fs.StringVar(&c.Arch, "arch", "mlp", "architecture: mlp (784-200-100-10), mlp:H1,H2,... or lenet")
	fs.StringVar(&c.LossName, "loss", "", "loss: mse (default) or ce (default for concat's parity 0: the paper's cross-entropy on the group's labels)")
	fs.IntVar(&c.Epochs, "epochs", 60, "epochs (coding groups redrawn every epoch; the best epoch by validation Ad is kept)")
	fs.Uint64Var(&c.Seed, "seed", 1, "seed: initial weights, validation split, coding groups (same seed and --shards: bit-identical weights)")
	fs.Float64Var(&c.Lr, "lr", 1e-3, "Adam learning rate")
	fs.Float64Var(&c.Wd, "weight-decay", 1e-5, "Adam weight decay (L2 added to the gradient)")
	fs.IntVar(&c.Batch, "batch", 0, "coding groups per step (default 64 at k=2, else 32)")
	fs.IntVar(&c.Shards, "shards", 4, "minibatch shards computed in parallel and summed in order (part of a run's identity)")
	fs.IntVar(&c.Workers, "workers", 0, "goroutines (default GOMAXPROCS)")
	fs.IntVar(&c.Val, "val", 5000, "training images held out for validation")
	fs.IntVar(&c.Limit, "train-images", 0, "use only the first N training images (0: all 60,000)")
	fs.IntVar(&c.TestLimit, "test-images", 0, "use only the first N test images (0: all 10,000)")
	fs.BoolVar(&c.Classifier, "classifier", false, "train a deployed classifier on the true labels (cross-entropy, softmax output) instead of a parity model")
	fs.BoolVar(&c.LinearOut, "logits", false, "with --classifier: store linear outputs (logits, as the paper's deployed model answers) instead of a softmax")
	fs.StringVar(&c.Out, "out", "", "weights file (default <name>.bin by the embedded naming scheme; parity j >= 1 inserts -p<j> before the extension)")
	fs.StringVar(&c.JsonOut, "json", "", "write the test-set rows (one per (k, r, encoder)) as a JSON array to this file")
	fs.StringVar(&c.Prog, "progress", "auto", "progress display on stderr: auto, bar, lines or none")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	return harness.RunParityTrain(ctx, c)
}

// runParityEval is `hams parity eval`: its flags, then the library call that does the work.
func runParityEval(args []string) error {
	fs := newFlagSet("parity eval")
	var c harness.ParityEvalConfig
	registerDeployedFlags(&c.Deployed, fs, "")
	fs.StringVar(&c.Data, "data", models.FashionDir, "directory of the Fashion-MNIST IDX .gz files")
	fs.StringVar(&c.Weights, "weights", "", "comma-separated parity weights (embedded names or files); default: every embedded parity model")
	fs.IntVar(&c.TestLimit, "test-images", 0, "use only the first N test images (0: all 10,000)")
	fs.StringVar(&c.JsonOut, "json", "", "write the rows as a JSON array to this file (docs/design.md's contract)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	return harness.RunParityEval(ctx, c)
}
