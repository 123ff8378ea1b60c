package sidecar

import (
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"hash"
	"slices"
)

// stateHashMark is the spacing of the saved intermediate states of a
// stateHash, and the most it hashes in one call into the assembly block
// function (not preemptible: a state-sized write in one call would hold
// off a GC's stop-the-world, see internal/bigmem).
const stateHashMark = 1 << 20

// stateHash is the SHA-256 of a state that is patched in place (a backup's
// cur), kept with the hash's intermediate state at every stateHashMark
// bytes: after a patch, hashing resumes at the mark before the lowest
// changed byte instead of at the start. The digest is the contract's
// (plain SHA-256 of the state's bytes); only the work differs. A learner's
// batch changes a few experts' weights spread over the state, so most of a
// 64 MiB state lies before its lowest change: the audit's digest of every
// applied delta was ~40 ms of hashing (and about half of a 64 MiB learner's
// backup CPU) before.
//
// Not safe for concurrent use; the backup's apply goroutine owns it.
type stateHash struct {
	h     hash.Hash
	n     int      // bytes hashed
	marks [][]byte // marks[k]: the hash's state after k*stateHashMark bytes
	dirty int      // lowest byte changed since the last Sum (n: none)
}

func newStateHash() *stateHash { return &stateHash{h: sha256.New()} }

// Write hashes p after the bytes written so far.
func (sh *stateHash) Write(p []byte) {
	for len(p) > 0 {
		if sh.n%stateHashMark == 0 {
			m, err := sh.h.(encoding.BinaryMarshaler).MarshalBinary()
			if err != nil {
				panic(err) // crypto/sha256 digests always marshal
			}
			sh.marks = append(sh.marks[:sh.n/stateHashMark], m)
		}
		k := min(len(p), stateHashMark-sh.n%stateHashMark)
		sh.h.Write(p[:k])
		p = p[k:]
		sh.n += k
	}
	sh.dirty = sh.n
}

// Changed records that the hashed bytes from lo on may have changed.
func (sh *stateHash) Changed(lo int) { sh.dirty = min(sh.dirty, max(lo, 0)) }

// Sum is the hex SHA-256 of data, the bytes hashed so far as patched since
// (Changed told where): it rehashes data from the mark before the lowest
// change. data must have the length hashed.
func (sh *stateHash) Sum(data []byte) string {
	if len(data) != sh.n {
		// Not the hashed buffer: hash it whole.
		*sh = stateHash{h: sha256.New()}
		sh.Write(data)
	} else if sh.dirty < sh.n {
		k := sh.dirty / stateHashMark
		h := sha256.New()
		if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(sh.marks[k]); err != nil {
			panic(err) // our own marshalled state
		}
		sh.h, sh.n, sh.marks = h, k*stateHashMark, sh.marks[:k]
		sh.Write(data[sh.n:])
	}
	sh.dirty = sh.n
	return hex.EncodeToString(sh.h.Sum(nil))
}

// Marks returns the hash's intermediate states at every stateHashMark
// bytes of data (the state it hashes, as patched since), hashing what
// changed first; a copy the caller may keep.
func (sh *stateHash) Marks(data []byte) [][]byte {
	sh.Sum(data)
	return slices.Clone(sh.marks)
}

// stateHashFromMarks is the stateHash of data given its marks (Marks of
// the same bytes, elsewhere): only the bytes after the last mark are
// hashed. ok is false when marks cannot be data's (wrong count, a mark
// that does not unmarshal).
func stateHashFromMarks(marks [][]byte, data []byte) (sh *stateHash, ok bool) {
	if len(data) == 0 || len(marks) != (len(data)+stateHashMark-1)/stateHashMark {
		return nil, false
	}
	k := len(marks) - 1
	h := sha256.New()
	if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(marks[k]); err != nil {
		return nil, false
	}
	sh = &stateHash{h: h, n: k * stateHashMark, marks: slices.Clone(marks[:k])}
	sh.Write(data[sh.n:])
	return sh, true
}
