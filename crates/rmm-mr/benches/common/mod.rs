//! What the host hot-path benches share: the do-nothing upstream, the fixed pseudo-random
//! sequences and their sizes (`suballocator_hot_path.rs`, `pair_count.rs`).

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};

use rmm_mr::{DeviceMemoryResource, MrResult};
use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

/// Allocations held live.
pub(crate) const LIVE: usize = 1000;

/// Length of the pre-drawn size and slot sequences (a power of two).
pub(crate) const SEQ: usize = 1 << 14;

/// A resource that does no work: distinct 256-aligned fake addresses from a bump counter
/// (never reused, never dereferenced); `deallocate` is a no-op.
#[derive(Debug)]
pub(crate) struct NullUpstream {
    next: AtomicU64,
}

impl NullUpstream {
    pub(crate) fn new() -> Self {
        Self {
            next: AtomicU64::new(1 << 40),
        }
    }
}

// SAFETY: a benchmark double handing out fake addresses. That breaks the promise of valid
// memory, which is sound only because this benchmark never touches the memory.
unsafe impl DeviceMemoryResource for NullUpstream {
    fn allocate(
        &self,
        _stream: CudaStreamView<'_>,
        bytes: usize,
        _alignment: usize,
    ) -> MrResult<DevicePtr> {
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
        _stream: CudaStreamView<'_>,
        _ptr: DevicePtr,
        _bytes: usize,
        _alignment: usize,
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

/// xorshift64*: a fixed, reproducible sequence.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// `SEQ` sizes uniform in `1..=max` and `SEQ` slot numbers below `LIVE`.
pub(crate) fn sequences(max: usize) -> (Vec<usize>, Vec<usize>) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ max as u64);
    let sizes = (0..SEQ).map(|_| 1 + (rng.next() as usize) % max).collect();
    let slots = (0..SEQ).map(|_| (rng.next() as usize) % LIVE).collect();
    (sizes, slots)
}
