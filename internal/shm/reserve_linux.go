package shm

import (
	"errors"
	"os"
	"syscall"
)

// reserve allocates the object's pages up front (fallocate), so that a
// /dev/shm too small for it fails here with ENOSPC instead of with a
// SIGBUS in whichever process first writes a page that tmpfs cannot
// back (a container's default /dev/shm is 64 MB). Filesystems without
// fallocate keep the sparse object.
func reserve(f *os.File, size int) error {
	if size == 0 {
		return nil
	}
	err := syscall.Fallocate(int(f.Fd()), 0, 0, int64(size))
	if errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS) {
		return nil
	}
	return err
}
