//! The pool resource (RMM's `pool_memory_resource`) and its pure bookkeeping.
//!
//! Pure bookkeeping, no CUDA calls:
//!
//! - [`free_list`]: the coalescing best-fit free list (O(log n) insert, best fit and release,
//!   where RMM's address-ordered `std::list` is linear).
//! - [`growth`]: the pool growth policy (`size_to_grow`, the halving retry, the size checks and
//!   the out-of-memory messages).
//! - `event_policy`: when an ordinary stream's list records its event and what a thief may do
//!   with it (the lazy rule shared with the fixed-size resource).
//!
//! Addresses there are plain `u64` and sizes `usize`. The CUDA-aware part:
//!
//! - [`PoolMemoryResource`], built on the stream-ordered core it shares with the fixed-size
//!   resource (`stream_ordered`: per-stream lists, stealing, merging, growth, the record of
//!   handed-out blocks) and its stream machinery (`stream_lists`: stream keys, the per-thread
//!   list cache, events and the lazy event rule; `append_only`: where the lists live). The
//!   pool's record of handed-out blocks is a sharded map (`handed`).

pub mod free_list;
pub mod growth;
mod resource;

pub use resource::PoolMemoryResource;
