package sidecar

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/tracing"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Shipping parameters.
const (
	// shipChunkBytes leaves room for a chunk's other fields so that an
	// encoded chunk fits grpc-go's largest pooled buffer (1 MiB); a
	// larger message takes a fresh, zeroed buffer per send (40% of a
	// 64 MiB learner's primary sidecar CPU in a profile).
	shipChunkBytes = 1<<20 - 4<<10
	shipTimeout    = 60 * time.Second
	shipMinBackoff = 5 * time.Millisecond
	shipMaxBackoff = time.Second
	// shipIdleCheck: how often an idle shipper looks for a moved backup
	// when the resolver does not signal topology changes.
	shipIdleCheck = 100 * time.Millisecond
)

// shipper sends a primary's snapshots to its backup over
// Replication.ShipSnapshot (one call per snapshot, chunked), off the
// request path, in batch order. A snapshot stays queued until the backup's
// response arrives; after a broken call it is sent again (the backup drops
// duplicates by batch id).
//
// Coalescing: snapshots copied while an earlier one is being sent wait in
// the queue without a snapshot id. When the shipper takes them, it ships
// only the newest state, with the request records and outputs of every
// batch they cover, under one new id (ids are dense, so the backup's
// apply-in-order rule is unchanged; its deps are the maxima over all the
// covered requests' lineage, computed by the backup from the records).
// Since each snapshot holds the full state, the newest one is the state
// after every covered batch.
//
// Invariants (under mu): queue holds the unacknowledged snapshots in batch
// order, those taken (given an id: being sent, or a base) before the waiting ones;
// kept is the last acknowledged one; applied is the last one the backup is
// known to have applied (ack with applied set, or its durability notice)
// and unapplied the acknowledged ones after it, in batch order. The
// primary keeps the applied state until the backup applies a later one:
// the rollback target of a correlated failure (IV-C). nextID is the id of
// the next snapshot taken.
type shipper struct {
	// h is the primary's sidecar as the shipper sees it.
	h    Host
	acks chan uint64 // last compute batch covered by acknowledged snapshots, in order, to the driver

	mu      sync.Mutex
	queue   []*snapshot
	kept    *snapshot
	applied *snapshot
	// appliedTail: delta snapshots applied after applied, in order; the
	// state the backup applied is applied's with them patched in (fold).
	// Kept apart so no applied state is ever written in place.
	appliedTail []*snapshot
	// appliedOwn: applied's state is one buffer (appliedBuf) that only
	// the shipper references, made by a fold, so the next fold patches
	// the tail into it in place (cost: the tail's bytes) instead of
	// copying the whole state (issue 22). Whoever takes applied out of
	// the shipper (Applied, a rebase) takes the buffer with it: the flag
	// is cleared first and the next fold copies again.
	appliedOwn bool
	appliedBuf []byte
	unapplied  []*snapshot
	// appliedMax is the highest batch the backup is known to have
	// applied. A durability notice can arrive before the shipper has
	// recorded the ack of the same snapshot (the notice races the ack's
	// return); the snapshot then counts as applied when it is recorded.
	appliedMax uint64
	nextID     uint64
	// sentTo is the backup address that acknowledged kept; a new address
	// (a new or demoted backup) first gets kept again, as its base.
	sentTo string
	wake   chan struct{}
	// appliedC wakes the primary's driver when applied moves (the
	// unapplied bound may allow a batch again); tookC when the shipper
	// took the waiting snapshots (it can take a new copy).
	appliedC chan struct{}
	tookC    chan struct{}

	// dialOptions are appended to grpcx.DialOptions (tests).
	dialOptions []grpc.DialOption
	// bulk is the bulk stream to the backup (run goroutine only);
	// bulkDial, when set, opens its connections, and bulkTLS, when set,
	// is their TLS client configuration instead of the host's (tests).
	bulk     *bulkClient
	bulkDial func(ctx context.Context, addr string) (net.Conn, error)
	bulkTLS  *tls.Config
}

func newShipper(h Host) *shipper {
	return &shipper{h: h, acks: make(chan uint64, 64), wake: make(chan struct{}, 1), appliedC: make(chan struct{}, 1), tookC: make(chan struct{}, 1)}
}

// enqueue queues a copied snapshot (without an id).
func (sh *shipper) enqueue(sn *snapshot) {
	sh.mu.Lock()
	sh.queue = append(sh.queue, sn)
	sh.mu.Unlock()
	select {
	case sh.wake <- struct{}{}:
	default:
	}
}

// Waiting is the number of queued snapshots not taken for sending yet.
func (sh *shipper) Waiting() int {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	n := 0
	for _, sn := range sh.queue {
		if !sn.taken {
			n++
		}
	}
	return n
}

// head returns the snapshot to send next: the first one with an id, or
// the waiting ones merged into one and given the next id.
func (sh *shipper) head() *snapshot {
	sh.mu.Lock()
	if len(sh.queue) == 0 {
		sh.mu.Unlock()
		return nil
	}
	if sn := sh.queue[0]; sn.taken {
		sh.mu.Unlock()
		return sn
	}
	waiting := sh.queue
	sn, err := mergeSnapshots(waiting)
	if err != nil {
		// Outputs that do not concatenate: send the first alone.
		sh.h.Logger().Warn("snapshots not coalesced", "err", err)
		sn, waiting = waiting[0], waiting[:1]
	}
	if sh.nextID == 0 {
		sh.nextID = 1
	}
	sn.batch, sn.taken = sh.nextID, true
	sn.header.BatchId = sn.batch
	sh.nextID++
	sh.queue = append([]*snapshot{sn}, sh.queue[len(waiting):]...)
	sh.mu.Unlock()
	sh.h.Metrics().coalesced.Observe(float64(sn.batches))
	select {
	case sh.tookC <- struct{}{}:
	default:
	}
	return sn
}

// mergeSnapshots coalesces copied snapshots (oldest first) into one: the
// newest state with every request record and output, in batch order.
func mergeSnapshots(sns []*snapshot) (*snapshot, error) {
	if len(sns) == 1 {
		return sns[0], nil
	}
	top := sns[len(sns)-1]
	th := top.header
	h := &hamsv1.SnapshotHeader{Model: th.GetModel(), Epoch: th.GetEpoch(), StateVersion: th.GetStateVersion(),
		StateTensors: th.GetStateTensors(), StateBytes: th.GetStateBytes(), Delta: th.GetDelta()}
	var deltas [][]*hamsv1.StateRange
	for _, sn := range sns {
		if sn.isDelta() != top.isDelta() {
			return nil, fmt.Errorf("full and delta snapshots do not coalesce")
		}
		deltas = append(deltas, sn.delta)
	}
	parts := make([][]*hamsv1.Tensor, 0, len(sns))
	batches := 0
	var seq uint64
	var links []trace.Link
	for _, sn := range sns {
		h.Requests = append(h.Requests, sn.header.GetRequests()...)
		h.OutputRows = append(h.OutputRows, sn.header.GetOutputRows()...)
		parts = append(parts, sn.header.GetOutputs())
		links = append(links, sn.links...)
		batches += sn.batches
		seq = max(seq, sn.seq)
	}
	outs, err := concatOutputs(parts)
	if err != nil {
		return nil, err
	}
	h.Outputs = outs
	m := *top
	m.header, m.seq, m.batches, m.links = h, seq, batches, links
	m.copiedAt = sns[0].copiedAt
	if top.isDelta() {
		// Each delta holds what changed since the one before: together,
		// in order, they take the state from before the first to after
		// the last.
		m.delta = mergeRanges(deltas...)
		h.DeltaBytes = rangeBytes(m.delta)
	}
	return &m, nil
}

// concatOutputs concatenates the outputs of several batches along dim 0,
// tensor by tensor.
func concatOutputs(parts [][]*hamsv1.Tensor) ([]*hamsv1.Tensor, error) {
	if len(parts) == 1 {
		return parts[0], nil
	}
	n := len(parts[0])
	out := make([]*hamsv1.Tensor, n)
	for j := 0; j < n; j++ {
		col := make([]*hamsv1.Tensor, len(parts))
		for i, p := range parts {
			if len(p) != n {
				return nil, fmt.Errorf("batch %d has %d output tensors, batch 0 has %d", i, len(p), n)
			}
			col[i] = p[j]
		}
		t, err := tensor.Concat(col)
		if err != nil {
			return nil, fmt.Errorf("concatenate output %q: %w", col[0].GetName(), err)
		}
		out[j] = t
	}
	return out, nil
}

// Kept returns the last snapshot the backup acknowledged (nil before the
// first) and the number of unacknowledged ones, counted as they will be
// shipped: the waiting ones coalesce into one.
func (sh *shipper) Kept() (*snapshot, int) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.kept, sh.pendingLocked()
}

// pendingLocked counts the queued snapshots as shipments (caller holds
// mu): the taken ones, plus one for all the waiting ones.
func (sh *shipper) pendingLocked() int {
	n := 0
	for _, sn := range sh.queue {
		if sn.taken {
			n++
		}
	}
	if n < len(sh.queue) {
		n++
	}
	return n
}

// Unapplied is the number of snapshots not known applied (queued ones
// counted as shipments).
func (sh *shipper) Unapplied() int {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.pendingLocked() + len(sh.unapplied)
}

// Applied returns the rollback target: the last state the backup applied,
// as a full snapshot. The shipper never writes its state afterwards.
func (sh *shipper) Applied() *snapshot {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if err := sh.foldApplied(); err != nil {
		sh.h.Logger().Error("rollback target not materialized", "err", err)
		return nil
	}
	sh.disownApplied()
	return sh.applied
}

// disownApplied gives applied's buffer up (caller holds mu): it is about
// to be read outside the shipper.
func (sh *shipper) disownApplied() { sh.appliedOwn, sh.appliedBuf = false, nil }

// foldApplied makes applied the full state with appliedTail patched in
// (caller holds mu): in place when the shipper owns applied's buffer
// (the tail's ranges, merged, are all it writes), else into a new one.
func (sh *shipper) foldApplied() error {
	if len(sh.appliedTail) == 0 {
		return nil
	}
	if !sh.appliedOwn {
		f, buf, err := foldBuf(sh.applied, sh.appliedTail)
		if err != nil {
			return err
		}
		sh.applied, sh.appliedOwn, sh.appliedBuf = f, true, buf
	} else {
		rs := mergeRanges(deltasOf(sh.appliedTail)...)
		if err := checkRanges(rs, uint64(len(sh.appliedBuf))); err != nil {
			return fmt.Errorf("fold delta snapshots into the state of %d: %w", sh.applied.batch, err)
		}
		patchRanges(sh.appliedBuf, rs)
		top := sh.appliedTail[len(sh.appliedTail)-1]
		th, ah := top.header, sh.applied.header
		h := &hamsv1.SnapshotHeader{Model: th.GetModel(), Epoch: th.GetEpoch(), BatchId: th.GetBatchId(), StateVersion: th.GetStateVersion(),
			Requests: th.GetRequests(), StateTensors: ah.GetStateTensors(), StateBytes: ah.GetStateBytes(), Outputs: th.GetOutputs(), OutputRows: th.GetOutputRows()}
		m := *top
		m.header, m.state, m.delta, m.digest = h, sh.applied.state, nil, ""
		sh.applied = &m
	}
	clear(sh.appliedTail)
	sh.appliedTail = sh.appliedTail[:0]
	return nil
}

// deltasOf is the delta of each snapshot, in order.
func deltasOf(sns []*snapshot) [][]*hamsv1.StateRange {
	out := make([][]*hamsv1.StateRange, len(sns))
	for i, sn := range sns {
		out[i] = sn.delta
	}
	return out
}

// setApplied records that the backup applied batch n (caller holds mu).
// Applied deltas are folded into the full state once they add up to
// its size (each fold copies the state once, so folding costs at most
// one byte copied per delta byte, and the tail holds at most about one
// state's worth of deltas).
func (sh *shipper) setApplied(n uint64) {
	sh.appliedMax = max(sh.appliedMax, n)
	i := 0
	for i < len(sh.unapplied) && sh.unapplied[i].batch <= n {
		if sn := sh.unapplied[i]; sn.isDelta() && sh.applied != nil {
			sh.appliedTail = append(sh.appliedTail, sn)
		} else {
			sh.applied, sh.appliedTail = sn, sh.appliedTail[:0]
			sh.disownApplied()
		}
		i++
	}
	clear(sh.unapplied[:i])
	sh.unapplied = sh.unapplied[i:]
	if len(sh.appliedTail) > 0 {
		var tail uint64
		for _, d := range sh.appliedTail {
			tail += d.header.GetDeltaBytes()
		}
		if tail > sh.applied.header.GetStateBytes() || len(sh.appliedTail) >= maxUnapplied {
			if err := sh.foldApplied(); err != nil {
				sh.h.Logger().Error("fold applied deltas", "err", err)
			}
		}
	}
}

// recordAck records the backup's acknowledgement of sn (applied: the
// ack says it wrote it).
func (sh *shipper) recordAck(sn *snapshot, addr string, applied bool) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.sentTo = addr
	if (sh.applied == nil || sn.batch > sh.applied.batch) &&
		(len(sh.unapplied) == 0 || sn.batch > sh.unapplied[len(sh.unapplied)-1].batch) {
		sh.unapplied = append(sh.unapplied, sn)
	}
	switch {
	case applied:
		sh.setApplied(sn.batch)
	case sn.batch <= sh.appliedMax:
		// Its durability notice came first.
		sh.setApplied(sh.appliedMax)
	}
}

// reset makes base the only state known (promotion, rollback): nothing is
// queued, base counts as applied, and it is shipped first to whichever
// backup is found (when ship is set). Ids continue after base's.
func (sh *shipper) reset(base *snapshot, ship bool) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	clear(sh.queue)
	sh.queue = sh.queue[:0]
	clear(sh.unapplied)
	sh.unapplied = nil
	clear(sh.appliedTail)
	sh.appliedTail = nil
	sh.applied, sh.kept, sh.sentTo = base, base, ""
	sh.disownApplied()
	sh.nextID, sh.appliedMax = 0, 0
	if base != nil {
		sh.nextID, sh.appliedMax = base.batch+1, base.batch
	}
	if ship && base != nil {
		sh.queue = append(sh.queue, base)
	}
	for {
		select {
		case <-sh.acks:
			continue
		default:
		}
		break
	}
}

func (sh *shipper) run(ctx context.Context) error {
	var (
		cc      *grpc.ClientConn
		ccAddr  string
		backoff = shipMinBackoff
	)
	defer func() {
		if cc != nil {
			_ = cc.Close()
		}
		sh.bulk.close()
	}()
	for {
		sn := sh.head()
		if sn == nil {
			// Idle: a new backup still needs its base. The primary may
			// queue nothing more until one applies (the unapplied bound
			// is reached when the old backup acknowledged snapshots it
			// never wrote), so the move is looked for here too.
			if addr, _, ok := sh.h.Backups().ResolveBackup(sh.h.Model()); ok && sh.rebase(addr) {
				continue
			}
			var changed <-chan struct{}
			if sh.h.Topology() != nil {
				changed = sh.h.Topology().Changed()
			}
			t := time.NewTimer(shipIdleCheck)
			select {
			case <-sh.wake:
			case <-changed:
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil
			}
			t.Stop()
			continue
		}
		if hook := sh.h.ShipHook(); hook != nil {
			hook(ctx, sn.batch)
		}
		if ctx.Err() != nil {
			return nil
		}
		addr, _, ok := sh.h.Backups().ResolveBackup(sh.h.Model())
		if ok && addr == sh.h.Addr() {
			// The topology still names this instance as the backup: it
			// was just promoted and the manager has not rewired yet.
			// Shipping would stream the whole state to itself only to be
			// refused (tens of ms of a failover, for a 64 MiB state).
			sh.h.Metrics().shipSelf.Inc()
			if !sh.backoff(ctx, shipIdleCheck) {
				return nil
			}
			continue
		}
		if ok && sh.rebase(addr) {
			continue
		}
		var err error
		if !ok {
			err = fmt.Errorf("backup of %s not resolvable", sh.h.Model())
		} else {
			if cc == nil || addr != ccAddr {
				if cc != nil {
					_ = cc.Close()
				}
				cc, err = grpcx.Dial(addr, sh.h.MaxMessageBytes(), append(slices.Clip(sh.h.DialOptions()), sh.dialOptions...)...)
				if err != nil {
					return fmt.Errorf("dial backup %s: %w", addr, err)
				}
				ccAddr = addr
			}
			var applied bool
			t0 := time.Now()
			// A send to a backup that stopped answering (stopped,
			// descheduled: declared dead and replaced) would block until
			// shipTimeout; it is given up as soon as the topology names
			// another backup (docs/recovery.md, "False suspicion").
			sctx, stopWatch := sh.untilBackupMoves(ctx, addr)
			if onBulk(sn) {
				applied, err = sh.sendBulk(sctx, addr, sn)
				if err == nil {
					sh.h.Metrics().shipBulk.Inc()
				}
			} else {
				applied, err = sh.send(sctx, cc, sn)
			}
			stopWatch()
			sh.h.Metrics().shipSend.Observe(time.Since(t0).Seconds())
			if err == nil {
				sh.recordAck(sn, addr, applied)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if status.Code(err) == codes.FailedPrecondition && strings.Contains(err.Error(), errNeedBase) && sh.baseFirst() {
				sh.h.Logger().Info("backup needs a full base state; shipping the applied state first", "backup", addr, "batch", sn.batch)
				continue
			}
			sh.h.Metrics().shipRetries.Inc()
			sh.h.Logger().Info("snapshot shipment failed, resending", "batch", sn.batch, "backup", addr, "err", err, "backoff", backoff)
			if !sh.backoff(ctx, backoff) {
				return nil
			}
			backoff = min(2*backoff, shipMaxBackoff)
			continue
		}
		backoff = shipMinBackoff
		sh.mu.Lock()
		if len(sh.queue) > 0 && sh.queue[0] == sn {
			sh.queue[0] = nil
			sh.queue = sh.queue[1:]
		}
		if sh.kept == nil || sn.batch >= sh.kept.batch {
			sh.kept = sn
		}
		sh.mu.Unlock()
		sh.h.Metrics().shipped.Inc()
		if sn.isDelta() {
			sh.h.Metrics().shipBytes.Add(float64(sn.header.GetDeltaBytes()))
		} else {
			sh.h.Metrics().shipBytes.Add(float64(sn.header.GetStateBytes()))
		}
		sh.h.Metrics().snapDelivery.Observe(time.Since(sn.copiedAt).Seconds())
		sh.h.Logger().Debug("snapshot acknowledged", "batch", sn.batch, "bytes", sn.header.GetStateBytes())
		select {
		case sh.acks <- sn.last:
		case <-ctx.Done():
			return nil
		}
	}
}

// untilBackupMoves returns a context of ctx that is cancelled when the
// topology resolves the backup to another address than addr (or to none);
// stop ends the watch and waits for it.
func (sh *shipper) untilBackupMoves(ctx context.Context, addr string) (context.Context, func()) {
	res := sh.h.Topology()
	if res == nil {
		return ctx, func() {}
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			changed := res.Changed()
			if a, _, ok := sh.h.Backups().ResolveBackup(sh.h.Model()); !ok || a != addr {
				sh.h.Logger().Info("backup moved while a snapshot was being shipped; giving the shipment up", "backup", addr, "now", a)
				cancel()
				return
			}
			select {
			case <-changed:
			case <-sctx.Done():
				return
			}
		}
	}()
	return sctx, func() { cancel(); <-done }
}

// backoff waits d before the next attempt, or less when the topology
// changes (a new backup is worth trying at once); false when ctx ended.
func (sh *shipper) backoff(ctx context.Context, d time.Duration) bool {
	var changed <-chan struct{}
	if sh.h.Topology() != nil {
		changed = sh.h.Topology().Changed()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-changed:
	case <-ctx.Done():
		return false
	}
	return true
}

// send ships one snapshot: header, state data in chunks of at most
// shipChunkBytes (a delta's ranges, each chunk with its offset), the
// digest on the last chunk.
func (sh *shipper) send(ctx context.Context, cc *grpc.ClientConn, sn *snapshot) (applied bool, err error) {
	// The integrity check on the wire is XXH64, for full states as for
	// deltas (rangesDigest): the stream is our own sidecars', checked for
	// corruption, not authenticated. A full state's is computed chunk by
	// chunk as the chunks go out; SHA-256 of a 64 MiB base took ~46 ms of
	// CPU at each end of the failover path (the backup computes the
	// contract's SHA-256 itself when it writes audit digests).
	var stateSum *xxhash.Digest
	if !strings.HasPrefix(sn.digest, xxhPrefix) {
		switch {
		case sn.isDelta():
			sn.digest = rangesDigest(sn.delta)
		case sn.header.GetStateBytes() == 0:
			sn.digest = deltaDigest(xxhash.Sum64(nil))
		default:
			stateSum = xxhash.New()
		}
	}
	ctx, span := traceShip(ctx, sh.h.Model(), sh.h.ID(), sn) // nil when untraced (tracing.go)
	if span != nil {
		defer func() { tracing.EndErr(span, err) }()
	}
	ctx, cancel := context.WithTimeout(ctx, shipTimeout)
	defer cancel()
	st, err := hamsv1.NewReplicationClient(cc).ShipSnapshot(ctx)
	if err != nil {
		return false, fmt.Errorf("open ShipSnapshot: %w", err)
	}
	first := &hamsv1.SnapshotChunk{Part: &hamsv1.SnapshotChunk_Header{Header: sn.header}}
	size := sn.header.GetStateBytes()
	if sn.isDelta() {
		size = sn.header.GetDeltaBytes()
	}
	if size == 0 {
		first.StateDigest = sn.digest
	}
	if err := st.Send(first); err != nil {
		_, err = st.CloseAndRecv()
		return false, fmt.Errorf("send header of batch %d: %w", sn.batch, err)
	}
	var sent uint64
	emit := func(off uint64, d []byte) error {
		for len(d) > 0 {
			k := min(len(d), shipChunkBytes)
			ch := &hamsv1.SnapshotChunk{Part: &hamsv1.SnapshotChunk_Data{Data: d[:k]}, Offset: off}
			d, off = d[k:], off+uint64(k)
			sent += uint64(k)
			if stateSum != nil {
				stateSum.Write(ch.GetData())
			}
			if sent == size {
				if stateSum != nil {
					sn.digest = deltaDigest(stateSum.Sum64())
				}
				ch.StateDigest = sn.digest
			}
			if err := st.Send(ch); err != nil {
				_, err = st.CloseAndRecv()
				return fmt.Errorf("send state of batch %d: %w", sn.batch, err)
			}
		}
		return nil
	}
	if sn.isDelta() {
		for _, r := range sn.delta {
			if err := emit(r.GetOffset(), r.GetData()); err != nil {
				return false, err
			}
		}
	} else {
		var off uint64
		for _, t := range sn.state {
			if err := emit(off, t.GetData()); err != nil {
				return false, err
			}
			off += uint64(len(t.GetData()))
		}
	}
	resp, err := st.CloseAndRecv()
	if err != nil {
		return false, fmt.Errorf("ship batch %d: %w", sn.batch, err)
	}
	if resp.GetBatchId() != sn.batch {
		return false, fmt.Errorf("backup acknowledged batch %d for batch %d", resp.GetBatchId(), sn.batch)
	}
	return resp.GetApplied(), nil
}

// rangesDigest is the integrity check of a delta's data, in order:
// "xxh64:" and the hex XXH64. Deltas are checked for corruption, not
// authenticated (the stream is the sidecars' own); SHA-256 of every delta
// took 15% of a 64 MiB learner's primary and 40% of its backup (CPU
// profiles, docs/measurements.md), XXH64 is ~10x faster.
func rangesDigest(rs []*hamsv1.StateRange) string {
	h := xxhash.New()
	for _, r := range rs {
		_, _ = h.Write(r.GetData())
	}
	return deltaDigest(h.Sum64())
}

// xxhPrefix starts every state_digest on the Replication stream.
const xxhPrefix = "xxh64:"

// deltaDigest formats an XXH64 sum as a snapshot's state_digest (a
// delta's, of its data; a full state's, of the state).
func deltaDigest(sum uint64) string { return xxhPrefix + strconv.FormatUint(sum, 16) }

// rebase queues kept again, first, when the backup's address changed since
// it was acknowledged (a new or demoted backup needs a base state). It
// reports whether it queued something.
func (sh *shipper) rebase(addr string) bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.kept == nil || sh.sentTo == "" || sh.sentTo == addr {
		return false
	}
	if len(sh.queue) > 0 && sh.queue[0] == sh.kept {
		return false
	}
	base := sh.rebaseSnapshots()
	if len(base) == 0 {
		return false
	}
	sh.h.Logger().Info("backup moved; shipping the last state as its base", "backup", addr, "batch", base[0].batch,
		"snapshots", len(base))
	sh.queue = append(base, sh.queue...)
	sh.sentTo = ""
	return true
}

// baseFirst queues the base a backup without one needs before the queued
// snapshots (a delta reached a backup that lost or never had its base);
// false when there is none to give.
func (sh *shipper) baseFirst() bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.kept == nil {
		return false
	}
	base := sh.rebaseSnapshots()
	if len(base) == 0 || base[0].isDelta() {
		return false
	}
	sh.queue = append(base, sh.queue...)
	return true
}

// rebaseSnapshots is what a new backup gets first (caller holds mu):
// every acknowledged snapshot no backup is known to have applied, in order (the
// first one is its base, the others follow under their ids), or kept
// when all are applied. Applying kept makes all of them durable, so the
// new backup must have their records (audit, lineage index) and outputs
// (a resend after its promotion); kept alone would leave the earlier
// unapplied batches' requests durable with no record of it. They are not
// merged: each record keeps the digest of its own batch's state, the one
// the old backup wrote if it applied that batch before it failed.
//
// With delta snapshots the base must be a full state: the applied state
// (folded), then every unapplied delta after it.
func (sh *shipper) rebaseSnapshots() []*snapshot {
	n := len(sh.unapplied)
	if sh.kept.isDelta() || n > 0 && sh.unapplied[0].isDelta() || len(sh.appliedTail) > 0 {
		if err := sh.foldApplied(); err != nil || sh.applied == nil {
			sh.h.Logger().Error("no full base for a new backup", "err", err)
			return nil
		}
		sh.disownApplied() // it is sent, and may become kept
		return append([]*snapshot{sh.applied}, sh.unapplied...)
	}
	if n == 0 || sh.unapplied[n-1] != sh.kept {
		return []*snapshot{sh.kept}
	}
	return slices.Clone(sh.unapplied)
}

// watchOwnDurable learns from this model's durability notices which
// snapshot the backup applied (the rollback target moves forward), until
// ctx ends. Notices of an epoch before recovered (the epoch of this
// instance's last promotion or rollback) are another numbering's.
func (sh *shipper) watchOwnDurable(ctx context.Context, recovered func() uint64) error {
	return sh.h.Coord().WatchDurable(ctx, []string{sh.h.Model()}, func(n *hamsv1.DurabilityNotice) {
		if n.GetModel() != sh.h.Model() || n.GetEpoch() < recovered() {
			return
		}
		sh.mu.Lock()
		sh.setApplied(n.GetBatchId())
		sh.mu.Unlock()
		select {
		case sh.appliedC <- struct{}{}:
		default:
		}
	})
}
