/* A stand-in libcuda.so.1, so that the project's real drivers (NVIDIA's cuda-bindings, and
 * pycuda built from source) run their code paths in CI, on machines without a GPU.
 *
 * Compiled against the real cuda.h: each function here has NVIDIA's prototype and the name the
 * header exports it under (cuMemAlloc is cuMemAlloc_v2). Every other entry point is a stub
 * generated from the same header (entry_points.py) that fails with CUDA_ERROR_NOT_SUPPORTED;
 * cuGetProcAddress answers by base name and ABI version, as the real driver does.
 *
 * The device: one, compute capability 9.0, under a CUDA 13.0 driver, named as a stand-in.
 *  - Device memory is host memory: a device pointer is a host address (the stand-in cuBLAS
 *    reads it). Fresh memory holds 0xFF bytes (a NaN as a float), as real memory holds
 *    garbage; guard bytes follow each allocation.
 *  - Streams and events are synchronous: work runs when it is queued. An event never recorded
 *    is complete (cuEventQuery answers CUDA_SUCCESS, as CUDA does).
 *  - A module is PTX text (each .entry's parameter list gives the kernel's parameter types)
 *    or a CUBIN for sm_90 (an ELF image: its kernels are the entry symbols of its symbol table,
 *    their parameter types come from $STANDIN_CUDA_SIGNATURES, lines "name PiPf" with P a
 *    pointer, i an int, f a float, checked against the parameter sizes the CUBIN records).
 *    PTX of an ISA newer than the driver's is refused as a 13.0 driver refuses it.
 *  - A launch calls the host build of the same kernel (found by name in the shared libraries
 *    listed in $STANDIN_CUDA_HOST_LIBS, colon-separated) once, through libffi, with the
 *    arguments of kernelParams or of a packed CU_LAUNCH_PARAM_BUFFER (pycuda's way). The host
 *    build's loop covers every index whatever the grid (the kernels' rules, backend/cuda).
 *  - What a GPU faults on (a kernel's pointer argument outside every allocation, a kernel
 *    writing past an allocation's end, a cuBLAS operand outside one) loses the device as a
 *    GPU fault does: the faulting kernel does not run, its launch succeeds and every later
 *    call that needs the device returns CUDA_ERROR_ILLEGAL_ADDRESS; with
 *    CUDA_LAUNCH_BLOCKING=1 the launch itself returns it.
 *  - Contexts: the primary context, or created ones, on a real per-thread stack. With
 *    STANDIN_CUDA_CHECK_EXIT=1, a thread or the process that ends with a context it pushed and
 *    never popped aborts (status 134), as pycuda does, so a driver that leaks one is caught
 *    whichever binding runs it.
 * STANDIN_CUDA_TRACE=1 explains every refusal (and names every stub called) on stderr;
 * STANDIN_CUDA_MEMORY sets the device's size in bytes (default 8 GiB).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <elf.h>
#include <ffi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "entry_points.h"

#define DRIVER_VERSION 13000
#define PTX_ISA_MAX 90                   /* CUDA 13.0 reads PTX ISA 9.0 and older */
#define CC_MAJOR 9
#define CC_MINOR 0
#define DEVICE_NAME "Poseidon-Caffe stand-in CUDA device (host memory, host-built kernels)"
#define DEFAULT_MEMORY (8ull << 30)
#define MULTIPROCESSORS 132
#define ALIGNMENT 256                    /* cuMemAlloc's */
#define GUARD 64
#define GUARD_BYTE 0xA5
#define FRESH_BYTE 0xFF
#define MAX_PARAMS 64
#define MAX_DEPTH 64                     /* contexts on one thread's stack */
#define MAX_THREADS_PER_BLOCK 1024
#define MAX_SHARED_PER_BLOCK 49152
#define EM_CUDA_MACHINE 190
#define CUDA_ELF_ABI_V7 7                /* NVRTC 12's CUBINs: the SM in e_flags' low byte */
#define CUDA_ELF_ABI_V8 8                /* NVRTC 13's: the SM in e_flags' second byte */
#define STO_CUDA_ENTRY 0x10              /* a kernel's symbol, in a CUBIN's symbol table */
#define EIATTR_KPARAM_INFO 0x17          /* in .nv.info.<kernel>: one parameter's size */
#define EIFMT_SVAL 4
#define FATBIN_MAGIC "\x50\xed\x55\xba"     /* a fatbin's first bytes */

/* -- tracing and settings ---------------------------------------------------------------------- */
static int env_flag(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}
static int tracing(void) {
    static int on = -1;
    if (on < 0) on = env_flag("STANDIN_CUDA_TRACE");
    return on;
}
#define TRACE(...) do { if (tracing()) { fprintf(stderr, "standin-cuda: " __VA_ARGS__); \
                                         fputc('\n', stderr); } } while (0)

STANDIN_HIDDEN int standin_unsupported(const char *name) {
    TRACE("%s is not implemented by the stand-in: CUDA_ERROR_NOT_SUPPORTED", name);
    return CUDA_ERROR_NOT_SUPPORTED;
}

static int initialised;
static size_t total_memory = DEFAULT_MEMORY;
static int check_exit;
static pthread_key_t thread_end;

/* The device's sticky fault: once set, every call that needs the device returns it. */
static CUresult sticky = CUDA_SUCCESS;

static CUresult fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static CUresult fault(const char *fmt, ...) {
    if (tracing()) {
        va_list ap;
        va_start(ap, fmt);
        fputs("standin-cuda: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputs(": the device is lost (CUDA_ERROR_ILLEGAL_ADDRESS from now on)\n", stderr);
        va_end(ap);
    }
    sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
    return env_flag("CUDA_LAUNCH_BLOCKING") ? sticky : CUDA_SUCCESS;
}

/* -- contexts: a stack per thread -------------------------------------------------------------- */
struct CUctx_st { int primary; };
static struct CUctx_st primary_context = {1};
static int primary_references;
static pthread_mutex_t context_lock = PTHREAD_MUTEX_INITIALIZER;

struct frame { CUcontext context; int pushed; };  /* pushed: by cuCtxPushCurrent, not set */
static __thread struct frame stack[MAX_DEPTH];
static __thread int depth;

static CUcontext current(void) { return depth ? stack[depth - 1].context : NULL; }

static void report_pushed(const char *who) {
    int pushed = 0;
    for (int i = 0; i < depth; i++) pushed += stack[i].pushed;
    if (!check_exit || !pushed) return;
    fprintf(stderr, "standin-cuda: %s ends with %d context%s pushed and never popped\n", who,
            pushed, pushed == 1 ? "" : "s");
    abort();
}
static void on_thread_end(void *unused) { (void)unused; report_pushed("a thread"); }
/* after every atexit handler, pycuda's own check at its clean-up included */
__attribute__((destructor)) static void on_unload(void) { report_pushed("the process"); }

static void setup(void) {
    const char *memory = getenv("STANDIN_CUDA_MEMORY");
    if (memory && *memory) total_memory = strtoull(memory, NULL, 0);
    check_exit = env_flag("STANDIN_CUDA_CHECK_EXIT");
    pthread_key_create(&thread_end, on_thread_end);
}

#define NEED_INIT() do { if (!initialised) return CUDA_ERROR_NOT_INITIALIZED; } while (0)
#define NEED_DEVICE(d) do { if ((d) != 0) return CUDA_ERROR_INVALID_DEVICE; } while (0)
#define NEED_CONTEXT() do { NEED_INIT(); \
    if (!current()) { TRACE("%s without a current context", __func__); \
                      return CUDA_ERROR_INVALID_CONTEXT; } \
    if (sticky) return sticky; } while (0)
#define NEED(arg) do { if (!(arg)) return CUDA_ERROR_INVALID_VALUE; } while (0)

static CUresult push(CUcontext ctx, int pushed) {
    if (depth == MAX_DEPTH) {
        TRACE("more than %d contexts pushed on one thread", MAX_DEPTH);
        return CUDA_ERROR_INVALID_VALUE;
    }
    stack[depth].context = ctx;
    stack[depth++].pushed = pushed;
    pthread_setspecific(thread_end, (void *)1);   /* so that the thread's end is checked */
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuInit(unsigned int flags) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    NEED(flags == 0);
    pthread_once(&once, setup);
    initialised = 1;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDriverGetVersion(int *version) {
    NEED(version);
    *version = DRIVER_VERSION;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    NEED_INIT(); NEED_DEVICE(dev); NEED(ctx);
    pthread_mutex_lock(&context_lock);
    primary_references++;
    pthread_mutex_unlock(&context_lock);
    *ctx = &primary_context;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
    NEED_INIT(); NEED_DEVICE(dev);
    pthread_mutex_lock(&context_lock);
    int was = primary_references;
    if (was) primary_references--;
    pthread_mutex_unlock(&context_lock);
    return was ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}
CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    NEED_INIT(); NEED_DEVICE(dev); NEED(flags && active);
    *flags = 0;
    *active = primary_references > 0;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxCreate(CUcontext *ctx, CUctxCreateParams *params, unsigned int flags,
                             CUdevice dev) {
    (void)params; (void)flags;
    NEED_INIT(); NEED_DEVICE(dev); NEED(ctx);
    CUcontext made = calloc(1, sizeof *made);
    if (!made) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = push(made, 1);
    if (r != CUDA_SUCCESS) { free(made); return r; }
    *ctx = made;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxDestroy(CUcontext ctx) {
    NEED_INIT(); NEED(ctx);
    if (ctx->primary) return CUDA_ERROR_INVALID_CONTEXT;
    for (int i = depth - 1; i >= 0; i--)           /* off this thread's stack */
        if (stack[i].context == ctx) {
            memmove(&stack[i], &stack[i + 1], (depth - i - 1) * sizeof *stack);
            depth--;
        }
    free(ctx);
    return CUDA_SUCCESS;
}
/* deprecated, but pycuda calls it on every context it drops at exit, its primary one too (its
 * base class's destructor): the context must be current; it is popped, and a created one is
 * destroyed (the stand-in has no cuCtxAttach, so a created context has one user) */
CUresult CUDAAPI cuCtxDetach(CUcontext ctx) {
    NEED_INIT(); NEED(ctx);
    if (current() != ctx) return CUDA_ERROR_INVALID_CONTEXT;
    depth--;
    if (!ctx->primary) return cuCtxDestroy(ctx);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) {
    NEED_INIT(); NEED(ctx);
    return push(ctx, 1);
}
CUresult CUDAAPI cuCtxPopCurrent(CUcontext *ctx) {
    NEED_INIT();
    if (!depth) return CUDA_ERROR_INVALID_CONTEXT;
    depth--;
    if (ctx) *ctx = stack[depth].context;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
    NEED_INIT();
    if (!ctx) {                                    /* a pop, or nothing on an empty stack */
        if (depth) depth--;
        return CUDA_SUCCESS;
    }
    if (!depth) return push(ctx, 0);
    stack[depth - 1].context = ctx;                /* replaces the top */
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxGetCurrent(CUcontext *ctx) {
    NEED_INIT(); NEED(ctx);
    *ctx = current();
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxGetDevice(CUdevice *dev) {
    NEED_INIT(); NEED(dev);
    if (!current()) return CUDA_ERROR_INVALID_CONTEXT;
    *dev = 0;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice *dev, CUcontext ctx) {
    NEED_INIT(); NEED(dev);
    if (!ctx && !current()) return CUDA_ERROR_INVALID_CONTEXT;
    *dev = 0;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxSynchronize(void) {
    NEED_CONTEXT();
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
    NEED_INIT();
    if (!ctx && !current()) return CUDA_ERROR_INVALID_CONTEXT;
    return sticky;
}

/* -- the device -------------------------------------------------------------------------------- */
CUresult CUDAAPI cuDeviceGetCount(int *count) {
    NEED_INIT(); NEED(count);
    *count = 1;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceGet(CUdevice *dev, int ordinal) {
    NEED_INIT(); NEED(dev); NEED_DEVICE(ordinal);
    *dev = 0;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev) {
    NEED_INIT(); NEED_DEVICE(dev); NEED(name && len > 0);
    snprintf(name, len, "%s", DEVICE_NAME);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev) {
    NEED_INIT(); NEED_DEVICE(dev); NEED(bytes);
    *bytes = total_memory;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceComputeCapability(int *major, int *minor, CUdevice dev) {
    NEED_INIT(); NEED_DEVICE(dev); NEED(major && minor);
    *major = CC_MAJOR;
    *minor = CC_MINOR;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceGetAttribute(int *value, CUdevice_attribute attribute, CUdevice dev) {
    NEED_INIT(); NEED_DEVICE(dev); NEED(value);
    switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = MAX_THREADS_PER_BLOCK; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *value = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *value = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *value = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *value = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *value = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *value = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *value = MAX_SHARED_PER_BLOCK; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: *value = 65536; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *value = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: *value = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *value = 65536; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *value = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: *value = 512; break;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = MULTIPROCESSORS; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = CC_MAJOR; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = CC_MINOR; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *value = 2; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *value = 2048; break;
    default: *value = 0;
    }
    return CUDA_SUCCESS;
}

/* -- memory: allocations sorted by address ----------------------------------------------------- */
struct allocation { uintptr_t start; size_t size; };
static struct allocation *allocations;
static size_t allocation_count, allocation_room, in_use;
static pthread_mutex_t memory_lock = PTHREAD_MUTEX_INITIALIZER;

/* the allocation holding address p, or -1 (memory_lock held) */
static long find_locked(uintptr_t p) {
    size_t lo = 0, hi = allocation_count;
    while (lo < hi) {                              /* the first start above p */
        size_t mid = (lo + hi) / 2;
        if (allocations[mid].start <= p) lo = mid + 1; else hi = mid;
    }
    if (lo == 0) return -1;
    const struct allocation *a = &allocations[lo - 1];
    return p < a->start + a->size ? (long)(lo - 1) : -1;
}

/* [p, p + n) lies inside one allocation */
static int inside(uintptr_t p, size_t n) {
    pthread_mutex_lock(&memory_lock);
    long i = find_locked(p);
    int ok = i >= 0 && n <= allocations[i].start + allocations[i].size - p;
    pthread_mutex_unlock(&memory_lock);
    return ok;
}
#define NEED_RANGE(p, n) do { if ((n) != 0 && !inside((uintptr_t)(p), (n))) { \
    TRACE("%s: %zu bytes at 0x%lx are not inside one allocation", __func__, (size_t)(n), \
          (unsigned long)(p)); return CUDA_ERROR_INVALID_VALUE; } } while (0)

/* For the stand-in cuBLAS: 0 when [p, p + n) lies inside one allocation of a device that has
 * not faulted; else the device faults, as a GPU kernel reading outside memory makes it, and
 * the call either succeeds with the fault showing in the calls after it (1) or fails now (2:
 * the device had faulted before, or CUDA_LAUNCH_BLOCKING is set). */
int standin_cuda_operand(uintptr_t p, size_t n, const char *call) {
    if (sticky) return 2;
    if (!n || inside(p, n)) return 0;
    return fault("%s: an operand of %zu bytes at 0x%lx is not inside one allocation", call, n,
                 (unsigned long)p) == CUDA_SUCCESS ? 1 : 2;
}

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t size) {
    NEED_CONTEXT(); NEED(dptr && size);
    pthread_mutex_lock(&memory_lock);
    CUresult r = CUDA_SUCCESS;
    char *raw = NULL;
    if (size > total_memory - in_use) {
        TRACE("cuMemAlloc of %zu bytes with %zu of %zu free", size, total_memory - in_use,
              total_memory);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (allocation_count == allocation_room) {
        size_t room = allocation_room ? 2 * allocation_room : 1024;
        struct allocation *grown = realloc(allocations, room * sizeof *grown);
        if (grown) { allocations = grown; allocation_room = room; }
        else r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (r == CUDA_SUCCESS) {
        raw = aligned_alloc(ALIGNMENT, (size + GUARD + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT);
        if (!raw) r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (r == CUDA_SUCCESS) {
        memset(raw, FRESH_BYTE, size);
        memset(raw + size, GUARD_BYTE, GUARD);
        uintptr_t start = (uintptr_t)raw;
        size_t at = allocation_count;
        while (at && allocations[at - 1].start > start) at--;
        memmove(&allocations[at + 1], &allocations[at],
                (allocation_count - at) * sizeof *allocations);
        allocations[at].start = start;
        allocations[at].size = size;
        allocation_count++;
        in_use += size;
        *dptr = (CUdeviceptr)start;
    }
    pthread_mutex_unlock(&memory_lock);
    return r;
}
CUresult CUDAAPI cuMemFree(CUdeviceptr dptr) {
    NEED_CONTEXT();
    if (!dptr) return CUDA_SUCCESS;
    pthread_mutex_lock(&memory_lock);
    long i = find_locked((uintptr_t)dptr);
    int found = i >= 0 && allocations[i].start == (uintptr_t)dptr;
    if (found) {
        in_use -= allocations[i].size;
        memmove(&allocations[i], &allocations[i + 1],
                (allocation_count - i - 1) * sizeof *allocations);
        allocation_count--;
    }
    pthread_mutex_unlock(&memory_lock);
    if (!found) {
        TRACE("cuMemFree of 0x%lx, which is not an allocation's start", (unsigned long)dptr);
        return CUDA_ERROR_INVALID_VALUE;
    }
    free((void *)(uintptr_t)dptr);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemGetInfo(size_t *free_bytes, size_t *total) {
    NEED_CONTEXT(); NEED(free_bytes && total);
    pthread_mutex_lock(&memory_lock);
    *free_bytes = total_memory - in_use;
    pthread_mutex_unlock(&memory_lock);
    *total = total_memory;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr dptr) {
    NEED_CONTEXT();
    pthread_mutex_lock(&memory_lock);
    long i = find_locked((uintptr_t)dptr);
    if (i >= 0) {
        if (base) *base = allocations[i].start;
        if (size) *size = allocations[i].size;
    }
    pthread_mutex_unlock(&memory_lock);
    return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
    (void)flags;
    NEED_CONTEXT(); NEED(pp);
    *pp = aligned_alloc(4096, ((size ? size : 1) + 4095) / 4096 * 4096);
    return *pp ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult CUDAAPI cuMemAllocHost(void **pp, size_t size) { return cuMemHostAlloc(pp, size, 0); }
CUresult CUDAAPI cuMemFreeHost(void *p) {
    NEED_CONTEXT();
    free(p);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemHostGetFlags(unsigned int *flags, void *p) {
    (void)p;
    NEED_CONTEXT(); NEED(flags);
    *flags = 0;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemsetD8(CUdeviceptr dst, unsigned char value, size_t n) {
    NEED_CONTEXT(); NEED_RANGE(dst, n);
    memset((void *)(uintptr_t)dst, value, n);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream s) {
    (void)s;
    return cuMemsetD8(dst, value, n);
}
CUresult CUDAAPI cuMemsetD32(CUdeviceptr dst, unsigned int value, size_t n) {
    NEED_CONTEXT(); NEED(dst % 4 == 0); NEED_RANGE(dst, 4 * n);
    unsigned int *word = (unsigned int *)(uintptr_t)dst;
    for (size_t i = 0; i < n; i++) word[i] = value;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t n, CUstream s) {
    (void)s;
    return cuMemsetD32(dst, value, n);
}
CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n) {
    NEED_CONTEXT(); NEED_RANGE(dst, n);
    memcpy((void *)(uintptr_t)dst, src, n);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    (void)s;
    return cuMemcpyHtoD(dst, src, n);
}
CUresult CUDAAPI cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n) {
    NEED_CONTEXT(); NEED_RANGE(src, n);
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    (void)s;
    return cuMemcpyDtoH(dst, src, n);
}
CUresult CUDAAPI cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    NEED_CONTEXT(); NEED_RANGE(dst, n); NEED_RANGE(src, n);
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    (void)s;
    return cuMemcpyDtoD(dst, src, n);
}

/* -- streams and events: everything ran when it was queued ------------------------------------- */
struct CUstream_st { unsigned int flags; };
struct CUevent_st { unsigned int flags; int recorded; double seconds; };

CUresult CUDAAPI cuStreamCreate(CUstream *stream, unsigned int flags) {
    NEED_CONTEXT(); NEED(stream); NEED((flags & ~CU_STREAM_NON_BLOCKING) == 0);
    *stream = calloc(1, sizeof **stream);
    if (!*stream) return CUDA_ERROR_OUT_OF_MEMORY;
    (*stream)->flags = flags;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamDestroy(CUstream stream) {
    NEED_INIT(); NEED(stream);
    free(stream);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamSynchronize(CUstream stream) {
    (void)stream;
    NEED_CONTEXT();
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamQuery(CUstream stream) {
    (void)stream;
    NEED_CONTEXT();
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
    (void)stream; (void)flags;
    NEED_CONTEXT(); NEED(event);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamGetFlags(CUstream stream, unsigned int *flags) {
    NEED_CONTEXT(); NEED(flags);
    *flags = stream ? stream->flags : 0;
    return CUDA_SUCCESS;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
CUresult CUDAAPI cuEventCreate(CUevent *event, unsigned int flags) {
    NEED_CONTEXT(); NEED(event);
    *event = calloc(1, sizeof **event);
    if (!*event) return CUDA_ERROR_OUT_OF_MEMORY;
    (*event)->flags = flags;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuEventDestroy(CUevent event) {
    NEED_INIT(); NEED(event);
    free(event);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuEventRecord(CUevent event, CUstream stream) {
    (void)stream;
    NEED_CONTEXT(); NEED(event);
    event->seconds = now();
    event->recorded = 1;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuEventSynchronize(CUevent event) {
    NEED_CONTEXT(); NEED(event);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuEventQuery(CUevent event) {      /* complete, recorded or not */
    NEED_CONTEXT(); NEED(event);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
    NEED_CONTEXT(); NEED(ms && start && end);
    if (!start->recorded || !end->recorded ||
        ((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_HANDLE;
    *ms = (float)((end->seconds - start->seconds) * 1000.0);
    return CUDA_SUCCESS;
}

/* -- host builds of the kernels, and their signatures ------------------------------------------ */
static void **host_libraries;
static size_t host_library_count;
static char **signature_lines;                   /* "name kinds" lines of the signatures file */
static size_t signature_count;

static void load_host_libraries(void) {
    const char *list = getenv("STANDIN_CUDA_HOST_LIBS");
    if (!list || !*list) { TRACE("STANDIN_CUDA_HOST_LIBS is not set: no kernel can run"); return; }
    char *copy = strdup(list), *save = NULL;
    for (char *path = strtok_r(copy, ":", &save); path; path = strtok_r(NULL, ":", &save)) {
        void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!handle) { TRACE("cannot load host kernels %s: %s", path, dlerror()); continue; }
        void **grown = realloc(host_libraries, (host_library_count + 1) * sizeof *grown);
        if (!grown) break;
        host_libraries = grown;
        host_libraries[host_library_count++] = handle;
    }
    free(copy);
}
static void load_signatures(void) {
    const char *path = getenv("STANDIN_CUDA_SIGNATURES");
    FILE *f = path && *path ? fopen(path, "r") : NULL;
    if (!f) { TRACE("no signatures file (STANDIN_CUDA_SIGNATURES=%s)", path ? path : ""); return; }
    char line[512];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!*line || *line == '#') continue;
        char **grown = realloc(signature_lines, (signature_count + 1) * sizeof *grown);
        if (!grown) break;
        signature_lines = grown;
        signature_lines[signature_count++] = strdup(line);
    }
    fclose(f);
}
static void load_host_side(void) { load_host_libraries(); load_signatures(); }
static pthread_once_t host_side_once = PTHREAD_ONCE_INIT;

static void *host_function(const char *name) {
    pthread_once(&host_side_once, load_host_side);
    for (size_t i = 0; i < host_library_count; i++) {
        void *fn = dlsym(host_libraries[i], name);
        if (fn) return fn;
    }
    return NULL;
}
static const char *signature_of(const char *name) {
    pthread_once(&host_side_once, load_host_side);
    size_t len = strlen(name);
    for (size_t i = 0; i < signature_count; i++)
        if (!strncmp(signature_lines[i], name, len) && signature_lines[i][len] == ' ')
            return signature_lines[i] + len + 1;
    return NULL;
}

/* -- modules ----------------------------------------------------------------------------------- */
struct CUfunc_st {
    struct CUfunc_st *next;
    char name[256];
    int nparams;
    char kinds[MAX_PARAMS + 1];                  /* P, i or f per parameter */
    void *host;
    CUresult refusal;                            /* cuModuleGetFunction's, if it refuses it */
    char why[160];
    ffi_cif cif;
    ffi_type *types[MAX_PARAMS];
};
struct CUmod_st { struct CUfunc_st *functions; };

/* A load's error log: JIT option buffers where the caller gave some (pycuda shows them). */
struct jit_log { char *text; size_t size; void **size_slot; };

static CUresult refuse(struct jit_log *log, CUresult r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static CUresult refuse(struct jit_log *log, CUresult r, const char *fmt, ...) {
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    TRACE("%s", message);
    if (log && log->text && log->size) {
        snprintf(log->text, log->size, "standin-cuda: %s", message);
        if (log->size_slot) *log->size_slot = (void *)(uintptr_t)(strlen(log->text) + 1);
    }
    return r;
}

static void free_module(struct CUmod_st *m) {
    while (m->functions) {
        struct CUfunc_st *next = m->functions->next;
        free(m->functions);
        m->functions = next;
    }
    free(m);
}

static CUresult add_function(struct CUmod_st *m, const char *name, size_t len, const char *kinds,
                             struct jit_log *log) {
    if (len >= sizeof m->functions->name) return refuse(log, CUDA_ERROR_INVALID_IMAGE,
                                                        "a kernel name of %zu characters", len);
    struct CUfunc_st *f = calloc(1, sizeof *f);
    if (!f) return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(f->name, name, len);
    f->next = m->functions;
    m->functions = f;
    if (!kinds) {
        f->refusal = CUDA_ERROR_NOT_FOUND;
        snprintf(f->why, sizeof f->why, "no signature in STANDIN_CUDA_SIGNATURES");
        return CUDA_SUCCESS;
    }
    f->nparams = (int)strlen(kinds);
    if (f->nparams > MAX_PARAMS) return refuse(log, CUDA_ERROR_INVALID_IMAGE,
                                               "kernel %s has over %d parameters", f->name,
                                               MAX_PARAMS);
    memcpy(f->kinds, kinds, f->nparams);
    for (int k = 0; k < f->nparams; k++) {
        switch (kinds[k]) {
        case 'P': f->types[k] = &ffi_type_pointer; break;
        case 'i': f->types[k] = &ffi_type_sint32; break;
        case 'f': f->types[k] = &ffi_type_float; break;
        default: return refuse(log, CUDA_ERROR_INVALID_IMAGE, "kernel %s: parameter kind '%c' "
                               "is not P, i or f", f->name, kinds[k]);
        }
    }
    if (ffi_prep_cif(&f->cif, FFI_DEFAULT_ABI, f->nparams, &ffi_type_void, f->types) != FFI_OK)
        return refuse(log, CUDA_ERROR_INVALID_IMAGE, "libffi cannot call kernel %s", f->name);
    f->host = host_function(f->name);
    if (!f->host) {
        f->refusal = CUDA_ERROR_NOT_FOUND;
        snprintf(f->why, sizeof f->why, "no host build of it in STANDIN_CUDA_HOST_LIBS");
    }
    return CUDA_SUCCESS;
}

/* PTX: ".version X.Y", ".target sm_NN", and ".entry name(.param .u32 a, .param .u64 b, ...)" */
static CUresult load_ptx(struct CUmod_st *m, const char *ptx, struct jit_log *log) {
    const char *version = strstr(ptx, ".version"), *target = strstr(ptx, ".target");
    int major, minor, sm;
    if (!version || sscanf(version, ".version %d.%d", &major, &minor) != 2 ||
        !target || sscanf(target, ".target sm_%d", &sm) != 1)
        return refuse(log, CUDA_ERROR_INVALID_PTX, "PTX without a .version or .target sm_NN");
    if (major * 10 + minor > PTX_ISA_MAX)
        return refuse(log, CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "PTX ISA %d.%d is newer than "
                      "the %d.%d a CUDA %d.%d driver reads", major, minor, PTX_ISA_MAX / 10,
                      PTX_ISA_MAX % 10, DRIVER_VERSION / 1000, DRIVER_VERSION % 1000 / 10);
    if (sm > CC_MAJOR * 10 + CC_MINOR)
        return refuse(log, CUDA_ERROR_INVALID_PTX, "PTX for sm_%d does not compile for the "
                      "device's sm_%d%d", sm, CC_MAJOR, CC_MINOR);
    for (const char *p = ptx; (p = strstr(p, ".entry")) != NULL; ) {
        p += 6;
        while (*p == ' ' || *p == '\t') p++;
        const char *name = p;
        while (*p && *p != '(' && *p != ' ' && *p != '\n') p++;
        size_t len = p - name;
        const char *open = strchr(p, '('), *close = open ? strchr(open, ')') : NULL;
        if (!len || !open || !close) return refuse(log, CUDA_ERROR_INVALID_PTX,
                                                   "an .entry without its parameter list");
        char kinds[MAX_PARAMS + 1];
        int n = 0;
        for (const char *q = open; (q = strstr(q, ".param")) != NULL && q < close; ) {
            q += 6;
            while (*q == ' ' || *q == '\t') q++;
            if (n == MAX_PARAMS) return refuse(log, CUDA_ERROR_INVALID_PTX,
                                               "an .entry with over %d parameters", MAX_PARAMS);
            if (!strncmp(q, ".u64", 4) || !strncmp(q, ".b64", 4) || !strncmp(q, ".s64", 4))
                kinds[n++] = 'P';
            else if (!strncmp(q, ".u32", 4) || !strncmp(q, ".s32", 4) || !strncmp(q, ".b32", 4))
                kinds[n++] = 'i';
            else if (!strncmp(q, ".f32", 4))
                kinds[n++] = 'f';
            else
                return refuse(log, CUDA_ERROR_INVALID_PTX, "entry %.*s: a parameter of type "
                              "%.5s, which the stand-in does not pass", (int)len, name, q);
        }
        kinds[n] = 0;
        CUresult r = add_function(m, name, len, kinds, log);
        if (r != CUDA_SUCCESS) return r;
        p = close;
    }
    return CUDA_SUCCESS;
}

/* the parameter sizes a CUBIN records for one kernel (.nv.info.<name>'s KPARAM_INFO
 * attributes): how many, or -1 when it records none */
static int cubin_parameter_sizes(const unsigned char *info, size_t size, int *sizes) {
    int count = -1;
    for (size_t at = 0; at + 4 <= size; ) {
        unsigned format = info[at], attribute = info[at + 1];
        size_t length = format == EIFMT_SVAL ? (size_t)(info[at + 2] | info[at + 3] << 8) : 0;
        if (format < 1 || format > EIFMT_SVAL) return -1;    /* a layout this does not know */
        if (attribute == EIATTR_KPARAM_INFO && length >= 12 && at + 4 + length <= size) {
            const unsigned char *v = info + at + 4;
            int ordinal = v[4] | v[5] << 8;
            uint32_t bits = v[8] | v[9] << 8 | v[10] << 16 | (uint32_t)v[11] << 24;
            if (ordinal < MAX_PARAMS) {
                sizes[ordinal] = (int)((bits >> 18) & 0x3fff);
                if (ordinal + 1 > count) count = ordinal + 1;
            }
        }
        at += 4 + length;
    }
    return count;
}

static CUresult load_cubin(struct CUmod_st *m, const unsigned char *image, struct jit_log *log) {
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)image;
    if (eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_ident[EI_DATA] != ELFDATA2LSB ||
        eh->e_machine != EM_CUDA_MACHINE || eh->e_shentsize != sizeof(Elf64_Shdr) ||
        !eh->e_shnum || eh->e_shstrndx >= eh->e_shnum)
        return refuse(log, CUDA_ERROR_INVALID_IMAGE, "an ELF image that is not a 64-bit CUBIN");
    int abi = eh->e_ident[EI_ABIVERSION];
    int sm = abi == CUDA_ELF_ABI_V7 ? (int)(eh->e_flags & 0xff)
           : abi == CUDA_ELF_ABI_V8 ? (int)(eh->e_flags >> 8 & 0xff) : -1;
    if (sm < 0)
        TRACE("a CUBIN of CUDA ELF ABI %d: its architecture is not checked", abi);
    else if (sm / 10 != CC_MAJOR || sm % 10 > CC_MINOR)
        return refuse(log, CUDA_ERROR_NO_BINARY_FOR_GPU, "a CUBIN for sm_%d does not run on "
                      "the device's sm_%d%d", sm, CC_MAJOR, CC_MINOR);
    const Elf64_Shdr *sections = (const Elf64_Shdr *)(image + eh->e_shoff);
    const char *section_names = (const char *)image + sections[eh->e_shstrndx].sh_offset;
    for (int s = 0; s < eh->e_shnum; s++) {
        if (sections[s].sh_type != SHT_SYMTAB || sections[s].sh_link >= eh->e_shnum) continue;
        const Elf64_Sym *symbols = (const Elf64_Sym *)(image + sections[s].sh_offset);
        const char *names = (const char *)image + sections[sections[s].sh_link].sh_offset;
        size_t count = sections[s].sh_size / sizeof *symbols;
        for (size_t i = 0; i < count; i++) {
            const Elf64_Sym *sym = &symbols[i];
            if (ELF64_ST_TYPE(sym->st_info) != STT_FUNC ||
                ELF64_ST_BIND(sym->st_info) != STB_GLOBAL || !(sym->st_other & STO_CUDA_ENTRY))
                continue;
            const char *name = names + sym->st_name;
            const char *kinds = signature_of(name);
            char info_name[300];
            snprintf(info_name, sizeof info_name, ".nv.info.%s", name);
            for (int t = 0; kinds && t < eh->e_shnum; t++) {
                if (strcmp(section_names + sections[t].sh_name, info_name)) continue;
                int sizes[MAX_PARAMS] = {0};
                int n = cubin_parameter_sizes(image + sections[t].sh_offset, sections[t].sh_size,
                                              sizes);
                int agree = n < 0 || n == (int)strlen(kinds);
                for (int k = 0; agree && k < n; k++)
                    agree = sizes[k] == (kinds[k] == 'P' ? 8 : 4);
                if (!agree)
                    return refuse(log, CUDA_ERROR_INVALID_IMAGE, "kernel %s: the CUBIN's %d "
                                  "parameters do not fit the signature %s of "
                                  "STANDIN_CUDA_SIGNATURES", name, n, kinds);
            }
            CUresult r = add_function(m, name, strlen(name), kinds, log);
            if (r != CUDA_SUCCESS) return r;
        }
    }
    return CUDA_SUCCESS;
}

static CUresult load_module(CUmodule *module, const void *image, unsigned int count,
                            CUjit_option *options, void **values) {
    NEED_CONTEXT(); NEED(module && image);
    struct jit_log log = {0};
    for (unsigned int i = 0; options && values && i < count; i++) {
        if (options[i] == CU_JIT_ERROR_LOG_BUFFER) log.text = values[i];
        else if (options[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) {
            log.size = (size_t)(uintptr_t)values[i];
            log.size_slot = &values[i];
        }
    }
    if (log.text && log.size) log.text[0] = 0;
    if (log.size_slot) *log.size_slot = 0;
    for (unsigned int i = 0; options && values && i < count; i++)   /* an empty info log */
        if (options[i] == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES) values[i] = 0;
    struct CUmod_st *m = calloc(1, sizeof *m);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    const unsigned char *bytes = image;
    CUresult r;
    if (!memcmp(bytes, ELFMAG, SELFMAG))
        r = load_cubin(m, bytes, &log);
    else if (!memcmp(bytes, FATBIN_MAGIC, sizeof FATBIN_MAGIC - 1))
        r = refuse(&log, CUDA_ERROR_INVALID_IMAGE, "a fatbin: the stand-in loads PTX or a CUBIN");
    else if (strstr(image, ".entry") || strstr(image, ".version"))
        r = load_ptx(m, image, &log);
    else
        r = refuse(&log, CUDA_ERROR_INVALID_IMAGE, "an image that is neither PTX nor a CUBIN");
    if (r != CUDA_SUCCESS) { free_module(m); return r; }
    *module = m;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image) {
    return load_module(module, image, 0, NULL, NULL);
}
CUresult CUDAAPI cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int count,
                                    CUjit_option *options, void **values) {
    return load_module(module, image, count, options, values);
}
CUresult CUDAAPI cuModuleUnload(CUmodule module) {
    NEED_INIT(); NEED(module);
    free_module(module);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuModuleGetFunction(CUfunction *fn, CUmodule module, const char *name) {
    NEED_CONTEXT(); NEED(fn && module && name);
    for (struct CUfunc_st *f = module->functions; f; f = f->next)
        if (!strcmp(f->name, name)) {
            if (f->refusal != CUDA_SUCCESS) {
                TRACE("kernel %s: %s", f->name, f->why);
                return f->refusal;
            }
            *fn = f;
            return CUDA_SUCCESS;
        }
    TRACE("the module has no kernel %s", name);
    return CUDA_ERROR_NOT_FOUND;
}
CUresult CUDAAPI cuFuncGetAttribute(int *value, CUfunction_attribute attribute, CUfunction fn) {
    NEED_INIT(); NEED(value && fn);
    switch (attribute) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = MAX_THREADS_PER_BLOCK; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *value = 32; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: *value = CC_MAJOR * 10 + CC_MINOR; break;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *value = CC_MAJOR * 10 + CC_MINOR; break;
    default: *value = 0;
    }
    return CUDA_SUCCESS;
}

/* pycuda's prepared calls still set the block shape the old way before each launch */
CUresult CUDAAPI cuFuncSetBlockShape(CUfunction fn, int x, int y, int z) {
    NEED_CONTEXT(); NEED(fn);
    NEED(x > 0 && y > 0 && z > 0 && (long)x * y * z <= MAX_THREADS_PER_BLOCK);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuFuncSetSharedSize(CUfunction fn, unsigned int bytes) {
    NEED_CONTEXT(); NEED(fn && bytes <= MAX_SHARED_PER_BLOCK);
    return CUDA_SUCCESS;
}

/* -- launches ---------------------------------------------------------------------------------- */
static int guard_intact(uintptr_t p) {       /* restores the guard of p's allocation if not */
    int intact = 1;
    pthread_mutex_lock(&memory_lock);
    long i = find_locked(p);
    if (i >= 0) {
        unsigned char *guard = (unsigned char *)(allocations[i].start + allocations[i].size);
        for (int b = 0; b < GUARD; b++) intact &= guard[b] == GUARD_BYTE;
        if (!intact) memset(guard, GUARD_BYTE, GUARD);
    }
    pthread_mutex_unlock(&memory_lock);
    return intact;
}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                unsigned int bx, unsigned int by, unsigned int bz,
                                unsigned int shared, CUstream stream, void **params,
                                void **extra) {
    (void)stream;
    NEED_CONTEXT(); NEED(f);
    if (!gx || !gy || !gz || gy > 65535 || gz > 65535 || !bx || !by || !bz || bx > 1024 ||
        by > 1024 || bz > 64 || (unsigned long)bx * by * bz > MAX_THREADS_PER_BLOCK ||
        shared > MAX_SHARED_PER_BLOCK) {
        TRACE("launch %s: grid %ux%ux%u, block %ux%ux%u, %u shared bytes are out of bounds",
              f->name, gx, gy, gz, bx, by, bz, shared);
        return CUDA_ERROR_INVALID_VALUE;
    }
    void *values[MAX_PARAMS] = {0};
    if (params && extra) return CUDA_ERROR_INVALID_VALUE;
    if (params) {
        for (int k = 0; k < f->nparams; k++) values[k] = params[k];
    } else if (extra) {                          /* one packed buffer, naturally aligned */
        char *buffer = NULL;
        size_t size = 0, at = 0;
        for (int k = 0; extra[k] != CU_LAUNCH_PARAM_END; k += 2) {
            if (extra[k] == CU_LAUNCH_PARAM_BUFFER_POINTER) buffer = extra[k + 1];
            else if (extra[k] == CU_LAUNCH_PARAM_BUFFER_SIZE) size = *(size_t *)extra[k + 1];
            else return CUDA_ERROR_INVALID_VALUE;
        }
        for (int k = 0; k < f->nparams; k++) {
            size_t width = f->kinds[k] == 'P' ? 8 : 4;
            at = (at + width - 1) / width * width;
            if (!buffer || at + width > size) {
                TRACE("launch %s: a parameter buffer of %zu bytes is too short", f->name, size);
                return CUDA_ERROR_INVALID_VALUE;
            }
            values[k] = buffer + at;
            at += width;
        }
    } else if (f->nparams) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* a kernel whose index count (its first parameter) is not positive touches no memory */
    if (f->nparams && f->kinds[0] == 'i' && *(int *)values[0] <= 0) return CUDA_SUCCESS;
    for (int k = 0; k < f->nparams; k++) {
        uintptr_t p = f->kinds[k] == 'P' ? *(uintptr_t *)values[k] : 0;
        if (p && !inside(p, 1))
            return fault("kernel %s: pointer argument %d (0x%lx) is outside every allocation",
                         f->name, k, (unsigned long)p);
    }
    ffi_call(&f->cif, FFI_FN(f->host), NULL, values);
    for (int k = 0; k < f->nparams; k++)
        if (f->kinds[k] == 'P' && *(uintptr_t *)values[k] && !guard_intact(*(uintptr_t *)values[k]))
            return fault("kernel %s wrote past the end of the allocation of its pointer "
                         "argument %d", f->name, k);
    return CUDA_SUCCESS;
}

/* -- errors and entry points ------------------------------------------------------------------- */
CUresult CUDAAPI cuGetErrorName(CUresult error, const char **name) {
    NEED(name);
    for (const struct standin_result_name *r = standin_result_names; r->name; r++)
        if (r->value == (int)error) { *name = r->name; return CUDA_SUCCESS; }
    *name = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}
/* the stand-in's description of a result is its name */
CUresult CUDAAPI cuGetErrorString(CUresult error, const char **text) {
    return cuGetErrorName(error, text);
}

CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult *status) {
    (void)flags;              /* per-thread default stream or not: every stream is synchronous */
    NEED(symbol && pfn);
    const struct standin_entry_point *found = NULL;
    int named = 0;
    for (const struct standin_entry_point *e = standin_entry_points; e->name; e++)
        if (!strcmp(e->name, symbol)) {
            named = 1;
            if (e->version <= version) found = e;    /* the newest ABI not above version */
        }
    *pfn = found ? found->fn : NULL;
    if (status) *status = found ? CU_GET_PROC_ADDRESS_SUCCESS : named ?
        CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (!found) {
        TRACE("cuGetProcAddress(%s, CUDA %d): %s", symbol, version,
              named ? "no ABI that old" : "no such entry point");
        return CUDA_ERROR_NOT_FOUND;
    }
    return CUDA_SUCCESS;
}
