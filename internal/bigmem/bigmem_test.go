package bigmem

import (
	"bytes"
	"crypto/sha256"
	"math/rand/v2"
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"
	"time"
)

func TestCopyCloneWriteMatchTheBuiltins(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, Chunk - 1, Chunk, Chunk + 1, 3*Chunk + 17} {
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		if got := Clone(src); !bytes.Equal(got, src) || (n > 0 && &got[0] == &src[0]) {
			t.Fatalf("Clone of %d bytes: not an equal, separate copy", n)
		}
		short := make([]byte, n/2)
		if c := Copy(short, src); c != n/2 || !bytes.Equal(short, src[:n/2]) {
			t.Fatalf("Copy into %d of %d bytes: copied %d", n/2, n, c)
		}
		h := sha256.New()
		if w, err := Write(h, src); err != nil || w != n {
			t.Fatalf("Write of %d bytes: %d, %v", n, w, err)
		}
		if want := sha256.Sum256(src); !bytes.Equal(h.Sum(nil), want[:]) {
			t.Fatalf("Write of %d bytes: the hash differs from one Write", n)
		}
	}
	if Clone(nil) != nil {
		t.Fatal("Clone(nil) is not nil")
	}
}

// BenchmarkCloneStopTheWorld clones a 64 MiB state over and over while
// another goroutine forces collections, and reports the longest time the
// collector waited for the world to stop (stw-max-ms), for bytes.Clone
// beside Clone.
func BenchmarkCloneStopTheWorld(b *testing.B) {
	src := make([]byte, 64<<20)
	for _, c := range []struct {
		name  string
		clone func([]byte) []byte
	}{{"bytes.Clone", bytes.Clone}, {"bigmem.Clone", Clone}} {
		b.Run(c.name, func(b *testing.B) {
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					case <-time.After(5 * time.Millisecond):
						runtime.GC()
					}
				}
			}()
			before := stopping()
			var sink []byte
			for b.Loop() {
				sink = c.clone(src)
			}
			close(stop)
			wg.Wait()
			_ = sink
			b.ReportMetric(stoppingMaxSince(before)*1e3, "stw-max-ms")
		})
	}
}

// BenchmarkClone is the cost of a 64 MiB clone without collections.
func BenchmarkClone(b *testing.B) {
	src := make([]byte, 64<<20)
	dst := make([]byte, 64<<20)
	b.Run("builtin-copy", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			copy(dst, src)
		}
	})
	b.Run("bigmem.Copy", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			Copy(dst, src)
		}
	})
}

// stopping reads the runtime's histogram of time spent stopping the world
// for the GC.
func stopping() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: "/sched/pauses/stopping/gc:seconds"}}
	metrics.Read(s)
	return s[0].Value.Float64Histogram()
}

// stoppingMaxSince is the upper bound of the highest bucket that gained
// counts since before.
func stoppingMaxSince(before *metrics.Float64Histogram) float64 {
	h := stopping()
	for i := len(h.Counts) - 1; i >= 0; i-- {
		if h.Counts[i] > before.Counts[i] {
			return h.Buckets[i+1]
		}
	}
	return 0
}
