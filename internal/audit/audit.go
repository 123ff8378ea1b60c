// Package audit writes the JSONL audit logs of the command-line contract
// (docs/design.md): durable.jsonl, one record per request covered by a snapshot a
// backup applied, and replies.jsonl, one record per reply released to a
// client (marked "approximate" when it is a parity reconstruction). Any number of files of these names may exist under an audit
// directory (one per process); the consistency checker reads them all.
package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
)

// File names of the contract.
const (
	DurableFile = "durable.jsonl"
	RepliesFile = "replies.jsonl"
)

// Durable is one request covered by an applied snapshot.
type Durable struct {
	Model        string `json:"model"`
	Seq          uint64 `json:"seq"`
	InputDigest  string `json:"input_digest"`
	OutputDigest string `json:"output_digest"`
	StateDigest  string `json:"state_digest"`
}

// LineageStep is one model a reply went through.
type LineageStep struct {
	Model        string `json:"model"`
	Seq          uint64 `json:"seq"`
	OutputDigest string `json:"output_digest"`
}

// Reply is one reply released to a client. Approximate marks a reply
// whose tensors are (or were computed from) a parity model's
// reconstruction rather than the deployed model's own output (docs/design.md,
// "Parity models"); it is omitted when false, so exact replies keep the
// contract's three fields and records written before the field existed
// read as exact.
type Reply struct {
	ReqID       string        `json:"req_id"`
	Lineage     []LineageStep `json:"lineage"`
	ReplyDigest string        `json:"reply_digest"`
	Approximate bool          `json:"approximate,omitempty"`
}

// bufferBytes is the size at which Write flushes buffered records.
const bufferBytes = 64 << 10

// Log appends records of one kind to a JSONL file. Safe for concurrent
// use. Records are buffered and flushed at least on Flush and Close (and
// whenever the buffer reaches bufferBytes). Every write to the file is a
// run of whole records, each ending in a newline, in one write call: a
// process killed mid-write leaves at most an unterminated final line,
// never part of a record followed by a later one.
type Log struct {
	mu  sync.Mutex
	f   *os.File
	buf []byte
}

// Open creates dir/sub/name (sub may be empty), appending if it exists.
// An unterminated final line left by a writer killed mid-write is cut
// off first, so the next record starts on a line of its own.
func Open(dir, sub, name string) (*Log, error) {
	d := filepath.Join(dir, sub)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, fmt.Errorf("audit: create %s: %w", d, err)
	}
	p := filepath.Join(d, name)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("audit: open %s: %w", p, err)
	}
	if err := cutTornTail(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("audit: open %s: %w", p, err)
	}
	return &Log{f: f, buf: make([]byte, 0, bufferBytes)}, nil
}

// cutTornTail truncates f after its last newline when it does not end in
// one.
func cutTornTail(f *os.File) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	if size == 0 {
		return nil
	}
	var last [1]byte
	if _, err := f.ReadAt(last[:], size-1); err != nil {
		return fmt.Errorf("read last byte: %w", err)
	}
	if last[0] == '\n' {
		return nil
	}
	// Scan back for the last newline, a block at a time.
	const block = 4096
	end := size
	for end > 0 {
		start := max(end-block, 0)
		b := make([]byte, end-start)
		if _, err := f.ReadAt(b, start); err != nil {
			return fmt.Errorf("read tail: %w", err)
		}
		if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
			return f.Truncate(start + int64(i) + 1)
		}
		end = start
	}
	return f.Truncate(0)
}

// Write appends one record.
func (l *Log) Write(rec any) error {
	if l == nil {
		return nil
	}
	line, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("audit: write record: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return fmt.Errorf("audit: write after close")
	}
	l.buf = append(l.buf, line...)
	l.buf = append(l.buf, '\n')
	if len(l.buf) >= bufferBytes {
		return l.flushLocked()
	}
	return nil
}

// flushLocked writes the buffered whole records in one write call
// (caller holds mu).
func (l *Log) flushLocked() error {
	if len(l.buf) == 0 {
		return nil
	}
	_, err := l.f.Write(l.buf)
	l.buf = l.buf[:0]
	if cap(l.buf) > 4*bufferBytes {
		l.buf = make([]byte, 0, bufferBytes)
	}
	if err != nil {
		return fmt.Errorf("audit: flush: %w", err)
	}
	return nil
}

// Flush writes buffered records to the file.
func (l *Log) Flush() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	return l.flushLocked()
}

// Close flushes and closes; it is idempotent.
func (l *Log) Close() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.flushLocked()
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	l.f = nil
	return err
}

// ReadAll reads every file named name under dir (recursively) and decodes
// each line into a new T. A final line without its newline that does not
// decode is skipped: a record torn by a writer killed mid-write.
func ReadAll[T any](dir, name string) ([]T, error) {
	var out []T
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != name {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		r := bufio.NewReaderSize(f, 1<<20)
		for line := 1; ; line++ {
			b, err := r.ReadBytes('\n')
			if err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			torn := errors.Is(err, io.EOF)
			if b = bytes.TrimSpace(b); len(b) > 0 {
				var v T
				if uerr := json.Unmarshal(b, &v); uerr != nil {
					if torn {
						return nil
					}
					return fmt.Errorf("audit: %s line %d: %w", p, line, uerr)
				}
				out = append(out, v)
			}
			if torn {
				return nil
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("audit: read %s under %s: %w", name, dir, err)
	}
	return out, nil
}
