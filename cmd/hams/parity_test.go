package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/refserver"
	"github.com/hams-go/hams/refserver/models"
)

// Bad input to hams parity: each error names the problem.
func TestParityBadInput(t *testing.T) {
	dir := t.TempDir()
	corrupt := filepath.Join(dir, "corrupt")
	os.MkdirAll(corrupt, 0o755)
	for _, f := range []string{"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"} {
		os.WriteFile(filepath.Join(corrupt, f), []byte("not an idx file"), 0o644)
	}
	garbage := filepath.Join(dir, "garbage.bin")
	os.WriteFile(garbage, []byte("HAMSNETW\x07\x00\x00\x00\x00\x00\x00\x00"), 0o644)
	out := filepath.Join(dir, "w.bin")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"train", "--k", "17"}, "k=17"},
		{[]string{"train", "--k", "1"}, "k=1"},
		{[]string{"train", "--r", "5"}, "r=5"},
		{[]string{"train", "--r", "2", "--parity", "3"}, "--parity 3: out of range 0..1"},
		{[]string{"train", "--encoder", "zip"}, `unknown encoder "zip"`},
		{[]string{"train", "--epochs", "0"}, "--epochs 0"},
		{[]string{"train", "--deployed", "nope", "--out", out}, `deployed "nope"`},
		{[]string{"train", "--deployed", "fashion-parity-sum-k2", "--out", out}, "is a parity model"},
		{[]string{"train", "--deployed-addr", "127.0.0.1:1", "--backend", "grpc", "--out", out}, `--backend "grpc"`},
		{[]string{"train", "--data", filepath.Join(dir, "missing"), "--out", out}, "Fashion-MNIST train set under " + filepath.Join(dir, "missing")},
		{[]string{"train", "--data", corrupt, "--out", out}, "Fashion-MNIST train set under " + corrupt},
		{[]string{"train", "--progress", "fancy", "--train-images", "100", "--test-images", "10", "--val", "20", "--out", out}, "--progress"},
		{[]string{"eval", "--weights", garbage}, "format version 7"},
		{[]string{"eval", "--weights", filepath.Join(dir, "absent.bin")}, "absent.bin"},
		{[]string{"eval", "--weights", "fashion-mlp"}, "not a parity model"},
		{[]string{"eval", "--weights", "fashion-parity-sum-k2", "--data", corrupt}, "Fashion-MNIST t10k set under " + corrupt},
		{[]string{"frobnicate"}, `unknown subcommand "frobnicate"`},
	} {
		err := runParity(c.args)
		if c.want == "--progress" {
			if _, statErr := os.Stat(models.FashionDir); statErr != nil {
				continue // needs the dataset to get that far
			}
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("hams parity %s: %v, want an error naming %q", strings.Join(c.args, " "), err, c.want)
		}
		if _, err := os.Stat(out); err == nil {
			t.Fatalf("hams parity %s left %s behind", strings.Join(c.args, " "), out)
		}
	}
}

// A black-box deployed model reached through the reference adapter: the
// labels come from its answers, the parity model trains (a short run on a
// subset), the weights file and the contract JSON come out, and hams
// parity eval scores the file against the same server.
func TestParityTrainBlackBox(t *testing.T) {
	if _, _, err := models.LoadFashion(models.FashionDir, "t10k"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("dataset missing in CI: %v", err)
		}
		t.Skipf("Fashion-MNIST not installed: %v", err)
	}
	d, err := config.Parse([]byte(`
name: p
hosts: [h1]
models:
  - {name: fashion, kind: classifier, params: {deterministic: 1}}
services:
  - {name: s, edges: [[frontend, fashion], [fashion, frontend]]}
`))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := refserver.New(refserver.Config{Deployment: d, Models: []string{"fashion"}, GRPCListener: lis, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	dir := t.TempDir()
	out, js := filepath.Join(dir, "bb.bin"), filepath.Join(dir, "bb.json")
	addr := lis.Addr().String()
	err = runParity([]string{"train", "--deployed-addr", addr, "--backend", "reference", "--deployed-model", "fashion",
		"--train-images", "3000", "--test-images", "600", "--val", "500", "--epochs", "3", "--arch", "mlp:32", "--progress", "none",
		"--out", out, "--json", js})
	if err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rows); err != nil || len(rows) != 1 {
		t.Fatalf("json %s: %v", b, err)
	}
	row := rows[0]
	for _, f := range []string{"k", "r", "encoder", "aa", "ad", "agreement", "ao"} {
		if _, ok := row[f]; !ok {
			t.Fatalf("row without %q: %v", f, row)
		}
	}
	ao := row["ao"].(map[string]any)
	if row["k"].(float64) != 2 || row["r"].(float64) != 1 || row["encoder"] != "sum" || len(ao) != 3 || ao["0.05"] == nil {
		t.Fatalf("row %v", row)
	}
	if ad := row["ad"].(float64); ad < 0.3 {
		t.Fatalf("Ad %.3f after a short black-box run: not well above the 0.10 default", ad)
	}
	// hams parity eval scores the file against the same black box.
	js2 := filepath.Join(dir, "eval.json")
	if err := runParity([]string{"eval", "--weights", out, "--deployed-addr", addr, "--backend", "reference", "--test-images", "600", "--json", js2}); err != nil {
		t.Fatal(err)
	}
	b2, _ := os.ReadFile(js2)
	var rows2 []map[string]any
	if err := json.Unmarshal(b2, &rows2); err != nil || len(rows2) != 1 || rows2[0]["ad"] != row["ad"] {
		t.Fatalf("eval %s, train %v: %v", b2, row, err)
	}
}
