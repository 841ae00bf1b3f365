//! A driver pool's statistics ([`PoolStatistics`]), read from its attributes: what the driver
//! pools report and what their out-of-memory reports quote.

use rmm_sys::mempool;
use rmm_sys::{MemPoolAttribute, MemPoolHandle};

use crate::error::MrResult;

/// Live statistics of a driver pool, read from its attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStatistics {
    /// Bytes the pool holds from the driver now (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`;
    /// PyTorch's `memory_reserved`).
    pub reserved_current: u64,
    /// High watermark of `reserved_current`.
    pub reserved_high: u64,
    /// Bytes allocated to users now (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`; PyTorch's
    /// `memory_allocated`).
    pub used_current: u64,
    /// High watermark of `used_current`.
    pub used_high: u64,
}

/// Reads a pool's statistics.
///
/// # Safety
/// `pool` is a live pool (see [`MemPoolHandle`]).
pub(crate) unsafe fn pool_statistics(pool: MemPoolHandle) -> MrResult<PoolStatistics> {
    use MemPoolAttribute as A;
    let get = |attr| {
        // SAFETY: the caller's contract.
        unsafe { mempool::mem_pool_get_attribute(pool, attr) }
    };
    Ok(PoolStatistics {
        reserved_current: get(A::ReservedMemCurrent)?,
        reserved_high: get(A::ReservedMemHigh)?,
        used_current: get(A::UsedMemCurrent)?,
        used_high: get(A::UsedMemHigh)?,
    })
}
