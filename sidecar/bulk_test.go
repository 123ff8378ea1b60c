package sidecar

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// faultyConn damages what the first connections of a shipper's bulk
// stream write: each write passes through hurt, which may change it or
// fail the connection.
type faultyConn struct {
	net.Conn
	hurt func(p []byte) ([]byte, error)
}

func (c *faultyConn) Write(p []byte) (int, error) {
	q, err := c.hurt(p)
	if err != nil {
		_, _ = c.Conn.Write(q)
		_ = c.Conn.Close()
		return len(q), err
	}
	if _, err := c.Conn.Write(q); err != nil {
		return 0, err
	}
	return len(p), nil
}

// faultyDial dials normally and wraps the first n connections with hurt.
func faultyDial(n int, hurt func(p []byte) ([]byte, error)) (func(context.Context, string) (net.Conn, error), func() int) {
	var mu sync.Mutex
	dials := 0
	return func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			mu.Lock()
			defer mu.Unlock()
			dials++
			if dials <= n {
				return &faultyConn{Conn: c, hurt: hurt}, nil
			}
			return c, nil
		}, func() int {
			mu.Lock()
			defer mu.Unlock()
			return dials
		}
}

// A bulk stream that breaks mid-snapshot, or delivers a corrupted byte,
// costs a resend over a new connection; the backup ends at the primary's
// state and never installs a damaged one.
func TestBulkStreamFaultsAreResent(t *testing.T) {
	defer func(n uint64) { bulkMinBytes = n }(bulkMinBytes)
	bulkMinBytes = 0
	faults := map[string]func(p []byte) ([]byte, error){
		// Half of the first write, then the connection is gone.
		"cut": func(p []byte) ([]byte, error) { return p[:len(p)/2], errors.New("injected cut") },
		// A state byte flipped: the shipper writes the data as slices of
		// its own (writev), so a write of whole floats that is neither
		// the magic, a header (field 1 first: 0x0a) nor a digest is
		// data.
		"corrupt": func(p []byte) ([]byte, error) {
			q := bytes.Clone(p)
			if len(q) >= 4 && len(q)%4 == 0 && q[0] != 0x0a && string(q) != bulkMagic &&
				!bytes.HasPrefix(q, []byte(xxhPrefix)) && !bytes.HasPrefix(q, []byte(xxh3Prefix)) {
				q[len(q)-1] ^= 0xff
			}
			return q, nil
		},
	}
	for name, hurt := range faults {
		t.Run(name, func(t *testing.T) {
			bothStateKinds(t, func(t *testing.T, delta bool) {
				prim, back := newCounter(16), newCounter(16)
				dial, dials := faultyDial(2, hurt)
				h := startRepl(t, fmt.Sprintf(oneStateful, "nspb"), map[string]Backend{"a": prim}, map[string]Backend{"a": back},
					replOpts{tweak: func(_ string, s *Sidecar) {
						if s.prim != nil && s.Role() == config.RolePrimary {
							s.prim.ship.bulkDial = dial
						}
					}})
				defer h.stop()
				const n = 40
				h.send(1, n)
				waitFor(t, "all replies", func() bool { return h.sink.count() >= n })
				waitFor(t, "backup durable to n", func() bool { return maxSeqOf(h.backups["a"]) == n })
				waitFor(t, "the primary installed its last update", prim.settled)
				if d := bkStateDigest(h.backups["a"]); prim.Digest() != d {
					t.Fatalf("backup applied state %s != primary state %s", d, prim.Digest())
				}
				for i, d := range back.Written() {
					if _, ok := prim.history[d]; !ok {
						t.Fatalf("write %d installed state %s, which the primary never had", i, d)
					}
				}
				if got := counterValue(h.sidecars["a"].metrics.shipRetries); got < 2 || dials() < 3 {
					t.Fatalf("%v resends over %d connections, want the 2 damaged shipments resent on a third", got, dials())
				}
			})
		})
	}
}

// bulkClientConn is a raw bulk connection for feeding a backup bad input.
type bulkClientConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
	bw *bufio.Writer
}

func dialBulk(t *testing.T, addr string) *bulkClientConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	b := &bulkClientConn{t: t, c: c, br: bufio.NewReader(c), bw: bufio.NewWriter(c)}
	_, _ = b.bw.WriteString(bulkMagic)
	return b
}

func (b *bulkClientConn) header(h *hamsv1.SnapshotHeader) *bulkClientConn {
	hb, err := proto.Marshal(h)
	if err != nil {
		b.t.Fatal(err)
	}
	_ = writeFrame(b.bw, hb)
	return b
}

func (b *bulkClientConn) raw(p []byte) *bulkClientConn { _, _ = b.bw.Write(p); return b }

func (b *bulkClientConn) uvarint(v uint64) *bulkClientConn {
	return b.raw(binary.AppendUvarint(nil, v))
}

// answer flushes and reads the backup's answer.
func (b *bulkClientConn) answer() (codes.Code, []byte) {
	b.t.Helper()
	if err := b.bw.Flush(); err != nil {
		b.t.Fatal(err)
	}
	code, err := binary.ReadUvarint(b.br)
	if err != nil {
		b.t.Fatalf("no answer: %v", err)
	}
	p, err := readFrame(b.br, bulkMaxFrame, "answer")
	if err != nil {
		b.t.Fatalf("answer: %v", err)
	}
	return codes.Code(code), p
}

// Bad input on the bulk stream is answered with the code ShipSnapshot
// would give, and the backup keeps serving.
func TestBulkStreamRejectsBadInput(t *testing.T) {
	h := startRepl(t, fmt.Sprintf(oneStateful, "nspb"), nil, map[string]Backend{"a": newCounter(2)}, replOpts{})
	defer h.stop()
	baddr := h.backups["a"].cfg.GRPCListener.Addr().String()
	hp := startRepl(t, fmt.Sprintf(oneStateful, "nspb"), map[string]Backend{"a": newCounter(2)}, nil, replOpts{})
	defer hp.stop()
	paddr := hp.sidecars["a"].cfg.GRPCListener.Addr().String()
	specs := []*hamsv1.TensorSpec{{Name: "counter", Datatype: "FP32", Shape: []int64{2}}}
	good := func() *hamsv1.SnapshotHeader {
		return &hamsv1.SnapshotHeader{Model: "a", Epoch: 1, BatchId: 1, StateBytes: 8, StateTensors: specs,
			Requests: []*hamsv1.RequestRecord{{ReqId: 1, Seq: 1}}}
	}
	state := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	digest := []byte(deltaDigestOf(state))
	cases := []struct {
		name string
		addr string
		send func(b *bulkClientConn)
		want codes.Code
	}{
		{"other model", baddr, func(b *bulkClientConn) {
			h := good()
			h.Model = "x"
			b.header(h)
		}, codes.InvalidArgument},
		{"not a backup", paddr, func(b *bulkClientConn) { b.header(good()) }, codes.FailedPrecondition},
		{"oversized frame", baddr, func(b *bulkClientConn) { b.uvarint(bulkMaxFrame + 1) }, codes.ResourceExhausted},
		{"state too large", baddr, func(b *bulkClientConn) {
			h := good()
			h.StateBytes = maxSnapshotBytes + 1
			b.header(h)
		}, codes.ResourceExhausted},
		{"bad digest", baddr, func(b *bulkClientConn) {
			b.header(good()).raw(state)
			_ = writeFrame(b.bw, []byte(deltaDigestOf([]byte("x"))))
		}, codes.DataLoss},
		{"range past the state", baddr, func(b *bulkClientConn) {
			h := good()
			h.Delta, h.DeltaBytes = true, 4
			b.header(h).uvarint(6).uvarint(4).raw(state[:4])
		}, codes.InvalidArgument},
		{"range longer than announced", baddr, func(b *bulkClientConn) {
			h := good()
			h.Delta, h.DeltaBytes = true, 4
			b.header(h).uvarint(0).uvarint(8)
		}, codes.InvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := dialBulk(t, c.addr)
			c.send(b)
			if code, msg := b.answer(); code != c.want {
				t.Fatalf("answer %v %q, want %v", code, msg, c.want)
			}
		})
	}
	// The backup still takes a good snapshot, and a second one on the same
	// connection.
	b := dialBulk(t, baddr)
	b.header(good()).raw(state)
	_ = writeFrame(b.bw, digest)
	if code, msg := b.answer(); code != codes.OK {
		t.Fatalf("good snapshot: %v %q", code, msg)
	}
	h2 := good()
	h2.BatchId, h2.Requests = 2, []*hamsv1.RequestRecord{{ReqId: 2, Seq: 2}}
	b.header(h2).raw(state)
	_ = writeFrame(b.bw, digest)
	code, msg := b.answer()
	if code != codes.OK {
		t.Fatalf("second snapshot on the connection: %v %q", code, msg)
	}
	resp := &hamsv1.ShipSnapshotResponse{}
	if err := proto.Unmarshal(msg, resp); err != nil || resp.GetBatchId() != 2 {
		t.Fatalf("answer %v %v, want batch 2", resp, err)
	}
	waitFor(t, "both applied", func() bool { return maxSeqOf(h.backups["a"]) == 2 })
}
