//! Pure bookkeeping of the pool resource (RMM's `pool_memory_resource`), no CUDA calls.
//!
//! - [`free_list`]: the coalescing best-fit free list (O(log n) insert, best fit and release,
//!   where RMM's address-ordered `std::list` is linear).
//! - [`growth`]: the pool growth policy (`size_to_grow`, the halving retry, the size checks and
//!   the out-of-memory messages).
//!
//! Addresses are plain `u64` and sizes `usize`; the CUDA-aware resource wraps these types.

pub mod free_list;
pub mod growth;
