//! # rmm-capi: the C ABI of rmm-rs
//!
//! A C library (`librmm_capi.so`, `librmm_capi.a`, header `include/rmm_rs.h`) over the
//! [`rmm`] facade, for C and C++ programs and for PyTorch, which loads it as its CUDA
//! allocator through `torch.cuda.memory.CUDAPluggableAllocator(path, "rmm_rs_torch_alloc",
//! "rmm_rs_torch_free")` (`python/rmm_rs_torch.py` does that). The guide page "Using rmm-rs from
//! PyTorch and C" (`rmm::guide::pytorch_and_c`) shows both.
//!
//! **Contract.**
//! - The header is the specification; every function it declares is an `extern "C"` function
//!   of [`ffi`] or [`torch`] with the same signature, and its structs and constants are those of
//!   [`abi`] and [`status`] (the `header` test checks all of it).
//! - Nothing unwinds into C: every entry point runs behind [`std::panic::catch_unwind`] and a
//!   panic becomes `RMM_RS_ERROR_PANIC`. The one exception is `rmm_rs_torch_alloc`, which throws
//!   a C++ `std::bad_alloc` on failure by design, because PyTorch does not check for null.
//! - Errors are status codes with a thread-local message (`rmm_rs_last_error`), mapped from
//!   [`rmm::MrError`] kind by kind, out-of-memory distinct.
//! - Foreign threads are welcome: before its first driver call that needs a context, a call
//!   for device N makes N's primary context current, and puts back a context it replaced
//!   ([`rmm::sys::DeferredPrimaryContext`]); a call that needs none (a pool serving from its
//!   free memory) makes no context call at all.
//! - The allocation and free entry points are a short path: one atomic load finds the device's
//!   stack, a pool (with or without statistics) is called directly, failures are handled out
//!   of line (`benches/capi_pair_count.rs` counts its instructions; `docs/performance.md`).
//! - Streams from C are foreign handles: wrapping one is `unsafe` in Rust, so the entry points
//!   that take one are `unsafe extern "C"` functions and the header states the contract the C
//!   caller takes on.
//!
//! What differs from RMM (whose C++ API has no C ABI and whose Python `rmm_torch_allocator`
//! needs RMM built with a CUDA toolkit): this library builds without a toolkit, counts what it
//! hands out so that reconfiguring a device with memory outstanding is refused instead of
//! corrupting it, and keeps a replaced pool alive (empty) rather than freeing memory under a
//! thread that may still name it.

pub mod abi;
mod config;
mod exit;
pub mod ffi;
mod last_error;
mod registry;
mod stack;
pub mod status;
#[cfg(test)]
mod test_support;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;
pub mod torch;

pub use abi::{RmmRsOptions, RmmRsStatistics};
