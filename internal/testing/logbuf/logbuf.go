// Package logbuf is a log sink for tests whose loggers many goroutines
// write to (servers, pools): a bytes.Buffer behind a mutex.
package logbuf

import (
	"bytes"
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
