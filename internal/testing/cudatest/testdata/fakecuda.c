// fakecuda: a TEST DOUBLE of the parts of libcuda.so.1 that internal/cuda
// calls, for machines without a GPU. It is not a driver: "device memory"
// is host memory in POSIX shared-memory objects, so that an IPC handle
// (the object's name, its size and the exporting pid) can be opened by
// another process on the same host, as a real cudaIpcMemHandle_t can.
//
// What it checks, as the real driver does: a context must be current on
// the calling thread for memory calls (push/pop are per thread), copies
// must stay inside an allocation, a handle cannot be opened by the process
// that exported it, and a handle of a freed allocation cannot be opened.
//
// Build and use (the tests do this when gcc is present, with
// cudatest.RunWithFakeDriver):
//
//	gcc -shared -fPIC -O2 -o libfakecuda.so internal/cuda/cudatest/testdata/fakecuda.c
//	HAMS_LIBCUDA=$PWD/libfakecuda.so go test ./internal/cuda ./refserver ./adapters/triton
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef struct { char reserved[64]; } CUipcMemHandle;

enum {
  OK = 0,
  INVALID_VALUE = 1,
  OUT_OF_MEMORY = 2,
  INVALID_DEVICE = 101,
  INVALID_CONTEXT = 201,
  MAP_FAILED_ = 205,
  INVALID_HANDLE = 400,
};

#define MAXALLOC 4096
struct alloc {
  int used, imported;
  char name[48];
  uint64_t size;
  void *addr;
};
static struct alloc allocs[MAXALLOC];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long counter;
static int primary = 0x1234; // the one context: its address
static __thread CUcontext stack[16];
static __thread int depth;

static int current(void) { return depth > 0 && stack[depth - 1] == (CUcontext)&primary; }

CUresult cuInit(unsigned int flags) { return flags == 0 ? OK : INVALID_VALUE; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return OK; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  if (ordinal != 0) return INVALID_DEVICE;
  *d = 0;
  return OK;
}
CUresult cuDeviceGetName(char *name, int n, CUdevice d) {
  if (d != 0) return INVALID_DEVICE;
  snprintf(name, n, "fakecuda (host memory test double)");
  return OK;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  if (d != 0) return INVALID_DEVICE;
  *c = &primary;
  return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return d == 0 ? OK : INVALID_DEVICE; }
CUresult cuCtxPushCurrent_v2(CUcontext c) {
  if (c != &primary || depth == 16) return INVALID_CONTEXT;
  stack[depth++] = c;
  return OK;
}
CUresult cuCtxPopCurrent_v2(CUcontext *c) {
  if (depth == 0) return INVALID_CONTEXT;
  *c = stack[--depth];
  return OK;
}
CUresult cuCtxSynchronize(void) { return current() ? OK : INVALID_CONTEXT; }

// find returns the allocation holding [p, p+n), or NULL; mu is held.
static struct alloc *find(CUdeviceptr p, uint64_t n) {
  for (int i = 0; i < MAXALLOC; i++) {
    struct alloc *a = &allocs[i];
    uint64_t b = (uint64_t)(uintptr_t)a->addr;
    if (a->used && p >= b && p - b <= a->size && n <= a->size - (p - b)) return a;
  }
  return NULL;
}

static struct alloc *slot(void) {
  for (int i = 0; i < MAXALLOC; i++)
    if (!allocs[i].used) return &allocs[i];
  return NULL;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  if (!current()) return INVALID_CONTEXT;
  if (n == 0) return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  struct alloc *a = slot();
  if (!a) { pthread_mutex_unlock(&mu); return OUT_OF_MEMORY; }
  snprintf(a->name, sizeof a->name, "/fakecuda_%d_%lu", (int)getpid(), ++counter);
  int fd = shm_open(a->name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 || ftruncate(fd, n) != 0) {
    if (fd >= 0) { close(fd); shm_unlink(a->name); }
    pthread_mutex_unlock(&mu);
    return OUT_OF_MEMORY;
  }
  void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) { shm_unlink(a->name); pthread_mutex_unlock(&mu); return OUT_OF_MEMORY; }
  a->used = 1; a->imported = 0; a->size = n; a->addr = m;
  *p = (CUdeviceptr)(uintptr_t)m;
  pthread_mutex_unlock(&mu);
  return OK;
}

static CUresult release(CUdeviceptr p, int imported) {
  if (!current()) return INVALID_CONTEXT;
  pthread_mutex_lock(&mu);
  struct alloc *a = find(p, 0);
  if (!a || (uint64_t)(uintptr_t)a->addr != p || a->imported != imported) { pthread_mutex_unlock(&mu); return INVALID_VALUE; }
  munmap(a->addr, a->size);
  if (!imported) shm_unlink(a->name);
  a->used = 0;
  pthread_mutex_unlock(&mu);
  return OK;
}

CUresult cuMemFree_v2(CUdeviceptr p) { return release(p, 0); }
CUresult cuIpcCloseMemHandle(CUdeviceptr p) { return release(p, 1); }

static CUresult copy(void *dst, const void *src, CUdeviceptr dev, size_t n) {
  if (!current()) return INVALID_CONTEXT;
  pthread_mutex_lock(&mu);
  struct alloc *a = find(dev, n);
  pthread_mutex_unlock(&mu);
  if (!a) return INVALID_VALUE;
  memcpy(dst, src, n);
  return OK;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) { return copy((void *)(uintptr_t)dst, src, dst, n); }
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { return copy(dst, (const void *)(uintptr_t)src, src, n); }
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
  if (!current()) return INVALID_CONTEXT;
  pthread_mutex_lock(&mu);
  struct alloc *a = find(dst, n);
  pthread_mutex_unlock(&mu);
  if (!a) return INVALID_VALUE;
  memset((void *)(uintptr_t)dst, v, n);
  return OK;
}
CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
  if (!current()) return INVALID_CONTEXT;
  pthread_mutex_lock(&mu);
  struct alloc *a = find(p, 0);
  pthread_mutex_unlock(&mu);
  if (!a) return INVALID_VALUE;
  *base = (CUdeviceptr)(uintptr_t)a->addr;
  *size = a->size;
  return OK;
}

// A handle: name (48 bytes), size (8), exporting pid (8).
CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
  if (!current()) return INVALID_CONTEXT;
  pthread_mutex_lock(&mu);
  struct alloc *a = find(p, 0);
  if (!a || a->imported || (uint64_t)(uintptr_t)a->addr != p) { pthread_mutex_unlock(&mu); return INVALID_VALUE; }
  memset(h, 0, sizeof *h);
  memcpy(h->reserved, a->name, 48);
  uint64_t pid = (uint64_t)getpid();
  memcpy(h->reserved + 48, &a->size, 8);
  memcpy(h->reserved + 56, &pid, 8);
  pthread_mutex_unlock(&mu);
  return OK;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
  if (!current()) return INVALID_CONTEXT;
  if (flags != 1) return INVALID_VALUE; // the tests use lazy peer access
  char name[49];
  uint64_t size, pid;
  memcpy(name, h.reserved, 48);
  name[48] = 0;
  memcpy(&size, h.reserved + 48, 8);
  memcpy(&pid, h.reserved + 56, 8);
  if (strncmp(name, "/fakecuda_", 10) != 0 || size == 0) return INVALID_HANDLE;
  if (pid == (uint64_t)getpid()) return INVALID_CONTEXT; // not in the exporting process
  int fd = shm_open(name, O_RDWR, 0);
  if (fd < 0) return MAP_FAILED_;
  void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return MAP_FAILED_;
  pthread_mutex_lock(&mu);
  struct alloc *a = slot();
  if (!a) { pthread_mutex_unlock(&mu); munmap(m, size); return OUT_OF_MEMORY; }
  a->used = 1; a->imported = 1; a->size = size; a->addr = m;
  memcpy(a->name, name, 48);
  *p = (CUdeviceptr)(uintptr_t)m;
  pthread_mutex_unlock(&mu);
  return OK;
}

CUresult cuGetErrorName(CUresult r, const char **s) {
  switch (r) {
  case OK: *s = "CUDA_SUCCESS"; return OK;
  case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
  case OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return OK;
  case INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; return OK;
  case INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; return OK;
  case MAP_FAILED_: *s = "CUDA_ERROR_MAP_FAILED"; return OK;
  case INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; return OK;
  }
  return INVALID_VALUE;
}
CUresult cuGetErrorString(CUresult r, const char **s) {
  const char *n;
  if (cuGetErrorName(r, &n) != OK) return INVALID_VALUE;
  *s = "fakecuda test double";
  return OK;
}
