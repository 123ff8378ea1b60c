package audit

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestWriteReadAcrossFiles(t *testing.T) {
	dir := t.TempDir()
	a, err := Open(dir, "p1", DurableFile)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(dir, "p2", DurableFile)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			l := a
			if i%2 == 1 {
				l = b
			}
			if err := l.Write(Durable{Model: "m", Seq: uint64(i), StateDigest: "s"}); err != nil {
				t.Error(err)
			}
		}(i)
	}
	wg.Wait()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	a.Close() // idempotent
	b.Close()
	if err := a.Write(Durable{}); err == nil {
		t.Fatal("write after close accepted")
	}
	recs, err := ReadAll[Durable](dir, DurableFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 50 {
		t.Fatalf("read %d records, want 50", len(recs))
	}
	seen := map[uint64]bool{}
	for _, r := range recs {
		seen[r.Seq] = true
	}
	if len(seen) != 50 {
		t.Fatal("records lost or duplicated")
	}
}

func TestReadAllNamesTheBadLine(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, RepliesFile), []byte(`{"req_id":"1"}`+"\n{bad\n"), 0o644)
	_, err := ReadAll[Reply](dir, RepliesFile)
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("got %v", err)
	}
}
