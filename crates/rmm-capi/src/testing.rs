//! Hooks for benchmarks and tests without a GPU (feature `testing`; never in a library anyone
//! loads): [`serve_fake_memory`] makes the C entry points serve fake addresses from a
//! do-nothing resource, so that the host cost of the path PyTorch calls can be counted
//! (`benches/capi_pair_count.rs`).

use std::sync::Arc;

use rmm::mr::testing::NullResource;
use rmm::{DeviceId, MrResult, PoolMemoryResource, SharedResource};

use rmm::sys::PrimaryContext;

use crate::config::{Config, ResourceKind};
use crate::registry::Registry;
use crate::stack::{assemble, pool_options, DeviceState, Holder};

/// Builds `config` over the do-nothing resource: a pool over it (initial size 0 unless set)
/// or, for the other kinds, the resource itself; statistics and the log as configured; a fake
/// primary context, so that each call opens its deferred context scope as on a GPU (nothing
/// in these stacks makes a call that needs it).
fn build_fake(config: &Config, device: DeviceId) -> MrResult<DeviceState> {
    let null: SharedResource = Arc::new(NullResource::new());
    let (base, holder): (SharedResource, Holder) = if config.kind == ResourceKind::Pool {
        let initial = config.initial_pool_size.unwrap_or(0);
        let pool = PoolMemoryResource::with_options(null, pool_options(initial, config))?;
        (Arc::new(pool.clone()), Holder::Pool(pool))
    } else {
        (null, Holder::Plain)
    };
    assemble(config, device, base, holder, Some(PrimaryContext::fake()))
}

/// Makes the C entry points of this process serve fake addresses (never to be dereferenced)
/// from a do-nothing resource, with no CUDA call but the stream calls rmm-sys's simulated
/// driver answers. Call it before any other entry point; false (nothing changed) when the
/// table of the C API already exists.
#[must_use]
pub fn serve_fake_memory() -> bool {
    Registry::install_global(build_fake)
}
