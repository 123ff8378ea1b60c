// Package chunkhash is a tree of XXH3-64 sums over chunks of ranges: the
// integrity check of bulk state data between hams processes where a
// cryptographic digest is not what is asked for (the data crosses a
// connection that TLS authenticates, or the loopback between a sidecar
// and its own model server). It runs at memory speed (one-shot XXH3 of
// each chunk where it lies: 88 GB/s over 16 MiB in cache on the
// development machine, against crypto/sha256's 2.0 GB/s with SHA-NI, in
// one run).
//
// Sum: each range is cut into chunks of Chunk bytes from its start (the
// last one shorter); each chunk is hashed with one-shot XXH3-64; the sum is
// the XXH3-64 of those chunk sums (little-endian, in order). Both ends
// must cut the data into the same ranges (EndRange) to agree.
package chunkhash

import (
	"encoding/binary"
	"strconv"
	"strings"

	"github.com/zeebo/xxh3"
)

// Chunk is the chunk size of the tree.
const Chunk = 64 << 10

// Prefix starts a formatted sum ("xxh3:<hex>").
const Prefix = "xxh3:"

// XXH3 is a running sum; the zero value is ready. The one-shot hash reads
// a chunk where it lies: zeebo/xxh3's streaming Hasher copies every byte
// after its first Write through a 1 KiB buffer (a memmove per hashed
// byte). Only a chunk that a Write leaves unfinished is copied (at most
// Chunk-1 bytes, at a range's end).
type XXH3 struct {
	sums []byte
	part []byte // the current range's unfinished chunk
}

// Write adds p to the current range; it never fails.
func (c *XXH3) Write(p []byte) (int, error) {
	n := len(p)
	if len(c.part) > 0 {
		k := min(len(p), Chunk-len(c.part))
		c.part = append(c.part, p[:k]...)
		p = p[k:]
		if len(c.part) == Chunk {
			c.emit(c.part)
			c.part = c.part[:0]
		}
	}
	for len(p) >= Chunk {
		c.emit(p[:Chunk])
		p = p[Chunk:]
	}
	if len(p) > 0 {
		if c.part == nil {
			c.part = make([]byte, 0, Chunk)
		}
		c.part = append(c.part, p...)
	}
	return n, nil
}

func (c *XXH3) emit(chunk []byte) {
	c.sums = binary.LittleEndian.AppendUint64(c.sums, xxh3.Hash(chunk))
}

// EndRange ends the current range: the next Write starts a chunk.
func (c *XXH3) EndRange() {
	if len(c.part) > 0 {
		c.emit(c.part)
		c.part = c.part[:0]
	}
}

// Sum64 ends the current range and returns the sum of everything written.
func (c *XXH3) Sum64() uint64 {
	c.EndRange()
	return xxh3.Hash(c.sums)
}

// SumRanges is the sum of ranges, each its own range.
func SumRanges(ranges [][]byte) uint64 {
	var h XXH3
	for _, r := range ranges {
		_, _ = h.Write(r)
		h.EndRange()
	}
	return h.Sum64()
}

// Format is sum as a digest string ("xxh3:<hex>").
func Format(sum uint64) string { return Prefix + strconv.FormatUint(sum, 16) }

// Is reports whether d is a formatted XXH3 sum.
func Is(d string) bool { return strings.HasPrefix(d, Prefix) }
