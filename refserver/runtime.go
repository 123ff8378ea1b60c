package refserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/chunkhash"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver/models"
)

const (
	defaultChunk = 1 << 20
	minChunk     = 4 << 10
	maxChunk     = 16 << 20
)

type runtimeAPI struct {
	hamsv1.UnimplementedModelRuntimeServer
	s *Server
}

func (a *runtimeAPI) Health(ctx context.Context, req *hamsv1.HealthRequest) (*hamsv1.HealthResponse, error) {
	if req.GetModel() == "" {
		return &hamsv1.HealthResponse{Live: true, Ready: true, Detail: "serving"}, nil
	}
	h, err := a.s.lookup(req.GetModel())
	if err != nil {
		return nil, err
	}
	if !h.ready() {
		return &hamsv1.HealthResponse{Live: true, Ready: false, Detail: "not ready"}, nil
	}
	return &hamsv1.HealthResponse{Live: true, Ready: true, Detail: "serving"}, nil
}

func (a *runtimeAPI) Describe(ctx context.Context, req *hamsv1.DescribeRequest) (*hamsv1.ModelDescription, error) {
	h, err := a.s.lookup(req.GetModel())
	if err != nil {
		return nil, err
	}
	d := h.m.Describe()
	if d.GetStateBytes() > 0 {
		d = proto.CloneOf(d) // the model's own description stays as it is
		d.WriteStateDigests, d.WriteStateRegions = []string{writeDigestXXH3}, true
	}
	return d, nil
}

// writeSource gives a WriteState chunk's data: its own, or, in a write
// whose first chunk names a region, the next byte_size bytes of that
// region (pinned until the write ends).
type writeSource struct {
	use    *shmUse // nil: data inline
	region string
	cursor uint64
}

func (a *runtimeAPI) openWriteSource(first *hamsv1.StateChunk, model string) (*writeSource, error) {
	name := first.GetRegion()
	if name == "" {
		return &writeSource{}, nil
	}
	u, err := a.s.shm.pin(name)
	if err != nil {
		return nil, status.Errorf(status.Code(err), "write state of %q from region %q: %s", model, name, status.Convert(err).Message())
	}
	return &writeSource{use: u, region: name}, nil
}

func (w *writeSource) data(ch *hamsv1.StateChunk, model string) ([]byte, error) {
	if w.use == nil {
		if ch.GetByteSize() != 0 {
			return nil, status.Errorf(codes.InvalidArgument, "write state of %q: chunk at %d with byte_size %d but the write names no region", model, ch.GetOffset(), ch.GetByteSize())
		}
		return ch.GetData(), nil
	}
	if len(ch.GetData()) > 0 {
		return nil, status.Errorf(codes.InvalidArgument, "write state of %q from region %q: chunk at %d carries %d bytes of data itself", model, w.region, ch.GetOffset(), len(ch.GetData()))
	}
	n, left := ch.GetByteSize(), uint64(len(w.use.buf))-w.cursor
	if n > left {
		return nil, status.Errorf(codes.InvalidArgument, "write state of %q from region %q: chunk of %d bytes at region offset %d, past its %d bytes", model, w.region, n, w.cursor, len(w.use.buf))
	}
	d := w.use.buf[w.cursor : w.cursor+n : w.cursor+n]
	w.cursor += n
	return d, nil
}

// writeDigestXXH3 is the digest kind (ModelDescription.write_state_digests)
// of chunkhash's XXH3 tree, each data chunk one range.
const writeDigestXXH3 = "xxh3"

// writeDigest checks the digest on a WriteState's last chunk against the
// data chunks received (in stream order): digest when the chunk carries
// one (its kind must be one this server lists), else sha256. It returns
// the response's digest fields. what names the write for errors.
func writeDigest(last *hamsv1.StateChunk, data [][]byte, what string) (*hamsv1.WriteStateResponse, error) {
	if d := last.GetDigest(); d != "" {
		if !chunkhash.Is(d) {
			return nil, status.Errorf(codes.InvalidArgument, "%s: digest %q is of no kind this server takes (%s)", what, d, writeDigestXXH3)
		}
		got := chunkhash.Format(chunkhash.SumRanges(data))
		if d != got {
			return nil, status.Errorf(codes.InvalidArgument, "%s: digest %q does not match the data (%s)", what, d, got)
		}
		return &hamsv1.WriteStateResponse{Digest: got}, nil
	}
	h := sha256.New()
	for _, b := range data {
		h.Write(b)
	}
	got := hex.EncodeToString(h.Sum(nil))
	if last.GetSha256() != got {
		return nil, status.Errorf(codes.InvalidArgument, "%s: sha256 %q does not match the data (%s)", what, last.GetSha256(), got)
	}
	return &hamsv1.WriteStateResponse{Sha256: got}, nil
}

func batchOf(req *hamsv1.BatchRequest) *models.Batch {
	return &models.Batch{Inputs: req.Inputs, Rows: append([]uint32(nil), req.Rows...), StreamIDs: req.StreamIds, BatchID: req.BatchId, StageDelta: req.StageDelta, InstallID: req.InstallBatchId}
}

func (a *runtimeAPI) step(ctx context.Context, req *hamsv1.BatchRequest, method string, fn func(models.Model, *models.Batch) (*models.Result, error)) (*hamsv1.BatchResponse, error) {
	h, err := a.s.lookup(req.GetModel())
	if err != nil {
		return nil, err
	}
	var resp *hamsv1.BatchResponse
	err = a.s.run(h, method, func() error {
		if err := a.s.straggle(ctx, h, method); err != nil {
			return err
		}
		b := batchOf(req)
		r, err := fn(h.m, b)
		if err != nil {
			return err
		}
		resp = &hamsv1.BatchResponse{Outputs: r.Outputs, Rows: b.Rows, BatchId: req.BatchId, NextStateVersion: r.NextStateVersion, HasStateDelta: r.HasDelta}
		if r.HasDelta {
			resp.StateDelta = make([]*hamsv1.StateRange, len(r.Delta))
			if name := req.GetDeltaRegion(); name != "" {
				if sizes, ok := a.s.shm.writeDelta(name, r.Delta); ok {
					resp.StateDeltaRegion, resp.StateDeltaSizes = name, sizes
					for i, d := range r.Delta {
						resp.StateDelta[i] = &hamsv1.StateRange{Offset: d.Off}
					}
					return nil
				}
			}
			for i, d := range r.Delta {
				resp.StateDelta[i] = &hamsv1.StateRange{Offset: d.Off, Data: d.Data}
			}
		}
		return nil
	})
	return resp, err
}

func (a *runtimeAPI) Infer(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	return a.step(ctx, req, "Infer", models.Model.Infer)
}

func (a *runtimeAPI) Compute(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	return a.step(ctx, req, "Compute", models.Model.Compute)
}

func (a *runtimeAPI) Update(ctx context.Context, req *hamsv1.UpdateRequest) (*hamsv1.UpdateResponse, error) {
	h, err := a.s.lookup(req.GetModel())
	if err != nil {
		return nil, err
	}
	var v uint64
	err = a.s.run(h, "Update", func() error {
		var err error
		v, err = h.m.Update(req.BatchId)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &hamsv1.UpdateResponse{StateVersion: v}, nil
}

// chunkSender streams state bytes as StateChunks of up to size bytes; the
// chunk that completes total carries last and the SHA-256.
type chunkSender struct {
	stream hamsv1.ModelRuntime_ReadStateServer
	size   int
	total  uint64
	sent   uint64
	buf    []byte
	h      hash.Hash
}

func (c *chunkSender) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), c.size-len(c.buf))
		c.buf = append(c.buf, p[:k]...)
		p = p[k:]
		if len(c.buf) == c.size {
			if err := c.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (c *chunkSender) flush() error {
	if len(c.buf) == 0 {
		return nil
	}
	c.h.Write(c.buf)
	ch := &hamsv1.StateChunk{Offset: c.sent, Data: c.buf}
	c.sent += uint64(len(c.buf))
	if c.sent > c.total {
		return status.Errorf(codes.Internal, "state grew while being read: %d > %d bytes", c.sent, c.total)
	}
	if c.sent == c.total {
		ch.Last, ch.Sha256 = true, hex.EncodeToString(c.h.Sum(nil))
	}
	err := c.stream.Send(ch)
	c.buf = c.buf[:0]
	return err
}

func (a *runtimeAPI) ReadState(req *hamsv1.ReadStateRequest, stream hamsv1.ModelRuntime_ReadStateServer) error {
	h, err := a.s.lookup(req.GetModel())
	if err != nil {
		return err
	}
	size := int(req.ChunkBytes)
	if size == 0 {
		size = defaultChunk
	}
	size = max(minChunk, min(size, maxChunk))
	cs := &chunkSender{stream: stream, size: size, h: sha256.New()}
	err = h.m.ReadState(func(info models.StateInfo) (io.Writer, error) {
		cs.total = info.TotalBytes
		cs.buf = make([]byte, 0, min(uint64(size), max(info.TotalBytes, 1)))
		hdr := &hamsv1.StateChunk{Model: h.name, StateVersion: info.Version, Tensors: info.Tensors, TotalBytes: info.TotalBytes}
		if info.TotalBytes == 0 {
			hdr.Last, hdr.Sha256 = true, hex.EncodeToString(cs.h.Sum(nil))
		}
		return cs, stream.Send(hdr)
	})
	if err == nil {
		err = cs.flush()
	}
	if err == nil && cs.sent != cs.total {
		err = status.Errorf(codes.Internal, "state of %q: sent %d of %d bytes", h.name, cs.sent, cs.total)
	}
	if err != nil {
		if _, ok := status.FromError(err); !ok {
			err = status.Errorf(codes.Unavailable, "read state of %q: %v", h.name, err)
		}
	}
	return err
}

func (a *runtimeAPI) WriteState(stream hamsv1.ModelRuntime_WriteStateServer) error {
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return status.Error(codes.InvalidArgument, "write state: empty stream")
		}
		return err
	}
	h, err := a.s.lookup(first.GetModel())
	if err != nil {
		return err
	}
	info := h.m.StateInfo()
	if first.TotalBytes != info.TotalBytes {
		return status.Errorf(codes.InvalidArgument, "write state of %q: %d bytes, the model's state is %d", h.name, first.TotalBytes, info.TotalBytes)
	}
	if len(first.Tensors) != len(info.Tensors) {
		return status.Errorf(codes.InvalidArgument, "write state of %q: %d tensors, the model has %d", h.name, len(first.Tensors), len(info.Tensors))
	}
	for i, t := range first.Tensors {
		if !proto.Equal(t, info.Tensors[i]) {
			return status.Errorf(codes.InvalidArgument, "write state of %q: tensor %d is %v, want %v", h.name, i, t, info.Tensors[i])
		}
	}
	src, err := a.openWriteSource(first, h.name)
	if err != nil {
		return err
	}
	defer a.s.shm.release(src.use)
	if first.Partial {
		return a.writeStateRanges(stream, h, first, src)
	}
	data := make([]byte, 0, info.TotalBytes)
	var chunks [][]byte // data's chunks as received, for the digest
	ch := first
	for {
		chd, err := src.data(ch, h.name)
		if err != nil {
			return err
		}
		if ch.Offset != uint64(len(data)) && len(chd) > 0 {
			return status.Errorf(codes.InvalidArgument, "write state of %q: chunk at offset %d, expected %d", h.name, ch.Offset, len(data))
		}
		if uint64(len(data)+len(chd)) > info.TotalBytes {
			return status.Errorf(codes.InvalidArgument, "write state of %q: more than %d bytes", h.name, info.TotalBytes)
		}
		if len(chd) > 0 {
			data = append(data, chd...)
			chunks = append(chunks, data[len(data)-len(chd):])
		}
		if ch.Last {
			break
		}
		ch, err = stream.Recv()
		if errors.Is(err, io.EOF) {
			return status.Errorf(codes.InvalidArgument, "write state of %q: stream ended without a last chunk", h.name)
		}
		if err != nil {
			return err
		}
	}
	if uint64(len(data)) != info.TotalBytes {
		return status.Errorf(codes.InvalidArgument, "write state of %q: %d of %d bytes", h.name, len(data), info.TotalBytes)
	}
	resp, err := writeDigest(ch, chunks, fmt.Sprintf("write state of %q", h.name))
	if err != nil {
		return err
	}
	var v uint64
	err = a.s.run(h, "WriteState", func() error {
		var err error
		v, err = h.m.WriteState(first.StateVersion, data)
		return err
	})
	if err != nil {
		return err
	}
	a.s.log.Debug("state written", "model", h.name, "version", v, "bytes", len(data))
	resp.StateVersion = v
	return stream.SendAndClose(resp)
}

// writeStateRanges serves a partial WriteState: data chunks (inline or
// from src's region) at any offsets, applied in stream order on top of
// base_version, the digest of their data on the last chunk.
func (a *runtimeAPI) writeStateRanges(stream hamsv1.ModelRuntime_WriteStateServer, h *hosted, first *hamsv1.StateChunk, src *writeSource) error {
	var (
		ranges []models.Range
		chunks [][]byte // the ranges' data as received, for the digest
		bytes  uint64
	)
	ch := first
	for {
		chd, err := src.data(ch, h.name)
		if err != nil {
			return err
		}
		if len(chd) > 0 {
			if bytes += uint64(len(chd)); bytes > 2*first.TotalBytes+maxChunk {
				return status.Errorf(codes.InvalidArgument, "partial write state of %q: more data than the state could take", h.name)
			}
			// From a region, the model copies the ranges while the
			// region is pinned (patch never keeps a range's bytes).
			chunks = append(chunks, chd)
			ranges = append(ranges, models.Range{Off: ch.Offset, Data: chd})
		}
		if ch.Last {
			break
		}
		ch, err = stream.Recv()
		if errors.Is(err, io.EOF) {
			return status.Errorf(codes.InvalidArgument, "partial write state of %q: stream ended without a last chunk", h.name)
		}
		if err != nil {
			return err
		}
	}
	resp, err := writeDigest(ch, chunks, fmt.Sprintf("partial write state of %q", h.name))
	if err != nil {
		return err
	}
	var v uint64
	err = a.s.run(h, "WriteState", func() error {
		var err error
		v, err = h.m.WriteStateRanges(first.BaseVersion, first.StateVersion, ranges)
		return err
	})
	if err != nil {
		return err
	}
	a.s.log.Debug("state ranges written", "model", h.name, "version", v, "ranges", len(ranges), "bytes", bytes)
	resp.StateVersion = v
	return stream.SendAndClose(resp)
}

func (a *runtimeAPI) StateHandles(ctx context.Context, req *hamsv1.StateHandlesRequest) (*hamsv1.StateHandlesResponse, error) {
	if _, err := a.s.lookup(req.GetModel()); err != nil {
		return nil, err
	}
	return nil, status.Error(codes.Unimplemented, "reference model server: StateHandles (POSIX shm / CUDA IPC state regions) is not implemented yet; use ReadState")
}

// LoadWeights replaces a hosted model's weights (a parity model trained
// online). A kind without replaceable weights is Unimplemented; weights it
// refuses are InvalidArgument and the old ones stay.
func (a *runtimeAPI) LoadWeights(ctx context.Context, req *hamsv1.LoadWeightsRequest) (*hamsv1.LoadWeightsResponse, error) {
	h, err := a.s.lookup(req.GetModel())
	if err != nil {
		return nil, err
	}
	if len(req.GetWeights()) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "model %q: empty weights", req.GetModel())
	}
	switch err := models.LoadWeights(h.m, req.GetWeights()); {
	case errors.Is(err, models.ErrNoWeights):
		return nil, status.Errorf(codes.Unimplemented, "model %q: %v", req.GetModel(), err)
	case err != nil:
		return nil, status.Errorf(codes.InvalidArgument, "model %q: %v", req.GetModel(), err)
	}
	a.s.log.Info("weights replaced", "model", req.GetModel(), "version", req.GetVersion(), "bytes", len(req.GetWeights()))
	return &hamsv1.LoadWeightsResponse{Version: req.GetVersion()}, nil
}
