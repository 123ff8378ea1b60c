// Package cuda is the small part of the CUDA driver API that HAMS needs to
// keep state tensors in GPU memory shared with a model server: allocate
// device buffers, copy between host and device, and export or import a
// buffer across processes as a raw cudaIpcMemHandle_t (the 64 bytes that
// KServe v2 CudaSharedMemoryRegister carries).
//
// # Loading the driver
//
// The driver (libcuda.so.1) is loaded at run time with
// github.com/ebitengine/purego: no cgo, no CUDA headers or libraries at
// build time, and a binary that runs unchanged on machines without a GPU.
// The first call tries, in order, $HAMS_LIBCUDA (a path), libcuda.so.1 on
// the loader's path, and a short list of well-known locations
// (/usr/lib/x86_64-linux-gnu, /usr/lib/aarch64-linux-gnu, /usr/lib64,
// /usr/local/nvidia/lib64, /usr/lib/wsl/lib). A missing library, a
// library without the needed symbols, a failed cuInit or a machine
// without devices is ErrUnavailable, never a crash; Available reports it
// so that tests can skip.
//
// # Build tags
//
// The purego implementation is built for linux without the tag nocuda.
// Even with CGO_ENABLED=0 it makes the binary dynamically linked against
// libc (purego needs the system's dlopen), so an image built FROM scratch
// has no loader to start it. Build such images with -tags nocuda: every
// call of the stub implementation (also used on other systems) returns
// ErrUnavailable, and the binary stays static.
//
// # Contexts and threads
//
// A Device holds its device's primary context (retained by Open, released
// by Close). The driver's current context is per OS thread and goroutines
// migrate between threads, so every call sequence locks its goroutine to
// its thread and pushes the primary context for the sequence's duration
// (popped before the thread is unlocked). Copies are synchronous: when
// CopyFromHost returns, the bytes are in device memory and visible to
// every process that maps the buffer; when CopyToHost returns, dst holds
// them.
//
// # IPC
//
// Buffer.IPCHandle exports an allocation; Device.OpenIPC maps another
// process's allocation. A handle is valid only on the same host, only
// while the allocating process lives, and cannot be opened by the process
// that allocated it (the driver refuses). The exporter must outlive every
// importer's use: free a buffer only after the importers closed it (for
// a model server: after CudaSharedMemoryUnregister and its last request).
package cuda
