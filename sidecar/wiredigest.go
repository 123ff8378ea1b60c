package sidecar

import (
	"strings"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/chunkhash"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Wire digests: the integrity check a snapshot's data carries between
// sidecars (state_digest on ShipSnapshot's last chunk, the digest frame on
// the bulk stream). It checks for corruption, not authenticity (the
// stream is our own sidecars', over mutual TLS where TLS is on), so it is
// not the audit contract's SHA-256 (which a backup computes itself, of
// the whole state, when it writes durable.jsonl): changing it changes
// nothing an audit compares.
//
// Two kinds exist: XXH64 ("xxh64:<hex>", every version) and a tree of
// XXH3-64 ("xxh3:<hex>", chunkXXH3: ~3-4x faster than XXH64 on this
// machine, 22-30 GB/s against 5-10). Both ends must agree, and the two
// sides of a deployment may run different versions during an upgrade,
// so XXH3 is negotiated per bulk connection:
//   - a backup that checks XXH3 says so in every bulk answer: the
//     ShipSnapshotResponse bytes carry the varint field
//     wireDigestKindsField (unknown to older primaries, which ignore it)
//     with the bit of every kind it checks;
//   - a primary uses XXH3 on a connection only after an answer on that
//     connection said so (the first snapshot of a connection, and every
//     snapshot to an older backup, carries XXH64), and then announces it
//     in the header frame (the same field number, unknown to the
//     SnapshotHeader message: value the kind), so the backup hashes the
//     data with the right function as it arrives, not in a second pass.
//
// Over TLS the data needs no digest of its own: TLS's AEAD authenticates
// every byte of the stream, so what the backup reads is what the primary
// wrote. A TLS backup also offers digestAEAD ("aead:", no hash at either
// end), and a TLS primary takes it; a backup refuses it on a connection
// without TLS (the flag is the sender's to set: the receiver checks its
// own transport).
//
// ShipSnapshot (gRPC: small traced snapshots, onBulk) keeps XXH64.
//
// The field number is outside the ones replication.proto uses; a field
// added there must not take it.
const wireDigestKindsField protowire.Number = 22022

// Digest kinds: the value announced in a header, and the bits of an
// answer.
const (
	digestXXH64 uint64 = 1
	digestXXH3  uint64 = 2
	digestAEAD  uint64 = 4
)

// xxh3Prefix starts an XXH3 state_digest (xxhPrefix an XXH64 one);
// aeadDigest is the digest of a snapshot the TLS connection's AEAD
// checks.
const (
	xxh3Prefix = chunkhash.Prefix
	aeadDigest = "aead:"
)

// wireHash is a running wire digest. EndRange marks the end of a
// delta's range (a full state is one range).
type wireHash interface {
	Write(p []byte) (int, error)
	EndRange()
	Sum64() uint64
}

func newWireHash(kind uint64) wireHash {
	switch kind {
	case digestXXH3:
		return &chunkXXH3{}
	case digestAEAD:
		return noHash{}
	}
	return xxh64Hash{xxhash.New()}
}

// noHash is the wire hash of digestAEAD: nothing to compute.
type noHash struct{}

func (noHash) Write(p []byte) (int, error) { return len(p), nil }
func (noHash) EndRange()                   {}
func (noHash) Sum64() uint64               { return 0 }

type xxh64Hash struct{ *xxhash.Digest }

func (xxh64Hash) EndRange() {}

// chunkXXH3 is the XXH3 wire digest (internal/chunkhash): each range is
// cut into chunks of 64 KiB from its start, each chunk hashed with one-shot
// XXH3-64, and the digest is the XXH3-64 of those sums.
type chunkXXH3 = chunkhash.XXH3

// formatWireDigest formats a sum of kind as a state_digest.
func formatWireDigest(kind, sum uint64) string {
	switch kind {
	case digestXXH3:
		return chunkhash.Format(sum)
	case digestAEAD:
		return aeadDigest
	}
	return deltaDigest(sum)
}

// isWireDigest reports whether d is a wire digest of either kind (a
// snapshot's digest once its shipper computed it).
func isWireDigest(d string) bool {
	return strings.HasPrefix(d, xxhPrefix) || strings.HasPrefix(d, xxh3Prefix) || d == aeadDigest
}

// digestKindOf is the kind of a formatted wire digest (XXH64 for anything
// else: it then fails the check).
func digestKindOf(d string) uint64 {
	switch {
	case strings.HasPrefix(d, xxh3Prefix):
		return digestXXH3
	case d == aeadDigest:
		return digestAEAD
	}
	return digestXXH64
}

// uvarintField is the last value of varint field num in the unknown
// fields raw (0 when absent or malformed).
func uvarintField(raw []byte, num protowire.Number) uint64 {
	var v uint64
	for len(raw) > 0 {
		n, typ, k := protowire.ConsumeTag(raw)
		if k < 0 {
			return 0
		}
		raw = raw[k:]
		if n == num && typ == protowire.VarintType {
			x, k := protowire.ConsumeVarint(raw)
			if k < 0 {
				return 0
			}
			v, raw = x, raw[k:]
			continue
		}
		k = protowire.ConsumeFieldValue(n, typ, raw)
		if k < 0 {
			return 0
		}
		raw = raw[k:]
	}
	return v
}

// headerDigestKind is the wire digest kind a bulk header announces
// (XXH64 when it announces none: an older primary). It removes the
// announcement from h: the header a backup keeps is the snapshot's, not
// the transport's (nothing re-encodes it with the kind of another
// shipment).
func headerDigestKind(h *hamsv1.SnapshotHeader) uint64 {
	m := h.ProtoReflect()
	raw := m.GetUnknown()
	k := uvarintField(raw, wireDigestKindsField)
	if len(raw) > 0 {
		m.SetUnknown(withoutField(raw, wireDigestKindsField))
	}
	switch k {
	case digestXXH3, digestAEAD:
		return k
	}
	return digestXXH64
}

// withoutField is the unknown fields raw less every field num (raw as is
// when it does not parse).
func withoutField(raw []byte, num protowire.Number) []byte {
	var out []byte
	for rest := raw; len(rest) > 0; {
		n, typ, k := protowire.ConsumeTag(rest)
		if k < 0 {
			return raw
		}
		v := protowire.ConsumeFieldValue(n, typ, rest[k:])
		if v < 0 {
			return raw
		}
		if n != num {
			out = append(out, rest[:k+v]...)
		}
		rest = rest[k+v:]
	}
	return out
}

// appendDigestKind appends the announcement of kind to an encoded header.
func appendDigestKind(hb []byte, kind uint64) []byte {
	if kind == digestXXH64 {
		return hb // the default: nothing to announce
	}
	hb = protowire.AppendTag(hb, wireDigestKindsField, protowire.VarintType)
	return protowire.AppendVarint(hb, kind)
}

// marshalAnswer encodes a bulk answer with the kinds this backup takes
// (kinds: bits).
func marshalAnswer(resp *hamsv1.ShipSnapshotResponse, kinds uint64) ([]byte, error) {
	b, err := proto.Marshal(resp)
	if err != nil {
		return nil, err
	}
	b = protowire.AppendTag(b, wireDigestKindsField, protowire.VarintType)
	return protowire.AppendVarint(b, kinds), nil
}

// answerKinds is the digest kinds (bits) a decoded bulk answer says its
// backup takes (0: a backup before XXH3, which takes XXH64 only).
func answerKinds(resp *hamsv1.ShipSnapshotResponse) uint64 {
	return uvarintField(resp.ProtoReflect().GetUnknown(), wireDigestKindsField)
}

// pickDigest is the kind a shipper uses given the kinds its backup takes
// and whether the connection is TLS.
func pickDigest(kinds uint64, tls bool) uint64 {
	switch {
	case tls && kinds&digestAEAD != 0:
		return digestAEAD
	case kinds&digestXXH3 != 0:
		return digestXXH3
	}
	return digestXXH64
}

// makeNoZero returns a buffer of n bytes whose contents are arbitrary
// (not zeroed: memory the heap reuses keeps what was there). Only for a
// buffer every byte of which is written before any is read, and dropped
// otherwise (a read cut short): zeroing a state-sized buffer costs as
// much as the copy into it (19% of a learner primary's CPU in a
// profile, issue 22). strings.Builder.Grow is the standard library's one
// way to such memory (internal/bytealg.MakeNoZero); the string it backs
// is never used, so no string is ever seen changing.
func makeNoZero(n int) []byte {
	if n <= 0 {
		return nil
	}
	var sb strings.Builder
	sb.Grow(n)
	_ = sb.WriteByte(0)
	s := sb.String()
	return unsafe.Slice(unsafe.StringData(s), n)
}
