package sidecar

import (
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/grpcx"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// allocatedBy is how many bytes the process allocated while f ran.
func allocatedBy(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// closedBy waits until the backup closed the connection (it read what
// it was going to read), after this side closed its writing half.
func closedBy(t *testing.T, b *bulkClientConn) {
	t.Helper()
	if err := b.bw.Flush(); err != nil {
		t.Fatal(err)
	}
	_ = b.c.(*net.TCPConn).CloseWrite()
	_, _ = io.Copy(io.Discard, b.br)
}

// Hostile input on the bulk stream: a huge length, to any sidecar, is
// checked against the role and the bounds before anything of that size
// is allocated. Without the checks, each case below allocates at least
// the announced size (256 MiB, 64 MiB, 1 GiB).
func TestBulkStreamChecksBeforeAllocating(t *testing.T) {
	h := startRepl(t, fmt.Sprintf(oneStateful, "nspb"), nil, map[string]Backend{"a": newCounter(2)}, replOpts{})
	defer h.stop()
	baddr := h.backups["a"].cfg.GRPCListener.Addr().String()
	hp := startRepl(t, fmt.Sprintf(oneStateful, "nspb"), map[string]Backend{"a": newCounter(2)}, nil, replOpts{})
	defer hp.stop()
	paddr := hp.sidecars["a"].cfg.GRPCListener.Addr().String()
	maxMsg := uint64(h.backups["a"].maxMsg)
	good := func() *hamsv1.SnapshotHeader {
		return &hamsv1.SnapshotHeader{Model: "a", Epoch: 1, BatchId: 1, StateBytes: 8,
			StateTensors: []*hamsv1.TensorSpec{{Name: "counter", Datatype: "FP32", Shape: []int64{2}}},
			Requests:     []*hamsv1.RequestRecord{{ReqId: 1, Seq: 1}}}
	}
	const most = 16 << 20
	cases := []struct {
		name string
		addr string
		send func(b *bulkClientConn)
		code codes.Code
		msg  string
	}{
		{"256 MiB header to a primary", paddr, func(b *bulkClientConn) { b.uvarint(256 << 20) }, codes.FailedPrecondition, "not a backup"},
		{"header over the message limit", baddr, func(b *bulkClientConn) { b.uvarint(maxMsg + 1) }, codes.ResourceExhausted, fmt.Sprintf("header frame of %d bytes (limit %d)", maxMsg+1, maxMsg)},
		{"state over the model's state size", baddr, func(b *bulkClientConn) {
			hd := good()
			hd.StateBytes = 1 << 30
			b.header(hd)
		}, codes.ResourceExhausted, "1073741824 state bytes (the model's state size 8)"},
		{"delta over its state", baddr, func(b *bulkClientConn) {
			hd := good()
			hd.Delta, hd.DeltaBytes = true, 1<<30
			b.header(hd)
		}, codes.ResourceExhausted, "1073741824 delta bytes for a 8-byte state"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := dialBulk(t, c.addr)
			var code codes.Code
			var msg []byte
			if n := allocatedBy(func() { c.send(b); code, msg = b.answer() }); n > most {
				t.Errorf("%d bytes allocated", n)
			}
			if code != c.code || !strings.Contains(string(msg), c.msg) {
				t.Fatalf("answer %v %q, want %v naming %q", code, msg, c.code, c.msg)
			}
		})
	}
	// A header of the largest size allowed, announced but not sent: the
	// buffer grows only with what arrives.
	t.Run("announced header not sent", func(t *testing.T) {
		b := dialBulk(t, baddr)
		if n := allocatedBy(func() { b.uvarint(maxMsg).raw([]byte("0123456789")); closedBy(t, b) }); n > most {
			t.Errorf("%d bytes allocated for a header of 10 bytes announced as %d", n, maxMsg)
		}
	})
	// A delta's ranges are allocated as they arrive, not delta_bytes up
	// front.
	t.Run("announced delta not sent", func(t *testing.T) {
		if err := h.backups["a"].bk.stateLimitForTest(1 << 30); err != nil {
			t.Fatal(err)
		}
		b := dialBulk(t, baddr)
		hd := good()
		hd.StateBytes, hd.StateTensors = 1<<30, []*hamsv1.TensorSpec{{Name: "counter", Datatype: "FP32", Shape: []int64{1 << 28}}}
		hd.Delta, hd.DeltaBytes = true, 1<<30
		if n := allocatedBy(func() { b.header(hd).uvarint(0).uvarint(4).raw([]byte{1, 2, 3, 4}); closedBy(t, b) }); n > most {
			t.Errorf("%d bytes allocated for a delta of 4 bytes announced as %d", n, hd.DeltaBytes)
		}
		_ = h.backups["a"].bk.stateLimitForTest(8)
	})
	// ShipSnapshot takes the same bounds.
	cc, err := grpcx.Dial(baddr, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	st, err := hamsv1.NewReplicationClient(cc).ShipSnapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	hd := good()
	hd.StateBytes = 1 << 30
	_ = st.Send(&hamsv1.SnapshotChunk{Part: &hamsv1.SnapshotChunk_Header{Header: hd}})
	_, err = st.CloseAndRecv()
	if s := status.Convert(err); s.Code() != codes.ResourceExhausted || !strings.Contains(s.Message(), "the model's state size 8") {
		t.Fatalf("ShipSnapshot of 1 GiB: %v", err)
	}
	// The backup still takes a good snapshot.
	b := dialBulk(t, baddr)
	state := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	b.header(good()).raw(state)
	_ = writeFrame(b.bw, []byte(deltaDigestOf(state)))
	if code, msg := b.answer(); code != codes.OK {
		t.Fatalf("good snapshot: %v %q", code, msg)
	}
	waitFor(t, "applied", func() bool { return maxSeqOf(h.backups["a"]) == 1 })
}

// stateLimitForTest sets the state size the backup knows.
func (b *backupState) stateLimitForTest(n uint64) error {
	if b == nil {
		return fmt.Errorf("no backup state")
	}
	b.setKnown(n)
	return nil
}
