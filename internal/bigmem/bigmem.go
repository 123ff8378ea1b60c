package bigmem

import (
	"io"
	"os"
	"runtime"
)

// Chunk is the unit of work between two yields: 1 MiB copies in ~0.1 ms.
const Chunk = 1 << 20

// Copy copies min(len(dst), len(src)) bytes from src to dst in chunks,
// yielding between them, and returns the number copied. dst and src may
// overlap only as the built-in copy allows when dst starts at or before
// src.
func Copy(dst, src []byte) int {
	n := min(len(dst), len(src))
	for off := 0; off < n; off += Chunk {
		if off > 0 {
			runtime.Gosched()
		}
		end := min(off+Chunk, n)
		copy(dst[off:end], src[off:end])
	}
	return n
}

// Clone returns a copy of b in a new buffer (nil for nil).
func Clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	out := make([]byte, len(b))
	Copy(out, b)
	return out
}

// Write writes b to w (a hash, typically) in chunks, yielding between
// them.
func Write(w io.Writer, b []byte) (int, error) {
	written := 0
	for off := 0; off < len(b); off += Chunk {
		if off > 0 {
			runtime.Gosched()
		}
		n, err := w.Write(b[off:min(off+Chunk, len(b))])
		written += n
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

// pageSize is the granularity at which Prefaulted touches a buffer.
var pageSize = os.Getpagesize()

// Prefaulted returns a zeroed buffer of n bytes whose pages are mapped
// already. The first write to each page of a fresh large buffer takes a
// page fault (a 64 MiB buffer: ~16k faults, ~40 ms on the development
// machine against ~3 ms to copy into memory that is mapped), so a buffer
// a latency-critical path will need (a spare backup's base state, the
// copy of it the first delta patches) is faulted in ahead of time, off
// that path.
func Prefaulted(n int) []byte {
	b := make([]byte, n)
	for off := 0; off < n; off += Chunk {
		if off > 0 {
			runtime.Gosched()
		}
		end := min(off+Chunk, n)
		for p := off; p < end; p += pageSize {
			b[p] = 0
		}
	}
	return b
}
