//! The C structs and constants of `rmm_rs.h`, field for field (the `header` test compares
//! them with the header).

use std::ffi::c_char;

/// `RMM_RS_ABI_VERSION`: bumped on every change of a signature, struct or constant.
pub const RMM_RS_ABI_VERSION: u32 = 3;

/// `RMM_RS_RESOURCE_CUDA`: the driver's allocator per call.
pub const RMM_RS_RESOURCE_CUDA: i32 = 0;
/// `RMM_RS_RESOURCE_POOL`: a pool over the driver's allocator.
pub const RMM_RS_RESOURCE_POOL: i32 = 1;
/// `RMM_RS_RESOURCE_ASYNC`: the driver's stream-ordered pool.
pub const RMM_RS_RESOURCE_ASYNC: i32 = 2;

/// `RMM_RS_SIZE_DEFAULT`: a size option left at its default.
pub const RMM_RS_SIZE_DEFAULT: u64 = u64::MAX;

/// `RMM_RS_STREAM_LEGACY`: the legacy default stream's handle (`CU_STREAM_LEGACY`).
pub const RMM_RS_STREAM_LEGACY: usize = 0x1;
/// `RMM_RS_STREAM_PER_THREAD`: the calling thread's per-thread default stream's handle
/// (`CU_STREAM_PER_THREAD`).
pub const RMM_RS_STREAM_PER_THREAD: usize = 0x2;

/// `rmm_rs_options`: what `rmm_rs_configure` builds (see the header for each field).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RmmRsOptions {
    /// `RMM_RS_RESOURCE_*`.
    pub resource: i32,
    /// Nonzero: managed memory.
    pub managed_memory: i32,
    /// The pool's first chunk (or the driver pool's priming), `RMM_RS_SIZE_DEFAULT` for the
    /// default.
    pub initial_pool_size: u64,
    /// The pool's maximum, `RMM_RS_SIZE_DEFAULT` for none.
    pub maximum_pool_size: u64,
    /// The CSV log's base path, or null for no log.
    pub log_file: *const c_char,
    /// Nonzero: count bytes and allocations.
    pub statistics: i32,
    /// 0: every device, lazily; N: the `devices` array, now.
    pub num_devices: i32,
    /// `num_devices` device ordinals.
    pub devices: *const i32,
}

impl Default for RmmRsOptions {
    /// `rmm_rs_options_init`'s defaults: a pool of default sizes on device memory, no log,
    /// statistics on, every device.
    fn default() -> Self {
        Self {
            resource: RMM_RS_RESOURCE_POOL,
            managed_memory: 0,
            initial_pool_size: RMM_RS_SIZE_DEFAULT,
            maximum_pool_size: RMM_RS_SIZE_DEFAULT,
            log_file: std::ptr::null(),
            statistics: 1,
            num_devices: 0,
            devices: std::ptr::null(),
        }
    }
}

/// `rmm_rs_statistics`: what `rmm_rs_get_statistics` reports (see the header for each field).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RmmRsStatistics {
    /// Bytes outstanding (as requested).
    pub current_bytes: i64,
    /// Their peak.
    pub peak_bytes: i64,
    /// Their running total.
    pub total_bytes: i64,
    /// Allocations outstanding.
    pub current_allocations: i64,
    /// Their peak.
    pub peak_allocations: i64,
    /// Their running total.
    pub total_allocations: i64,
    /// Allocations not yet freed, counted with statistics off too.
    pub outstanding_allocations: u64,
    /// Bytes the resource holds from the device.
    pub pool_size: u64,
    /// Failed allocations.
    pub failed_allocations: u64,
    /// Refused frees.
    pub failed_frees: u64,
    /// Nonzero when the six counters are counted.
    pub statistics_enabled: i32,
    /// The device.
    pub device: i32,
    /// The most `pool_size` since the resource was built or the last peak reset.
    pub peak_pool_size: u64,
    /// The failed allocations that were out of memory.
    pub out_of_memory_failures: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn layouts_are_the_headers() {
        // x86-64 and aarch64 Linux (LP64): what a C compiler lays out for the header.
        assert_eq!(size_of::<RmmRsOptions>(), 48);
        assert_eq!(align_of::<RmmRsOptions>(), 8);
        assert_eq!(offset_of!(RmmRsOptions, initial_pool_size), 8);
        assert_eq!(offset_of!(RmmRsOptions, log_file), 24);
        assert_eq!(offset_of!(RmmRsOptions, statistics), 32);
        assert_eq!(offset_of!(RmmRsOptions, devices), 40);
        assert_eq!(size_of::<RmmRsStatistics>(), 104);
        assert_eq!(offset_of!(RmmRsStatistics, statistics_enabled), 80);
        assert_eq!(offset_of!(RmmRsStatistics, peak_pool_size), 88);
        assert_eq!(offset_of!(RmmRsStatistics, out_of_memory_failures), 96);
    }
}
