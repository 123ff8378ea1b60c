// Package logbuf is a log sink for tests whose loggers many goroutines
// write to (servers, pools): a bytes.Buffer behind a mutex.
package logbuf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
)

// Buffer collects what is written to it; safe for concurrent use. The
// zero value is ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Records decodes every line written so far as one JSON object (a slog
// JSON handler's records), in order; a line that is not one is an error
// naming it.
func (l *Buffer) Records() ([]map[string]any, error) {
	var out []map[string]any
	for _, ln := range strings.Split(strings.TrimSpace(l.String()), "\n") {
		if ln == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(ln), &m); err != nil {
			return nil, fmt.Errorf("log line %q is not JSON: %w", ln, err)
		}
		out = append(out, m)
	}
	return out, nil
}
