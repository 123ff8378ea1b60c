package chunkhash

import (
	"testing"
)

func bytesOf(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

// The sum of a range does not depend on how the writes cut it (a sender
// hashes the pieces it writes, a receiver those it reads), it does
// depend on where ranges end, and a flipped byte changes it.
func TestSumIndependentOfWrites(t *testing.T) {
	data := bytesOf(3*Chunk+12345, 9)
	sum := func(cuts []int, ends ...int) uint64 {
		var h XXH3
		prev := 0
		for _, c := range append(cuts, len(data)) {
			_, _ = h.Write(data[prev:c])
			for _, e := range ends {
				if e == c {
					h.EndRange()
				}
			}
			prev = c
		}
		h.EndRange()
		return h.Sum64()
	}
	whole := sum(nil)
	for _, cuts := range [][]int{{1}, {Chunk - 1, Chunk + 1}, {100, 200, 2*Chunk + 7}, {Chunk, 2 * Chunk}} {
		if got := sum(cuts); got != whole {
			t.Fatalf("writes cut at %v: %x, whole: %x", cuts, got, whole)
		}
	}
	if sum([]int{1000}, 1000) == whole {
		t.Fatal("a range ending at 1000 hashes as one range")
	}
	if SumRanges([][]byte{data[:1000], data[1000:]}) != sum([]int{1000}, 1000) {
		t.Fatal("SumRanges differs from writes that end a range at each of its ranges")
	}
	data[len(data)/2] ^= 1
	if sum(nil) == whole {
		t.Fatal("a flipped byte does not change the digest")
	}
}

func TestFormat(t *testing.T) {
	if d := Format(0xabc); d != "xxh3:abc" || !Is(d) || Is("sha256:abc") || Is("") {
		t.Fatalf("Format(0xabc) = %q", d)
	}
}
