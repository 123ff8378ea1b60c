package harness

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// The demo's status line keeps its figures: elapsed of the total, the
// bar, and what the caller reports.
func TestLoadBar(t *testing.T) {
	var b bytes.Buffer
	done := make(chan struct{})
	go func() { time.Sleep(1200 * time.Millisecond); close(done) }()
	LoadBar(&b, time.Second, done, func() string { return "replies 7  errors 0  p50 1.25ms" })
	out := b.String()
	for _, want := range []string{"[########################]", "1.0s/1s", "replies 7  errors 0  p50 1.25ms", "100%"} {
		if !strings.Contains(out, want) {
			t.Errorf("status line lacks %q: %q", want, out)
		}
	}
	if !strings.HasSuffix(out, "\n") {
		t.Errorf("status line not ended: %q", out)
	}
}
