package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hamsBin is the binary built once for the whole package.
var hamsBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hams-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	hamsBin = filepath.Join(dir, "hams")
	if bin := os.Getenv("HAMS_BIN"); bin != "" {
		// A prebuilt binary (e.g. one built with -race or an overlay).
		hamsBin = bin
		code := m.Run()
		os.RemoveAll(dir)
		os.Exit(code)
	}
	build := exec.Command("go", "build", "-o", hamsBin, "./cmd/hams")
	build.Dir = ".."
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build hams:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// result of a finished hams command.
type result struct {
	code           int
	stdout, stderr string
}

// runHams runs the binary to completion (bounded by timeout).
func runHams(t *testing.T, timeout time.Duration, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, hamsBin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("hams %s: %v\nstderr:\n%s", strings.Join(args, " "), err, errb.String())
	}
	if ctx.Err() != nil {
		t.Fatalf("hams %s: timed out after %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), timeout, r.stdout, r.stderr)
	}
	return r
}

// proc is a long-running hams process whose first stdout line is JSON.
type proc struct {
	cmd    *exec.Cmd
	ready  map[string]any
	stderr *bytes.Buffer
	// done receives the exit once (a test that reads it takes it); exited
	// is closed after it was sent, for any number of waiters.
	done   chan error
	exited chan struct{}
}

// startHams starts the binary and waits for its JSON ready line.
func startHams(t *testing.T, timeout time.Duration, args ...string) *proc {
	t.Helper()
	noteUp(t, args)
	return startProc(t, timeout, exec.Command(hamsBin, args...), args)
}

// startProc starts cmd (hams, or hams under a wrapper such as `ip netns
// exec`) and waits for its JSON ready line.
func startProc(t *testing.T, timeout time.Duration, cmd *exec.Cmd, args []string) *proc {
	t.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &proc{cmd: cmd, stderr: &bytes.Buffer{}, done: make(chan error, 1), exited: make(chan struct{})}
	cmd.Stderr = &lockedWriter{b: p.stderr}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Whatever happened, nothing of the process group survives the test.
		// Waits on exited, not done: after stop (or a test's own receive
		// from done) done stays empty, and waiting on it took the whole
		// 10 s of every such test.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
		}
	})
	lines := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(out)
		s.Buffer(make([]byte, 1<<20), 1<<20)
		first := true
		for s.Scan() {
			if first {
				lines <- s.Text()
				first = false
			}
		}
		if first {
			close(lines)
		}
	}()
	go func() { p.done <- cmd.Wait(); close(p.exited) }()
	select {
	case l, ok := <-lines:
		if !ok {
			t.Fatalf("hams %s exited without a ready line; stderr:\n%s", strings.Join(args, " "), p.stderrText())
		}
		if err := json.Unmarshal([]byte(l), &p.ready); err != nil {
			t.Fatalf("ready line %q: %v", l, err)
		}
	case <-time.After(timeout):
		t.Fatalf("hams %s: no ready line within %v; stderr:\n%s", strings.Join(args, " "), timeout, p.stderrText())
	}
	return p
}

func (p *proc) stderrText() string {
	lw := p.cmd.Stderr.(*lockedWriter)
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.b.String()
}

func (p *proc) str(t *testing.T, key string) string {
	t.Helper()
	s, ok := p.ready[key].(string)
	if !ok || s == "" {
		t.Fatalf("ready line %v lacks %q", p.ready, key)
	}
	return s
}

// stop sends SIGTERM and waits for a clean exit.
func (p *proc) stop(t *testing.T, within time.Duration) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v; stderr:\n%s", err, p.stderrText())
		}
	case <-time.After(within):
		t.Fatalf("no exit within %v of SIGTERM; stderr:\n%s", within, p.stderrText())
	}
}
