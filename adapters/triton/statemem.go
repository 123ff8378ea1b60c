package triton

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/bigmem"
	"github.com/hams-go/hams/internal/cuda"
	"github.com/hams-go/hams/internal/shm"
	"github.com/hams-go/hams/protos/inference"
)

// State memory kinds (StateMemory.Kind).
const (
	// MemorySystem keeps the state in POSIX shared memory registered with
	// SystemSharedMemoryRegister (the default).
	MemorySystem = "system"
	// MemoryCUDA keeps the state in device memory of the adapter's
	// process, registered with CudaSharedMemoryRegister as a raw
	// cudaIpcMemHandle_t.
	MemoryCUDA = "cuda"
)

// StateMemoryKinds lists the valid StateMemory.Kind values.
var StateMemoryKinds = []string{MemorySystem, MemoryCUDA}

// StateMemory says where a Stateful backend keeps its state buffers.
type StateMemory struct {
	// Kind is MemorySystem ("" means it) or MemoryCUDA.
	Kind string
	// Device is the CUDA device ordinal (MemoryCUDA only).
	Device int
}

func (m StateMemory) validate() error {
	switch m.Kind {
	case "", MemorySystem:
		if m.Device != 0 {
			return fmt.Errorf("%w: state memory %q takes no CUDA device (got %d)", ErrConfig, MemorySystem, m.Device)
		}
	case MemoryCUDA:
		if m.Device < 0 {
			return fmt.Errorf("%w: CUDA device %d is negative", ErrConfig, m.Device)
		}
	default:
		return fmt.Errorf("%w: state memory %q is not one of %s", ErrConfig, m.Kind, strings.Join(StateMemoryKinds, ", "))
	}
	return nil
}

// StatefulOption configures a Stateful backend beyond Config.
type StatefulOption func(*statefulOptions)

type statefulOptions struct {
	mem StateMemory
}

// WithStateMemory picks where the state buffers live (default: system
// shared memory).
func WithStateMemory(m StateMemory) StatefulOption {
	return func(o *statefulOptions) { o.mem = m }
}

// region is one state buffer (A or B of one state tensor) in memory the
// model server reads and writes through a registered region name. Its
// contents are only touched under the Stateful's locks (stateful.go), so
// implementations need not be safe for concurrent writes.
type region interface {
	// read copies the whole buffer into dst (len(dst) is its size).
	read(dst []byte) error
	// write overwrites the whole buffer with src; on return the bytes are
	// visible to the server.
	write(src []byte) error
	// free releases the buffer; call it after its registration is dropped.
	free() error
}

// memory allocates the state buffers of one kind and registers them with
// the server.
type memory interface {
	kind() string
	// open prepares the memory (the CUDA device); Setup calls it once.
	open() error
	// alloc creates a zeroed buffer of size bytes for region name.
	alloc(name string, size int) (region, error)
	// register and unregister are the server's Register/Unregister calls
	// for this kind (codes unchanged; the caller maps them).
	register(ctx context.Context, name string, r region, size int) error
	unregister(ctx context.Context, name string) error
	// registered is the set of region names of this kind the server
	// holds now (its Status call with no name: every region).
	registered(ctx context.Context) (map[string]bool, error)
	// describe is a short description for logs ("system", "cuda:0 (H100)").
	describe() string
	// close releases what open took (after every region is freed).
	close() error
}

func newMemory(m StateMemory, cl inference.GRPCInferenceServiceClient) memory {
	if m.Kind == MemoryCUDA {
		return &cudaMemory{cl: cl, ordinal: m.Device}
	}
	return &systemMemory{cl: cl}
}

// systemMemory is POSIX shared memory: the key of region name is "/"+name,
// the object /dev/shm/name on Linux.
type systemMemory struct {
	cl inference.GRPCInferenceServiceClient
}

type shmRegion struct {
	key string
	m   *shm.Region
}

func (r *shmRegion) read(dst []byte) error  { bigmem.Copy(dst, r.m.Bytes()); return nil }
func (r *shmRegion) write(src []byte) error { bigmem.Copy(r.m.Bytes(), src); return nil }
func (r *shmRegion) free() error {
	return errors.Join(r.m.Close(), shm.Unlink(r.key))
}

func (*systemMemory) kind() string     { return MemorySystem }
func (*systemMemory) open() error      { return nil }
func (*systemMemory) close() error     { return nil }
func (*systemMemory) describe() string { return MemorySystem }

func (*systemMemory) alloc(name string, size int) (region, error) {
	key := "/" + name
	m, err := shm.Create(key, size)
	if errors.Is(err, os.ErrExist) {
		// left by a dead process with our pid: ours to reclaim
		_ = shm.Unlink(key)
		m, err = shm.Create(key, size)
	}
	if err != nil {
		return nil, err
	}
	return &shmRegion{key: key, m: m}, nil
}

func (s *systemMemory) register(ctx context.Context, name string, r region, size int) error {
	_, err := s.cl.SystemSharedMemoryRegister(ctx, &inference.SystemSharedMemoryRegisterRequest{Name: name, Key: r.(*shmRegion).key, ByteSize: uint64(size)})
	return err
}

func (s *systemMemory) unregister(ctx context.Context, name string) error {
	_, err := s.cl.SystemSharedMemoryUnregister(ctx, &inference.SystemSharedMemoryUnregisterRequest{Name: name})
	return err
}

func (s *systemMemory) registered(ctx context.Context) (map[string]bool, error) {
	st, err := s.cl.SystemSharedMemoryStatus(ctx, &inference.SystemSharedMemoryStatusRequest{})
	if err != nil {
		return nil, err
	}
	return regionSet(st.GetRegions()), nil
}

// regionSet is the set of keys of a Status response's regions (Triton
// keys them by region name).
func regionSet[R any](regions map[string]R) map[string]bool {
	out := make(map[string]bool, len(regions))
	for n := range regions {
		out[n] = true
	}
	return out
}

// cudaMemory is device memory of this process: each buffer its own
// allocation, exported to the server as a cudaIpcMemHandle_t. The handle
// dies with this process, which is fine: the sidecar and its model server
// are one failure unit.
type cudaMemory struct {
	cl      inference.GRPCInferenceServiceClient
	ordinal int
	dev     *cuda.Device
}

type cudaRegion struct {
	buf *cuda.Buffer
}

func (r *cudaRegion) read(dst []byte) error  { return r.buf.CopyToHost(0, dst) }
func (r *cudaRegion) write(src []byte) error { return r.buf.CopyFromHost(0, src) }
func (r *cudaRegion) free() error            { return r.buf.Close() }

func (*cudaMemory) kind() string { return MemoryCUDA }

func (c *cudaMemory) open() error {
	if c.dev != nil {
		return nil
	}
	d, err := cuda.Open(c.ordinal)
	if err != nil {
		return err
	}
	c.dev = d
	return nil
}

func (c *cudaMemory) describe() string {
	if c.dev == nil {
		return fmt.Sprintf("cuda:%d", c.ordinal)
	}
	return fmt.Sprintf("cuda:%d (%s)", c.ordinal, c.dev.Name())
}

func (c *cudaMemory) alloc(_ string, size int) (region, error) {
	b, err := c.dev.Alloc(size)
	if err != nil {
		return nil, err
	}
	return &cudaRegion{buf: b}, nil
}

func (c *cudaMemory) register(ctx context.Context, name string, r region, size int) error {
	h, err := r.(*cudaRegion).buf.IPCHandle()
	if err != nil {
		return status.Errorf(codes.Internal, "%v", err)
	}
	_, err = c.cl.CudaSharedMemoryRegister(ctx, &inference.CudaSharedMemoryRegisterRequest{Name: name, RawHandle: h[:], DeviceId: int64(c.ordinal), ByteSize: uint64(size)})
	return err
}

func (c *cudaMemory) unregister(ctx context.Context, name string) error {
	_, err := c.cl.CudaSharedMemoryUnregister(ctx, &inference.CudaSharedMemoryUnregisterRequest{Name: name})
	return err
}

func (c *cudaMemory) registered(ctx context.Context) (map[string]bool, error) {
	st, err := c.cl.CudaSharedMemoryStatus(ctx, &inference.CudaSharedMemoryStatusRequest{})
	if err != nil {
		return nil, err
	}
	return regionSet(st.GetRegions()), nil
}

func (c *cudaMemory) close() error {
	if c.dev == nil {
		return nil
	}
	err := c.dev.Close()
	c.dev = nil
	return err
}
