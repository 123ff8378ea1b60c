package reference

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/chunkhash"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// StateChunkBytes is the data size of one StateChunk this adapter asks for
// and sends.
const StateChunkBytes = 1 << 20

// Compute runs the compute stage of a stateful step: outputs of the batch
// from the installed state; the next state is staged until Update.
//
// With stage_delta the delta's data comes through a shared-memory region
// lent to the server where it can (deltashm.go), else inline.
func (b *Backend) Compute(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	if req.GetModel() == "" {
		req.Model = b.model
	}
	if !req.GetStageDelta() {
		ctx, cancel := b.ctx(ctx)
		defer cancel()
		resp, err := b.rt.Compute(ctx, req)
		return resp, b.mapErr("compute", err)
	}
	d := &b.delta
	d.mu.Lock()
	defer d.mu.Unlock()
	req.DeltaRegion = b.lend(ctx, d, b.stateBytes.Load())
	defer func() { req.DeltaRegion = "" }()
	cctx, cancel := b.ctx(ctx)
	defer cancel()
	resp, err := b.rt.Compute(cctx, req)
	if err != nil {
		return nil, b.mapErr("compute", err)
	}
	switch {
	case resp.GetStateDeltaRegion() != "":
		if err := b.takeDelta(resp); err != nil {
			return nil, err
		}
	case req.DeltaRegion != "" && resp.GetHasStateDelta():
		// Inline although a region was lent: the server lost it (a
		// restart) or cannot use it; register a new one later.
		b.log().Warn("model server answered a delta inline instead of in the lent region", "region", req.DeltaRegion, "used_before", d.inUse)
		b.drop(ctx, d)
	}
	return resp, nil
}

// Update installs the state staged by batch batchID's Compute.
func (b *Backend) Update(ctx context.Context, batchID uint64) error {
	ctx, cancel := b.ctx(ctx)
	defer cancel()
	_, err := b.rt.Update(ctx, &hamsv1.UpdateRequest{Model: b.model, BatchId: batchID})
	return b.mapErr("update", err)
}

// ReadState streams the installed state and returns it as tensors (one per
// state tensor spec, in the model's order) with its version. It verifies
// the stream: header first, offsets contiguous, exactly total_bytes, and
// the SHA-256 on the last chunk.
func (b *Backend) ReadState(ctx context.Context) ([]*hamsv1.Tensor, uint64, error) {
	ts, v, _, err := b.ReadStatePinned(ctx, nil)
	return ts, v, err
}

// ReadStatePinned is ReadState that calls pinned (when not nil) as soon as
// the header chunk arrived: the model server sends it once it holds the
// state it streams (ModelRuntime.ReadState is atomic with respect to
// Update: the server either captured that version or holds updates until
// the stream ends), so an Update issued afterwards cannot change the data.
// It returns the verified SHA-256 (hex) of the state bytes too.
func (b *Backend) ReadStatePinned(ctx context.Context, pinned func()) ([]*hamsv1.Tensor, uint64, string, error) {
	ts, v, sum, err := b.readState(ctx, pinned)
	return ts, v, sum, err
}

func (b *Backend) readState(ctx context.Context, pinned func()) ([]*hamsv1.Tensor, uint64, string, error) {
	ctx, progress, stop := b.streamCtx(ctx)
	defer stop()
	st, err := b.rt.ReadState(ctx, &hamsv1.ReadStateRequest{Model: b.model, ChunkBytes: StateChunkBytes})
	if err != nil {
		return nil, 0, "", b.streamErr(ctx, "read state", err)
	}
	var (
		first *hamsv1.StateChunk
		data  []byte
		sum   string
		h     = sha256.New()
	)
	for {
		ch, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil, 0, "", status.Errorf(codes.DataLoss, "reference %s read state: stream ended without a last chunk", b.model)
		}
		if err != nil {
			return nil, 0, "", b.streamErr(ctx, "read state", err)
		}
		progress()
		if first == nil {
			first = ch
			if pinned != nil {
				pinned()
			}
			if ch.GetTotalBytes() > 1<<34 {
				return nil, 0, "", status.Errorf(codes.ResourceExhausted, "reference %s read state: %d bytes", b.model, ch.GetTotalBytes())
			}
			data = make([]byte, 0, ch.GetTotalBytes())
		}
		if len(ch.GetData()) > 0 && ch.GetOffset() != uint64(len(data)) {
			return nil, 0, "", status.Errorf(codes.DataLoss, "reference %s read state: chunk at offset %d, expected %d", b.model, ch.GetOffset(), len(data))
		}
		if uint64(len(data)+len(ch.GetData())) > first.GetTotalBytes() {
			return nil, 0, "", status.Errorf(codes.DataLoss, "reference %s read state: more than the announced %d bytes", b.model, first.GetTotalBytes())
		}
		data = append(data, ch.GetData()...)
		h.Write(ch.GetData())
		if ch.GetLast() {
			if uint64(len(data)) != first.GetTotalBytes() {
				return nil, 0, "", status.Errorf(codes.DataLoss, "reference %s read state: %d of %d bytes", b.model, len(data), first.GetTotalBytes())
			}
			sum = hex.EncodeToString(h.Sum(nil))
			if ch.GetSha256() != sum {
				return nil, 0, "", status.Errorf(codes.DataLoss, "reference %s read state: sha256 %q does not match the data (%s)", b.model, ch.GetSha256(), sum)
			}
			break
		}
	}
	ts, err := tensor.SplitBySpecs(first.GetTensors(), data)
	if err != nil {
		return nil, 0, "", status.Errorf(codes.DataLoss, "reference %s read state: %v", b.model, err)
	}
	return ts, first.GetStateVersion(), sum, nil
}

// WriteState overwrites the installed state with tensors (the model's state
// tensors in order) and sets its version, streamed in chunks with the
// SHA-256 on the last one.
func (b *Backend) WriteState(ctx context.Context, tensors []*hamsv1.Tensor, version uint64) error {
	return b.WriteStateDigest(ctx, tensors, version, "")
}

// WriteStateDigest is WriteState with the hex SHA-256 of the tensors'
// bytes known already (digest; "" computes it when the SHA-256 is needed).
// The server verifies the data it received either way: against the
// XXH3 tree of chunkhash when it takes that (Describe; a small fraction
// of the SHA-256's cost, internal/chunkhash), else against the SHA-256.
func (b *Backend) WriteStateDigest(ctx context.Context, tensors []*hamsv1.Tensor, version uint64, digest string) error {
	specs := make([]*hamsv1.TensorSpec, len(tensors))
	offs, data := make([]uint64, len(tensors)), make([][]byte, len(tensors))
	var total uint64
	for i, t := range tensors {
		specs[i] = &hamsv1.TensorSpec{Name: t.GetName(), Datatype: t.GetDatatype(), Shape: t.GetShape()}
		offs[i], data[i] = total, t.GetData()
		total += uint64(len(t.GetData()))
	}
	header := func() *hamsv1.StateChunk {
		return &hamsv1.StateChunk{Model: b.model, StateVersion: version, Tensors: specs, TotalBytes: total}
	}
	if used, err := b.writeViaRegion(ctx, "write state", header(), offs, data); used {
		return err
	}
	return b.writeInline(ctx, "write state", header(), offs, data, b.newWriteSum(digest, data), false)
}

// writeDigestXXH3 is the kind of chunkhash's XXH3 tree in
// ModelDescription.write_state_digests.
const writeDigestXXH3 = "xxh3"

// writeSum is the digest a WriteState stream carries on its last chunk:
// the XXH3 tree of chunkhash (each data chunk one range, hashed just
// before it is sent) when the server takes it, else the SHA-256 of all the
// data (computed before the stream, or known already).
type writeSum struct {
	xxh3 *chunkhash.XXH3 // nil: SHA-256
	sha  string
	sent string // what the last chunk carried
}

// newWriteSum starts the digest of data (the chunks' data in stream
// order); sha is its SHA-256 when already known ("": computed here if
// needed).
func (b *Backend) newWriteSum(sha string, data [][]byte) *writeSum {
	if b.writeXXH3.Load() {
		return &writeSum{xxh3: &chunkhash.XXH3{}}
	}
	if sha == "" {
		h := sha256.New()
		for _, d := range data {
			h.Write(d)
		}
		sha = hex.EncodeToString(h.Sum(nil))
	}
	return &writeSum{sha: sha}
}

// chunk adds the data of one chunk about to be sent.
func (w *writeSum) chunk(d []byte) {
	if w.xxh3 != nil && len(d) > 0 {
		_, _ = w.xxh3.Write(d)
		w.xxh3.EndRange()
	}
}

// seal puts the digest on the last chunk (after its data was added).
func (w *writeSum) seal(last *hamsv1.StateChunk) {
	if w.xxh3 != nil {
		w.sent = chunkhash.Format(w.xxh3.Sum64())
		last.Digest = w.sent
		return
	}
	w.sent = w.sha
	last.Sha256 = w.sha
}

// check compares the digest the server computed with the one sent.
func (w *writeSum) check(resp *hamsv1.WriteStateResponse, model, what string) error {
	got := resp.GetSha256()
	if w.xxh3 != nil {
		got = resp.GetDigest()
	}
	if got != "" && got != w.sent {
		return status.Errorf(codes.DataLoss, "reference %s %s: server hashed %s, sent %s", model, what, got, w.sent)
	}
	return nil
}

// writeErr maps a failed write. A server that refused the XXH3 digest (an
// older one restarted behind the same address, say: it answers that the
// empty sha256 does not match) gets the SHA-256 from the next write on,
// until a Describe says otherwise.
func (b *Backend) writeErr(ctx context.Context, what string, sum *writeSum, err error) error {
	if st, ok := status.FromError(err); ok && sum.xxh3 != nil && st.Code() == codes.InvalidArgument &&
		(strings.Contains(st.Message(), "digest") || strings.Contains(st.Message(), "sha256")) {
		b.writeXXH3.Store(false)
		b.log().Warn("the model server refused the XXH3 digest of a state write; writes carry the SHA-256 from now on", "err", err)
	}
	return b.streamErr(ctx, what, err)
}

// WriteStateRanges patches ranges (StateRange offsets into the
// concatenated state of the tensors specs) into the installed state of
// version base and sets version (a partial ModelRuntime.WriteState; models
// whose Describe has state_delta). FailedPrecondition when the installed
// version is not base.
func (b *Backend) WriteStateRanges(ctx context.Context, specs []*hamsv1.TensorSpec, base, version uint64, ranges []*hamsv1.StateRange) error {
	total, err := tensor.SpecsBytes(specs)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "reference %s write state ranges: %v", b.model, err)
	}
	header := func() *hamsv1.StateChunk {
		return &hamsv1.StateChunk{Model: b.model, StateVersion: version, TotalBytes: total, Partial: true, BaseVersion: base, Tensors: specs}
	}
	offs, data := make([]uint64, len(ranges)), make([][]byte, len(ranges))
	for i, r := range ranges {
		offs[i], data[i] = r.GetOffset(), r.GetData()
	}
	if used, err := b.writeViaRegion(ctx, "write state ranges", header(), offs, data); used {
		return err
	}
	return b.writeInline(ctx, "write state ranges", header(), offs, data, b.newWriteSum("", data), true)
}

// writeInline streams a WriteState with header hdr and the data chunks
// data (at state offsets offs; empty ones are skipped) in the stream
// itself, in chunks of StateChunkBytes, sum's digest on the last chunk
// (on hdr when there is no data). needDigest: an answer that names no
// digest of what the server received is DataLoss (a partial write, whose
// ranges nothing else checks).
func (b *Backend) writeInline(ctx context.Context, what string, hdr *hamsv1.StateChunk, offs []uint64, data [][]byte, sum *writeSum, needDigest bool) error {
	lastData := -1
	for i, d := range data {
		if len(d) > 0 {
			lastData = i
		}
	}
	if lastData < 0 {
		hdr.Last = true
		sum.seal(hdr)
	}
	ctx, progress, stop := b.streamCtx(ctx)
	defer stop()
	st, err := b.rt.WriteState(ctx)
	if err != nil {
		return b.streamErr(ctx, what, err)
	}
	if err := st.Send(hdr); err != nil {
		_, err = st.CloseAndRecv()
		return b.streamErr(ctx, what, err)
	}
	progress()
	for i, d := range data {
		off := offs[i]
		for len(d) > 0 {
			k := min(len(d), StateChunkBytes)
			ch := &hamsv1.StateChunk{Offset: off, Data: d[:k]}
			off += uint64(k)
			d = d[k:]
			sum.chunk(ch.Data)
			if i == lastData && len(d) == 0 {
				ch.Last = true
				sum.seal(ch)
			}
			if err := st.Send(ch); err != nil {
				_, err = st.CloseAndRecv()
				return b.streamErr(ctx, what, err)
			}
			progress()
		}
	}
	resp, err := st.CloseAndRecv()
	if err != nil {
		return b.writeErr(ctx, what, sum, err)
	}
	if needDigest && resp.GetSha256() == "" && resp.GetDigest() == "" {
		return status.Errorf(codes.DataLoss, "reference %s %s: the server's answer names no digest of what it received", b.model, what)
	}
	return sum.check(resp, b.model, what)
}
