//go:build linux && !nocuda

package cuda

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestLoadErrors(t *testing.T) {
	_, err := load([]string{"/nonexistent/hams/libcuda.so.1"})
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "/nonexistent/hams/libcuda.so.1") || !strings.Contains(err.Error(), EnvLibrary) {
		t.Fatalf("missing library: %v", err)
	}
	// a real library that is not a CUDA driver
	_, err = load([]string{"/nonexistent/x.so", "libc.so.6"})
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "libc.so.6 has no symbol cuInit") {
		t.Fatalf("not a driver: %v", err)
	}
}

func needGPU(t testing.TB) *Device {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("no GPU: %v", err)
	}
	d, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func random(t testing.TB, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAllocCopyRoundTrip(t *testing.T) {
	d := needGPU(t)
	t.Logf("device %d: %s (driver %s)", d.Ordinal(), d.Name(), drv.path)
	if _, err := Open(1 << 20); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("device 1<<20: %v", err)
	}
	const n = 3<<20 + 13
	b, err := d.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	got[0], got[n-1] = 1, 1
	if err := b.CopyToHost(0, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, make([]byte, n)) {
		t.Fatal("a new buffer is not zeroed")
	}
	want := random(t, n)
	if err := b.CopyFromHost(0, want); err != nil {
		t.Fatal(err)
	}
	if err := b.CopyToHost(0, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("round trip differs")
	}
	// a window in the middle
	patch := random(t, 4097)
	if err := b.CopyFromHost(1000, patch); err != nil {
		t.Fatal(err)
	}
	copy(want[1000:], patch)
	part := make([]byte, 10000)
	if err := b.CopyToHost(500, part); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(part, want[500:10500]) {
		t.Fatal("window round trip differs")
	}
	if err := b.CopyToHost(n-10, make([]byte, 11)); !errors.Is(err, ErrRange) {
		t.Fatalf("read past the end: %v", err)
	}
	if err := b.CopyFromHost(-1, []byte{1}); !errors.Is(err, ErrRange) {
		t.Fatalf("negative offset: %v", err)
	}
	if _, err := d.Alloc(0); !errors.Is(err, ErrRange) {
		t.Fatalf("alloc 0: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if err := b.CopyToHost(0, got[:1]); !errors.Is(err, ErrClosed) {
		t.Fatalf("copy after close: %v", err)
	}
	// Device.Close frees what is left; buffers answer ErrClosed after
	left, err := d.Alloc(100)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second device close: %v", err)
	}
	if err := left.CopyFromHost(0, []byte{1}); !errors.Is(err, ErrClosed) {
		t.Fatalf("copy after device close: %v", err)
	}
	if _, err := d.Alloc(1); !errors.Is(err, ErrClosed) {
		t.Fatalf("alloc after device close: %v", err)
	}
}

const envChild = "HAMS_CUDA_IPC_CHILD"

// TestIPCAcrossProcesses: this process allocates and exports a buffer of
// random bytes; a child process (this test binary, TestIPCChild) opens the
// handle, reports the digest of what it reads, and writes the bytes'
// complement; this process then reads the complement from its buffer.
func TestIPCAcrossProcesses(t *testing.T) {
	d := needGPU(t)
	const n = 1<<20 + 7
	b, err := d.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	data := random(t, n)
	if err := b.CopyFromHost(0, data); err != nil {
		t.Fatal(err)
	}
	h, err := b.IPCHandle()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.OpenIPC(h, n); err == nil {
		t.Log("note: the driver opened a handle in its allocating process")
	} else {
		t.Logf("opening its own handle in the allocating process: %v", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestIPCChild$", "-test.v")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s:%d", envChild, hex.EncodeToString(h[:]), n))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\n%s\n%s", err, out, stderr.String())
	}
	sum := sha256.Sum256(data)
	var read, wrote bool
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		l := sc.Text()
		if v, ok := strings.CutPrefix(l, "READ "); ok {
			read = v == hex.EncodeToString(sum[:])
		}
		if v, ok := strings.CutPrefix(l, "TOOBIG "); ok && !strings.Contains(v, "out of range") {
			t.Errorf("child opened the handle with a size beyond the allocation: %s", v)
		}
		wrote = wrote || l == "WROTE"
	}
	if !read || !wrote {
		t.Fatalf("child did not read the parent's bytes or did not write (read %v, wrote %v):\n%s", read, wrote, out)
	}
	got := make([]byte, n)
	if err := b.CopyToHost(0, got); err != nil {
		t.Fatal(err)
	}
	for i := range data {
		if got[i] != ^data[i] {
			t.Fatalf("byte %d: %#x after the child wrote, want %#x", i, got[i], ^data[i])
		}
	}
	t.Logf("child process opened, read and wrote %d bytes through the IPC handle (%v incl. process start)", n, time.Since(start))
}

// TestIPCChild is the child of TestIPCAcrossProcesses (skipped otherwise).
func TestIPCChild(t *testing.T) {
	arg := os.Getenv(envChild)
	if arg == "" {
		t.Skip("child of TestIPCAcrossProcesses only")
	}
	hs, ns, _ := strings.Cut(arg, ":")
	raw, err := hex.DecodeString(hs)
	n, err2 := strconv.Atoi(ns)
	if err != nil || err2 != nil || len(raw) != HandleSize {
		t.Fatalf("bad %s=%q", envChild, arg)
	}
	d, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	h := IPCHandle(raw)
	if _, err := d.OpenIPC(h, n+1<<30); err != nil {
		fmt.Printf("TOOBIG %v\n", err)
	} else {
		fmt.Printf("TOOBIG opened\n")
	}
	b, err := d.OpenIPC(h, n)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, n)
	if err := b.CopyToHost(0, data); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	fmt.Printf("READ %s\n", hex.EncodeToString(sum[:]))
	for i := range data {
		data[i] = ^data[i]
	}
	if err := b.CopyFromHost(0, data); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	fmt.Println("WROTE")
}

// BenchmarkCopyToHost measures a device-to-host copy of a whole buffer
// (what ReadState does with CUDA state memory) against a host memcpy of
// the same size (system shared memory).
func BenchmarkCopyToHost(b *testing.B) {
	for _, mib := range []int{1, 16, 64} {
		n := mib << 20
		b.Run(fmt.Sprintf("dtoh/%dMiB", mib), func(b *testing.B) {
			d := needGPU(b)
			buf, err := d.Alloc(n)
			if err != nil {
				b.Fatal(err)
			}
			dst := make([]byte, n)
			b.SetBytes(int64(n))
			b.ResetTimer()
			for b.Loop() {
				if err := buf.CopyToHost(0, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("htod/%dMiB", mib), func(b *testing.B) {
			d := needGPU(b)
			buf, err := d.Alloc(n)
			if err != nil {
				b.Fatal(err)
			}
			src := random(b, n)
			b.SetBytes(int64(n))
			b.ResetTimer()
			for b.Loop() {
				if err := buf.CopyFromHost(0, src); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("memcpy/%dMiB", mib), func(b *testing.B) {
			src, dst := random(b, n), make([]byte, n)
			b.SetBytes(int64(n))
			b.ResetTimer()
			for b.Loop() {
				copy(dst, src)
			}
		})
	}
}
