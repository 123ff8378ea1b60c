package reference

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
	req.DeltaRegion = b.lend(ctx, b.stateBytes.Load())
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
		b.dropDelta(ctx)
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
// bytes known already (digest; "" computes it). The server verifies it
// against the data it received either way.
func (b *Backend) WriteStateDigest(ctx context.Context, tensors []*hamsv1.Tensor, version uint64, digest string) error {
	ctx, progress, stop := b.streamCtx(ctx)
	defer stop()
	specs := make([]*hamsv1.TensorSpec, len(tensors))
	var total uint64
	for i, t := range tensors {
		specs[i] = &hamsv1.TensorSpec{Name: t.GetName(), Datatype: t.GetDatatype(), Shape: t.GetShape()}
		total += uint64(len(t.GetData()))
	}
	sum := digest
	if sum == "" {
		h := sha256.New()
		for _, t := range tensors {
			h.Write(t.GetData())
		}
		sum = hex.EncodeToString(h.Sum(nil))
	}
	st, err := b.rt.WriteState(ctx)
	if err != nil {
		return b.streamErr(ctx, "write state", err)
	}
	hdr := &hamsv1.StateChunk{Model: b.model, StateVersion: version, Tensors: specs, TotalBytes: total}
	if total == 0 {
		hdr.Last, hdr.Sha256 = true, sum
	}
	if err := st.Send(hdr); err != nil {
		_, err = st.CloseAndRecv()
		return b.streamErr(ctx, "write state", err)
	}
	progress()
	var off uint64
	for _, t := range tensors {
		d := t.GetData()
		for len(d) > 0 {
			k := min(len(d), StateChunkBytes)
			ch := &hamsv1.StateChunk{Offset: off, Data: d[:k]}
			off += uint64(k)
			d = d[k:]
			if off == total {
				ch.Last, ch.Sha256 = true, sum
			}
			if err := st.Send(ch); err != nil {
				_, err = st.CloseAndRecv()
				return b.streamErr(ctx, "write state", err)
			}
			progress()
		}
	}
	resp, err := st.CloseAndRecv()
	if err != nil {
		return b.streamErr(ctx, "write state", err)
	}
	if resp.GetSha256() != "" && resp.GetSha256() != sum {
		return status.Errorf(codes.DataLoss, "reference %s write state: server hashed %s, sent %s", b.model, resp.GetSha256(), sum)
	}
	return nil
}

// WriteStateRanges patches ranges (StateRange offsets into the
// concatenated state of the tensors specs) into the installed state of
// version base and sets version (a partial ModelRuntime.WriteState; models
// whose Describe has state_delta). FailedPrecondition when the installed
// version is not base.
func (b *Backend) WriteStateRanges(ctx context.Context, specs []*hamsv1.TensorSpec, base, version uint64, ranges []*hamsv1.StateRange) error {
	ctx, progress, stop := b.streamCtx(ctx)
	defer stop()
	st, err := b.rt.WriteState(ctx)
	if err != nil {
		return b.streamErr(ctx, "write state ranges", err)
	}
	h := sha256.New()
	for _, r := range ranges {
		h.Write(r.GetData())
	}
	sum := hex.EncodeToString(h.Sum(nil))
	total, err := tensor.SpecsBytes(specs)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "reference %s write state ranges: %v", b.model, err)
	}
	hdr := &hamsv1.StateChunk{Model: b.model, StateVersion: version, TotalBytes: total, Partial: true, BaseVersion: base, Tensors: specs}
	if len(ranges) == 0 {
		hdr.Last, hdr.Sha256 = true, sum
	}
	if err := st.Send(hdr); err != nil {
		_, err = st.CloseAndRecv()
		return b.streamErr(ctx, "write state ranges", err)
	}
	progress()
	for i, r := range ranges {
		d, off := r.GetData(), r.GetOffset()
		for first := true; first || len(d) > 0; first = false {
			k := min(len(d), StateChunkBytes)
			ch := &hamsv1.StateChunk{Offset: off, Data: d[:k]}
			off += uint64(k)
			d = d[k:]
			if i == len(ranges)-1 && len(d) == 0 {
				ch.Last, ch.Sha256 = true, sum
			}
			if err := st.Send(ch); err != nil {
				_, err = st.CloseAndRecv()
				return b.streamErr(ctx, "write state ranges", err)
			}
			progress()
		}
	}
	resp, err := st.CloseAndRecv()
	if err != nil {
		return b.streamErr(ctx, "write state ranges", err)
	}
	if resp.GetSha256() != sum {
		return status.Errorf(codes.DataLoss, "reference %s write state ranges: server hashed %s, sent %s", b.model, resp.GetSha256(), sum)
	}
	return nil
}
