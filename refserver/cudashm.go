package refserver

import (
	"errors"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/cuda"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
)

// cudaRegion is one registered CUDA shared-memory region: a client's
// device allocation, opened from its raw cudaIpcMemHandle_t.
type cudaRegion struct {
	name   string
	device int
	size   uint64
	buf    *cuda.Buffer
	pins
}

func (r *cudaRegion) pinsOf() *pins { return &r.pins }
func (r *cudaRegion) closeRegion()  { _ = r.buf.Close() }

// cudaManager holds the registered CUDA regions and the devices they are
// on. The models are Go code on the CPU, so a CUDA input is copied device
// to host before the model runs and a CUDA output host to device after it
// (what Triton does for a CPU model given CUDA shared memory).
//
// Region names share one namespace with the system regions (Triton keeps
// both kinds in one manager): nameMu is held by both Register calls
// across the check of the other kind and the insert.
type cudaManager struct {
	nameMu sync.Mutex

	mu      sync.Mutex
	open    func(ordinal int) (*cuda.Device, error)
	devices map[int]*cuda.Device
	regions map[string]*cudaRegion
}

func newCudaManager() *cudaManager {
	return &cudaManager{open: cuda.Open, devices: map[int]*cuda.Device{}, regions: map[string]*cudaRegion{}}
}

// has reports whether name is a registered CUDA region.
func (m *cudaManager) has(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.regions[name] != nil
}

// device returns the opened device ordinal (opened on first use); m.mu
// is held.
func (m *cudaManager) device(ordinal int) (*cuda.Device, error) {
	if d := m.devices[ordinal]; d != nil {
		return d, nil
	}
	d, err := m.open(ordinal)
	if err != nil {
		return nil, err
	}
	m.devices[ordinal] = d
	return d, nil
}

// register opens raw (the 64 bytes of a cudaIpcMemHandle_t) on device and
// registers it as name. taken reports whether name is a system region.
func (m *cudaManager) register(name string, raw []byte, device int64, size uint64, taken func(string) bool) error {
	if name == "" {
		return status.Error(codes.InvalidArgument, "failed to register CUDA shared memory region: no name")
	}
	if len(raw) != cuda.HandleSize {
		return status.Errorf(codes.InvalidArgument, "failed to register CUDA shared memory region '%s': raw_handle has %d bytes, a cudaIpcMemHandle_t has %d", name, len(raw), cuda.HandleSize)
	}
	if device < 0 {
		return status.Errorf(codes.InvalidArgument, "failed to register CUDA shared memory region '%s': device_id %d is negative", name, device)
	}
	if size == 0 || size > uint64(int(^uint(0)>>1)) {
		return status.Errorf(codes.InvalidArgument, "failed to register CUDA shared memory region '%s': invalid args: byte_size %d", name, size)
	}
	m.nameMu.Lock()
	defer m.nameMu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.regions[name] != nil || taken(name) {
		return status.Errorf(codes.AlreadyExists, "shared memory region '%s' already in manager", name)
	}
	d, err := m.device(int(device))
	if err != nil {
		code := codes.Internal
		switch {
		case errors.Is(err, cuda.ErrUnavailable), errors.Is(err, cuda.ErrNoDevice):
			code = codes.FailedPrecondition
		}
		return status.Errorf(code, "failed to register CUDA shared memory region '%s': device %d: %v", name, device, err)
	}
	b, err := d.OpenIPC(cuda.IPCHandle(raw), int(size))
	if err != nil {
		code := codes.Internal
		switch {
		case errors.Is(err, cuda.ErrRange):
			code = codes.InvalidArgument
		case errors.Is(err, cuda.ErrDriver):
			// a handle the driver cannot open: not an allocation, from
			// another host, or its exporting process is gone
			code = codes.InvalidArgument
		}
		return status.Errorf(code, "failed to register CUDA shared memory region '%s': Unable to open CUDA IPC handle on device %d: %v", name, device, err)
	}
	m.regions[name] = &cudaRegion{name: name, device: int(device), size: size, buf: b}
	return nil
}

// unregister drops name (all CUDA regions for ""); unknown names succeed,
// as in Triton. A region still used by a request is unmapped when that
// request ends.
func (m *cudaManager) unregister(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	unregisterRegions(m.regions, name)
}

func (m *cudaManager) status(name string) (*inference.CudaSharedMemoryStatusResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	resp := &inference.CudaSharedMemoryStatusResponse{Regions: map[string]*inference.CudaSharedMemoryStatusResponse_RegionStatus{}}
	for n, r := range m.regions {
		if name != "" && n != name {
			continue
		}
		resp.Regions[n] = &inference.CudaSharedMemoryStatusResponse_RegionStatus{Name: n, DeviceId: uint64(r.device), ByteSize: r.size}
	}
	if name != "" && len(resp.Regions) == 0 {
		return nil, status.Errorf(codes.NotFound, "Unable to find cuda shared memory region: '%s'", name)
	}
	return resp, nil
}

// cudaUse is a window of a CUDA region a request reads or writes, pinned
// until release.
type cudaUse struct {
	r         *cudaRegion
	off, size int
}

// acquire checks the tensor's shared-memory parameters against the region
// and pins the region until release.
func (m *cudaManager) acquire(tensorName string, params map[string]*inference.InferParameter) (*cudaUse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, off, size, err := pinWindow(m.regions, func(r *cudaRegion) uint64 { return r.size }, tensorName, params)
	if err != nil {
		return nil, err
	}
	return &cudaUse{r: r, off: int(off), size: int(size)}, nil
}

func (m *cudaManager) release(u *cudaUse) {
	if u == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	unpin(u.r)
}

// input reads one input tensor out of a CUDA region (device to host).
func (m *cudaManager) input(in *inference.ModelInferRequest_InferInputTensor, raw []byte) (*hamsv1.Tensor, error) {
	if wire.ContentsCount(in.Contents) > 0 || len(raw) > 0 {
		return nil, status.Errorf(codes.InvalidArgument, "tensor %q: data in shared memory and in the request", in.Name)
	}
	u, err := m.acquire(in.Name, in.Parameters)
	if err != nil {
		return nil, err
	}
	defer m.release(u)
	data := make([]byte, u.size)
	if err := u.r.buf.CopyToHost(u.off, data); err != nil {
		return nil, status.Errorf(codes.Internal, "tensor %q: copy from CUDA shared memory region '%s': %v", in.Name, u.r.name, err)
	}
	t, err := wire.FromKServe(in.Name, in.Datatype, in.Shape, nil, data, true)
	return t, wireStatus(err)
}

// write copies an output into the window (host to device); on return the
// bytes are in device memory, before the response leaves.
func (u *cudaUse) write(data []byte) error {
	return u.r.buf.CopyFromHost(u.off, data)
}

// close unmaps every region and releases the devices (server shutdown,
// after the last request).
func (m *cudaManager) close() {
	m.unregister("")
	m.mu.Lock()
	defer m.mu.Unlock()
	for o, d := range m.devices {
		_ = d.Close()
		delete(m.devices, o)
	}
}

func (m *cudaManager) names() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return regionNames(m.regions)
}

// CUDASharedMemoryRegions lists the registered CUDA shared-memory regions.
func (s *Server) CUDASharedMemoryRegions() []string { return s.cuda.names() }
