/*
 * test_capi.c: the C API of rmm-rs from C, linked against librmm_capi.a (or .so):
 *
 *   cc -std=c11 -Wall -Wextra -Werror -I crates/rmm-capi/include \
 *      crates/rmm-capi/tests/c/test_capi.c target/debug/librmm_capi.a \
 *      -lstdc++ -ldl -lpthread -lm -o test_capi
 *   ./test_capi [DIR]      (DIR: where the CSV log goes; default $TMPDIR or /tmp)
 *
 * The checks that need no GPU always run; those that need one run when device 0 can be
 * configured, and are counted as skipped (with the reason) otherwise. The last line is
 * "test_capi: N passed, M failed, K skipped"; the exit status is 1 when anything failed.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmm_rs.h"

/* The layout the Rust side has (crates/rmm-capi/src/abi.rs tests the same numbers). */
_Static_assert(sizeof(rmm_rs_options) == 48, "rmm_rs_options is 48 bytes");
_Static_assert(offsetof(rmm_rs_options, log_file) == 24, "log_file at 24");
_Static_assert(offsetof(rmm_rs_options, devices) == 40, "devices at 40");
_Static_assert(sizeof(rmm_rs_statistics) == 104, "rmm_rs_statistics is 104 bytes");
_Static_assert(offsetof(rmm_rs_statistics, peak_pool_size) == 88, "peak_pool_size at 88");
_Static_assert(offsetof(rmm_rs_statistics, statistics_enabled) == 80, "flag at 80");

static int passed, failed, skipped;

#define CHECK(cond, ...)                                                                          \
    do {                                                                                          \
        if (cond) {                                                                               \
            passed++;                                                                             \
        } else {                                                                                  \
            failed++;                                                                             \
            printf("FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond);                              \
            printf(__VA_ARGS__);                                                                  \
            printf(" (last error %d: %s)\n", rmm_rs_last_error_code(), rmm_rs_last_error());     \
        }                                                                                         \
    } while (0)

#define MiB ((uint64_t)1 << 20)
#define LEGACY RMM_RS_STREAM_LEGACY

/* The header's stream handles are the driver's (cuda.h is not needed to use them). */
_Static_assert(sizeof(RMM_RS_STREAM_LEGACY) == sizeof(void *), "a stream handle");

static int contains(const char *text, const char *word) { return strstr(text, word) != NULL; }

static void *fresh_thread_sees_no_error(void *unused) {
    (void)unused;
    int ok = rmm_rs_last_error_code() == RMM_RS_SUCCESS && rmm_rs_last_error()[0] == '\0';
    return ok ? (void *)1 : NULL;
}

/* A thread with no CUDA context allocates and frees on the legacy stream. */
static void *fresh_thread_allocates(void *unused) {
    (void)unused;
    void *p = rmm_rs_alloc(4096, 0, LEGACY);
    if (p == NULL) {
        return NULL;
    }
    rmm_rs_clear_last_error();
    rmm_rs_free(p, 4096, 0, LEGACY);
    return rmm_rs_last_error_code() == RMM_RS_SUCCESS ? (void *)1 : NULL;
}

static void host_checks(void) {
    CHECK(rmm_rs_abi_version() == RMM_RS_ABI_VERSION, "abi %u", rmm_rs_abi_version());
    CHECK(strlen(rmm_rs_version()) > 0, "empty version");

    CHECK(rmm_rs_options_init(NULL) == RMM_RS_ERROR_INVALID_ARGUMENT, "NULL options accepted");
    CHECK(contains(rmm_rs_last_error(), "NULL"), "message: %s", rmm_rs_last_error());
    rmm_rs_options o;
    CHECK(rmm_rs_options_init(&o) == RMM_RS_SUCCESS, "init failed");
    CHECK(o.resource == RMM_RS_RESOURCE_POOL && o.statistics == 1 && o.num_devices == 0 &&
              o.initial_pool_size == RMM_RS_SIZE_DEFAULT &&
              o.maximum_pool_size == RMM_RS_SIZE_DEFAULT && o.log_file == NULL,
          "defaults");

    uint64_t bytes = 0;
    CHECK(rmm_rs_parse_byte_size("8GiB", &bytes) == RMM_RS_SUCCESS && bytes == 8ull << 30,
          "8GiB is %llu", (unsigned long long)bytes);
    CHECK(rmm_rs_parse_byte_size("lots", &bytes) == RMM_RS_ERROR_INVALID_ARGUMENT, "parsed lots");

    o.initial_pool_size = 100;
    CHECK(rmm_rs_configure(&o) == RMM_RS_ERROR_INVALID_ARGUMENT, "100-byte pool accepted");
    CHECK(contains(rmm_rs_last_error(), "256"), "message: %s", rmm_rs_last_error());
    int device = -2;
    rmm_rs_options_init(&o);
    o.num_devices = 1;
    o.devices = &device;
    CHECK(rmm_rs_configure(&o) == RMM_RS_ERROR_INVALID_ARGUMENT, "device -2 accepted");

    pthread_t t;
    void *ok = NULL;
    CHECK(pthread_create(&t, NULL, fresh_thread_sees_no_error, NULL) == 0 &&
              pthread_join(t, &ok) == 0 && ok != NULL,
          "another thread saw this thread's error");
    rmm_rs_clear_last_error();
    CHECK(rmm_rs_last_error_code() == RMM_RS_SUCCESS && rmm_rs_last_error()[0] == '\0',
          "not cleared");

    rmm_rs_free(NULL, 0, 0, NULL);
    CHECK(rmm_rs_last_error_code() == RMM_RS_SUCCESS, "free(NULL) failed");
    CHECK(rmm_rs_alloc(-1, 0, NULL) == NULL &&
              rmm_rs_last_error_code() == RMM_RS_ERROR_INVALID_ARGUMENT,
          "negative size");
    rmm_rs_statistics s;
    CHECK(rmm_rs_get_statistics(4000, &s) == RMM_RS_ERROR_NOT_CONFIGURED, "device 4000");
    CHECK(rmm_rs_flush_log(-1) == RMM_RS_SUCCESS, "flush of nothing");

    /* The stream constants are the driver's handles. */
    CHECK((uintptr_t)RMM_RS_STREAM_LEGACY == 0x1 && (uintptr_t)RMM_RS_STREAM_PER_THREAD == 0x2,
          "stream constants");

    /* The status-returning calls: the status, not a stale last error, says what happened. */
    void *p = (void *)&s;
    CHECK(rmm_rs_allocate(&p, 256, 4000, RMM_RS_STREAM_PER_THREAD) ==
                  RMM_RS_ERROR_NOT_CONFIGURED &&
              p == NULL,
          "allocate on an unconfigured device: %p", p);
    CHECK(contains(rmm_rs_last_error(), "rmm_rs_configure"), "message: %s", rmm_rs_last_error());
    CHECK(rmm_rs_allocate(NULL, 256, 0, NULL) == RMM_RS_ERROR_INVALID_ARGUMENT, "NULL ptr");
    CHECK(rmm_rs_allocate(&p, SIZE_MAX, 0, NULL) == RMM_RS_ERROR_INVALID_ARGUMENT && p == NULL,
          "a size above SSIZE_MAX");
    /* A success leaves the last error (as errno): its status is what tells. */
    CHECK(rmm_rs_deallocate(NULL, 0, 0, NULL) == RMM_RS_SUCCESS &&
              rmm_rs_last_error_code() == RMM_RS_ERROR_INVALID_ARGUMENT,
          "free(NULL) is a success that leaves the last error");
    p = (void *)&s;
    CHECK(rmm_rs_allocate(&p, 0, 4000, NULL) == RMM_RS_SUCCESS && p == NULL,
          "size 0 is a success and NULL, whatever the device");
    rmm_rs_clear_last_error();
    CHECK(rmm_rs_alloc(0, 0, NULL) == NULL && rmm_rs_last_error_code() == RMM_RS_SUCCESS,
          "rmm_rs_alloc of 0 bytes after a clear: NULL and no error");
    CHECK(rmm_rs_deallocate((void *)0x1000, 256, 4000, NULL) == RMM_RS_ERROR_INVALID_FREE,
          "a free on a device with nothing allocated is refused");
}

static int read_first_line(const char *path, char *line, size_t n, int *has_failure_row) {
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    int ok = fgets(line, (int)n, f) != NULL;
    char row[512];
    *has_failure_row = 0;
    while (fgets(row, sizeof row, f) != NULL) {
        if (contains(row, ",allocate failure,")) {
            *has_failure_row = 1;
        }
    }
    fclose(f);
    line[strcspn(line, "\r\n")] = '\0';
    return ok;
}

static void gpu_checks(const char *dir) {
    char log_base[4096], log_dev0[4096];
    snprintf(log_base, sizeof log_base, "%s/test_capi_log.csv", dir);
    snprintf(log_dev0, sizeof log_dev0, "%s/test_capi_log.dev0.csv", dir);

    int device = 0;
    rmm_rs_options o;
    rmm_rs_options_init(&o);
    o.initial_pool_size = 64 * MiB;
    o.maximum_pool_size = 256 * MiB;
    o.log_file = log_base;
    o.num_devices = 1;
    o.devices = &device;
    int code = rmm_rs_configure(&o);
    if (code == RMM_RS_ERROR_NO_DEVICE) {
        CHECK(strlen(rmm_rs_last_error()) > 0, "no reason given");
        skipped += 17;
        printf("skipped 17 GPU checks: %s\n", rmm_rs_last_error());
        return;
    }
    CHECK(code == RMM_RS_SUCCESS, "configure: %d", code);
    if (code != RMM_RS_SUCCESS) {
        return;
    }
    rmm_rs_statistics s;
    CHECK(rmm_rs_get_statistics(0, &s) == RMM_RS_SUCCESS && s.pool_size == 64 * MiB &&
              s.current_bytes == 0 && s.statistics_enabled == 1,
          "fresh pool: size %llu", (unsigned long long)s.pool_size);

    void *p = rmm_rs_alloc((ssize_t)MiB, 0, NULL);
    CHECK(p != NULL && (uintptr_t)p % 256 == 0, "1 MiB: %p", p);
    rmm_rs_get_statistics(0, &s);
    CHECK(s.current_bytes == (int64_t)MiB && s.outstanding_allocations == 1, "counted %lld",
          (long long)s.current_bytes);

    rmm_rs_clear_last_error();
    void *big = rmm_rs_alloc((ssize_t)(512 * MiB), 0, NULL);
    CHECK(big == NULL && rmm_rs_last_error_code() == RMM_RS_ERROR_OUT_OF_MEMORY &&
              contains(rmm_rs_last_error(), "out_of_memory"),
          "512 MiB over a 256 MiB maximum");

    pthread_t t;
    void *ok = NULL;
    CHECK(pthread_create(&t, NULL, fresh_thread_allocates, NULL) == 0 &&
              pthread_join(t, &ok) == 0 && ok != NULL,
          "a thread without a context could not allocate");

    rmm_rs_clear_last_error();
    rmm_rs_free((char *)p + 256, (ssize_t)MiB, 0, NULL);
    CHECK(rmm_rs_last_error_code() == RMM_RS_ERROR_INVALID_FREE, "a wrong free passed");
    CHECK(rmm_rs_deallocate((char *)p + 256, MiB, 0, NULL) == RMM_RS_ERROR_INVALID_FREE,
          "a wrong free returned success");

    /* The status-returning pair, on the per-thread default stream's constant. */
    void *r = NULL;
    CHECK(rmm_rs_allocate(&r, MiB, 0, RMM_RS_STREAM_PER_THREAD) == RMM_RS_SUCCESS && r != NULL,
          "allocate on the per-thread stream");
    CHECK(rmm_rs_deallocate(r, MiB, 0, RMM_RS_STREAM_PER_THREAD) == RMM_RS_SUCCESS,
          "deallocate on the per-thread stream");
    void *none = (void *)&s;
    CHECK(rmm_rs_allocate(&none, 512 * MiB, 0, LEGACY) == RMM_RS_ERROR_OUT_OF_MEMORY &&
              none == NULL,
          "allocate over the maximum");

    o.log_file = NULL;
    o.num_devices = 1;
    CHECK(rmm_rs_configure(&o) == RMM_RS_ERROR_BUSY, "reconfigured under a live allocation");
    rmm_rs_free(p, (ssize_t)MiB, 0, NULL);
    rmm_rs_get_statistics(0, &s);
    CHECK(s.outstanding_allocations == 0 && s.failed_frees == 2 && s.failed_allocations == 2 &&
              s.out_of_memory_failures == 2 && s.peak_bytes >= (int64_t)MiB &&
              s.peak_pool_size >= s.pool_size && s.pool_size >= 64 * MiB,
          "after the frees: %llu outstanding", (unsigned long long)s.outstanding_allocations);
    CHECK(rmm_rs_reset_peak_statistics(0) == RMM_RS_SUCCESS &&
              rmm_rs_get_statistics(0, &s) == RMM_RS_SUCCESS && s.peak_bytes == s.current_bytes &&
              s.peak_allocations == 0 && s.peak_pool_size == s.pool_size && s.total_allocations >= 3,
          "peaks reset: peak %lld, current %lld", (long long)s.peak_bytes,
          (long long)s.current_bytes);

    CHECK(rmm_rs_flush_log(0) == RMM_RS_SUCCESS, "flush");
    char header[256];
    int failure_row = 0;
    CHECK(read_first_line(log_dev0, header, sizeof header, &failure_row) &&
              strcmp(header, "Thread,Time,Action,Pointer,Size,Stream") == 0 && failure_row,
          "the log %s", log_dev0);

    /* Every device, lazily, on the driver's allocator: built on first use. */
    rmm_rs_options_init(&o);
    o.resource = RMM_RS_RESOURCE_CUDA;
    CHECK(rmm_rs_configure(&o) == RMM_RS_SUCCESS, "every device");
    void *q = rmm_rs_alloc(1000, 0, LEGACY);
    rmm_rs_clear_last_error();
    rmm_rs_free(q, 1000, 0, LEGACY);
    CHECK(q != NULL && rmm_rs_last_error_code() == RMM_RS_SUCCESS, "cuda resource");
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : getenv("TMPDIR");
    if (dir == NULL || dir[0] == '\0') {
        dir = "/tmp";
    }
    host_checks();
    gpu_checks(dir);
    printf("test_capi: %d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed > 0 ? 1 : 0;
}
