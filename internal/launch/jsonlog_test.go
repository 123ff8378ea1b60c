package launch

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestChildLogIsJSONLines: the supervisor's own records in a child's log
// (start, stray stdout, exit) are JSON lines, so a log of a child that
// logs JSON parses line by line from its first line on.
func TestChildLogIsJSONLines(t *testing.T) {
	s := newSup(t, nil)
	if _, err := s.Start(context.Background(), Spec{Name: "j", Args: []string{"serve", "x"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(s.LogPath("j"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var msgs []string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("line %d %q is not JSON: %v", n, sc.Text(), err)
		}
		msg, _ := rec["msg"].(string)
		msgs = append(msgs, msg)
		if msg == "launch: stdout" && !strings.Contains(rec["line"].(string), "some noise") {
			t.Fatalf("stdout record %v lacks the child's line", rec)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{"launch: start", "launch: stdout", "launch: exit"}
	if strings.Join(msgs, ",") != strings.Join(want, ",") {
		t.Fatalf("records %q, want %q", msgs, want)
	}
}
