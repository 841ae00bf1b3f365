// test_torch_shim.cpp: the PyTorch hook rmm_rs_torch_alloc from C++, as PyTorch calls it: a
// failure must arrive as a C++ exception derived from std::bad_alloc carrying rmm-rs's
// message (rmm_rs::out_of_memory for exhaustion), never as a null pointer.
//
//   c++ -std=c++17 -Wall -Wextra -Werror -I crates/rmm-capi/include
//       crates/rmm-capi/tests/c/test_torch_shim.cpp target/debug/librmm_capi.a
//       -ldl -lpthread -lm -o test_torch_shim          (one line)
//
// Last line: "test_torch_shim: N passed, M failed, K skipped".

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <typeinfo>

#include "rmm_rs.h"

static int passed, failed, skipped;

#define CHECK(cond, what)                                                                         \
    do {                                                                                          \
        if (cond) {                                                                               \
            passed++;                                                                             \
        } else {                                                                                  \
            failed++;                                                                             \
            std::printf("FAILED %s:%d: %s: %s\n", __FILE__, __LINE__, #cond, what);               \
        }                                                                                         \
    } while (0)

struct Outcome {
    bool threw_bad_alloc = false;
    bool out_of_memory_type = false;
    char what[1024] = "";
    void *ptr = nullptr;
};

static Outcome torch_alloc(ssize_t size, int device) {
    Outcome o;
    try {
        o.ptr = rmm_rs_torch_alloc(size, device, nullptr);
    } catch (const std::bad_alloc &e) {
        o.threw_bad_alloc = true;
        o.out_of_memory_type = std::strstr(typeid(e).name(), "out_of_memory") != nullptr;
        std::snprintf(o.what, sizeof o.what, "%s", e.what());
    }
    return o;
}

int main() {
    // Device 4000 is never configured: the hook throws rmm_rs::bad_alloc with the reason.
    Outcome o = torch_alloc(256, 4000);
    CHECK(o.threw_bad_alloc && !o.out_of_memory_type, o.what);
    CHECK(std::strstr(o.what, "not configured") != nullptr, o.what);
    o = torch_alloc(-8, 4000);
    CHECK(o.threw_bad_alloc && std::strstr(o.what, "negative") != nullptr, o.what);
    o = torch_alloc(0, 4000);
    CHECK(!o.threw_bad_alloc && o.ptr == nullptr, "0 bytes threw");
    bool caught_as_std_exception = false;
    try {
        rmm_rs_torch_alloc(1, 4000, nullptr);
    } catch (const std::exception &e) {
        caught_as_std_exception = std::strlen(e.what()) > 0;
    }
    CHECK(caught_as_std_exception, "not a std::exception");
    rmm_rs_torch_free(nullptr, 0, 4000, nullptr);
    CHECK(rmm_rs_last_error_code() != RMM_RS_ERROR_PANIC, "free of null");

    int device = 0;
    rmm_rs_options opts;
    rmm_rs_options_init(&opts);
    opts.initial_pool_size = 0;
    opts.maximum_pool_size = 64u << 20;
    opts.num_devices = 1;
    opts.devices = &device;
    int code = rmm_rs_configure(&opts);
    if (code == RMM_RS_ERROR_NO_DEVICE) {
        skipped += 3;
        std::printf("skipped 3 GPU checks: %s\n", rmm_rs_last_error());
    } else {
        CHECK(code == RMM_RS_SUCCESS, rmm_rs_last_error());
        o = torch_alloc(128 << 20, 0);
        CHECK(o.threw_bad_alloc && o.out_of_memory_type, o.what);
        CHECK(std::strncmp(o.what, "std::bad_alloc: out_of_memory:", 30) == 0, o.what);
        o = torch_alloc(1 << 20, 0);
        CHECK(!o.threw_bad_alloc && o.ptr != nullptr, o.what);
        rmm_rs_torch_free(o.ptr, 1 << 20, 0, nullptr);
    }
    std::printf("test_torch_shim: %d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed > 0 ? 1 : 0;
}
