//go:build !linux || nocuda

package cuda

import (
	"fmt"
	"runtime"
)

// Supported is false: this build never loads a driver.
const Supported = false

// errStub says why this build has no driver.
var errStub = fmt.Errorf("%w: this build has no CUDA support (%s)", ErrUnavailable, stubReason())

func stubReason() string {
	if runtime.GOOS != "linux" {
		return "not supported on " + runtime.GOOS
	}
	return "built with -tags nocuda"
}

// Available reports ErrUnavailable: the stub has no driver.
func Available() error { return errStub }

// DeviceCount reports ErrUnavailable.
func DeviceCount() (int, error) { return 0, errStub }

// Device is a CUDA device; the stub never opens one.
type Device struct{}

// Open reports ErrUnavailable.
func Open(int) (*Device, error) { return nil, errStub }

// Ordinal is -1: the stub has no device.
func (*Device) Ordinal() int { return -1 }

// Name is empty.
func (*Device) Name() string { return "" }

// Alloc reports ErrUnavailable.
func (*Device) Alloc(int) (*Buffer, error) { return nil, errStub }

// OpenIPC reports ErrUnavailable.
func (*Device) OpenIPC(IPCHandle, int) (*Buffer, error) { return nil, errStub }

// Close is a no-op.
func (*Device) Close() error { return nil }

// Buffer is device memory; the stub never has one.
type Buffer struct{}

// Size is 0.
func (*Buffer) Size() int { return 0 }

// IPCHandle reports ErrUnavailable.
func (*Buffer) IPCHandle() (IPCHandle, error) { return IPCHandle{}, errStub }

// CopyFromHost reports ErrUnavailable.
func (*Buffer) CopyFromHost(int, []byte) error { return errStub }

// CopyToHost reports ErrUnavailable.
func (*Buffer) CopyToHost(int, []byte) error { return errStub }

// Close is a no-op.
func (*Buffer) Close() error { return nil }
