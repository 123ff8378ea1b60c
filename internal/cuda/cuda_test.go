package cuda

import (
	"errors"
	"strings"
	"testing"
)

func TestErrorNamesCallAndResult(t *testing.T) {
	e := &Error{Call: "cuMemAlloc_v2", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY", Desc: "out of memory"}
	if got, want := e.Error(), "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
	if !errors.Is(e, ErrDriver) || errors.Is(e, ErrNoDevice) || errors.Is(e, ErrUnavailable) {
		t.Fatal("out of memory must match ErrDriver only")
	}
	nd := &Error{Call: "cuDeviceGet", Code: cudaErrorInvalidDevice}
	if !errors.Is(nd, ErrNoDevice) || !errors.Is(nd, ErrDriver) || !strings.Contains(nd.Error(), "CUresult 101") {
		t.Fatalf("invalid device: %v", nd)
	}
}

func TestCheckRange(t *testing.T) {
	for _, c := range []struct {
		off, n, size int
		ok           bool
	}{{0, 10, 10, true}, {10, 0, 10, true}, {3, 7, 10, true}, {3, 8, 10, false}, {-1, 1, 10, false}, {0, -1, 10, false}, {11, 0, 10, false}} {
		err := checkRange("copy", c.off, c.n, c.size)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrRange)) {
			t.Errorf("checkRange(%d, %d, %d) = %v", c.off, c.n, c.size, err)
		}
	}
}

// TestUnavailableIsClean: on a machine without a usable driver (or a
// nocuda build) every entry point answers ErrUnavailable; nothing panics.
func TestUnavailableIsClean(t *testing.T) {
	if Available() == nil {
		t.Skip("a CUDA device is available; the GPU tests cover this machine")
	}
	if err := Available(); !errors.Is(err, ErrUnavailable) || !strings.HasPrefix(err.Error(), "cuda: ") {
		t.Fatalf("Available: %v", err)
	}
	if _, err := DeviceCount(); !errors.Is(err, ErrUnavailable) && err != nil {
		t.Fatalf("DeviceCount: %v", err)
	}
	d, err := Open(0)
	if !errors.Is(err, ErrUnavailable) || d != nil {
		t.Fatalf("Open: %v, %v", d, err)
	}
	t.Logf("without a driver: %v", err)
}
