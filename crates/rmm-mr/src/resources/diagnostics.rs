//! Out-of-memory reports of the base resources and the driver's pools (cold paths only).

use rmm_sys::MemPoolHandle;

use crate::diagnostics::{OomReport, Verdict};
use crate::error::MrError;

/// `e` with a report of the device's memory attached when it is out-of-memory: the device's
/// total as reserved, what `cuMemGetInfo` says is free, the rest in use.
#[cold]
#[inline(never)]
pub(crate) fn with_device_report(e: MrError, resource: &'static str) -> MrError {
    if !e.is_out_of_memory() {
        return e;
    }
    e.with_oom_report(|requested| {
        let (free, total) = rmm_sys::available_device_memory().unwrap_or((0, 0));
        OomReport {
            resource,
            reserved: total,
            in_use: total.saturating_sub(free),
            free,
            // The driver does not say how its free memory is split.
            largest_free_block: free,
            device_free: Some(free),
            ..OomReport::new(requested)
        }
        .classified(false, false)
    })
}

/// `e` with a report of the driver pool `pool` attached when it is out-of-memory: the pool's
/// reserved and used bytes (`CU_MEMPOOL_ATTR_*_MEM_CURRENT`) and the device's free memory.
/// Fragmentation when the pool's own free bytes covered the request (the driver could not
/// place it), else capacity.
///
/// # Safety
/// `pool` is a live pool.
#[cold]
#[inline(never)]
pub(crate) unsafe fn with_pool_report(
    e: MrError,
    pool: MemPoolHandle,
    resource: &'static str,
) -> MrError {
    if !e.is_out_of_memory() {
        return e;
    }
    // SAFETY: the caller's contract.
    let stats = unsafe { super::pool_statistics::pool_statistics(pool) }.ok();
    e.with_oom_report(|requested| {
        let as_usize = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        let (reserved, in_use) = stats.map_or((0, 0), |s| {
            (as_usize(s.reserved_current), as_usize(s.used_current))
        });
        let free = reserved.saturating_sub(in_use);
        let device_free = rmm_sys::available_device_memory().ok().map(|(f, _)| f);
        OomReport {
            resource,
            reserved,
            in_use,
            free,
            largest_free_block: 0,
            device_free,
            verdict: if free >= requested {
                Verdict::Fragmentation
            } else {
                Verdict::Capacity
            },
            ..OomReport::new(requested)
        }
    })
}
