//! Configuring the device pool other libraries allocate from.

use rmm_mr::{MrError, MrResult};
use rmm_sys::mempool::{
    device_current_mem_pool, mem_pool_get_attribute, mem_pool_set_attribute, mem_pool_trim_to,
};
use rmm_sys::{DeviceId, MemPoolAttribute, MemPoolHandle};

/// What a device's current pool holds (`CU_MEMPOOL_ATTR_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevicePoolState {
    /// The pool (`cuDeviceGetMemPool`).
    pub pool: MemPoolHandle,
    /// Bytes the pool keeps reserved across synchronizations.
    pub release_threshold: u64,
    /// Bytes the pool currently holds from the driver.
    pub reserved_current: u64,
    /// Bytes currently allocated from the pool.
    pub used_current: u64,
}

fn check_device(device: DeviceId) -> MrResult<()> {
    if device.value() < 0 {
        return Err(MrError::invalid_argument(format!(
            "invalid device ordinal {device}"
        )));
    }
    Ok(())
}

/// Reads the state of `device`'s current memory pool.
pub fn device_pool_state(device: DeviceId) -> MrResult<DevicePoolState> {
    check_device(device)?;
    let pool = device_current_mem_pool(device)?;
    let get = |attr| {
        // SAFETY: the device's current pool, just read from the driver, is live: the default
        // pool is never destroyed, and a pool that other code made current with
        // `cuDeviceSetMemPool` is that code's to keep alive while it is current; rmm-rs
        // assumes it is not destroyed during these few calls (rmm-rs never destroys a pool it
        // did not create).
        unsafe { mem_pool_get_attribute(pool, attr) }
    };
    Ok(DevicePoolState {
        pool,
        release_threshold: get(MemPoolAttribute::ReleaseThreshold)?,
        reserved_current: get(MemPoolAttribute::ReservedMemCurrent)?,
        used_current: get(MemPoolAttribute::UsedMemCurrent)?,
    })
}

/// Configures the pool cudarc, candle and cubecl allocate from: `device`'s current memory pool
/// (`cuDeviceGetMemPool`; the device's default pool unless someone replaced it).
///
/// Sets its release threshold to `release_threshold` bytes (`u64::MAX` keeps everything, as
/// RMM's async resource does; 0 is the driver's default) and, with `trim_to = Some(n)`, releases
/// unused memory down to `n` bytes now (`cuMemPoolTrimTo`). Returns the pool's state
/// afterwards.
///
/// # Errors
/// A negative device is [`MrError::InvalidArgument`] (before any CUDA call); no driver, an
/// unknown device or a device without memory pools is [`MrError::Cuda`].
pub fn configure_device_default_pool(
    device: DeviceId,
    release_threshold: u64,
    trim_to: Option<usize>,
) -> MrResult<DevicePoolState> {
    check_device(device)?;
    let pool = device_current_mem_pool(device)?;
    // SAFETY: as in `device_pool_state`: the device's current pool is live.
    unsafe {
        mem_pool_set_attribute(pool, MemPoolAttribute::ReleaseThreshold, release_threshold)?;
        if let Some(keep) = trim_to {
            mem_pool_trim_to(pool, keep)?;
        }
    }
    device_pool_state(device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_devices_are_rejected_before_cuda() {
        assert!(matches!(
            configure_device_default_pool(DeviceId(-1), 0, None),
            Err(MrError::InvalidArgument(_))
        ));
        assert!(matches!(
            device_pool_state(DeviceId(-3)),
            Err(MrError::InvalidArgument(_))
        ));
    }

    #[test]
    fn without_a_driver_it_is_an_error_not_a_panic() {
        if !rmm_sys::is_driver_present() {
            let e = configure_device_default_pool(DeviceId(0), u64::MAX, Some(0)).unwrap_err();
            assert!(e.is_no_device(), "{e}");
        }
    }
}
