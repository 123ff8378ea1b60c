package reference

import (
	"context"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// State writes through shared memory. A backup sidecar writes every
// snapshot it applies to its own model server (WriteStateRanges: an olv
// learner's delta is 15-20 MB per batch). Over gRPC that is a protobuf
// encode, TLS at both ends, socket copies and a decode, all on the host
// the backup shares with other work: with the SHA-256 those writes carried
// before, most of the backup pair's CPU in a profile (issue 22). The
// sidecar and its model server share a host (one failure unit), so where
// the server's description offers write_state_regions the adapter copies
// the data into a region of the state's size lent to the server (created,
// registered and unlinked like the delta region, deltashm.go) and the
// WriteState stream carries offsets and sizes only: one copy on each side
// (into the region, out of it into the model's state) instead of an
// encode, an encryption, two socket copies, a decryption and a decode.
//
// Ordering: the region is lent for one write at a time (write.mu) and
// the adapter touches it only before the stream opens and after its
// answer; the server reads it only while the write is in flight. A server
// that does not know the region (a restarted one: registrations are gone)
// answers NotFound before it writes anything; the write then goes inline
// and a new region is registered at most every deltaRetry.

// writeViaRegion streams a WriteState with header hdr whose data chunks
// are data (at state offsets offs) through the write region. used is
// false when nothing was written that way (no region can be lent now, the
// data does not fit it, the server lost it): the caller writes inline.
func (b *Backend) writeViaRegion(ctx context.Context, what string, hdr *hamsv1.StateChunk, offs []uint64, data [][]byte) (used bool, err error) {
	if !b.writeRegions.Load() {
		return false, nil
	}
	var total uint64
	for _, p := range data {
		total += uint64(len(p))
	}
	d := &b.write
	d.mu.Lock()
	defer d.mu.Unlock()
	name := b.lend(ctx, d, b.stateBytes.Load())
	if name == "" {
		return false, nil
	}
	win := d.m.Bytes()
	if total > uint64(len(win)) {
		// Ranges that overlap (a failed write's and the next ones,
		// merged) can add up to more than the state.
		return false, nil
	}
	sum := b.newWriteSum("", data)
	hdr.Region = name
	chunks := make([]*hamsv1.StateChunk, 0, len(data))
	var at uint64
	for i, p := range data {
		if len(p) == 0 {
			continue
		}
		n := uint64(copy(win[at:], p))
		sum.chunk(win[at : at+n]) // still in cache
		chunks = append(chunks, &hamsv1.StateChunk{Offset: offs[i], ByteSize: n})
		at += n
	}
	last := hdr
	if len(chunks) > 0 {
		last = chunks[len(chunks)-1]
	}
	last.Last = true
	sum.seal(last)

	sctx, progress, stop := b.streamCtx(ctx)
	defer stop()
	st, err := b.rt.WriteState(sctx)
	if err != nil {
		return true, b.streamErr(sctx, what, err)
	}
	for _, ch := range append([]*hamsv1.StateChunk{hdr}, chunks...) {
		if err := st.Send(ch); err != nil {
			break // CloseAndRecv says why
		}
		progress()
	}
	resp, err := st.CloseAndRecv()
	if s, ok := status.FromError(err); ok && s.Code() == codes.NotFound && strings.Contains(s.Message(), name) {
		b.log().Warn("the model server lost the state write region; this write goes inline", "region", name, "err", err)
		b.drop(ctx, d)
		return false, nil
	}
	if err != nil {
		return true, b.writeErr(sctx, what, sum, err)
	}
	d.inUse = true
	return true, sum.check(resp, b.model, what)
}
