// Package shm creates and maps POSIX shared-memory objects without cgo, with
// the semantics of shm_open(3) on Linux: an object named "/key" (or "key")
// is the file /dev/shm/key on the tmpfs glibc uses, so a region created
// here is the same object another process opens with shm_open("/key") —
// the KServe v2 / Triton system shared memory key.
//
// Create makes a new object of a fixed size (O_CREAT|O_EXCL, ftruncate)
// and maps it read-write, MAP_SHARED; Open maps an existing object whole;
// Close unmaps; Unlink removes the name (mappings stay valid until
// unmapped, as with shm_unlink). The package does not synchronise access
// to the bytes: who writes a region and when is the caller's protocol
// (adapters/triton double-buffers state regions for that reason).
package shm
