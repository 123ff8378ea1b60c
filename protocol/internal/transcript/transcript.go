// Package transcript runs text transcript tests (in the style of
// cockroachdb/datadriven, which this module does not depend on): a file
// of cases, each one or more input lines, a "----" line and the expected
// output, ended by a blank line or the end of the file:
//
//	# a comment (only between cases)
//	a.primary computed batch=1
//	----
//	a.primary: release batch=1
//
// The test's handler turns a case's input into its output; Run compares
// it with the expected output, or with -update rewrites the file with
// the outputs (comments and inputs are kept as they are). An output never
// contains a blank line (it would end the case).
package transcript

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite transcript files with the actual outputs")

// Separator ends a case's input.
const Separator = "----"

// Case is one case of a transcript file.
type Case struct {
	// Pos is "file:line" of the case's first input line.
	Pos string
	// Cmd and Args are the first input line's words: Cmd the first, Args
	// the others (Arg parses key=value words).
	Cmd  string
	Args []string
	// Lines are the input lines, the first included.
	Lines []string
	// Expected is the expected output as written in the file (lines
	// joined by "\n", no trailing newline).
	Expected string

	lead []string // comment and blank lines before the case
}

// Arg returns the value of the key=value word key and whether it is
// there; a bare word key counts as present with value "".
func Arg(args []string, key string) (string, bool) {
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if k == key {
			if !ok {
				return "", true
			}
			return v, true
		}
	}
	return "", false
}

// Uint returns the key=N word as a number; a missing key is def, a
// malformed one an error.
func Uint(args []string, key string, def uint64) (uint64, error) {
	v, ok := Arg(args, key)
	if !ok {
		return def, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("transcript: %s=%q: %w", key, v, err)
	}
	return n, nil
}

// Parse reads a transcript file's text into its cases and the text after
// the last case.
func Parse(name, text string) (cases []*Case, tail []string, err error) {
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	var lead []string
	for i := 0; i < len(lines); {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			lead = append(lead, l)
			i++
			continue
		}
		c := &Case{Pos: fmt.Sprintf("%s:%d", name, i+1), lead: lead}
		lead = nil
		for ; i < len(lines) && lines[i] != Separator; i++ {
			if strings.TrimSpace(lines[i]) == "" {
				return nil, nil, fmt.Errorf("transcript: %s: blank line before %q", c.Pos, Separator)
			}
			c.Lines = append(c.Lines, lines[i])
		}
		if i == len(lines) {
			return nil, nil, fmt.Errorf("transcript: %s: no %q line", c.Pos, Separator)
		}
		i++ // the separator
		var out []string
		for ; i < len(lines) && strings.TrimSpace(lines[i]) != ""; i++ {
			out = append(out, lines[i])
		}
		c.Expected = strings.Join(out, "\n")
		f := strings.Fields(c.Lines[0])
		c.Cmd, c.Args = f[0], f[1:]
		cases = append(cases, c)
	}
	return cases, lead, nil
}

// Run runs every case of file path through handle, in order, and fails t
// on each output that differs from the expected one (-update: rewrites
// the file instead).
func Run(t *testing.T, path string, handle func(t *testing.T, c *Case) string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cases, tail, err := Parse(filepath.Base(path), string(data))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, c := range cases {
		got := strings.TrimRight(handle(t, c), "\n")
		for _, l := range strings.Split(got, "\n") {
			if strings.TrimSpace(l) == "" && got != "" {
				t.Fatalf("%s: the output has a blank line (it would end the case):\n%s", c.Pos, got)
			}
		}
		if !*update && got != c.Expected {
			t.Errorf("%s: output differs for\n%s\n--- expected\n%s\n+++ got\n%s", c.Pos, strings.Join(c.Lines, "\n"), c.Expected, got)
		}
		for _, l := range c.lead {
			b.WriteString(l + "\n")
		}
		for _, l := range c.Lines {
			b.WriteString(l + "\n")
		}
		b.WriteString(Separator + "\n")
		if got != "" {
			b.WriteString(got + "\n")
		}
	}
	for _, l := range tail {
		b.WriteString(l + "\n")
	}
	if *update && b.String() != string(data) {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s rewritten", path)
	}
}

// Walk runs Run on every *.txt file of dir, each as a subtest named by
// the file, with a handler made for that file by newHandler (the state a
// transcript builds up is its own).
func Walk(t *testing.T, dir string, newHandler func() func(t *testing.T, c *Case) string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no transcripts in %s", dir)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { Run(t, f, newHandler()) })
	}
}
