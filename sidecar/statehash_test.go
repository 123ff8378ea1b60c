package sidecar

import (
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"testing"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// A stateHash patched and told where gives the plain SHA-256 of the
// patched bytes, whatever the patch positions (first byte, mark
// boundaries, last byte) and the state size (not a multiple of a mark).
func TestStateHashMatchesSHA256AfterPatches(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{0, 1, stateHashMark, 3*stateHashMark + 17} {
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		sh := newStateHash()
		// Fed in uneven chunks, as a base arrives.
		for off := 0; off < size; {
			k := min(size-off, 1+rng.IntN(stateHashMark+1000))
			sh.Write(data[off : off+k])
			off += k
		}
		want := func() string { s := sha256.Sum256(data); return hex.EncodeToString(s[:]) }
		if got := sh.Sum(data); got != want() {
			t.Fatalf("size %d: fresh sum %s, want %s", size, got, want())
		}
		if size == 0 {
			continue
		}
		for _, lo := range []int{0, stateHashMark - 1, stateHashMark, size - 1, rng.IntN(size)} {
			if lo >= size {
				continue
			}
			data[lo]++
			hi := min(size, lo+1+rng.IntN(5000))
			for i := lo + 1; i < hi; i++ {
				data[i] ^= 0x5a
			}
			sh.Changed(lo)
			if got := sh.Sum(data); got != want() {
				t.Fatalf("size %d, patch at %d: sum %s, want %s", size, lo, got, want())
			}
		}
		// A buffer of another length is hashed whole.
		longer := append(append([]byte{}, data...), 7)
		if got, w := sh.Sum(longer), sha256.Sum256(longer); got != hex.EncodeToString(w[:]) {
			t.Fatalf("size %d: other buffer's sum %s", size, got)
		}
	}
}

// BenchmarkStateHashDelta: the audit digest of a 64 MiB state after a
// patch at a random offset, whole SHA-256 beside the resumed one.
func BenchmarkStateHashDelta(b *testing.B) {
	data := make([]byte, 64<<20)
	rng := rand.New(rand.NewPCG(3, 4))
	b.Run("sha256-whole", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			data[rng.IntN(len(data))]++
			sha256.Sum256(data)
		}
	})
	b.Run("stateHash-resumed", func(b *testing.B) {
		sh := newStateHash()
		sh.Write(data)
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			lo := rng.IntN(len(data))
			data[lo]++
			sh.Changed(lo)
			sh.Sum(data)
		}
	})
}

// A backup resumes the audit hash of a received base from the sender's
// marks: the digest is the plain SHA-256 of the state, and it is the
// marks that make it (marks of other bytes give another digest, which
// shows they are used rather than the state hashed again).
func TestBaseAuditHashResumesFromSenderMarks(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, n := range []int{1, stateHashMark, stateHashMark + 1, 3*stateHashMark + stateHashMark/2} {
		data, other := make([]byte, n), make([]byte, n)
		for i := range data {
			data[i], other[i] = byte(rng.Uint32()), byte(rng.Uint32())
		}
		want := sha256.Sum256(data)
		b := &backupState{h: testHost(&Config{Model: "a", AuditDir: t.TempDir()}, 0)}
		receive := func(marks [][]byte) *received {
			t.Helper()
			h := &hamsv1.SnapshotHeader{Model: "a", BatchId: 1, StateBytes: uint64(n), Sha256Marks: marks,
				StateTensors: []*hamsv1.TensorSpec{{Name: "s", Datatype: "UINT8", Shape: []int64{int64(n)}}}}
			k, err := b.newSink(h)
			if err != nil {
				t.Fatal(err)
			}
			if err := k.add(0, data); err != nil {
				t.Fatal(err)
			}
			r, err := k.finish(deltaDigestOf(data))
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		if r := receive(newStateHash().Marks(data)); r.digest != hex.EncodeToString(want[:]) {
			t.Fatalf("%d bytes, resumed from its marks: digest %s, want the SHA-256 %x", n, r.digest, want)
		} else {
			// Deltas patched on top resume from the same marks.
			r.data[n/2] ^= 1
			r.hash.Changed(n / 2)
			if got, w := r.hash.Sum(r.data), sha256.Sum256(r.data); got != hex.EncodeToString(w[:]) {
				t.Fatalf("%d bytes: digest after a patch %s, want %x", n, got, w)
			}
		}
		if n > stateHashMark {
			if r := receive(newStateHash().Marks(other)); r.digest == hex.EncodeToString(want[:]) {
				t.Fatalf("%d bytes: marks of other bytes gave the data's own digest: the marks were not used", n)
			}
		}
		// Marks of the wrong count are ignored: the backup hashes itself.
		if r := receive([][]byte{{1}}); r.digest != hex.EncodeToString(want[:]) {
			t.Fatalf("%d bytes, bad marks: digest %s, want %x", n, r.digest, want)
		}
	}
}
