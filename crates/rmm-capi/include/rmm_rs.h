/*
 * rmm_rs.h: the C ABI of rmm-rs (crate rmm-capi), the RAPIDS Memory Manager rebuilt in Rust.
 *
 * What it gives: per-device memory resources built from a few options (the CUDA driver's
 * allocator, a pool over it, or the driver's stream-ordered pool; managed memory; a maximum
 * size; a CSV log of every allocation; statistics), allocation and free with the signatures of
 * PyTorch's CUDAPluggableAllocator, statistics as a struct, and the last error as a string.
 *
 * Linking:
 *   shared: cc prog.c -I<include> -L<dir> -lrmm_capi            (librmm_capi.so; the library
 *           needs libstdc++.so.6 at run time, which it names itself)
 *   static: cc prog.c -I<include> <dir>/librmm_capi.a -lstdc++ -ldl -lpthread -lm
 * No CUDA toolkit is needed to build or link: the library loads the driver (libcuda.so.1) at
 * run time, and without one every call that needs it fails with RMM_RS_ERROR_NO_DEVICE.
 *
 * Conventions:
 *   - Every function may be called from any thread, with or without a current CUDA context:
 *     before its first CUDA call for device N it makes device N's primary context current on
 *     the calling thread (the context the CUDA runtime, PyTorch and CuPy use). A thread that
 *     had no context keeps that one afterwards (as with the runtime); a thread that had another
 *     context gets it back before the call returns. A call that needs no CUDA call (an
 *     allocation or free a pool serves from its own memory on stream 0, CU_STREAM_LEGACY or
 *     CU_STREAM_PER_THREAD) leaves the thread's context as it was.
 *   - Functions returning int return RMM_RS_SUCCESS (0) or an RMM_RS_ERROR_* code; on failure
 *     rmm_rs_last_error() holds the message. A successful call leaves the last error as it
 *     was (as errno): test the returned status, not rmm_rs_last_error_code(), to know whether
 *     a call failed (rmm_rs_allocate and rmm_rs_deallocate return one; before reading the
 *     code after rmm_rs_alloc or rmm_rs_free, call rmm_rs_clear_last_error). No function
 *     unwinds (a Rust panic becomes RMM_RS_ERROR_PANIC) and none aborts, except
 *     rmm_rs_torch_alloc, which throws a C++ exception by design (see below).
 *   - rmm_rs_configure comes first: an allocation on a device no call configured fails with
 *     RMM_RS_ERROR_NOT_CONFIGURED.
 *   - Streams (CUstream, the runtime's cudaStream_t) are borrowed, never destroyed. A stream
 *     passed in must be 0, RMM_RS_STREAM_LEGACY (CU_STREAM_LEGACY, 0x1),
 *     RMM_RS_STREAM_PER_THREAD (CU_STREAM_PER_THREAD, 0x2) or a stream of the
 *     device's primary context that stays alive for the call and until the work it orders on
 *     the memory is done. Stream 0 means the legacy default stream, or the per-thread default
 *     stream when the process's RMM_DEFAULT_STREAM is "per-thread" (read once per process);
 *     the torch entry points always read 0 as the legacy stream, as PyTorch does.
 *   - Memory allocated on a stream is ready for work on that stream; freeing it on the same
 *     stream is ordered after that work. Using it on another stream needs an event, as with
 *     cudaMallocAsync.
 *   - Sizes are bytes. Pool sizes are multiples of 256. Allocations are 256-byte aligned.
 *
 * This ABI has no stability promise before rmm-rs 1.0: check rmm_rs_abi_version() against
 * RMM_RS_ABI_VERSION when loading the library.
 */
#ifndef RMM_RS_H
#define RMM_RS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* ssize_t, as PyTorch's allocator hooks use */

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header's ABI; rmm_rs_abi_version() returns the library's. */
#define RMM_RS_ABI_VERSION 3

/* Status codes. */
#define RMM_RS_SUCCESS 0
/* A bad argument or option, or an option combination that makes no sense. */
#define RMM_RS_ERROR_INVALID_ARGUMENT 1
/* Out of memory: the device, the pool's maximum size or the driver's pool is exhausted. */
#define RMM_RS_ERROR_OUT_OF_MEMORY 2
/* An allocation failed for another reason (a driver error during allocation). */
#define RMM_RS_ERROR_BAD_ALLOC 3
/* A free the resource detected as wrong: unknown pointer, double free, size mismatch. */
#define RMM_RS_ERROR_INVALID_FREE 4
/* No CUDA driver, or no such device. */
#define RMM_RS_ERROR_NO_DEVICE 5
/* Another CUDA driver error. */
#define RMM_RS_ERROR_CUDA 6
/* The device was never configured (rmm_rs_configure). */
#define RMM_RS_ERROR_NOT_CONFIGURED 7
/* rmm_rs_configure would replace a resource that still has allocations outstanding. */
#define RMM_RS_ERROR_BUSY 8
/* A bug in rmm-rs: a Rust panic, caught at the boundary. */
#define RMM_RS_ERROR_PANIC 9
/* The device or its driver lacks a capability the configured resource needs (memory pools for
 * _ASYNC, CUDA 13 for _ASYNC with managed memory, ...); the message names it. Choose another
 * resource. */
#define RMM_RS_ERROR_UNSUPPORTED 10

/* Stream handles for programs without cuda.h: the legacy default stream (CU_STREAM_LEGACY)
 * and the calling thread's per-thread default stream (CU_STREAM_PER_THREAD). 0 (NULL) is the
 * legacy one, or the per-thread one when RMM_DEFAULT_STREAM is "per-thread". */
#define RMM_RS_STREAM_LEGACY ((void *)0x1)
#define RMM_RS_STREAM_PER_THREAD ((void *)0x2)

/* rmm_rs_options.resource */
/* The driver's allocator: cuMemAlloc / cuMemFree per call (RMM's cuda_memory_resource). */
#define RMM_RS_RESOURCE_CUDA 0
/* A pool sub-allocating from large chunks (RMM's pool_memory_resource). */
#define RMM_RS_RESOURCE_POOL 1
/* The driver's stream-ordered pool, cuMemAllocAsync (RMM's cuda_async_memory_resource). */
#define RMM_RS_RESOURCE_ASYNC 2

/* A size option left at its default. */
#define RMM_RS_SIZE_DEFAULT UINT64_MAX

/* What rmm_rs_configure builds for a device, from the bottom up: device (or managed) memory;
 * the pool or the driver's pool; statistics; the CSV log on top. Set the defaults with
 * rmm_rs_options_init, then change what you need. */
typedef struct rmm_rs_options {
    /* RMM_RS_RESOURCE_CUDA, _POOL (the default) or _ASYNC. */
    int32_t resource;
    /* Nonzero: managed (unified) memory instead of device memory (with _ASYNC: the driver's
     * managed pool). Default 0. */
    int32_t managed_memory;
    /* _POOL: the size of the first chunk, taken when the device's resource is built;
     * RMM_RS_SIZE_DEFAULT is half of the device's free memory (capped by the maximum), as
     * RMM's Python reinitialize; 0 grows on first use. _ASYNC: bytes allocated and freed once
     * to prime the driver's pool (default: none). Not allowed with _CUDA. */
    uint64_t initial_pool_size;
    /* _POOL only: the most the pool takes from the device; RMM_RS_SIZE_DEFAULT for no
     * maximum. An allocation beyond it fails with RMM_RS_ERROR_OUT_OF_MEMORY. */
    uint64_t maximum_pool_size;
    /* NULL: no log. Otherwise every allocation, failed allocation and free is written to a
     * CSV file per device in RMM's format (replayable with rmm-replay): device N writes to
     * <stem>.devN<ext> beside this path, e.g. "rmm_log.csv" -> "rmm_log.dev0.csv". The file is
     * buffered: rmm_rs_flush_log writes it out (also done at process exit). The string is
     * copied. */
    const char *log_file;
    /* Nonzero: count bytes and allocations (current, peak, total) for
     * rmm_rs_get_statistics. Default 1. */
    int32_t statistics;
    /* 0: every device, each built on its first allocation, with that device current. N > 0:
     * the N ordinals in devices, built now (errors are reported now). */
    int32_t num_devices;
    const int32_t *devices;
} rmm_rs_options;

/* What rmm_rs_get_statistics reports for a device. */
typedef struct rmm_rs_statistics {
    /* Bytes allocated and not yet freed (as requested), their peak and their running total.
     * Zero unless statistics_enabled. */
    int64_t current_bytes;
    int64_t peak_bytes;
    int64_t total_bytes;
    /* The same for the number of allocations. Zero unless statistics_enabled. */
    int64_t current_allocations;
    int64_t peak_allocations;
    int64_t total_allocations;
    /* Allocations of this configuration not yet freed (counted with statistics off too). */
    uint64_t outstanding_allocations;
    /* Bytes the resource holds from the device: the pool's chunks, the driver pool's reserved
     * memory; for _CUDA the same as current_bytes when counted, else 0. */
    uint64_t pool_size;
    /* Failed allocations and refused frees since the device's resource was built. */
    uint64_t failed_allocations;
    uint64_t failed_frees;
    /* Nonzero when the counters above are counted. */
    int32_t statistics_enabled;
    /* The device these numbers are for. */
    int32_t device;
    /* The most pool_size reached since the device's resource was built or since the last
     * rmm_rs_reset_peak_statistics (PyTorch's reserved_bytes.all.peak): a pool gives nothing
     * back while configured, so for _POOL it is pool_size; for _ASYNC the driver pool's high
     * watermark until the first reset, then the most any rmm_rs_get_statistics call read; for
     * _CUDA peak_bytes. */
    uint64_t peak_pool_size;
    /* The failed allocations that were out of memory (RMM_RS_ERROR_OUT_OF_MEMORY), counted in
     * failed_allocations too (PyTorch's num_ooms). */
    uint64_t out_of_memory_failures;
} rmm_rs_statistics;

/* The ABI version of the loaded library (compare with RMM_RS_ABI_VERSION). */
uint32_t rmm_rs_abi_version(void);

/* The rmm-rs version, e.g. "0.1.0" (a static string). */
const char *rmm_rs_version(void);

/* Fills *options with the defaults: a pool of RMM_RS_SIZE_DEFAULT initial and maximum size,
 * device memory, no log, statistics on, every device. Fails only for NULL. */
int rmm_rs_options_init(rmm_rs_options *options);

/* Parses a byte size: "1024", "256KiB", "8GiB", "1.5GB", "2 MiB" (binary and decimal units,
 * case-insensitive) into *bytes. */
int rmm_rs_parse_byte_size(const char *text, uint64_t *bytes);

/* Configures devices as *options says (see rmm_rs_options.num_devices); call it before the
 * first allocation. Replaces what an earlier call configured for those devices; fails with
 * RMM_RS_ERROR_BUSY, changing nothing, while any of them has allocations outstanding. A
 * replaced pool returns its free memory to the device.
 * Racing with allocations: call it while no other thread allocates or frees on the devices it
 * changes. If one does, nothing is undefined: the replaced resource is retired, never
 * destroyed while the library is loaded, so an allocation served by it in the race stays
 * valid; but the BUSY check cannot see an allocation made during the call, and a later free of
 * such memory goes to the new resource, which refuses it where it can tell
 * (RMM_RS_ERROR_INVALID_FREE, counted in failed_frees), so that memory stays allocated until
 * the process exits. */
int rmm_rs_configure(const rmm_rs_options *options);

/* Allocates size bytes on device (an ordinal) ordered on stream: PyTorch's alloc signature.
 * rmm_rs_configure must have configured device first (else RMM_RS_ERROR_NOT_CONFIGURED).
 * Returns NULL for size 0 and on failure (then rmm_rs_last_error() says why; a negative size
 * is RMM_RS_ERROR_INVALID_ARGUMENT). A success leaves the last error as it was: to test the
 * code after a NULL, call rmm_rs_clear_last_error() first, or use rmm_rs_allocate. */
void *rmm_rs_alloc(ssize_t size, int device, void *stream);

/* As rmm_rs_alloc, returning the status: RMM_RS_SUCCESS with *ptr the memory (NULL for size
 * 0), or an RMM_RS_ERROR_* code with *ptr NULL (RMM_RS_ERROR_INVALID_ARGUMENT for a NULL ptr
 * or a size above SSIZE_MAX). */
int rmm_rs_allocate(void **ptr, size_t size, int device, void *stream);

/* Frees ptr, allocated by rmm_rs_alloc (or rmm_rs_torch_alloc) with the same size and device,
 * ordered on stream (the allocation's stream, or one ordered after the last work on the
 * memory): PyTorch's free signature. NULL does nothing. A free the resource detects as wrong
 * is refused, counted in failed_frees and reported by rmm_rs_last_error(), and so is a free
 * while the device has no allocation outstanding; what it cannot detect (memory still in use,
 * a pointer of another allocator on the plain _CUDA resource while others are outstanding) is
 * undefined behaviour, as for cudaFree. rmm_rs_deallocate returns the status instead. */
void rmm_rs_free(void *ptr, ssize_t size, int device, void *stream);

/* As rmm_rs_free, returning the status: RMM_RS_SUCCESS, or RMM_RS_ERROR_INVALID_FREE for a free
 * the resource refused (the memory stays allocated), or another code. */
int rmm_rs_deallocate(void *ptr, size_t size, int device, void *stream);

/* The hooks for torch.cuda.memory.CUDAPluggableAllocator(path, "rmm_rs_torch_alloc",
 * "rmm_rs_torch_free"). As rmm_rs_alloc and rmm_rs_free, except that stream 0 is always the
 * legacy stream (PyTorch's default stream), that a failed allocation throws a C++ exception
 * derived from std::bad_alloc (rmm_rs::out_of_memory for RMM_RS_ERROR_OUT_OF_MEMORY, else
 * rmm_rs::bad_alloc) whose what() is the message, since PyTorch would otherwise hand out a
 * tensor with a null data pointer, and that a refused free is also written to stderr (the
 * first few). Call rmm_rs_torch_alloc only from C++ code that can catch. */
void *rmm_rs_torch_alloc(ssize_t size, int device, void *stream);
void rmm_rs_torch_free(void *ptr, ssize_t size, int device, void *stream);

/* Writes the statistics of device to *out. A configured device whose resource is not built
 * yet reports zeros. RMM_RS_ERROR_NOT_CONFIGURED for a device never configured. */
int rmm_rs_get_statistics(int device, rmm_rs_statistics *out);

/* Resets the peaks of device (peak_bytes, peak_allocations, peak_pool_size) to their current
 * values, as torch.cuda.reset_peak_memory_stats; totals and failure counts stay. Nothing to do
 * for a configured device whose resource is not built yet. RMM_RS_ERROR_NOT_CONFIGURED for a
 * device never configured. */
int rmm_rs_reset_peak_statistics(int device);

/* Writes the memory snapshot of device to the file path (created or replaced) in the format of
 * PyTorch's torch.cuda.memory._dump_snapshot: a pickle with "segments" (the pool's chunks with
 * their blocks, allocated or free, and streams) and "device_traces", which PyTorch's viewer
 * (python -m torch.cuda._memory_viz, pytorch.org/memory_viz) and rmm-replay read. A configured
 * device whose resource is not built yet writes an empty snapshot. RMM_RS_ERROR_UNSUPPORTED
 * when the device's resource keeps no blocks (the message names it); RMM_RS_ERROR_INVALID_ARGUMENT
 * when the file cannot be written; RMM_RS_ERROR_NOT_CONFIGURED for a device never configured. */
int rmm_rs_dump_snapshot(int device, const char *path);

/* Writes the buffered rows of device's CSV log to its file; device -1: every device. Nothing
 * to do (no log, not built yet) is success. */
int rmm_rs_flush_log(int device);

/* The message of the last failed call on the calling thread ("" if none): a NUL-terminated
 * string owned by the library, valid until the next failing call on this thread. Successful
 * calls leave it (as errno); rmm_rs_clear_last_error resets it. */
const char *rmm_rs_last_error(void);

/* The status code of the last failed call on the calling thread (RMM_RS_SUCCESS if none). */
int rmm_rs_last_error_code(void);

/* Resets the calling thread's last error to RMM_RS_SUCCESS and "". */
void rmm_rs_clear_last_error(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* RMM_RS_H */
