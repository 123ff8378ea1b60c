package sidecar

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/chunkhash"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Tests of the copy-free shipping paths (issue 22): writev shipping, the
// XXH3 negotiation, ranges received into their own unzeroed buffers, the
// primary's in-place fold.

// fakeBulkBackup serves bulk snapshots with the backup's receiving code
// (bulkOne) and answers as a backup of this version does, or (old) as
// one that predates XXH3. It records every snapshot it took and the
// digest kind its header announced.
type fakeBulkBackup struct {
	t    *testing.T
	lis  net.Listener
	old  bool
	bk   *backupState
	mu   sync.Mutex
	got  []*received
	errs []error
	wg   sync.WaitGroup
}

func newFakeBulkBackup(t *testing.T, state uint64, old bool) *fakeBulkBackup {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeBulkBackup{t: t, lis: lis, old: old, bk: newBackupState(testHost(&Config{Model: "a"}, 1<<20), 0)}
	f.bk.setKnown(state)
	f.wg.Add(1)
	go f.serve()
	t.Cleanup(func() { _ = lis.Close(); f.wg.Wait() })
	return f
}

func (f *fakeBulkBackup) serve() {
	defer f.wg.Done()
	for {
		c, err := f.lis.Accept()
		if err != nil {
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer c.Close()
			magic := make([]byte, len(bulkMagic))
			if _, err := io.ReadFull(c, magic); err != nil || string(magic) != bulkMagic {
				return
			}
			br, bw := bufio.NewReader(c), bufio.NewWriter(c)
			for {
				if _, err := br.Peek(1); err != nil {
					return
				}
				r, err := bulkOne(f.bk, br)
				f.mu.Lock()
				if err != nil {
					f.errs = append(f.errs, err)
				} else {
					f.got = append(f.got, r)
				}
				f.mu.Unlock()
				if err != nil {
					if _, ok := status.FromError(err); ok {
						_ = writeBulkAnswer(bw, nil, err)
					}
					return // out of step
				}
				resp := &hamsv1.ShipSnapshotResponse{BatchId: r.header.GetBatchId()}
				if f.old {
					err = writeBulkAnswerBefore(bw, resp)
				} else {
					err = writeBulkAnswer(bw, resp, nil)
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

func (f *fakeBulkBackup) taken() ([]*received, []error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*received(nil), f.got...), append([]error(nil), f.errs...)
}

// deltaSnap is a delta snapshot with batch id id of ranges over a state
// of n bytes.
func deltaSnap(id, n uint64, rs ...*hamsv1.StateRange) *snapshot {
	h := &hamsv1.SnapshotHeader{Model: "a", Epoch: 1, BatchId: id, StateBytes: n, Delta: true, DeltaBytes: rangeBytes(rs),
		StateTensors: []*hamsv1.TensorSpec{{Name: "s", Datatype: "UINT8", Shape: []int64{int64(n)}}},
		Requests:     []*hamsv1.RequestRecord{{ReqId: id, Seq: id}}}
	return &snapshot{batch: id, header: h, delta: rs}
}

func bytesOf(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// A shipper uses XXH64 on a new connection and XXH3 once the backup's
// answer says it checks it; a backup that predates XXH3 gets XXH64 only.
// Either way the ranges (one ending at the state's last byte, one larger
// than a writev, one larger than a read piece) arrive intact.
func TestBulkDigestNegotiation(t *testing.T) {
	const n = 8 << 20
	rs := func(seed byte) []*hamsv1.StateRange {
		return []*hamsv1.StateRange{{Offset: 0, Data: bytesOf(3, seed)}, {Offset: 4096, Data: bytesOf(bulkWriteBytes+bulkReadBytes+5, seed)},
			{Offset: n - 1000, Data: bytesOf(1000, seed)}}
	}
	for _, old := range []bool{false, true} {
		name := map[bool]string{false: "current backup", true: "backup before xxh3"}[old]
		t.Run(name, func(t *testing.T) {
			f := newFakeBulkBackup(t, n, old)
			sh := &shipper{h: testHost(&Config{Model: "a"}, 0)}
			defer func() { sh.bulk.close() }()
			var kinds []string
			for id := uint64(1); id <= 3; id++ {
				sn := deltaSnap(id, n, rs(byte(id))...)
				if _, err := sh.sendBulk(context.Background(), f.lis.Addr().String(), sn); err != nil {
					t.Fatalf("snapshot %d: %v", id, err)
				}
				kinds = append(kinds, sn.digest[:strings.IndexByte(sn.digest, ':')])
			}
			want := "xxh64 xxh3 xxh3"
			if old {
				want = "xxh64 xxh64 xxh64"
			}
			if got := strings.Join(kinds, " "); got != want {
				t.Fatalf("digest kinds %s, want %s", got, want)
			}
			got, errs := f.taken()
			if len(errs) > 0 || len(got) != 3 {
				t.Fatalf("backup took %d snapshots, errors %v", len(got), errs)
			}
			for i, r := range got {
				want := rs(byte(i + 1))
				if len(r.delta) != len(want) {
					t.Fatalf("snapshot %d: %d ranges, want %d", i+1, len(r.delta), len(want))
				}
				for j := range want {
					if r.delta[j].GetOffset() != want[j].GetOffset() || !bytes.Equal(r.delta[j].GetData(), want[j].GetData()) {
						t.Fatalf("snapshot %d range %d differs", i+1, j)
					}
				}
			}
		})
	}
}

// cutConn fails the connection after it wrote limit bytes (the write
// that crosses the limit is short).
type cutConn struct {
	net.Conn
	limit int
}

func (c *cutConn) Write(p []byte) (int, error) {
	if len(p) <= c.limit {
		c.limit -= len(p)
		return c.Conn.Write(p)
	}
	n, _ := c.Conn.Write(p[:c.limit])
	c.limit = 0
	_ = c.Conn.Close()
	return n, errors.New("injected short write")
}

// A short write mid-range fails the shipment with an error naming what
// was being written, closes the connection (the next shipment dials
// again and gets through), and the backup takes nothing of the cut one.
func TestBulkShortWriteMidRange(t *testing.T) {
	const n = 4 << 20
	f := newFakeBulkBackup(t, n, false)
	sh := &shipper{h: testHost(&Config{Model: "a"}, 0)}
	defer func() { sh.bulk.close() }()
	dials := 0
	sh.bulkDial = func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		if dials++; dials == 1 {
			return &cutConn{Conn: c, limit: len(bulkMagic) + 200 + bulkWriteBytes/2}, nil
		}
		return c, nil
	}
	sn := deltaSnap(1, n, &hamsv1.StateRange{Offset: 8, Data: bytesOf(2<<20, 1)})
	_, err := sh.sendBulk(context.Background(), f.lis.Addr().String(), sn)
	if err == nil || !strings.Contains(err.Error(), "injected short write") || !strings.Contains(err.Error(), "batch 1") {
		t.Fatalf("cut shipment: err %v, want the injected short write of batch 1", err)
	}
	if sh.bulk.c != nil {
		t.Fatal("the connection of a failed shipment stays open")
	}
	if _, err := sh.sendBulk(context.Background(), f.lis.Addr().String(), sn); err != nil {
		t.Fatalf("resend: %v", err)
	}
	got, errs := f.taken()
	if len(got) != 1 || !bytes.Equal(got[0].delta[0].GetData(), sn.delta[0].GetData()) {
		t.Fatalf("backup took %d snapshots, want the resent one intact", len(got))
	}
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "range data") {
		t.Fatalf("backup errors %v, want one cut range", errs)
	}
}

// encodeDelta is a bulk delta as a shipper writes it, with the given
// header digest kind and a digest of that kind.
func encodeDelta(sn *snapshot, kind uint64, damage func([]byte)) []byte {
	var buf bytes.Buffer
	bw := bufio.NewWriter(&buf)
	hb, _ := proto.Marshal(sn.header)
	_ = writeFrame(bw, appendDigestKind(hb, kind))
	sum := newWireHash(kind)
	for _, r := range sn.delta {
		_, _ = bw.Write(binary.AppendUvarint(binary.AppendUvarint(nil, r.GetOffset()), uint64(len(r.GetData()))))
		_, _ = sum.Write(r.GetData())
		sum.EndRange()
		d := bytes.Clone(r.GetData())
		if damage != nil {
			damage(d)
		}
		_, _ = bw.Write(d)
	}
	_ = writeFrame(bw, []byte(formatWireDigest(kind, sum.Sum64())))
	_ = bw.Flush()
	return buf.Bytes()
}

// What the backup's bulk reader takes and refuses in the new paths: a
// range that ends at the state's last byte is taken, one byte more is
// refused before anything is allocated for it; a flipped data byte under
// either digest kind is DataLoss; a digest of another kind than the
// header announced is DataLoss; a stream cut mid-range is an I/O error.
// Nothing refused is returned to be applied.
func TestBulkReceiveEdges(t *testing.T) {
	const n = 1 << 20
	end := deltaSnap(1, n, &hamsv1.StateRange{Offset: n - 4096, Data: bytesOf(4096, 3)})
	past := deltaSnap(1, n, &hamsv1.StateRange{Offset: n - 4095, Data: bytesOf(4096, 3)})
	flip := func(d []byte) { d[len(d)/2] ^= 1 }
	mixed := encodeDelta(end, digestXXH3, nil)
	// The same data announced as XXH3 with an XXH64 digest.
	i := bytes.LastIndex(mixed, []byte(xxh3Prefix))
	mixed = append(mixed[:i-1], writeFrameBytes([]byte(rangesDigest(end.delta)))...)
	cases := []struct {
		name   string
		stream []byte
		code   codes.Code // OK: taken; Unknown: an I/O error
	}{
		{"range at the end, xxh3", encodeDelta(end, digestXXH3, nil), codes.OK},
		{"range at the end, xxh64", encodeDelta(end, digestXXH64, nil), codes.OK},
		{"range one byte past the end", encodeDelta(past, digestXXH3, nil), codes.InvalidArgument},
		{"corrupt data, xxh3", encodeDelta(end, digestXXH3, flip), codes.DataLoss},
		{"corrupt data, xxh64", encodeDelta(end, digestXXH64, flip), codes.DataLoss},
		{"digest of another kind", mixed, codes.DataLoss},
		{"cut mid-range", encodeDelta(end, digestXXH3, nil)[:100+2048], codes.Unknown},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newBackupState(testHost(&Config{Model: "a"}, 1<<20), 0)
			b.setKnown(n)
			r, err := bulkOne(b, bufio.NewReader(bytes.NewReader(c.stream)))
			switch {
			case c.code == codes.OK && err != nil:
				t.Fatalf("refused: %v", err)
			case c.code == codes.OK:
				if !bytes.Equal(r.delta[0].GetData(), end.delta[0].GetData()) || r.delta[0].GetOffset() != n-4096 {
					t.Fatal("range taken differs from the one sent")
				}
			case err == nil || r != nil:
				t.Fatalf("taken (%v), want refused", err)
			case c.code == codes.Unknown:
				if _, ok := status.FromError(err); ok || !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("err %v, want an I/O error", err)
				}
			case status.Code(err) != c.code:
				t.Fatalf("err %v, want %v", err, c.code)
			}
		})
	}
}

func writeFrameBytes(b []byte) []byte { return append(binary.AppendUvarint(nil, uint64(len(b))), b...) }

// The primary's rollback target follows applied deltas in place once a
// fold made its buffer, and a target handed out (Applied) is never
// written afterwards.
func TestFoldInPlaceSparesHandedOutTarget(t *testing.T) {
	const n = 64
	specs := []*hamsv1.TensorSpec{{Name: "a", Datatype: "UINT8", Shape: []int64{32}}, {Name: "b", Datatype: "UINT8", Shape: []int64{32}}}
	base := &snapshot{batch: 1, header: &hamsv1.SnapshotHeader{BatchId: 1, StateBytes: n, StateTensors: specs},
		state: []*hamsv1.Tensor{{Name: "a", Datatype: "UINT8", Shape: []int64{32}, Data: make([]byte, 32)},
			{Name: "b", Datatype: "UINT8", Shape: []int64{32}, Data: make([]byte, 32)}}}
	sh := &shipper{h: &sidecarHost{cfg: &Config{Model: "a"}, log: slog.New(slog.NewTextHandler(testWriter{t}, nil))}}
	sh.reset(base, false)
	want := make([]byte, n)
	id := uint64(1)
	apply := func(off int, v byte, k int) {
		id++
		d := bytes.Repeat([]byte{v}, k)
		copy(want[off:], d)
		sn := deltaSnap(id, n, &hamsv1.StateRange{Offset: uint64(off), Data: d})
		sh.recordAck(sn, "b", true)
	}
	stateOf := func(sn *snapshot) []byte { return joinState(sn.state) }
	apply(0, 1, 40) // > state/2
	apply(30, 2, 30)
	// Folded (the tail passed the state's size): by copy the first time.
	if len(sh.appliedTail) != 0 || !sh.appliedOwn {
		t.Fatalf("tail %d, own %v after a state's worth of deltas", len(sh.appliedTail), sh.appliedOwn)
	}
	if got := stateOf(sh.applied); !bytes.Equal(got, want) || sh.applied.batch != id {
		t.Fatalf("folded state %v (batch %d), want %v (batch %d)", got, sh.applied.batch, want, id)
	}
	if !bytes.Equal(stateOf(base), make([]byte, n)) {
		t.Fatal("fold wrote the base state")
	}
	buf := sh.appliedBuf
	apply(60, 3, 4)
	apply(0, 4, 64)
	if !sh.appliedOwn || &sh.appliedBuf[0] != &buf[0] {
		t.Fatal("the second fold did not patch the owned buffer in place")
	}
	if got := stateOf(sh.applied); !bytes.Equal(got, want) {
		t.Fatalf("state after the in-place fold %v, want %v", got, want)
	}
	target := sh.Applied()
	kept := bytes.Clone(stateOf(target))
	if sh.appliedOwn {
		t.Fatal("Applied handed out the buffer the shipper still owns")
	}
	apply(4, 5, 60)
	apply(0, 6, 10)
	if !bytes.Equal(stateOf(target), kept) {
		t.Fatal("a rollback target handed out was written by a later fold")
	}
	if got := stateOf(sh.Applied()); !bytes.Equal(got, want) {
		t.Fatalf("state after the later folds %v, want %v", got, want)
	}
}

// testWriter logs through t.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func TestMakeNoZero(t *testing.T) {
	if makeNoZero(0) != nil {
		t.Fatal("a buffer for 0 bytes")
	}
	a, b := makeNoZero(1<<20+3), makeNoZero(1<<20+3)
	if len(a) != 1<<20+3 || cap(a) != len(a) {
		t.Fatalf("len %d cap %d", len(a), cap(a))
	}
	for i := range a {
		a[i], b[i] = 1, 2
	}
	if a[len(a)-1] != 1 || b[0] != 2 {
		t.Fatal("two buffers share memory")
	}
}

// A snapshot without a digest of its data (digestAEAD) is taken only on
// a TLS connection: the backup checks its own transport, not the
// sender's word.
func TestBulkAEADOnlyOverTLS(t *testing.T) {
	const n = 1 << 20
	sn := deltaSnap(1, n, &hamsv1.StateRange{Offset: 4096, Data: bytesOf(3*chunkhash.Chunk+5, 1)})
	for _, onTLS := range []bool{true, false} {
		b := newBackupState(testHost(&Config{Model: "a"}, 1<<20), 0)
		b.setKnown(n)
		br := bufio.NewReader(bytes.NewReader(encodeDelta(sn, digestAEAD, nil)))
		hb, err := readFrame(br, 1<<20, "header")
		if err != nil {
			t.Fatal(err)
		}
		h := &hamsv1.SnapshotHeader{}
		if err := proto.Unmarshal(hb, h); err != nil {
			t.Fatal(err)
		}
		k, err := b.newSink(h)
		if err != nil {
			t.Fatal(err)
		}
		k.aeadOK = onTLS
		if err := k.readFrom(br); err != nil {
			t.Fatal(err)
		}
		db, err := readFrame(br, bulkMaxDigest, "digest")
		if err != nil {
			t.Fatal(err)
		}
		r, err := k.finish(string(db))
		switch {
		case onTLS && err != nil:
			t.Fatalf("over TLS: %v", err)
		case onTLS && !bytes.Equal(r.delta[0].GetData(), sn.delta[0].GetData()):
			t.Fatal("over TLS: range differs")
		case !onTLS && status.Code(err) != codes.InvalidArgument:
			t.Fatalf("without TLS: err %v, want InvalidArgument", err)
		}
	}
	if got := pickDigest(digestXXH64|digestXXH3|digestAEAD, false); got != digestXXH3 {
		t.Fatalf("a plaintext shipper picks kind %d, want XXH3", got)
	}
	if got := pickDigest(0, true); got != digestXXH64 {
		t.Fatalf("a shipper to an older backup picks kind %d, want XXH64", got)
	}
}
