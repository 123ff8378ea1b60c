// Package cudatest runs a package's GPU tests on machines without a GPU,
// against testdata/fakecuda.c: a test double of the libcuda.so.1 entry points that
// internal/cuda calls, with host memory in POSIX shared-memory objects
// standing in for device memory (so IPC handles work across processes on
// one host). It checks what the code under test must get right without a
// GPU: the C ABI of every call (purego), a context current on the calling
// thread for every memory call, copies inside allocations, handles opened
// only by another process. It proves nothing about a real driver's
// performance or its IPC semantics; the GPU tests on a real GPU do.
package cudatest

import (
	"bufio"
	"bytes"
	_ "embed"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/cuda"
)

//go:embed testdata/fakecuda.c
var fakeSource []byte

// FakeDriver compiles testdata/fakecuda.c with gcc into a temporary directory and
// returns the library's path; it skips t when gcc is missing.
func FakeDriver(t testing.TB) string {
	t.Helper()
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc to build the fakecuda test double")
	}
	dir := t.TempDir()
	src, lib := filepath.Join(dir, "fakecuda.c"), filepath.Join(dir, "libfakecuda.so")
	if err := os.WriteFile(src, fakeSource, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("build fakecuda: %v\n%s", err, out)
	}
	return lib
}

// RunWithFakeDriver re-runs this test binary's tests matching run in a
// child process with HAMS_LIBCUDA pointing at the fake driver, and fails
// t unless the child passed and each test named in want ran and passed
// (a skip is a failure). It skips where a real CUDA device is available
// (the GPU tests run against it directly) and inside such a child.
func RunWithFakeDriver(t *testing.T, run string, want ...string) {
	t.Helper()
	if !cuda.Supported {
		t.Skip("this build has no CUDA support (-tags nocuda, or not Linux)")
	}
	if os.Getenv(cuda.EnvLibrary) != "" {
		t.Skipf("%s is set: the GPU tests run against it directly", cuda.EnvLibrary)
	}
	if cuda.Available() == nil {
		t.Skip("a CUDA device is available: the GPU tests run against it directly")
	}
	lib := FakeDriver(t)
	cmd := exec.Command(os.Args[0], "-test.run="+run, "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), cuda.EnvLibrary+"="+lib)
	out, err := cmd.CombinedOutput()
	removeStale()
	if err != nil {
		t.Fatalf("GPU tests against the fake driver: %v\n%s", err, out)
	}
	for _, w := range want {
		if !regexp.MustCompile(`(?m)^\s*--- PASS: ` + regexp.QuoteMeta(w) + ` `).Match(out) {
			t.Fatalf("%s did not run and pass against the fake driver:\n%s", w, out)
		}
	}
	var passed []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "--- PASS:") {
			passed = append(passed, strings.Fields(l)[2])
		}
	}
	t.Logf("against the fakecuda test double: passed %v", passed)
}

// removeStale removes the fake's shared-memory objects whose process is
// gone (a real driver frees a process's memory when it dies; the fake's
// objects would outlive a SIGKILLed process).
func removeStale() {
	es, _ := os.ReadDir("/dev/shm")
	for _, e := range es {
		rest, ok := strings.CutPrefix(e.Name(), "fakecuda_")
		if !ok {
			continue
		}
		pidS, _, _ := strings.Cut(rest, "_")
		pid, err := strconv.Atoi(pidS)
		if err == nil && syscall.Kill(pid, 0) == syscall.ESRCH {
			_ = os.Remove(filepath.Join("/dev/shm", e.Name()))
		}
	}
}

// StartChild runs this test binary again as a child process with only
// the test named run and env set (a CUDA IPC handle cannot be opened by
// the process that allocated it, so the other side of a GPU test runs in
// a child), and returns the text after "ADDR " on the first such line the
// child prints. The child runs until the test ends: its stdin closes then
// and it is expected to exit (it is killed after 10 s).
func StartChild(t testing.TB, run string, env ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+run+"$")
	cmd.Env = append(os.Environ(), env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "ADDR "); ok {
				select {
				case addrc <- a:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	select {
	case a := <-addrc:
		return a
	case <-time.After(30 * time.Second):
		t.Fatalf("child %s did not start:\n%s", run, stderr.String())
	}
	return ""
}
