package sidecar

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/authz"
	"github.com/hams-go/hams/internal/pki"
	"github.com/hams-go/hams/internal/tracing"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// The bulk stream carries a snapshot whose data is large (a base state, a
// whole state in remus mode, a learner's delta) from the primary's
// shipper to the backup over a plain TCP connection on the backup
// sidecar's own port (cmux tells the two apart by the connection's first
// bytes), instead of ShipSnapshot's gRPC stream. The data then crosses
// with two copies (into and out of the kernel) and straight into the
// backup's state buffer, against gRPC's HTTP/2 framing in 16 KiB frames,
// message reassembly and protobuf copies: moving 64 MiB over loopback took
// ~50-70 ms and ~90-120 ms of CPU through ShipSnapshot against ~15-20 ms
// and ~25-35 ms raw on the development machine (docs/coordination.md),
// and a 64 MiB base is what the replies of an olv failover wait for.
// Headers, checks and Algorithm 2 are ShipSnapshot's (snapshotSink,
// backupState.accept). Small snapshots take it too (onBulk), all but
// traced ones.
//
// A connection starts with bulkMagic; then, per snapshot, the sender
// writes a frame with the SnapshotHeader, the data (a full state: its
// state_bytes bytes; a delta: per range its offset, length and bytes,
// delta_bytes in all), and a frame with the state digest; the backup
// answers with a code (gRPC's, 0 for OK) and a frame (OK: a
// ShipSnapshotResponse; otherwise the error message). Frames are a
// uvarint length and that many bytes. The connection stays open for the
// next snapshot; any I/O error closes it (the shipper retries as it does
// any failed shipment).
const bulkMagic = "HAMSBLK1"

// bulkMinBytes is the smallest snapshot payload (state or delta bytes)
// shipped over the bulk stream; a var for tests (1<<40: every snapshot
// over ShipSnapshot).
var bulkMinBytes uint64

// bulkTracedMinBytes: a traced snapshot (traceShip) smaller than this
// takes ShipSnapshot, whose gRPC metadata carries its trace context to
// the backup's spans (docs/tracing.md); a larger one takes the bulk
// stream all the same, untraced past the primary.
const bulkTracedMinBytes = 1 << 20

// onBulk reports whether sn goes over the bulk stream. Every snapshot
// does but a small traced one: a ShipSnapshot stream per snapshot, at
// batch 1 one per request, cost both sidecars a stream's setup, its
// interceptors and its protobuf messages on top of the data
// (BenchmarkSmallSnapshotTransport: whole-process CPU per request 0.36-0.39
// ms on the bulk stream's standing connection, 0.48-0.57 ms on
// ShipSnapshot, 4 KiB state, mutual TLS).
func onBulk(sn *snapshot) bool {
	n := bulkPayload(sn)
	if n < bulkMinBytes {
		return false
	}
	return n >= bulkTracedMinBytes || len(sn.links) == 0 || !tracing.Enabled()
}

// Hostile input: anyone who reaches a sidecar's port can open a bulk
// connection, so nothing is allocated on a peer's say-so. The role is
// checked when a header's first byte arrives, before its length is read
// (only a backup takes snapshots); a header frame may be at most the
// deployment's message limit (ShipSnapshot's header travels in one
// message of that limit too) and its buffer grows as its bytes arrive, so
// a length alone allocates nothing; a digest frame is a few dozen bytes;
// a full state is at most the model's state size as its model server
// describes it (newSink); a delta's ranges are each at most that size,
// checked against the announced total and the state before the range's
// buffer is allocated (one range at a time, never delta_bytes up front);
// and a backup receives at most maxReceiving snapshots at once on both
// transports.
//
// Copies (issue 22): the primary writes the header, each range's offset
// and length and the data itself with writev (net.Buffers) of slices
// that point into the snapshot's own buffers, so the only copy on its
// side is the kernel's; the data is hashed in pieces just before the
// write that sends them, so the kernel reads them from cache. The backup
// reads the data straight into the buffer it keeps (the state buffer; a
// range's own buffer, not zeroed first: every byte is read into it
// before it is used), hashing each piece as it arrives.

const (
	// bulkMaxFrame bounds a header frame when the message limit is not
	// known (Sidecar.maxMsg), and any answer frame a shipper reads.
	bulkMaxFrame = 256 << 20
	// bulkMaxDigest bounds a digest frame (an "xxh64:" digest is 22
	// bytes).
	bulkMaxDigest = 256
	// bulkReadBytes is the piece size of reads into a state or range
	// buffer, each hashed after it arrives (it fits the L2 cache, so the
	// hash reads what the kernel just wrote).
	bulkReadBytes = 1 << 20
	// bulkPieceBytes is the piece size a shipper hashes before it is
	// written, and bulkWriteBytes the most data one writev carries (the
	// pieces hashed since the last write, still in cache).
	bulkPieceBytes  = 256 << 10
	bulkWriteBytes  = 1 << 20
	bulkDialTimeout = 5 * time.Second
)

// bulkPayload is how many data bytes sn ships.
func bulkPayload(sn *snapshot) uint64 {
	if sn.isDelta() {
		return sn.header.GetDeltaBytes()
	}
	return sn.header.GetStateBytes()
}

// serveBulk accepts bulk connections until ctx ends; every connection's
// goroutine ends (its connection closed) before it returns.
func (s *Sidecar) serveBulk(ctx context.Context, lis net.Listener) error {
	var (
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
		wg    sync.WaitGroup
	)
	stop := context.AfterFunc(ctx, func() {
		_ = lis.Close()
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
	})
	defer stop()
	defer wg.Wait()
	for {
		c, err := lis.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			// The listener closed under us: the gRPC server stopped.
			s.log.Debug("bulk listener closed", "err", err)
			return nil
		}
		mu.Lock()
		if ctx.Err() != nil {
			mu.Unlock()
			_ = c.Close()
			return nil
		}
		conns[c] = true
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.bulkConn(c)
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
			_ = c.Close()
		}()
	}
}

// bulkConn serves the snapshots of one bulk connection until it fails or
// closes.
func (s *Sidecar) bulkConn(c net.Conn) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("panic in a bulk snapshot", "panic", p, "peer", c.RemoteAddr())
		}
	}()
	// The magic is read unbuffered: with TLS, the handshake's bytes
	// follow it on the raw connection.
	magic := make([]byte, len(bulkMagic))
	_ = c.SetReadDeadline(time.Now().Add(shipTimeout))
	if _, err := io.ReadFull(c, magic); err != nil || string(magic) != bulkMagic {
		return
	}
	if s.cfg.TLS != nil {
		tc, err := s.bulkHandshake(c)
		if err != nil {
			s.log.Warn("bulk stream refused", "peer", c.RemoteAddr().String(), "err", err)
			return
		}
		c = tc
	}
	br := bufio.NewReaderSize(c, 64<<10)
	bw := bufio.NewWriterSize(c, 4<<10)
	for {
		// Between snapshots the connection may idle; a snapshot once
		// begun must arrive within shipTimeout.
		_ = c.SetReadDeadline(time.Time{})
		if _, err := br.Peek(1); err != nil {
			if !errors.Is(err, io.EOF) {
				s.log.Debug("bulk connection ended", "peer", c.RemoteAddr(), "err", err)
			}
			return
		}
		// A snapshot begins: only a backup takes one, and it says so
		// before it reads (or allocates for) anything of it.
		if (&replicationServer{s: s}).backup() == nil {
			_ = c.SetDeadline(time.Now().Add(shipTimeout))
			_ = writeBulkAnswer(bw, nil, (&replicationServer{s: s}).notBackup("bulk snapshot"))
			return
		}
		_ = c.SetDeadline(time.Now().Add(shipTimeout))
		hb, err := readFrame(br, headerLimit(s.maxMsg), "header")
		if err != nil {
			if _, ok := status.FromError(err); ok {
				_ = writeBulkAnswer(bw, nil, err) // then out of step: close
			} else if !errors.Is(err, io.EOF) {
				s.log.Debug("bulk connection ended", "peer", c.RemoteAddr(), "err", err)
			}
			return
		}
		resp, err, fatal := s.bulkSnapshot(br, hb)
		if err := writeBulkAnswerTLS(bw, resp, err, s.cfg.TLS != nil); err != nil || fatal {
			return
		}
	}
}

// bulkHandshake secures a bulk connection after its magic (the magic is
// plaintext so the port's mux can tell the stream from gRPC; everything
// after it is mutual TLS) and authorizes the peer: only a sidecar of this
// model ships snapshots to it (authz.BulkShip).
func (s *Sidecar) bulkHandshake(c net.Conn) (net.Conn, error) {
	tc := tls.Server(newReadBatcher(c), s.cfg.TLS.ServerConfig())
	if err := tc.Handshake(); err != nil {
		return nil, fmt.Errorf("bulk stream TLS handshake: %w", err)
	}
	peer, err := pki.IdentityOf(tc.ConnectionState())
	if err != nil {
		return nil, err
	}
	if err := s.authz.Allow(authz.BulkShip, peer, nil); err != nil {
		return nil, err
	}
	return tc, nil
}

// bulkSnapshot reads the rest of one snapshot (its header frame hb was
// read) and buffers it. fatal: the stream is out of step (the data was
// not read to its end), so the connection must close after the answer.
func (s *Sidecar) bulkSnapshot(br *bufio.Reader, hb []byte) (resp *hamsv1.ShipSnapshotResponse, err error, fatal bool) {
	h := &hamsv1.SnapshotHeader{}
	if err := proto.Unmarshal(hb, h); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "bulk snapshot: header: %v", err), true
	}
	bk := (&replicationServer{s: s}).backup()
	if bk == nil {
		return nil, (&replicationServer{s: s}).notBackup("bulk snapshot"), true
	}
	done, err := bk.beginReceive(h)
	if err != nil {
		return nil, err, true
	}
	defer done()
	sink, err := bk.newSink(h)
	if err != nil {
		return nil, err, true
	}
	sink.aeadOK = s.cfg.TLS != nil // this connection is TLS
	if err := sink.readFrom(br); err != nil {
		return nil, err, true
	}
	db, err := readFrame(br, bulkMaxDigest, "digest")
	if err != nil {
		return nil, fmt.Errorf("bulk snapshot %d: digest: %w", h.GetBatchId(), err), true
	}
	r, err := sink.finish(string(db))
	if err != nil {
		return nil, err, false
	}
	resp, err = bk.accept(r)
	return resp, err, false
}

// readFrom reads the snapshot's data off a bulk stream: a full state
// straight into the state buffer, a delta's ranges each into its own
// buffer (not zeroed: ReadFull fills it, and a failed read drops it), in
// pieces hashed as they arrive.
func (k *snapshotSink) readFrom(br *bufio.Reader) error {
	h := k.h
	if !h.GetDelta() {
		n := int(h.GetStateBytes())
		k.data = k.data[:0]
		for len(k.data) < n {
			m := min(bulkReadBytes, n-len(k.data))
			p := k.data[len(k.data) : len(k.data)+m]
			if _, err := io.ReadFull(br, p); err != nil {
				return fmt.Errorf("bulk snapshot %d: state data: %w", h.GetBatchId(), err)
			}
			k.data = k.data[:len(k.data)+m]
			k.hash(p)
		}
		return nil
	}
	// Each range is checked against the announced total and the state
	// (inside state_bytes, itself bounded by newSink) before its buffer
	// is allocated.
	left := h.GetDeltaBytes()
	for left > 0 {
		off, err := binary.ReadUvarint(br)
		if err != nil {
			return fmt.Errorf("bulk snapshot %d: range offset: %w", h.GetBatchId(), err)
		}
		n, err := binary.ReadUvarint(br)
		if err != nil {
			return fmt.Errorf("bulk snapshot %d: range length: %w", h.GetBatchId(), err)
		}
		if n == 0 || n > left {
			return status.Errorf(codes.InvalidArgument, "bulk snapshot %d: a range of %d bytes with %d of the announced %d delta bytes left", h.GetBatchId(), n, left, h.GetDeltaBytes())
		}
		if off > h.GetStateBytes() || n > h.GetStateBytes()-off {
			return status.Errorf(codes.InvalidArgument, "bulk snapshot %d: state range of %d bytes at %d outside the %d-byte state", h.GetBatchId(), n, off, h.GetStateBytes())
		}
		d := makeNoZero(int(n))
		for got := 0; got < len(d); {
			p := d[got:min(got+bulkReadBytes, len(d))]
			if _, err := io.ReadFull(br, p); err != nil {
				return fmt.Errorf("bulk snapshot %d: range data at %d (%d of %d bytes read): %w", h.GetBatchId(), off, got, n, err)
			}
			_, _ = k.check.Write(p)
			got += len(p)
		}
		k.check.EndRange()
		left -= n
		if err := k.addHashed(off, d); err != nil {
			return err
		}
	}
	return nil
}

// readFrame reads a uvarint length of at most limit and that many bytes
// (what names the frame in errors).
func readFrame(br *bufio.Reader, limit uint64, what string) ([]byte, error) {
	n, err := binary.ReadUvarint(br)
	if err != nil {
		return nil, err
	}
	if n > limit {
		return nil, status.Errorf(codes.ResourceExhausted, "bulk %s frame of %d bytes (limit %d)", what, n, limit)
	}
	return readBytes(br, n)
}

// readBytes reads n bytes into a buffer that grows as they arrive
// (bulkReadBytes at a time): a peer that announces n and sends less makes
// it allocate what it sent, not n.
func readBytes(br *bufio.Reader, n uint64) ([]byte, error) {
	b := make([]byte, 0, min(n, bulkReadBytes))
	for uint64(len(b)) < n {
		m := int(min(n-uint64(len(b)), bulkReadBytes))
		b = slices.Grow(b, m)
		if _, err := io.ReadFull(br, b[len(b):len(b)+m]); err != nil {
			return nil, err
		}
		b = b[:len(b)+m]
	}
	return b, nil
}

// headerLimit is the largest snapshot header frame a backup reads: the
// message limit.
func headerLimit(maxMsg int) uint64 {
	if maxMsg > 0 {
		return uint64(maxMsg)
	}
	return bulkMaxFrame
}

func writeFrame(bw *bufio.Writer, b []byte) error {
	if _, err := bw.Write(binary.AppendUvarint(nil, uint64(len(b)))); err != nil {
		return err
	}
	_, err := bw.Write(b)
	return err
}

// writeBulkAnswer writes the code and frame answering a snapshot on a
// connection without TLS.
func writeBulkAnswer(bw *bufio.Writer, resp *hamsv1.ShipSnapshotResponse, err error) error {
	return writeBulkAnswerTLS(bw, resp, err, false)
}

// writeBulkAnswerTLS writes the code and frame answering a snapshot; an
// answer over TLS offers digestAEAD too.
func writeBulkAnswerTLS(bw *bufio.Writer, resp *hamsv1.ShipSnapshotResponse, err error, tls bool) error {
	kinds := digestXXH64 | digestXXH3
	if tls {
		kinds |= digestAEAD
	}
	code, payload := codes.OK, []byte(nil)
	if err != nil {
		st, _ := status.FromError(err)
		code, payload = st.Code(), []byte(st.Message())
		if code == codes.OK {
			code = codes.Unknown
		}
	} else {
		var merr error
		if payload, merr = marshalAnswer(resp, kinds); merr != nil {
			code, payload = codes.Internal, []byte(merr.Error())
		}
	}
	if _, err := bw.Write(binary.AppendUvarint(nil, uint64(code))); err != nil {
		return err
	}
	if err := writeFrame(bw, payload); err != nil {
		return err
	}
	return bw.Flush()
}

// bulkClient is a shipper's bulk connection to one backup; only the
// shipper's run goroutine uses it.
type bulkClient struct {
	addr string
	c    net.Conn
	br   *bufio.Reader
	// kinds: the digest kinds the last answer on this connection
	// offered (wiredigest.go; 0 until then: XXH64); tls: the connection
	// is TLS.
	kinds uint64
	tls   bool
	// batch is the connection under TLS (nil without): it gathers the
	// records of one flush into one write.
	batch *recordBatcher
	// vec and small are reused from snapshot to snapshot: vec holds the
	// slices of the next writev; small the frames' lengths and the
	// ranges' offsets and lengths, which vec's slices point into (it is
	// only appended to between two writes, never past its capacity).
	vec   net.Buffers
	small []byte
}

func (bc *bulkClient) close() {
	if bc != nil && bc.c != nil {
		_ = bc.c.Close()
		bc.c = nil
	}
}

// bulkTo returns the open bulk connection to addr, dialling it first.
func (sh *shipper) bulkTo(ctx context.Context, addr string) (*bulkClient, error) {
	if bc := sh.bulk; bc != nil && bc.c != nil && bc.addr == addr {
		return bc, nil
	}
	sh.bulk.close()
	dial := sh.bulkDial
	if dial == nil {
		d := net.Dialer{Timeout: bulkDialTimeout}
		dial = func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
	}
	c, err := dial(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("dial bulk stream to %s: %w", addr, err)
	}
	// The magic in plaintext, then (with TLS) mutual TLS (bulkHandshake).
	_ = c.SetDeadline(time.Now().Add(bulkDialTimeout))
	if _, err := c.Write([]byte(bulkMagic)); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("open bulk stream to %s: %w", addr, err)
	}
	cfg := sh.bulkTLS
	if tlsSrc := sh.h.TLS(); cfg == nil && tlsSrc != nil {
		cfg = tlsSrc.ClientConfig()
	}
	var batch *recordBatcher
	if cfg != nil {
		batch = &recordBatcher{Conn: c}
		tc := tls.Client(batch, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("bulk stream TLS handshake with %s: %w", addr, err)
		}
		c = tc
	}
	_ = c.SetDeadline(time.Time{})
	bc := &bulkClient{addr: addr, c: c, br: bufio.NewReaderSize(c, 4<<10), small: make([]byte, 0, 1<<10), tls: cfg != nil, batch: batch}
	if sh.bulk != nil {
		bc.vec, bc.small = sh.bulk.vec[:0], sh.bulk.small[:0]
	}
	sh.bulk = bc
	return bc, nil
}

// bulkWriter writes one snapshot's frames and data to a bulk connection
// with writev, hashing the data (when sum is set) piece by piece just
// before the write that carries it.
type bulkWriter struct {
	bc      *bulkClient
	sum     wireHash
	pending int // data bytes in bc.vec
}

// frame queues a uvarint length and b (not hashed).
func (w *bulkWriter) frame(b []byte) error {
	if err := w.varints(uint64(len(b))); err != nil {
		return err
	}
	if len(b) > 0 {
		w.bc.vec = append(w.bc.vec, b)
	}
	return nil
}

// varints queues uvarints (not hashed) in small, writing out what is
// queued first when small has no room left (its slices must not move).
func (w *bulkWriter) varints(vs ...uint64) error {
	bc := w.bc
	if cap(bc.small)-len(bc.small) < binary.MaxVarintLen64*len(vs) {
		if err := w.flush(); err != nil {
			return err
		}
	}
	start := len(bc.small)
	for _, v := range vs {
		bc.small = binary.AppendUvarint(bc.small, v)
	}
	bc.vec = append(bc.vec, bc.small[start:len(bc.small):len(bc.small)])
	return nil
}

// data queues d, hashing it piece by piece, and writes out every
// bulkWriteBytes.
func (w *bulkWriter) data(d []byte) error {
	for len(d) > 0 {
		k := min(len(d), bulkPieceBytes, bulkWriteBytes-w.pending)
		if w.sum != nil {
			_, _ = w.sum.Write(d[:k])
		}
		w.bc.vec = append(w.bc.vec, d[:k:k])
		w.pending += k
		d = d[k:]
		if w.pending >= bulkWriteBytes {
			if err := w.flush(); err != nil {
				return err
			}
		}
	}
	return nil
}

// flush writes what is queued (one writev on a TCP connection; on TLS,
// the records of every slice gathered into one write) and empties the
// queue.
func (w *bulkWriter) flush() error {
	bc := w.bc
	v := bc.vec
	bc.batch.start()
	_, err := v.WriteTo(bc.c) // consumes v, not bc.vec's array
	if ferr := bc.batch.end(); err == nil {
		err = ferr
	}
	clear(bc.vec) // drop the references to the snapshot's data
	bc.vec, bc.small, w.pending = bc.vec[:0], bc.small[:0], 0
	return err
}

// recordBatcher is the raw connection under a bulk stream's TLS client.
// crypto/tls writes every record (16 KiB of data at most) with a write of
// its own: 64 system calls per MB shipped, each a pass through the TCP
// stack (on loopback the sender's thread also runs the receive path), 29%
// of a learner primary's CPU in a profile (issue 22). Between start and
// end the records are gathered in a buffer of bulkWriteBytes and leave in
// one write (a copy of the ciphertext, which costs a fraction of the
// calls it saves). Outside start/end (the handshake, alerts) writes go
// straight through: the handshake waits for its peer's answer. Only the
// shipper's run goroutine writes; nil is a no-op.
type recordBatcher struct {
	net.Conn
	buf      []byte
	batching bool
}

func (r *recordBatcher) Write(p []byte) (int, error) {
	if !r.batching {
		return r.Conn.Write(p)
	}
	if len(r.buf)+len(p) > cap(r.buf) {
		if err := r.flush(); err != nil {
			return 0, err
		}
		if len(p) > cap(r.buf) {
			return r.Conn.Write(p)
		}
	}
	r.buf = append(r.buf, p...)
	return len(p), nil
}

func (r *recordBatcher) flush() error {
	if len(r.buf) == 0 {
		return nil
	}
	_, err := r.Conn.Write(r.buf)
	r.buf = r.buf[:0]
	return err
}

// readBatcher is the raw connection under a bulk stream's TLS server:
// crypto/tls reads about one record (16 KiB) per read from the
// connection, a system call each; through a buffer of bulkReadBytes one
// call takes what the socket holds (the copy out of the buffer costs a
// fraction of the calls it saves).
type readBatcher struct {
	net.Conn
	r *bufio.Reader
}

func newReadBatcher(c net.Conn) net.Conn {
	if !batchRecords {
		return c
	}
	return &readBatcher{Conn: c, r: bufio.NewReaderSize(c, bulkReadBytes)}
}

func (r *readBatcher) Read(p []byte) (int, error) { return r.r.Read(p) }

// batchRecords turns recordBatcher and readBatcher on (a var for
// BenchmarkShipDelta's unbatched rows).
var batchRecords = true

func (r *recordBatcher) start() {
	if r == nil || !batchRecords {
		return
	}
	if r.buf == nil {
		// A flush carries bulkWriteBytes of data and a few frames;
		// each 16 KiB record adds 22 bytes.
		r.buf = make([]byte, 0, bulkWriteBytes+bulkWriteBytes/256+4<<10)
	}
	r.batching = true
}

// end writes what start gathered.
func (r *recordBatcher) end() error {
	if r == nil {
		return nil
	}
	r.batching = false
	return r.flush()
}

// sendBulk ships sn over the bulk stream to addr. An I/O error closes the
// connection (the next shipment dials again); the backup's refusal comes
// back as its gRPC status.
func (sh *shipper) sendBulk(ctx context.Context, addr string, sn *snapshot) (applied bool, err error) {
	bc, err := sh.bulkTo(ctx, addr)
	if err != nil {
		return false, err
	}
	defer func() {
		if err != nil {
			bc.close() // possibly out of step: the next shipment dials again
		}
	}()
	conn := bc.c // close() clears bc.c; the AfterFunc may run after stop
	_ = conn.SetDeadline(time.Now().Add(shipTimeout))
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	hb, err := proto.Marshal(sn.header)
	if err != nil {
		return false, fmt.Errorf("encode header of batch %d: %w", sn.batch, err)
	}
	kind := pickDigest(bc.kinds, bc.tls)
	hb = appendDigestKind(hb, kind)
	// A resend of a snapshot hashed with this kind already reuses its
	// digest.
	w := &bulkWriter{bc: bc}
	if !isWireDigest(sn.digest) || digestKindOf(sn.digest) != kind {
		w.sum = newWireHash(kind)
	}
	ioErr := func(what string, err error) error {
		return fmt.Errorf("bulk stream to %s: %s of batch %d: %w", addr, what, sn.batch, err)
	}
	if err := w.frame(hb); err != nil {
		return false, ioErr("header", err)
	}
	if sn.isDelta() {
		for _, r := range sn.delta {
			if len(r.GetData()) == 0 {
				continue
			}
			if err := w.varints(r.GetOffset(), uint64(len(r.GetData()))); err != nil {
				return false, ioErr("range", err)
			}
			if err := w.data(r.GetData()); err != nil {
				return false, ioErr("range data", err)
			}
			if w.sum != nil {
				w.sum.EndRange()
			}
		}
	} else {
		for _, t := range sn.state {
			if err := w.data(t.GetData()); err != nil {
				return false, ioErr("state data", err)
			}
		}
	}
	if w.sum != nil {
		sn.digest = formatWireDigest(kind, w.sum.Sum64())
	}
	if err := w.frame([]byte(sn.digest)); err != nil {
		return false, ioErr("digest", err)
	}
	if err := w.flush(); err != nil {
		return false, ioErr("write", err)
	}
	code, err := binary.ReadUvarint(bc.br)
	if err != nil {
		return false, ioErr("answer", err)
	}
	payload, err := readFrame(bc.br, bulkMaxFrame, "answer")
	if err != nil {
		return false, ioErr("answer", err)
	}
	if codes.Code(code) != codes.OK {
		return false, status.Error(codes.Code(code), string(payload))
	}
	resp := &hamsv1.ShipSnapshotResponse{}
	if err := proto.Unmarshal(payload, resp); err != nil {
		return false, fmt.Errorf("bulk stream to %s: answer for batch %d: %w", addr, sn.batch, err)
	}
	if resp.GetBatchId() != sn.batch {
		return false, fmt.Errorf("backup acknowledged batch %d for batch %d", resp.GetBatchId(), sn.batch)
	}
	bc.kinds = answerKinds(resp)
	return resp.GetApplied(), nil
}
