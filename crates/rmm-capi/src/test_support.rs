//! Stacks over host memory for the unit tests: the same assembly as on a GPU, over
//! [`HostMockResource`] (and a pool over it), with no CUDA call.

use std::sync::{Arc, OnceLock};

use rmm::mr::testing::{HostMockResource, PanickingResource};
use rmm::{DeviceId, MrResult, PoolMemoryResource, SharedResource};

use crate::config::{Config, ResourceKind};
use crate::stack::{assemble, pool_options, DeviceState, Holder};

/// [`crate::stack::build_on_device`] over host memory: a pool (initial size 0 by default) or
/// the plain mock.
pub(crate) fn build_on_host(config: &Config, device: DeviceId) -> MrResult<DeviceState> {
    let mock: SharedResource = Arc::new(HostMockResource::new());
    let (base, holder): (SharedResource, Holder) = if config.kind == ResourceKind::Pool {
        let initial = config.initial_pool_size.unwrap_or(0);
        let pool = PoolMemoryResource::with_options(mock, pool_options(initial, config))?;
        (Arc::new(pool.clone()), Holder::Pool(pool))
    } else {
        (mock, Holder::Plain)
    };
    assemble(config, device, base, holder, None)
}

/// [`build_on_host`] after a device synchronization (which finds no device here, but is seen
/// by rmm-sys's watchers), as building a pool on a GPU may wait for the device.
pub(crate) fn build_on_host_after_a_sync(
    config: &Config,
    device: DeviceId,
) -> MrResult<DeviceState> {
    let _ = rmm::sys::device_synchronize();
    build_on_host(config, device)
}

/// One host-memory "device allocator" for the whole test process, which tests also allocate
/// from directly (as a program allocates with `cudaMalloc` beside rmm-rs).
pub(crate) fn shared_host_memory() -> &'static HostMockResource {
    static MEMORY: OnceLock<HostMockResource> = OnceLock::new();
    MEMORY.get_or_init(HostMockResource::new)
}

/// A stack straight over [`shared_host_memory`] (the C API counts what it hands out), with
/// statistics and the log as configured.
pub(crate) fn build_on_shared_host(config: &Config, device: DeviceId) -> MrResult<DeviceState> {
    let memory: SharedResource = Arc::new(shared_host_memory().clone());
    assemble(config, device, memory, Holder::Plain, None)
}

/// Builds over host memory except on device 7, which fails like a device without a driver.
pub(crate) fn build_on_host_but_7(config: &Config, device: DeviceId) -> MrResult<DeviceState> {
    if device.0 == 7 {
        return Err(rmm::CudaError::DriverNotFound.into());
    }
    build_on_host(config, device)
}

/// Builds a stack over a resource that panics on allocation.
pub(crate) fn build_panicking(config: &Config, device: DeviceId) -> MrResult<DeviceState> {
    assemble(
        config,
        device,
        Arc::new(PanickingResource),
        Holder::Plain,
        None,
    )
}
