//go:build linux && !nocuda

package cuda

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Supported is true: this build loads the driver at run time (false in a
// build with -tags nocuda, or off Linux).
const Supported = true

// libraryPaths are tried after $HAMS_LIBCUDA, in order.
var libraryPaths = []string{
	"libcuda.so.1",
	"/usr/lib/x86_64-linux-gnu/libcuda.so.1",
	"/usr/lib/aarch64-linux-gnu/libcuda.so.1",
	"/usr/lib64/libcuda.so.1",
	"/usr/local/nvidia/lib64/libcuda.so.1",
	"/usr/local/nvidia/lib/libcuda.so.1",
	"/usr/lib/wsl/lib/libcuda.so.1",
}

// ipcMemHandle is CUipcMemHandle, passed by value to cuIpcOpenMemHandle
// (purego lays a struct argument out as the platform's C ABI does).
type ipcMemHandle struct {
	Reserved [HandleSize]byte
}

// cuIpcMemLazyEnablePeerAccess is CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS.
const cuIpcMemLazyEnablePeerAccess = 1

// driver is the loaded libcuda: the entry points this package calls.
// CUresult is a C enum (int32), CUdevice a C int, CUcontext a pointer,
// CUdeviceptr an unsigned long long (the _v2 ABI).
type driver struct {
	path string

	cuInit                    func(flags uint32) int32
	cuDeviceGetCount          func(count *int32) int32
	cuDeviceGet               func(dev *int32, ordinal int32) int32
	cuDeviceGetName           func(name *byte, n int32, dev int32) int32
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, dev int32) int32
	cuDevicePrimaryCtxRelease func(dev int32) int32
	cuCtxPushCurrent          func(ctx uintptr) int32
	cuCtxPopCurrent           func(ctx *uintptr) int32
	cuCtxSynchronize          func() int32
	cuMemAlloc                func(ptr *uint64, n uintptr) int32
	cuMemFree                 func(ptr uint64) int32
	cuMemcpyHtoD              func(dst uint64, src unsafe.Pointer, n uintptr) int32
	cuMemcpyDtoH              func(dst unsafe.Pointer, src uint64, n uintptr) int32
	cuMemsetD8                func(dst uint64, v uint8, n uintptr) int32
	cuMemGetAddressRange      func(base *uint64, size *uintptr, ptr uint64) int32
	cuIpcGetMemHandle         func(h *ipcMemHandle, ptr uint64) int32
	cuIpcOpenMemHandle        func(ptr *uint64, h ipcMemHandle, flags uint32) int32
	cuIpcCloseMemHandle       func(ptr uint64) int32
	cuGetErrorName            func(r int32, s **byte) int32
	cuGetErrorString          func(r int32, s **byte) int32
}

// symbols lists every entry point with the names to try, newest ABI first.
func (d *driver) symbols() []struct {
	fn    any
	names []string
} {
	type sym = struct {
		fn    any
		names []string
	}
	return []sym{
		{&d.cuInit, []string{"cuInit"}},
		{&d.cuDeviceGetCount, []string{"cuDeviceGetCount"}},
		{&d.cuDeviceGet, []string{"cuDeviceGet"}},
		{&d.cuDeviceGetName, []string{"cuDeviceGetName"}},
		{&d.cuDevicePrimaryCtxRetain, []string{"cuDevicePrimaryCtxRetain"}},
		{&d.cuDevicePrimaryCtxRelease, []string{"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}},
		{&d.cuCtxPushCurrent, []string{"cuCtxPushCurrent_v2"}},
		{&d.cuCtxPopCurrent, []string{"cuCtxPopCurrent_v2"}},
		{&d.cuCtxSynchronize, []string{"cuCtxSynchronize"}},
		{&d.cuMemAlloc, []string{"cuMemAlloc_v2"}},
		{&d.cuMemFree, []string{"cuMemFree_v2"}},
		{&d.cuMemcpyHtoD, []string{"cuMemcpyHtoD_v2"}},
		{&d.cuMemcpyDtoH, []string{"cuMemcpyDtoH_v2"}},
		{&d.cuMemsetD8, []string{"cuMemsetD8_v2"}},
		{&d.cuMemGetAddressRange, []string{"cuMemGetAddressRange_v2"}},
		{&d.cuIpcGetMemHandle, []string{"cuIpcGetMemHandle"}},
		{&d.cuIpcOpenMemHandle, []string{"cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"}},
		{&d.cuIpcCloseMemHandle, []string{"cuIpcCloseMemHandle"}},
		{&d.cuGetErrorName, []string{"cuGetErrorName"}},
		{&d.cuGetErrorString, []string{"cuGetErrorString"}},
	}
}

// load opens the first of paths that dlopen accepts and resolves every
// symbol; it does not call the driver.
func load(paths []string) (*driver, error) {
	var missing, failed []string
	var lib uintptr
	d := &driver{}
	for _, p := range paths {
		h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			if strings.Contains(err.Error(), "No such file") {
				missing = append(missing, p)
			} else {
				failed = append(failed, err.Error()) // dlerror names the path
			}
			continue
		}
		lib, d.path = h, p
		break
	}
	if lib == 0 {
		why := "not found at " + strings.Join(missing, ", ")
		if len(failed) > 0 {
			why += "; " + strings.Join(failed, "; ")
		}
		return nil, fmt.Errorf("%w: no libcuda.so.1 (set %s to its path): %s", ErrUnavailable, EnvLibrary, why)
	}
	for _, s := range d.symbols() {
		var addr uintptr
		for _, n := range s.names {
			if a, err := purego.Dlsym(lib, n); err == nil && a != 0 {
				addr = a
				break
			}
		}
		if addr == 0 {
			_ = purego.Dlclose(lib)
			return nil, fmt.Errorf("%w: %s has no symbol %s (not a CUDA driver, or one too old)", ErrUnavailable, d.path, strings.Join(s.names, " or "))
		}
		purego.RegisterFunc(s.fn, addr)
	}
	return d, nil
}

var (
	drvOnce sync.Once
	drv     *driver
	drvErr  error
)

// getDriver loads the driver and calls cuInit once per process.
func getDriver() (*driver, error) {
	drvOnce.Do(func() {
		paths := libraryPaths
		if p := os.Getenv(EnvLibrary); p != "" {
			paths = append([]string{p}, paths...)
		}
		d, err := load(paths)
		if err != nil {
			drvErr = err
			return
		}
		if r := d.cuInit(0); r != 0 {
			drvErr = fmt.Errorf("%w: %s: %w", ErrUnavailable, d.path, d.err("cuInit", r))
			return
		}
		drv = d
	})
	return drv, drvErr
}

// err describes a failed call (r != CUDA_SUCCESS).
func (d *driver) err(call string, r int32) error {
	e := &Error{Call: call, Code: int(r)}
	var s *byte
	if d.cuGetErrorName(r, &s) == 0 {
		e.Name = cString(s)
	}
	s = nil
	if d.cuGetErrorString(r, &s) == 0 {
		e.Desc = cString(s)
	}
	return e
}

// cString copies a NUL-terminated C string the driver owns (static).
func cString(p *byte) string {
	if p == nil {
		return ""
	}
	var b []byte
	for i := 0; i < 4096; i++ {
		c := *(*byte)(unsafe.Add(unsafe.Pointer(p), i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

// Available reports whether the driver loads and has at least one device;
// the error says why not (it wraps ErrUnavailable).
func Available() error {
	n, err := DeviceCount()
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%w: the driver reports no CUDA device", ErrUnavailable)
	}
	return nil
}

// DeviceCount is the number of CUDA devices.
func DeviceCount() (int, error) {
	d, err := getDriver()
	if err != nil {
		return 0, err
	}
	var n int32
	if r := d.cuDeviceGetCount(&n); r != 0 {
		return 0, fmt.Errorf("%w: %w", ErrUnavailable, d.err("cuDeviceGetCount", r))
	}
	return int(n), nil
}

// Device is one CUDA device with its primary context retained. Its
// methods are safe for concurrent use.
type Device struct {
	drv     *driver
	ordinal int
	dev     int32
	ctx     uintptr
	name    string

	mu     sync.Mutex
	closed bool
	bufs   map[*Buffer]struct{}
}

// Open retains the primary context of device ordinal.
func Open(ordinal int) (*Device, error) {
	d, err := getDriver()
	if err != nil {
		return nil, err
	}
	var n int32
	if r := d.cuDeviceGetCount(&n); r != 0 {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, d.err("cuDeviceGetCount", r))
	}
	if ordinal < 0 || ordinal >= int(n) {
		return nil, fmt.Errorf("%w: device %d (this machine has %d)", ErrNoDevice, ordinal, n)
	}
	dv := &Device{drv: d, ordinal: ordinal, bufs: map[*Buffer]struct{}{}}
	if r := d.cuDeviceGet(&dv.dev, int32(ordinal)); r != 0 {
		return nil, fmt.Errorf("cuda: device %d: %w", ordinal, d.err("cuDeviceGet", r))
	}
	var name [256]byte
	if r := d.cuDeviceGetName(&name[0], int32(len(name)), dv.dev); r == 0 {
		dv.name = cString(&name[0])
	}
	if r := d.cuDevicePrimaryCtxRetain(&dv.ctx, dv.dev); r != 0 {
		return nil, fmt.Errorf("cuda: device %d: %w", ordinal, d.err("cuDevicePrimaryCtxRetain", r))
	}
	return dv, nil
}

// Ordinal is the device's ordinal; Name its name as the driver reports it.
func (d *Device) Ordinal() int { return d.ordinal }

// Name is the device's name (e.g. "NVIDIA H100 80GB HBM3").
func (d *Device) Name() string { return d.name }

// do runs f with the primary context current on a locked OS thread. The
// context is popped before the thread is unlocked, so no thread keeps it.
// An error is "cuda: device N: op: ...".
func (d *Device) do(op string, f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if r := d.drv.cuCtxPushCurrent(d.ctx); r != 0 {
		return fmt.Errorf("cuda: device %d: %s: %w", d.ordinal, op, d.drv.err("cuCtxPushCurrent_v2", r))
	}
	err := f()
	var old uintptr
	if r := d.drv.cuCtxPopCurrent(&old); r != 0 && err == nil {
		err = d.drv.err("cuCtxPopCurrent_v2", r)
	}
	if err != nil {
		return fmt.Errorf("cuda: device %d: %s: %w", d.ordinal, op, err)
	}
	return nil
}

// call is the *Error of a CUresult (nil for CUDA_SUCCESS).
func (d *Device) call(name string, r int32) error {
	if r == 0 {
		return nil
	}
	return d.drv.err(name, r)
}

// Alloc allocates n bytes of device memory, zeroed (cuMemAlloc_v2,
// cuMemsetD8_v2).
func (d *Device) Alloc(n int) (*Buffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%w: allocation of %d bytes", ErrRange, n)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("%w: device %d", ErrClosed, d.ordinal)
	}
	b := &Buffer{d: d, size: n}
	err := d.do(fmt.Sprintf("allocate %d bytes", n), func() error {
		if err := d.call("cuMemAlloc_v2", d.drv.cuMemAlloc(&b.ptr, uintptr(n))); err != nil {
			return err
		}
		err := d.call("cuMemsetD8_v2", d.drv.cuMemsetD8(b.ptr, 0, uintptr(n)))
		if err == nil {
			err = d.call("cuCtxSynchronize", d.drv.cuCtxSynchronize())
		}
		if err != nil {
			_ = d.drv.cuMemFree(b.ptr)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	d.bufs[b] = struct{}{}
	return b, nil
}

// OpenIPC maps another process's allocation (cuIpcOpenMemHandle_v2 with
// lazy peer access) as a buffer of size bytes; size may not exceed the
// allocation. Close unmaps it (cuIpcCloseMemHandle); the memory stays the
// exporter's.
func (d *Device) OpenIPC(h IPCHandle, size int) (*Buffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("%w: IPC buffer of %d bytes", ErrRange, size)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("%w: device %d", ErrClosed, d.ordinal)
	}
	b := &Buffer{d: d, size: size, ipc: true}
	err := d.do("open IPC handle", func() error {
		if err := d.call("cuIpcOpenMemHandle_v2", d.drv.cuIpcOpenMemHandle(&b.ptr, ipcMemHandle{Reserved: h}, cuIpcMemLazyEnablePeerAccess)); err != nil {
			return err
		}
		// The size check is best effort: a driver that cannot report the
		// range of an imported allocation leaves it to the caller.
		var base uint64
		var n uintptr
		if d.drv.cuMemGetAddressRange(&base, &n, b.ptr) == 0 && (b.ptr-base)+uint64(size) > uint64(n) {
			_ = d.drv.cuIpcCloseMemHandle(b.ptr)
			return fmt.Errorf("%w: %d bytes requested, the allocation behind the handle has %d", ErrRange, size, uint64(n)-(b.ptr-base))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	d.bufs[b] = struct{}{}
	return b, nil
}

// Close frees (or unmaps) every buffer still open and releases the
// primary context. Closing twice is a no-op.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	bufs := make([]*Buffer, 0, len(d.bufs))
	for b := range d.bufs {
		bufs = append(bufs, b)
	}
	d.mu.Unlock()
	var errs []error
	for _, b := range bufs {
		errs = append(errs, b.Close())
	}
	if err := d.call("cuDevicePrimaryCtxRelease_v2", d.drv.cuDevicePrimaryCtxRelease(d.dev)); err != nil {
		errs = append(errs, fmt.Errorf("cuda: device %d: release: %w", d.ordinal, err))
	}
	return errors.Join(errs...)
}

// Buffer is device memory: allocated here (Alloc) or mapped from another
// process (OpenIPC). Copies may run concurrently with each other; Close
// waits for them.
type Buffer struct {
	d    *Device
	ptr  uint64
	size int
	ipc  bool

	mu     sync.RWMutex
	closed bool
}

// Size is the buffer's size in bytes.
func (b *Buffer) Size() int { return b.size }

// IPCHandle exports the buffer (cuIpcGetMemHandle) for another process on
// this host; it is valid while this process lives and the buffer is open.
func (b *Buffer) IPCHandle() (IPCHandle, error) {
	var h ipcMemHandle
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return IPCHandle{}, ErrClosed
	}
	err := b.d.do("export IPC handle", func() error { return b.d.call("cuIpcGetMemHandle", b.d.drv.cuIpcGetMemHandle(&h, b.ptr)) })
	if err != nil {
		return IPCHandle{}, err
	}
	return IPCHandle(h.Reserved), nil
}

// CopyFromHost copies src to the buffer at off (cuMemcpyHtoD_v2) and
// synchronizes the context: on return the bytes are in device memory,
// visible to every process that maps the buffer.
func (b *Buffer) CopyFromHost(off int, src []byte) error {
	if err := checkRange("copy from host", off, len(src), b.size); err != nil {
		return err
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return ErrClosed
	}
	if len(src) == 0 {
		return nil
	}
	return b.d.do(fmt.Sprintf("copy %d bytes from the host to offset %d", len(src), off), func() error {
		if err := b.d.call("cuMemcpyHtoD_v2", b.d.drv.cuMemcpyHtoD(b.ptr+uint64(off), unsafe.Pointer(&src[0]), uintptr(len(src)))); err != nil {
			return err
		}
		return b.d.call("cuCtxSynchronize", b.d.drv.cuCtxSynchronize())
	})
}

// CopyToHost copies len(dst) bytes at off out of the buffer
// (cuMemcpyDtoH_v2, synchronous).
func (b *Buffer) CopyToHost(off int, dst []byte) error {
	if err := checkRange("copy to host", off, len(dst), b.size); err != nil {
		return err
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return ErrClosed
	}
	if len(dst) == 0 {
		return nil
	}
	return b.d.do(fmt.Sprintf("copy %d bytes at offset %d to the host", len(dst), off), func() error {
		return b.d.call("cuMemcpyDtoH_v2", b.d.drv.cuMemcpyDtoH(unsafe.Pointer(&dst[0]), b.ptr+uint64(off), uintptr(len(dst))))
	})
}

// Close frees the buffer (cuMemFree_v2), or unmaps an IPC buffer
// (cuIpcCloseMemHandle). It waits for copies in flight; closing twice is
// a no-op.
func (b *Buffer) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()
	b.d.mu.Lock()
	delete(b.d.bufs, b)
	b.d.mu.Unlock()
	return b.d.do("close buffer", func() error {
		if b.ipc {
			return b.d.call("cuIpcCloseMemHandle", b.d.drv.cuIpcCloseMemHandle(b.ptr))
		}
		return b.d.call("cuMemFree_v2", b.d.drv.cuMemFree(b.ptr))
	})
}
