package protos_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGeneratedCodeIsCurrent regenerates every .pb.go into a temporary
// directory with the pinned plugins (make tools) and fails if any committed
// file differs or is missing.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	for _, tool := range []string{"protoc", "protoc-gen-go", "protoc-gen-go-grpc"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s not on PATH: CI must install it (apt-get install protobuf-compiler; make tools)", tool)
			}
			t.Skipf("%s not on PATH (apt-get install protobuf-compiler; make tools)", tool)
		}
	}
	out := t.TempDir()
	cmd := exec.Command("./gen.sh", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gen.sh: %v\n%s", err, b)
	}
	n := 0
	err := filepath.Walk(out, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(out, p)
		want, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		got, err := os.ReadFile(rel)
		if err != nil {
			t.Errorf("%s: generated but not committed (run make proto)", rel)
			return nil
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: stale (run make proto)", rel)
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The reverse: a committed .pb.go without a .proto is stale too.
	err = filepath.Walk(".", func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || !strings.HasSuffix(p, ".pb.go") {
			return err
		}
		if _, err := os.Stat(filepath.Join(out, p)); err != nil {
			t.Errorf("%s: committed but no .proto generates it", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("gen.sh generated nothing")
	}
}
