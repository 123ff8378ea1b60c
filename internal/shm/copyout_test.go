package shm

import (
	"bytes"
	"fmt"
	"testing"
)

func TestCopyOut(t *testing.T) {
	if CopyOut(nil) != nil {
		t.Fatal("a buffer for nothing")
	}
	src := bytes.Repeat([]byte("region"), 1<<18)
	a := CopyOut(src)
	if !bytes.Equal(a, src) || len(a) != cap(a) {
		t.Fatalf("copy differs (len %d cap %d)", len(a), cap(a))
	}
	src[0] = 'x'
	if a[0] != 'r' {
		t.Fatal("the copy aliases the region")
	}
	b := CopyOut(src)
	b[1] = 'y'
	if a[1] != 'e' {
		t.Fatal("two copies share memory")
	}
}

// BenchmarkCopyOut: copying a delta out of its region into a zeroed
// buffer (make+copy, the adapter's way before issue 22) against CopyOut.
// go test ./internal/shm -run '^$' -bench CopyOut -count 3
func BenchmarkCopyOut(b *testing.B) {
	for _, mib := range []int{4, 16, 64} {
		src := bytes.Repeat([]byte{1}, mib<<20)
		var keep []byte
		b.Run(fmt.Sprintf("make+copy/%dMiB", mib), func(b *testing.B) {
			b.SetBytes(int64(len(src)))
			total := len(src)
			for i := 0; i < b.N; i++ {
				// As adapters/reference's takeDelta: the length is not
				// len(src), so the compiler's make+copy fusion (which
				// skips the zeroing) does not apply.
				buf := make([]byte, total)
				copy(buf, src[:total])
				keep = buf
			}
		})
		b.Run(fmt.Sprintf("CopyOut/%dMiB", mib), func(b *testing.B) {
			b.SetBytes(int64(len(src)))
			for i := 0; i < b.N; i++ {
				keep = CopyOut(src)
			}
		})
		_ = keep
	}
}
