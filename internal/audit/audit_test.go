package audit

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
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

// Whatever is on disk after any Write is a run of whole records: a
// record larger than the buffer never reaches the file in two writes.
func TestFileHoldsOnlyWholeRecords(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, "p", DurableFile)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "p", DurableFile)
	sizes := []int{10, 40 << 10, 10, 100 << 10, 30 << 10, 30 << 10, 200 << 10, 5}
	for i, n := range sizes {
		if err := l.Write(Durable{Model: "m", Seq: uint64(i + 1), InputDigest: strings.Repeat("x", n)}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > 0 && b[len(b)-1] != '\n' {
			t.Fatalf("after record %d the file ends mid-record (%d bytes)", i+1, len(b))
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	recs, err := ReadAll[Durable](dir, DurableFile)
	if err != nil || len(recs) != len(sizes) {
		t.Fatalf("read %d records, %v", len(recs), err)
	}
	for i, r := range recs {
		if r.Seq != uint64(i+1) || len(r.InputDigest) != sizes[i] {
			t.Fatalf("record %d: seq %d, %d bytes", i, r.Seq, len(r.InputDigest))
		}
	}
}

// A record torn by a writer killed mid-write is cut off when the file is
// opened again, so the next record is not glued to it; a reader skips a
// torn final line.
func TestTornTail(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "p", DurableFile)
	os.MkdirAll(filepath.Dir(p), 0o755)
	whole := `{"model":"m","seq":1,"input_digest":"","output_digest":"","state_digest":""}` + "\n"
	torn := `{"model":"m","seq":2,"inp`
	if err := os.WriteFile(p, []byte(whole+torn), 0o644); err != nil {
		t.Fatal(err)
	}
	recs, err := ReadAll[Durable](dir, DurableFile)
	if err != nil || len(recs) != 1 || recs[0].Seq != 1 {
		t.Fatalf("reading a torn final line: %v %v", recs, err)
	}
	l, err := Open(dir, "p", DurableFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Write(Durable{Model: "m", Seq: 3}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	if lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n"); len(lines) != 2 || lines[0]+"\n" != whole {
		t.Fatalf("file after reopening: %q", b)
	}
	recs, err = ReadAll[Durable](dir, DurableFile)
	if err != nil || len(recs) != 2 || recs[1].Seq != 3 {
		t.Fatalf("after reopening: %v %v", recs, err)
	}
	// A file holding only a torn record (longer than one scan block) is
	// emptied.
	if err := os.WriteFile(p, []byte(`{"model":"`+strings.Repeat("m", 10000)), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err = Open(dir, "p", DurableFile)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if st, err := os.Stat(p); err != nil || st.Size() != 0 {
		t.Fatalf("torn-only file not emptied: %v %v", st.Size(), err)
	}
	// A torn line that is not the last one is an error.
	if err := os.WriteFile(p, []byte(torn+"\n"+whole), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadAll[Durable](dir, DurableFile); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("torn middle line: %v", err)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "file")
	os.WriteFile(f, nil, 0o644)
	if _, err := Open(f, "sub", DurableFile); err == nil {
		t.Fatal("Open under a regular file succeeded")
	}
	os.Mkdir(filepath.Join(dir, "d"), 0o755)
	if _, err := Open(dir, "", "d"); err == nil {
		t.Fatal("Open of a directory succeeded")
	}
	var nilLog *Log
	if nilLog.Write(Durable{}) != nil || nilLog.Flush() != nil || nilLog.Close() != nil {
		t.Fatal("nil Log is not a no-op")
	}
	l, err := Open(dir, "", DurableFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Write(func() {}); err == nil {
		t.Fatal("unencodable record accepted")
	}
	l.Close()
}

// TestReplyApproximateMark: a reply record carries "approximate": true
// only when the reply is approximate; an exact record keeps exactly the
// contract's fields, and a record written before the field existed reads
// as exact.
func TestReplyApproximateMark(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, "fe", RepliesFile)
	if err != nil {
		t.Fatal(err)
	}
	digest := strings.Repeat("ab", 32)
	steps := []LineageStep{{Model: "m", Seq: 1, OutputDigest: digest}}
	for _, r := range []Reply{
		{ReqID: "1", Lineage: steps, ReplyDigest: digest, Approximate: true},
		{ReqID: "2", Lineage: steps, ReplyDigest: digest},
	} {
		if err := l.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "fe", RepliesFile))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2: %q", len(lines), b)
	}
	keys := func(line string) string {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		if v, ok := m["approximate"]; ok && string(v) != "true" {
			t.Fatalf("%q: approximate is %s", line, v)
		}
		return strings.Join(ks, ",")
	}
	if got := keys(lines[0]); got != "approximate,lineage,reply_digest,req_id" {
		t.Fatalf("approximate record has fields %s: %s", got, lines[0])
	}
	if got := keys(lines[1]); got != "lineage,reply_digest,req_id" {
		t.Fatalf("exact record has fields %s: %s", got, lines[1])
	}
	// An old record (no approximate field) next to the new ones.
	old := `{"req_id":"3","lineage":[],"reply_digest":"` + digest + `"}` + "\n"
	if err := os.MkdirAll(filepath.Join(dir, "old"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "old", RepliesFile), []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	recs, err := ReadAll[Reply](dir, RepliesFile)
	if err != nil {
		t.Fatal(err)
	}
	approx := map[string]bool{}
	for _, r := range recs {
		approx[r.ReqID] = r.Approximate
	}
	if len(recs) != 3 || !approx["1"] || approx["2"] || approx["3"] {
		t.Fatalf("read back %+v", recs)
	}
}
