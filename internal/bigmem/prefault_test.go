//go:build linux

package bigmem

import (
	"syscall"
	"testing"
	"unsafe"
)

// resident is the fraction of b's whole pages that are mapped (mincore).
func resident(t testing.TB, b []byte) float64 {
	t.Helper()
	ps := uintptr(pageSize)
	lo := int((ps - uintptr(unsafe.Pointer(&b[0]))%ps) % ps)
	n := (len(b) - lo) / pageSize * pageSize
	if n <= 0 {
		t.Fatalf("buffer of %d bytes holds no whole page", len(b))
	}
	win := b[lo : lo+n]
	vec := make([]byte, n/pageSize)
	if _, _, errno := syscall.Syscall(syscall.SYS_MINCORE, uintptr(unsafe.Pointer(&win[0])), uintptr(len(win)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Skipf("mincore: %v", errno)
	}
	in := 0
	for _, v := range vec {
		in += int(v & 1)
	}
	return float64(in) / float64(len(vec))
}

// Prefaulted maps every page; a plain make of a fresh large buffer maps
// none until written (checked, so the test shows the difference it
// relies on rather than passing on reused heap memory).
func TestPrefaultedMapsEveryPage(t *testing.T) {
	const n = 48 << 20
	plain := make([]byte, n)
	if r := resident(t, plain); r > 0.5 {
		t.Skipf("a fresh %d-byte make is already %.0f%% resident (reused heap memory): inconclusive", n, 100*r)
	}
	b := Prefaulted(n)
	if len(b) != n {
		t.Fatalf("len %d, want %d", len(b), n)
	}
	if r := resident(t, b); r < 0.99 {
		t.Fatalf("Prefaulted buffer is %.1f%% resident, want all pages", 100*r)
	}
	for i := 0; i < n; i += 4093 {
		if b[i] != 0 {
			t.Fatalf("byte %d is %d, want 0", i, b[i])
		}
	}
}

// BenchmarkFirstCopy is a 64 MiB copy into a fresh anonymous mapping
// (every page faults on its first write, as a new state buffer's do)
// beside the same copy into a mapping whose pages were touched first.
func BenchmarkFirstCopy(b *testing.B) {
	const n = 64 << 20
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i)
	}
	for _, touch := range []bool{false, true} {
		name := "fresh"
		if touch {
			name = "prefaulted"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(n)
			for b.Loop() {
				b.StopTimer()
				m, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
				if err != nil {
					b.Fatal(err)
				}
				if touch {
					for p := 0; p < n; p += pageSize {
						m[p] = 0
					}
				}
				b.StartTimer()
				Copy(m, src)
				b.StopTimer()
				_ = syscall.Munmap(m)
				b.StartTimer()
			}
		})
	}
}
