//! Hooks for benchmarks and tests without a GPU (feature `testing`; never in a library anyone
//! loads): [`serve_fake_memory`] makes the C entry points serve fake addresses from a
//! do-nothing resource, so that the host cost of the path PyTorch calls can be counted
//! (`benches/capi_pair_count.rs`).

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rmm::{
    CudaStreamView, DeviceId, DeviceMemoryResource, DevicePtr, MrResult, PoolMemoryResource,
    SharedResource,
};

use rmm::sys::PrimaryContext;

use crate::config::{Config, ResourceKind};
use crate::registry::Registry;
use crate::stack::{assemble, pool_options, DeviceState, Holder};

/// A resource that does no work: distinct 256-aligned fake addresses from a bump counter
/// (never reused, never dereferenced); `deallocate` is a no-op.
#[derive(Debug)]
struct NullResource {
    next: AtomicU64,
}

// SAFETY: a benchmark double handing out fake addresses. That breaks the promise of valid
// memory, which is sound only because nothing that uses it touches the memory.
unsafe impl DeviceMemoryResource for NullResource {
    fn allocate(&self, _: CudaStreamView<'_>, bytes: usize, _: usize) -> MrResult<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let step = (bytes as u64).div_ceil(256) * 256;
        Ok(DevicePtr::from_raw(
            self.next.fetch_add(step, Ordering::Relaxed),
        ))
    }

    unsafe fn deallocate(
        &self,
        _: CudaStreamView<'_>,
        _: DevicePtr,
        _: usize,
        _: usize,
    ) -> MrResult<()> {
        Ok(())
    }

    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        std::ptr::eq(
            self as *const Self as *const u8,
            other.as_any() as *const dyn Any as *const u8,
        )
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Builds `config` over the do-nothing resource: a pool over it (initial size 0 unless set)
/// or, for the other kinds, the resource itself; statistics and the log as configured; a fake
/// primary context, so that each call opens its deferred context scope as on a GPU (nothing
/// in these stacks makes a call that needs it).
fn build_fake(config: &Config, device: DeviceId) -> MrResult<DeviceState> {
    let null: SharedResource = Arc::new(NullResource {
        next: AtomicU64::new(1 << 40),
    });
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
