// Package audit writes the JSONL audit logs of the command-line contract
// (DESIGN.md): durable.jsonl, one record per request covered by a snapshot a
// backup applied, and replies.jsonl, one record per reply released to a
// client. Any number of files of these names may exist under an audit
// directory (one per process); the consistency checker reads them all.
package audit

import (
	"bufio"
	"encoding/json"
	"fmt"
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

// Reply is one reply released to a client.
type Reply struct {
	ReqID       string        `json:"req_id"`
	Lineage     []LineageStep `json:"lineage"`
	ReplyDigest string        `json:"reply_digest"`
}

// Log appends records of one kind to a JSONL file. Safe for concurrent
// use. Records are flushed at least on Flush and Close; a record is written
// whole or not at all from the reader's point of view only after Flush.
type Log struct {
	mu  sync.Mutex
	f   *os.File
	w   *bufio.Writer
	enc *json.Encoder
}

// Open creates dir/sub/name (sub may be empty), appending if it exists.
func Open(dir, sub, name string) (*Log, error) {
	d := filepath.Join(dir, sub)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, fmt.Errorf("audit: create %s: %w", d, err)
	}
	p := filepath.Join(d, name)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("audit: open %s: %w", p, err)
	}
	w := bufio.NewWriterSize(f, 64<<10)
	return &Log{f: f, w: w, enc: json.NewEncoder(w)}, nil
}

// Write appends one record.
func (l *Log) Write(rec any) error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return fmt.Errorf("audit: write after close")
	}
	if err := l.enc.Encode(rec); err != nil {
		return fmt.Errorf("audit: write record: %w", err)
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
	return l.w.Flush()
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
	err := l.w.Flush()
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	l.f = nil
	return err
}

// ReadAll reads every file named name under dir (recursively) and decodes
// each line into a new T.
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
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		line := 0
		for sc.Scan() {
			line++
			if len(sc.Bytes()) == 0 {
				continue
			}
			var v T
			if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
				return fmt.Errorf("audit: %s line %d: %w", p, line, err)
			}
			out = append(out, v)
		}
		return sc.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("audit: read %s under %s: %w", name, dir, err)
	}
	return out, nil
}
