//! The user guide: the pages of `docs/guide/`, one module each.
//!
//! The modules are empty; each one's documentation is a page of the guide, included here so
//! that `cargo test -p rmm-rs --doc --all-features guide` compiles every code block in the guide
//! (the logging page needs the `debug-log` feature; blocks that need a GPU are compiled but not
//! run) and `cargo doc` publishes the guide with the API.
//!
//! 1. [`introduction`]: what rmm-rs is, a first program, errors and threads.
//! 2. [`choosing_a_memory_resource`]: the resources and adaptors, and which to use.
//! 3. [`stream_ordered_allocation`]: streams, events and the stream-ordering rule.
//! 4. [`pool_allocators`]: pool, arena, binning and fixed-size sub-allocators.
//! 5. [`managed_memory`]: managed, async managed, prefetching and system memory.
//! 6. [`logging_and_profiling`]: the CSV log, statistics, tracking and debug logging.
//! 7. [`multiple_devices`]: the per-device registry, device guards and containers.
//! 8. [`coming_from_rmm`]: RMM's C++ and Python names, and what rmm-rs does differently.
//! 9. [`replaying_logs`]: `rmm-replay`, simulated memory, and what a log's replay tells.
//! 10. [`fragmentation`]: where fragmentation comes from, the VMM pool, and the figures.
//! 11. [`pytorch_and_c`]: rmm-rs as PyTorch's allocator, and the C library (crate `rmm-capi`).
//! 12. [`cudarc_candle_and_burn`]: the cudarc version, interop, and sharing the driver pool.
//! 13. [`cuda_graphs`]: allocating under stream capture, graph pools, and the rules of capture.
//! 14. [`ipc_peer_and_pinned`]: IPC between processes, peer access, and pinned host memory.
//! 15. [`why_did_my_allocation_fail`]: out-of-memory reports, snapshots for PyTorch's viewer,
//!     profiling by region, and a replay that finds fragmentation.

#[doc = include_str!("../guide/01-introduction.md")]
pub mod introduction {}

#[doc = include_str!("../guide/02-choosing-a-memory-resource.md")]
pub mod choosing_a_memory_resource {}

#[doc = include_str!("../guide/03-stream-ordered-allocation.md")]
pub mod stream_ordered_allocation {}

#[doc = include_str!("../guide/04-pool-allocators.md")]
pub mod pool_allocators {}

#[doc = include_str!("../guide/05-managed-memory.md")]
pub mod managed_memory {}

#[doc = include_str!("../guide/06-logging-and-profiling.md")]
pub mod logging_and_profiling {}

#[doc = include_str!("../guide/07-multiple-devices.md")]
pub mod multiple_devices {}

#[doc = include_str!("../guide/08-coming-from-rmm.md")]
pub mod coming_from_rmm {}

#[doc = include_str!("../guide/09-replaying-logs.md")]
pub mod replaying_logs {}

#[doc = include_str!("../guide/10-fragmentation.md")]
pub mod fragmentation {}

#[doc = include_str!("../guide/11-pytorch-and-c.md")]
pub mod pytorch_and_c {}

#[doc = include_str!("../guide/12-cudarc-candle-and-burn.md")]
pub mod cudarc_candle_and_burn {}

#[doc = include_str!("../guide/13-cuda-graphs.md")]
pub mod cuda_graphs {}
#[doc = include_str!("../guide/14-ipc-peer-and-pinned.md")]
pub mod ipc_peer_and_pinned {}
#[doc = include_str!("../guide/15-why-did-my-allocation-fail.md")]
pub mod why_did_my_allocation_fail {}
