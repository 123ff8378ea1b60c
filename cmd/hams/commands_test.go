package main

import (
	"bytes"
	"runtime"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// run dispatches args with stdout and stderr captured.
func runCaptured(t *testing.T, args ...string) (code int, out, errOut string) {
	t.Helper()
	var o, e bytes.Buffer
	oldOut, oldErr := stdout, stderr
	stdout, stderr = &o, &e
	defer func() { stdout, stderr = oldOut, oldErr }()
	code = dispatch(args)
	return code, o.String(), e.String()
}

func TestVersion(t *testing.T) {
	for _, flag := range []string{"--version", "-v"} {
		code, out, _ := runCaptured(t, flag)
		if code != 0 {
			t.Fatalf("hams %s: exit %d", flag, code)
		}
		for _, want := range []string{"hams version " + version, "commit ", runtime.Version(), runtime.GOOS + "/" + runtime.GOARCH} {
			if !strings.Contains(out, want) {
				t.Errorf("hams %s: %q lacks %q", flag, out, want)
			}
		}
	}
	old := version
	version = "v9.8.7"
	defer func() { version = old }()
	if _, out, _ := runCaptured(t, "--version"); !strings.HasPrefix(out, "hams version v9.8.7, commit ") {
		t.Fatalf("-ldflags -X main.version: %q", out)
	}
}

// Every command of the tree (hidden ones too) answers -h with exit 0, its
// description and an example; `hams help NAME` says the same.
func TestEveryCommandHelp(t *testing.T) {
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		path := strings.Fields(c.CommandPath())[1:]
		if len(path) > 0 && (path[0] == "help" || path[0] == "completion" && len(path) > 1) {
			return // cobra's own help and per-shell completion commands
		}
		n++
		t.Run(strings.Join(append([]string{"hams"}, path...), "_"), func(t *testing.T) {
			if c.Short == "" || c.Long == "" || c.Example == "" {
				t.Fatalf("%s: Short %q, Long %q, Example %q: each must be set", c.CommandPath(), c.Short, c.Long, c.Example)
			}
			firstLine, _, _ := strings.Cut(c.Long, "\n")
			for _, h := range []string{"-h", "--help"} {
				code, out, errOut := runCaptured(t, append(path, h)...)
				if code != 0 {
					t.Fatalf("%s %s: exit %d\n%s", c.CommandPath(), h, code, errOut)
				}
				for _, want := range []string{firstLine, c.Example, "Usage:"} {
					if !strings.Contains(out, want) {
						t.Fatalf("%s %s lacks %q:\n%s", c.CommandPath(), h, want, out)
					}
				}
			}
			if len(path) == 0 {
				return
			}
			code, out, _ := runCaptured(t, append([]string{"help"}, path...)...)
			if code != 0 || !strings.Contains(out, firstLine) || !strings.Contains(out, c.Example) {
				t.Fatalf("hams help %s: exit %d:\n%s", strings.Join(path, " "), code, out)
			}
		})
	}
	walk(newRootCmd())
	if n < 16 {
		t.Fatalf("walked %d commands, want every one (16 and completion)", n)
	}
}

// A command's help lists its flag set's flags (the contract's among them).
func TestHelpListsFlags(t *testing.T) {
	for _, c := range []struct {
		cmd   []string
		flags []string
	}{
		{[]string{"demo"}, []string{"--service", "--duration", "--kill", "--json", "--mode", "--audit"}},
		{[]string{"bench"}, []string{"--service", "--modes", "--batch", "--requests", "--json"}},
		{[]string{"chaos"}, []string{"--service", "--duration", "--seed", "--audit", "--json", "--mode"}},
		{[]string{"up"}, []string{"--config", "--mode", "--audit"}},
		{[]string{"parity", "eval"}, []string{"--json"}},
		{[]string{"bench", "--service", "parm"}, []string{"--redundancy", "--k"}},
	} {
		code, out, _ := runCaptured(t, append(c.cmd, "-h")...)
		if code != 0 {
			t.Fatalf("%v -h: exit %d", c.cmd, code)
		}
		for _, f := range append(c.flags, "-h, --help") {
			if !strings.Contains(out, "\n  "+f) {
				t.Errorf("%v -h lacks flag %s:\n%s", c.cmd, f, out)
			}
		}
	}
}

// The contract's flags parse in every spelling the flag package took
// before cobra: --flag value, --flag=value, -flag value.
func TestContractFlagSpellings(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--batch", "0"}, {"bench", "--batch=0"}, {"bench", "-batch", "0"}, {"bench", "-batch=0"},
	} {
		code, _, errOut := runCaptured(t, args...)
		if code != 2 || !strings.Contains(errOut, "--batch") {
			t.Errorf("%v: exit %d, want 2 (--batch 0 refused)", args, code)
		}
	}
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"demo", "--no-such-flag"}, 2},
		{[]string{"demo", "extra"}, 2},
		{[]string{"report"}, 2},
		{[]string{"report", "bench", "-h"}, 0},
		{[]string{"report", "recovery", "/nonexistent.json"}, 2},
		{[]string{"parity"}, 2},
		{[]string{"parity", "frob"}, 2},
		{[]string{"help"}, 0},
		{[]string{"--help"}, 0},
		{[]string{"--no-such-flag"}, 2},
		{[]string{"completion", "bash"}, 0},
		{[]string{"completion", "nosh"}, 2},
	} {
		if code, _, _ := runCaptured(t, c.args...); code != c.code {
			t.Errorf("%v: exit %d, want %d", c.args, code, c.code)
		}
	}
	if _, _, errOut := runCaptured(t, "demoo"); !strings.Contains(errOut, `unknown command "demoo"`) || !strings.Contains(errOut, "did you mean demo") {
		t.Errorf("unknown command: %q", errOut)
	}
}

// Shell completion offers subcommands and a command's own flags.
func TestCompletion(t *testing.T) {
	_, out, _ := runCaptured(t, cobra.ShellCompRequestCmd, "de")
	if !strings.Contains(out, "demo") {
		t.Fatalf("command completion: %q", out)
	}
	_, out, _ = runCaptured(t, cobra.ShellCompRequestCmd, "chaos", "--se")
	if !strings.Contains(out, "--service\t") || !strings.Contains(out, "--seed\t") {
		t.Fatalf("flag completion of chaos: %q", out)
	}
	if _, out, _ = runCaptured(t, "completion", "zsh"); !strings.Contains(out, "#compdef hams") {
		t.Fatalf("zsh completion script: %.200q", out)
	}
}
