package refserver

import (
	"errors"
	"os"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/bigmem"
	"github.com/hams-go/hams/internal/shm"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	"github.com/hams-go/hams/refserver/models"
)

// shmRegion is one registered system shared-memory region: the window
// [offset, offset+size) of the object key, mapped whole.
type shmRegion struct {
	name, key    string
	offset, size uint64
	m            *shm.Region
	win          []byte
	pins
}

func (r *shmRegion) pinsOf() *pins { return &r.pins }
func (r *shmRegion) closeRegion()  { _ = r.m.Close() }

// shmManager holds the registered regions (Triton's SharedMemoryManager).
type shmManager struct {
	mu      sync.Mutex
	regions map[string]*shmRegion
}

func newShmManager() *shmManager { return &shmManager{regions: map[string]*shmRegion{}} }

func (m *shmManager) register(name, key string, offset, size uint64) error {
	if name == "" {
		return status.Error(codes.InvalidArgument, "failed to register shared memory region: no name")
	}
	if key == "" {
		return status.Errorf(codes.InvalidArgument, "failed to register shared memory region '%s': no key", name)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.regions[name] != nil {
		return status.Errorf(codes.AlreadyExists, "shared memory region '%s' already in manager", name)
	}
	r, err := shm.Open(key)
	if err != nil {
		code := codes.Internal
		switch {
		case errors.Is(err, os.ErrNotExist):
			code = codes.NotFound
		case errors.Is(err, shm.ErrInvalidKey):
			code = codes.InvalidArgument
		}
		return status.Errorf(code, "Unable to open shared memory region: '%s': %v", key, err)
	}
	if offset > uint64(r.Size()) || size > uint64(r.Size())-offset {
		_ = r.Close()
		return status.Errorf(codes.InvalidArgument, "failed to register shared memory region '%s': invalid args: offset %d + byte_size %d exceeds the %d bytes of '%s'", name, offset, size, r.Size(), key)
	}
	var win []byte
	if b := r.Bytes(); b != nil {
		win = b[offset : offset+size : offset+size]
	}
	m.regions[name] = &shmRegion{name: name, key: key, offset: offset, size: size, m: r, win: win}
	return nil
}

// unregister drops name (all regions for ""); unknown names succeed, as in
// Triton.
func (m *shmManager) unregister(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	unregisterRegions(m.regions, name)
}

func (m *shmManager) status(name string) (*inference.SystemSharedMemoryStatusResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	resp := &inference.SystemSharedMemoryStatusResponse{Regions: map[string]*inference.SystemSharedMemoryStatusResponse_RegionStatus{}}
	for n, r := range m.regions {
		if name != "" && n != name {
			continue
		}
		resp.Regions[n] = &inference.SystemSharedMemoryStatusResponse_RegionStatus{Name: n, Key: r.key, Offset: r.offset, ByteSize: r.size}
	}
	if name != "" && len(resp.Regions) == 0 {
		return nil, status.Errorf(codes.NotFound, "Unable to find system shared memory region: '%s'", name)
	}
	return resp, nil
}

// shmUse is a window of a region a request reads or writes; release it.
type shmUse struct {
	r   *shmRegion
	buf []byte
}

// acquire checks the tensor's shared-memory parameters against the region
// and pins the region until release.
func (m *shmManager) acquire(tensorName string, params map[string]*inference.InferParameter) (*shmUse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, off, size, err := pinWindow(m.regions, func(r *shmRegion) uint64 { return r.size }, tensorName, params)
	if err != nil {
		return nil, err
	}
	return &shmUse{r: r, buf: r.win[off : off+size : off+size]}, nil
}

func (m *shmManager) release(u *shmUse) {
	if u == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	unpin(u.r)
}

// pin returns the window of region name, pinned until release; NotFound
// when it is not registered or not mapped in this process.
func (m *shmManager) pin(name string) (*shmUse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.regions[name]
	if r == nil || r.win == nil {
		return nil, status.Errorf(codes.NotFound, "Unable to find system shared memory region: '%s'", name)
	}
	r.pins.refs++
	return &shmUse{r: r, buf: r.win}, nil
}

// writeDelta copies the data of a staged delta back to back into region
// name from its start and returns each range's size; ok is false (nothing
// written) when the region is not registered, not mapped here or too
// small, and the caller sends the data inline instead.
func (m *shmManager) writeDelta(name string, delta []models.Range) (sizes []uint64, ok bool) {
	m.mu.Lock()
	r := m.regions[name]
	if r == nil {
		m.mu.Unlock()
		return nil, false
	}
	r.pins.refs++
	m.mu.Unlock()
	u := &shmUse{r: r, buf: r.win}
	defer m.release(u)
	total := 0
	for _, d := range delta {
		total += len(d.Data)
	}
	if total > len(u.buf) {
		return nil, false
	}
	sizes = make([]uint64, len(delta))
	off := 0
	for i, d := range delta {
		off += copy(u.buf[off:], d.Data)
		sizes[i] = uint64(len(d.Data))
	}
	return sizes, true
}

// input reads one input tensor out of shared memory (a copy: the client
// may reuse the region once the response is back).
func (m *shmManager) input(in *inference.ModelInferRequest_InferInputTensor, raw []byte) (*hamsv1.Tensor, error) {
	if wire.ContentsCount(in.Contents) > 0 || len(raw) > 0 {
		return nil, status.Errorf(codes.InvalidArgument, "tensor %q: data in shared memory and in the request", in.Name)
	}
	u, err := m.acquire(in.Name, in.Parameters)
	if err != nil {
		return nil, err
	}
	defer m.release(u)
	t, err := wire.FromKServe(in.Name, in.Datatype, in.Shape, nil, bigmem.Clone(u.buf), true)
	return t, wireStatus(err)
}

// close unmaps every region (server shutdown).
func (m *shmManager) close() { m.unregister("") }

func (m *shmManager) names() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return regionNames(m.regions)
}
