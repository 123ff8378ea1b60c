package sidecar

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// fuzzState is the state size the fuzzed backup knows (its model
// server's description), fuzzMsg its message limit.
const (
	fuzzState = 64
	fuzzMsg   = 4096
)

// testHost is a Host of cfg alone (no metrics, log discarded, epoch 0),
// for a stage driven without a sidecar.
func testHost(cfg *Config, maxMsg int) *sidecarHost {
	return &sidecarHost{cfg: cfg, log: slog.New(slog.DiscardHandler), maxMsg: maxMsg, epochV: new(atomic.Uint64), metrics: newMetrics(nil, cfg.Model)}
}

// fuzzBackup is a backup's state manager as far as receiving goes.
func fuzzBackup() *backupState {
	b := newBackupState(testHost(&Config{Model: "a"}, fuzzMsg), 0)
	b.setKnown(fuzzState)
	return b
}

// bulkOne reads one snapshot off a bulk stream as bulkConn and
// bulkSnapshot do (role checked by the caller), up to its digest.
func bulkOne(b *backupState, br *bufio.Reader) (*received, error) {
	hb, err := readFrame(br, headerLimit(b.h.MaxMessageBytes()), "header")
	if err != nil {
		return nil, err
	}
	h := &hamsv1.SnapshotHeader{}
	if err := proto.Unmarshal(hb, h); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "bulk snapshot: header: %v", err)
	}
	done, err := b.beginReceive(h)
	if err != nil {
		return nil, err
	}
	defer done()
	sink, err := b.newSink(h)
	if err != nil {
		return nil, err
	}
	if err := sink.readFrom(br); err != nil {
		return nil, err
	}
	db, err := readFrame(br, bulkMaxDigest, "digest")
	if err != nil {
		return nil, err
	}
	return sink.finish(string(db))
}

// encodeBulk writes a received snapshot as a shipper's sendBulk does,
// with the wire digest kind it came with (a delta's digest is its wire
// digest; a full state's XXH64).
func encodeBulk(r *received) []byte {
	kind := digestXXH64
	if r.header.GetDelta() && isWireDigest(r.digest) {
		kind = digestKindOf(r.digest)
	}
	var buf bytes.Buffer
	bw := bufio.NewWriter(&buf)
	hb, _ := proto.Marshal(r.header)
	_ = writeFrame(bw, appendDigestKind(hb, kind))
	sum := newWireHash(kind)
	if r.header.GetDelta() {
		for _, d := range r.delta {
			_, _ = bw.Write(binary.AppendUvarint(binary.AppendUvarint(nil, d.GetOffset()), uint64(len(d.GetData()))))
			_, _ = bw.Write(d.GetData())
			_, _ = sum.Write(d.GetData())
			sum.EndRange()
		}
	} else {
		_, _ = bw.Write(r.data)
		_, _ = sum.Write(r.data)
	}
	_ = writeFrame(bw, []byte(formatWireDigest(kind, sum.Sum64())))
	_ = bw.Flush()
	return buf.Bytes()
}

// checkReceived: what a backup buffers is what the header announced,
// within the bounds.
func checkReceived(t *testing.T, r *received) {
	t.Helper()
	h := r.header
	if h.GetStateBytes() > fuzzState {
		t.Fatalf("took a snapshot of %d state bytes, the model's state is %d", h.GetStateBytes(), fuzzState)
	}
	if h.GetDelta() {
		var n uint64
		for _, d := range r.delta {
			if d.GetOffset()+uint64(len(d.GetData())) > h.GetStateBytes() {
				t.Fatalf("range of %d bytes at %d outside the %d-byte state", len(d.GetData()), d.GetOffset(), h.GetStateBytes())
			}
			n += uint64(len(d.GetData()))
		}
		if n != h.GetDeltaBytes() {
			t.Fatalf("delta of %d bytes, header says %d", n, h.GetDeltaBytes())
		}
	} else if uint64(len(r.data)) != h.GetStateBytes() {
		t.Fatalf("state of %d bytes, header says %d", len(r.data), h.GetStateBytes())
	}
}

func snapshotSeeds() [][]byte {
	specs := []*hamsv1.TensorSpec{{Name: "s", Datatype: "FP32", Shape: []int64{4}}}
	full := &received{header: &hamsv1.SnapshotHeader{Model: "a", Epoch: 1, BatchId: 1, StateBytes: 16, StateTensors: specs,
		Requests: []*hamsv1.RequestRecord{{ReqId: 1, Seq: 1}}}, data: []byte("0123456789abcdef")}
	delta := &received{header: &hamsv1.SnapshotHeader{Model: "a", Epoch: 1, BatchId: 2, StateBytes: 16, StateTensors: specs, Delta: true, DeltaBytes: 6,
		Requests: []*hamsv1.RequestRecord{{ReqId: 2, Seq: 2}}}, delta: []*hamsv1.StateRange{{Offset: 0, Data: []byte("ab")}, {Offset: 12, Data: []byte("wxyz")}}}
	// A delta as a shipper of this version sends it: XXH3 announced in
	// the header (wiredigest.go).
	xxh3Delta := encodeDelta(&snapshot{header: delta.header, delta: delta.delta}, digestXXH3, nil)
	return [][]byte{encodeBulk(full), encodeBulk(delta), append(encodeBulk(full), encodeBulk(delta)...),
		binary.AppendUvarint(nil, 256<<20), {}, xxh3Delta}
}

// FuzzBulkStream feeds arbitrary bytes to a backup as the rest of a bulk
// connection (after its magic): snapshots one after another as long as
// they decode. No panic; an error is a gRPC status or an I/O error of the
// stream (a short read); what is taken is what its header announced,
// never more than the model's state size; and a snapshot taken encodes
// back to a stream that decodes to the same snapshot (decode(encode(x))
// == x).
func FuzzBulkStream(f *testing.F) {
	for _, s := range snapshotSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		b := fuzzBackup()
		br := bufio.NewReader(bytes.NewReader(in))
		for range 4 {
			r, err := bulkOne(b, br)
			if err != nil {
				if _, ok := status.FromError(err); !ok && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, errOverflow()) {
					t.Fatalf("error %v is neither a status nor a short read", err)
				}
				return
			}
			checkReceived(t, r)
			again, err := bulkOne(fuzzBackup(), bufio.NewReader(bytes.NewReader(encodeBulk(r))))
			if err != nil {
				t.Fatalf("decode(encode(x)): %v", err)
			}
			if !proto.Equal(again.header, r.header) || !bytes.Equal(again.data, r.data) || len(again.delta) != len(r.delta) || again.digest != r.digest {
				t.Fatalf("decode(encode(x)) = %+v, want %+v", again, r)
			}
			for i := range r.delta {
				if !proto.Equal(again.delta[i], r.delta[i]) {
					t.Fatalf("decode(encode(x)) range %d = %v, want %v", i, again.delta[i], r.delta[i])
				}
			}
		}
	})
}

// errOverflow is binary.ReadUvarint's error for a varint over 64 bits.
func errOverflow() error {
	_, err := binary.ReadUvarint(bytes.NewReader(bytes.Repeat([]byte{0xff}, 11)))
	return err
}

// FuzzSnapshotHeader takes a SnapshotHeader (a full state's or a delta's)
// and data from arbitrary bytes as ShipSnapshot receives them: the header,
// then the data in chunks (a full state in order, a delta's ranges at
// offsets), then the digest of what was sent. No panic; errors are gRPC
// statuses with InvalidArgument, ResourceExhausted or DataLoss; a
// snapshot taken holds exactly what its header announced, within the
// model's state size.
func FuzzSnapshotHeader(f *testing.F) {
	for _, s := range snapshotSeeds()[:2] {
		br := bufio.NewReader(bytes.NewReader(s))
		hb, _ := readFrame(br, fuzzMsg, "header")
		rest, _ := io.ReadAll(br)
		f.Add(hb, rest, uint64(0), uint16(4))
		f.Add(hb, rest, uint64(12), uint16(3))
	}
	f.Fuzz(func(t *testing.T, hb, data []byte, off uint64, chunk uint16) {
		h := &hamsv1.SnapshotHeader{}
		if err := proto.Unmarshal(hb, h); err != nil {
			return
		}
		b := fuzzBackup()
		clean := func(err error) {
			t.Helper()
			switch status.Code(err) {
			case codes.InvalidArgument, codes.ResourceExhausted, codes.DataLoss:
			default:
				t.Fatalf("error %v: want InvalidArgument, ResourceExhausted or DataLoss", err)
			}
		}
		k, err := b.newSink(h)
		if err != nil {
			clean(err)
			return
		}
		step := max(int(chunk), 1)
		sum := xxhash.New()
		for i := 0; i < len(data); i += step {
			d := data[i:min(i+step, len(data))]
			_, _ = sum.Write(d)
			if err := k.add(off+uint64(i), bytes.Clone(d)); err != nil {
				clean(err)
				return
			}
		}
		r, err := k.finish(deltaDigest(sum.Sum64()))
		if err != nil {
			clean(err)
			return
		}
		checkReceived(t, r)
	})
}
