//go:build linux || freebsd || darwin

package shm

import (
	"os"
	"syscall"
)

func mapFile(f *os.File, size int) ([]byte, error) {
	if size == 0 {
		return nil, nil
	}
	return syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
}

func unmap(b []byte) error { return syscall.Munmap(b) }
