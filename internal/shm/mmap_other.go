//go:build !(linux || freebsd || darwin)

package shm

import "os"

func mapFile(*os.File, int) ([]byte, error) { return nil, ErrUnsupported }

func unmap([]byte) error { return ErrUnsupported }
