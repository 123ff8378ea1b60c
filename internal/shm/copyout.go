package shm

import (
	"strings"
	"unsafe"
)

// CopyOut returns a copy of b (bytes of a region another process writes)
// in a new heap buffer that is not zeroed before the copy fills it: a
// region is reused by the next exchange, so what a caller keeps must be
// copied out, and zeroing a buffer the copy overwrites whole doubles the
// cost (19% of a learner primary's sidecar CPU went to zeroing the
// buffer of a delta copied out of its region, issue 22).
// strings.Builder.Grow is the standard library's one way to unzeroed
// memory (internal/bytealg.MakeNoZero); the string it backs is never
// used, so no string is ever seen changing. nil for an empty b.
func CopyOut(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	var sb strings.Builder
	sb.Grow(len(b))
	_ = sb.WriteByte(0)
	s := sb.String()
	out := unsafe.Slice(unsafe.StringData(s), len(b))
	copy(out, b)
	return out
}
