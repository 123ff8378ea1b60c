package reference

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/shm"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
)

// Delta handoff through shared memory. A replicated primary's Compute
// returns the bytes its update will write (the delta snapshot shipped to
// the backup); for an online learner that is tens of MB per batch, which
// over gRPC costs an encode, two socket copies, a reassembly and a decode
// on the serving CPU, all before the batch's outputs can be released. The
// sidecar and its model server share a host, so the adapter lends the
// server a POSIX shared-memory region of the state's size (a delta never
// exceeds it: its ranges do not overlap) registered through KServe v2
// SystemSharedMemoryRegister; the server writes the delta's data there
// and answers with offsets and sizes only, and the adapter copies the data
// out once before it returns (the region is reused by the next Compute,
// while the shipper keeps a delta until the backup applied it and it is
// folded).
//
// The region's name is unlinked as soon as the server mapped it, so a
// killed sidecar leaves nothing in /dev/shm. A server that cannot use the
// region (a model server on another host: the key does not exist there; a
// restarted one: the registration is gone) answers with the data inline,
// and the adapter registers a new region at most every deltaRetry.

// deltaRetry spaces the attempts to register a delta region after one
// failed or the server stopped using it.
const deltaRetry = 5 * time.Second

var deltaSeq atomic.Uint64

// deltaRegion is a shared-memory region lent to the model server: the
// delta region (Compute writes a staged delta into it) or the write
// region (WriteState reads a state write's data from it, writeregion.go).
type deltaRegion struct {
	// prefix starts the region's name ("hams_delta_", "hams_write_").
	prefix string
	// mu is held for a whole call that lends the region: the server
	// writes (reads) it during the call and the adapter reads (wrote) it
	// around the call.
	mu       sync.Mutex
	disabled bool
	name     string
	m        *shm.Region
	retryAt  time.Time
	// retryEvery spaces registration attempts (deltaRetry; tests: 0).
	retryEvery time.Duration
	inUse      bool // the server used the current region at least once
}

// lend returns the region d to name in a call for a model whose state is
// stateBytes, registering a new one if needed ("" when none can be used
// now). Caller holds d.mu.
func (b *Backend) lend(ctx context.Context, d *deltaRegion, stateBytes uint64) string {
	if d.disabled || stateBytes == 0 {
		return ""
	}
	if d.m != nil {
		return d.name
	}
	if time.Now().Before(d.retryAt) {
		return ""
	}
	d.retryAt = time.Now().Add(d.retryEvery)
	name, m, err := b.registerRegion(ctx, d.prefix, stateBytes)
	if status.Code(err) == codes.NotFound {
		// The server cannot open what this host's /dev/shm holds: it
		// runs on another host (or in another IPC namespace) for good.
		d.disabled = true
		b.log().Info("the model server shares no /dev/shm with the sidecar; state data crosses gRPC", "region", d.prefix, "err", err)
		return ""
	}
	if err != nil {
		b.log().Warn("state data through shared memory unavailable; it crosses gRPC", "region", d.prefix, "err", err, "retry_in", d.retryEvery)
		return ""
	}
	d.name, d.m, d.inUse = name, m, false
	return name
}

// registerRegion creates a region of size bytes named prefix+model,
// registers it with the server and unlinks its name.
func (b *Backend) registerRegion(ctx context.Context, prefix string, size uint64) (string, *shm.Region, error) {
	if size > shm.MaxSize {
		return "", nil, fmt.Errorf("state of %d bytes: larger than a shared-memory region may be", size)
	}
	// One region name per model: a sidecar that replaces a killed one
	// (same model, same model server) takes the name over, so the server
	// does not keep the dead one's region mapped for good.
	name := prefix + shm.KeyPart(b.model)
	key := fmt.Sprintf("%s_%d_%d", name, os.Getpid(), deltaSeq.Add(1))
	m, err := shm.Create(key, int(size))
	if err != nil {
		return "", nil, fmt.Errorf("create region %s: %w", name, err)
	}
	ctx, cancel := b.ctx(ctx)
	defer cancel()
	req := &inference.SystemSharedMemoryRegisterRequest{Name: name, Key: key, ByteSize: size}
	_, err = b.ks.SystemSharedMemoryRegister(ctx, req)
	if status.Code(err) == codes.AlreadyExists {
		b.unregisterRegion(ctx, name)
		_, err = b.ks.SystemSharedMemoryRegister(ctx, req)
	}
	// Registered or not, the object's name is no longer needed: the
	// server mapped it if it could.
	_ = shm.Unlink(key)
	if err != nil {
		_ = m.Close()
		return "", nil, fmt.Errorf("register region %s (key %s, %d bytes) with the model server: %w", name, key, size, err)
	}
	return name, m, nil
}

// drop forgets region d (the server no longer uses it); caller holds
// d.mu.
func (b *Backend) drop(ctx context.Context, d *deltaRegion) {
	if d.m == nil {
		return
	}
	b.unregisterRegion(ctx, d.name)
	_ = d.m.Close()
	d.m, d.name = nil, ""
	d.retryAt = time.Now().Add(d.retryEvery)
}

func (b *Backend) unregisterRegion(ctx context.Context, name string) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, _ = b.ks.SystemSharedMemoryUnregister(ctx, &inference.SystemSharedMemoryUnregisterRequest{Name: name})
}

// takeDelta replaces the offsets-only ranges of a response whose delta
// went into the region by ranges holding a copy of their data (one
// buffer). Caller holds d.mu.
func (b *Backend) takeDelta(resp *hamsv1.BatchResponse) error {
	d := &b.delta
	sizes := resp.GetStateDeltaSizes()
	if resp.GetStateDeltaRegion() != d.name || len(sizes) != len(resp.GetStateDelta()) {
		return status.Errorf(codes.Internal, "reference %s compute: delta in region %q with %d sizes for %d ranges (lent %q)",
			b.model, resp.GetStateDeltaRegion(), len(sizes), len(resp.GetStateDelta()), d.name)
	}
	win := d.m.Bytes()
	total, err := deltaTotal(sizes, uint64(len(win)))
	if err != nil {
		return status.Errorf(codes.Internal, "reference %s compute: %v", b.model, err)
	}
	buf := shm.CopyOut(win[:total]) // unzeroed: every byte is overwritten
	off := uint64(0)
	for i, r := range resp.GetStateDelta() {
		if len(r.GetData()) != 0 {
			return status.Errorf(codes.Internal, "reference %s compute: range %d has data inline and in the region", b.model, i)
		}
		r.Data = buf[off : off+sizes[i] : off+sizes[i]]
		off += sizes[i]
	}
	resp.StateDeltaRegion, resp.StateDeltaSizes = "", nil
	d.inUse = true
	return nil
}

// deltaTotal is the bytes of a delta the server says it wrote into a
// region of win bytes, range by range (sizes are the server's: each is
// checked before it is added, so no sum wraps around).
func deltaTotal(sizes []uint64, win uint64) (uint64, error) {
	var total uint64
	for i, n := range sizes {
		if n > win-total {
			return 0, fmt.Errorf("delta range %d of %d bytes after %d in a region of %d", i, n, total, win)
		}
		total += n
	}
	return total, nil
}

// closeRegion unregisters and unmaps region d (Close).
func (b *Backend) closeRegion(d *deltaRegion) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.disabled = true
	if d.m != nil {
		b.unregisterRegion(context.Background(), d.name)
		_ = d.m.Close()
		d.m, d.name = nil, ""
	}
}
