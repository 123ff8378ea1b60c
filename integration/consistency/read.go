package consistency

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/hams-go/hams/internal/audit"
)

// Sentinel errors, wrapped by Check's errors.
var (
	// ErrMalformed: an audit line that does not decode or lacks a field.
	ErrMalformed = errors.New("consistency: malformed audit record")
	// ErrNoAudit: no durable.jsonl or replies.jsonl under the directory.
	ErrNoAudit = errors.New("consistency: no audit files")
	// ErrAccepted: an Accepted entry names neither a req_id nor a client id.
	ErrAccepted = errors.New("consistency: bad accepted entry")
)

// durRec is a durable record with where it was read.
type durRec struct {
	audit.Durable
	src string
}

// repRec is a reply record with where it was read.
type repRec struct {
	audit.Reply
	src string
}

// records is everything read from an audit directory. Records are in file
// order (lexical walk) and line order, so every result is deterministic.
type records struct {
	durable      []durRec
	replies      []repRec
	durableFiles int
	replyFiles   int
	torn         []string
}

// readDir reads every durable.jsonl and replies.jsonl under dir.
func readDir(dir string) (*records, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("consistency: read audit dir: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("consistency: audit dir %s is not a directory", dir)
	}
	rs := &records{}
	err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, rerr := filepath.Rel(dir, p)
		if rerr != nil {
			rel = p
		}
		switch d.Name() {
		case audit.DurableFile:
			rs.durableFiles++
			return readFile(p, rel, &rs.torn, func(src string, line []byte) error {
				var r durRec
				if err := decode(line, &r.Durable); err != nil {
					return err
				}
				if err := validDurable(&r.Durable); err != nil {
					return err
				}
				r.src = src
				rs.durable = append(rs.durable, r)
				return nil
			})
		case audit.RepliesFile:
			rs.replyFiles++
			return readFile(p, rel, &rs.torn, func(src string, line []byte) error {
				var r repRec
				if err := decode(line, &r.Reply); err != nil {
					return err
				}
				if err := validReply(&r.Reply); err != nil {
					return err
				}
				r.src = src
				rs.replies = append(rs.replies, r)
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("consistency: read audit logs under %s: %w", dir, err)
	}
	if rs.durableFiles+rs.replyFiles == 0 {
		return nil, fmt.Errorf("%w: no %s or %s under %s", ErrNoAudit, audit.DurableFile, audit.RepliesFile, dir)
	}
	return rs, nil
}

// readFile hands each non-empty line of p to rec with its source
// "rel:line". A final line without newline that does not decode is a
// write torn by a crash: it is recorded in torn, not an error (a record is
// flushed before anything depends on it, so a torn one carries nothing a
// reply relied on). Every other bad line is an ErrMalformed error naming
// file and line.
func readFile(p, rel string, torn *[]string, rec func(src string, line []byte) error) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 256<<10)
	for n := 1; ; n++ {
		line, rerr := br.ReadBytes('\n')
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			return fmt.Errorf("read %s: %w", rel, rerr)
		}
		last := rerr != nil // EOF: line has no newline
		src := fmt.Sprintf("%s:%d", rel, n)
		if b := bytes.TrimSpace(line); len(b) > 0 {
			if err := rec(src, b); err != nil {
				if last {
					*torn = append(*torn, src)
				} else {
					return fmt.Errorf("%w: %s: %v", ErrMalformed, src, err)
				}
			}
		}
		if last {
			return nil
		}
	}
}

// decode unmarshals one line; fields the checker does not know are
// allowed (producers may add some), trailing data is not.
func decode(line []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the record")
	}
	return nil
}

func validDurable(d *audit.Durable) error {
	if d.Model == "" {
		return errors.New("durable record without model")
	}
	if d.Seq == 0 {
		return errors.New("durable record without seq (seqs start at 1)")
	}
	for _, f := range []struct{ name, v string }{
		{"input_digest", d.InputDigest}, {"output_digest", d.OutputDigest}, {"state_digest", d.StateDigest},
	} {
		if err := validDigest(f.name, f.v); err != nil {
			return err
		}
	}
	return nil
}

func validReply(r *audit.Reply) error {
	if r.ReqID == "" {
		return errors.New("reply record without req_id")
	}
	if err := validDigest("reply_digest", r.ReplyDigest); err != nil {
		return err
	}
	for i, s := range r.Lineage {
		if s.Model == "" {
			return fmt.Errorf("lineage step %d without model", i)
		}
		if s.Seq == 0 {
			return fmt.Errorf("lineage step %d (%s) without seq", i, s.Model)
		}
		if err := validDigest(fmt.Sprintf("lineage step %d (%s) output_digest", i, s.Model), s.OutputDigest); err != nil {
			return err
		}
	}
	return nil
}

// validDigest accepts a hex SHA-256 (64 lowercase hex digits), the
// contract's digest format.
func validDigest(name, v string) error {
	if len(v) != 64 {
		return fmt.Errorf("%s %q is not a hex SHA-256", name, v)
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return fmt.Errorf("%s %q is not a hex SHA-256", name, v)
		}
	}
	return nil
}
