// The C++ half of rmm-capi's PyTorch allocation hook (see src/torch.rs): the exceptions a
// failed allocation throws, as RMM's C++ declares them (rmm::bad_alloc, rmm::out_of_memory),
// derived from std::bad_alloc so that any C++ caller catches them as such.
//
// No CUDA header and no PyTorch header: nothing here needs one. The message is kept in a fixed
// buffer rather than a std::string so that the shim needs nothing of libstdc++ but the
// exception machinery (no dual-ABI string symbols), and copying an exception cannot throw.

#include <cstddef>
#include <cstring>
#include <new>

namespace rmm_rs {

// An allocation failure with rmm-rs's message (RMM's rmm::bad_alloc).
class bad_alloc : public std::bad_alloc {
  public:
    explicit bad_alloc(const char *what) noexcept {
        std::size_t n = what != nullptr ? std::strlen(what) : 0;
        if (n >= sizeof(what_)) {
            n = sizeof(what_) - 1;
        }
        if (n > 0) {
            std::memcpy(what_, what, n);
        }
        what_[n] = '\0';
    }
    const char *what() const noexcept override { return what_; }

  private:
    char what_[1024];
};

// Out of memory: the device, the pool's maximum or the driver's pool (RMM's
// rmm::out_of_memory).
class out_of_memory : public bad_alloc {
  public:
    explicit out_of_memory(const char *what) noexcept : bad_alloc(what) {}
};

} // namespace rmm_rs

// Must match RMM_RS_ERROR_OUT_OF_MEMORY in include/rmm_rs.h.
static const int out_of_memory_code = 2;

extern "C" [[noreturn]] void rmm_rs_cxx_throw(int code, const char *what) {
    if (code == out_of_memory_code) {
        throw rmm_rs::out_of_memory(what);
    }
    throw rmm_rs::bad_alloc(what);
}
