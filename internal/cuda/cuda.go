package cuda

import (
	"errors"
	"fmt"
)

// HandleSize is the size of a cudaIpcMemHandle_t (CU_IPC_HANDLE_SIZE).
const HandleSize = 64

// IPCHandle is the raw bytes of a cudaIpcMemHandle_t (CUipcMemHandle).
type IPCHandle [HandleSize]byte

// EnvLibrary names the environment variable with the path of libcuda.so.1
// to try first.
const EnvLibrary = "HAMS_LIBCUDA"

var (
	// ErrUnavailable: no usable CUDA driver (library missing, symbols
	// missing, cuInit failed, no device) or a build with -tags nocuda.
	ErrUnavailable = errors.New("cuda: driver unavailable")
	// ErrNoDevice: the device ordinal is not one of this machine's.
	ErrNoDevice = errors.New("cuda: no such device")
	// ErrClosed: the Device or Buffer was closed.
	ErrClosed = errors.New("cuda: closed")
	// ErrRange: an offset and length outside the buffer, or a bad size.
	ErrRange = errors.New("cuda: out of range")
	// ErrDriver is matched by every *Error (a driver call failed).
	ErrDriver = errors.New("cuda: driver call failed")
)

// Error is a failed driver call: the call's name and its CUresult.
type Error struct {
	Call string // driver symbol, e.g. "cuMemAlloc_v2"
	Code int    // CUresult
	Name string // e.g. "CUDA_ERROR_OUT_OF_MEMORY" (empty if unknown)
	Desc string // the driver's description (empty if unknown)
}

// Error is "call: NAME (description)"; the package's errors wrap it
// after a "cuda: ..." prefix saying what was attempted.
func (e *Error) Error() string {
	name := e.Name
	if name == "" {
		name = fmt.Sprintf("CUresult %d", e.Code)
	}
	if e.Desc != "" {
		return fmt.Sprintf("%s: %s (%s)", e.Call, name, e.Desc)
	}
	return fmt.Sprintf("%s: %s", e.Call, name)
}

// CUresult values the package classifies.
const (
	cudaErrorNoDevice      = 100 // CUDA_ERROR_NO_DEVICE
	cudaErrorInvalidDevice = 101 // CUDA_ERROR_INVALID_DEVICE
)

// Is makes every *Error match ErrDriver, and the device errors ErrNoDevice.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrDriver:
		return true
	case ErrNoDevice:
		return e.Code == cudaErrorNoDevice || e.Code == cudaErrorInvalidDevice
	}
	return false
}

// checkRange validates [off, off+n) against a buffer of size bytes.
func checkRange(op string, off, n, size int) error {
	if off < 0 || n < 0 || off > size || n > size-off {
		return fmt.Errorf("%w: %s of %d bytes at offset %d in a buffer of %d bytes", ErrRange, op, n, off, size)
	}
	return nil
}
