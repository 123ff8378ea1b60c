package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// Sentinel errors.
var (
	// ErrInvalidKey: a key that is not a valid POSIX shm name.
	ErrInvalidKey = errors.New("shm: invalid key")
	// ErrInvalidSize: a negative or too large size, or an object whose size
	// does not fit the request.
	ErrInvalidSize = errors.New("shm: invalid size")
	// ErrClosed: the region was closed.
	ErrClosed = errors.New("shm: region closed")
	// ErrUnsupported: no POSIX shared memory on this platform.
	ErrUnsupported = errors.New("shm: not supported on this platform")
)

// Dir is where Linux (glibc, musl) keeps POSIX shared-memory objects.
const Dir = "/dev/shm"

// MaxSize bounds one region (64 GiB).
const MaxSize = 64 << 30

// Path returns the file of key under Dir after validating it: an optional
// leading "/", then 1..255 bytes without "/" or NUL, not "." or "..".
func Path(key string) (string, error) {
	name := strings.TrimPrefix(key, "/")
	switch {
	case name == "", name == ".", name == "..":
		return "", fmt.Errorf("%w: %q", ErrInvalidKey, key)
	case len(name) > 255:
		return "", fmt.Errorf("%w: %q is longer than 255 bytes", ErrInvalidKey, key)
	case strings.ContainsAny(name, "/\x00"):
		return "", fmt.Errorf("%w: %q contains '/' or NUL after the leading '/'", ErrInvalidKey, key)
	}
	return filepath.Join(Dir, name), nil
}

// Region is one mapped shared-memory object. Bytes is valid until Close.
type Region struct {
	key  string
	mu   sync.Mutex
	data []byte
	size int
}

// Key is the region's shm key, as given to Create or Open.
func (r *Region) Key() string { return r.key }

// Size is the mapped size in bytes.
func (r *Region) Size() int { return r.size }

// Bytes is the mapping (nil for a zero-size object or after Close). Writes
// are visible to every process that maps the same object.
func (r *Region) Bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.data
}

// Close unmaps the region; the object and its name stay (see Unlink).
// Closing twice is a no-op.
func (r *Region) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.data == nil {
		return nil
	}
	err := unmap(r.data)
	r.data = nil
	if err != nil {
		return fmt.Errorf("shm: unmap %q: %w", r.key, err)
	}
	return nil
}

// Create makes a new object named key of size bytes (zero-filled, its
// pages allocated where the filesystem can) and maps it read-write. It fails with an error wrapping os.ErrExist if the name is
// taken.
func Create(key string, size int) (*Region, error) {
	p, err := Path(key)
	if err != nil {
		return nil, err
	}
	if size < 0 || size > MaxSize {
		return nil, fmt.Errorf("%w: %d bytes for %q", ErrInvalidSize, size, key)
	}
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("shm: create %q: %w", key, err)
	}
	defer f.Close()
	if err := f.Truncate(int64(size)); err != nil {
		_ = os.Remove(p)
		return nil, fmt.Errorf("shm: ftruncate %q to %d bytes: %w", key, size, err)
	}
	if err := reserve(f, size); err != nil {
		_ = os.Remove(p)
		return nil, fmt.Errorf("shm: reserve %d bytes for %q (is %s large enough? a container's is 64 MB unless --shm-size): %w", size, key, Dir, err)
	}
	data, err := mapFile(f, size)
	if err != nil {
		_ = os.Remove(p)
		return nil, fmt.Errorf("shm: mmap %q (%d bytes): %w", key, size, err)
	}
	return &Region{key: key, data: data, size: size}, nil
}

// Open maps an existing object named key whole, read-write. A missing
// object is an error wrapping os.ErrNotExist.
func Open(key string) (*Region, error) {
	p, err := Path(key)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: open %q: %w", key, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("shm: fstat %q: %w", key, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %q is not a shared-memory object", ErrInvalidKey, key)
	}
	if st.Size() > MaxSize {
		return nil, fmt.Errorf("%w: %q holds %d bytes, more than %d", ErrInvalidSize, key, st.Size(), MaxSize)
	}
	size := int(st.Size())
	data, err := mapFile(f, size)
	if err != nil {
		return nil, fmt.Errorf("shm: mmap %q (%d bytes): %w", key, size, err)
	}
	return &Region{key: key, data: data, size: size}, nil
}

// Unlink removes the name key (shm_unlink); existing mappings stay valid.
// Unlinking a missing name is an error wrapping os.ErrNotExist.
func Unlink(key string) error {
	p, err := Path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil {
		return fmt.Errorf("shm: unlink %q: %w", key, err)
	}
	return nil
}

// Exists reports whether an object named key exists.
func Exists(key string) bool {
	p, err := Path(key)
	if err != nil {
		return false
	}
	_, err = os.Stat(p)
	return err == nil
}

// KeyPart maps s to characters safe in a key (letters, digits, '-' and
// '_'; anything else becomes '_'), for building keys from model and
// tensor names.
func KeyPart(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, s)
}
