//! The naive baseline of the GPU benchmarks over device memory: [`NaiveBestFit`] takes one
//! region from `cuMemAlloc` at construction and hands it out through
//! [`rmm_mr::testing::naive::NaiveRegion`], a best-fit coalescing allocator whose free blocks
//! sit in two B-trees behind one `Mutex` (sizes rounded up to 256, no record of what it handed
//! out, no stream ordering, no growth; see that module). Measured in the same run as the real
//! resources, so that "how much faster than doing the obvious thing" is a ratio machine drift
//! cancels from. The bookkeeping lives in rmm-mr (feature `testing`) so that rmm-mr's host
//! instruction counts (`pair_count naive`) run the same code over a fake region.

use std::any::Any;

use rmm_mr::testing::naive::NaiveRegion;
use rmm_mr::{CudaMemoryResource, DeviceMemoryResource, MrResult};
use rmm_stream::CudaStreamView;
use rmm_sys::{DevicePtr, ALLOCATION_ALIGNMENT};

pub use rmm_mr::testing::naive::FreeBlocks;

/// The naive baseline (see the [module documentation](self)) over a region of its own.
#[derive(Debug)]
pub struct NaiveBestFit {
    region: DevicePtr,
    size: usize,
    naive: NaiveRegion,
}

impl NaiveBestFit {
    /// Takes `size` bytes (rounded down to 256) of device memory from `cuMemAlloc`.
    pub fn new(size: usize) -> MrResult<Self> {
        let size = size / ALLOCATION_ALIGNMENT * ALLOCATION_ALIGNMENT;
        let region = CudaMemoryResource::new().allocate(
            CudaStreamView::legacy(),
            size,
            ALLOCATION_ALIGNMENT,
        )?;
        Ok(Self {
            region,
            size,
            naive: NaiveRegion::new(region.addr(), size),
        })
    }

    /// Bytes taken from `cuMemAlloc` (the region).
    #[must_use]
    pub fn region_size(&self) -> usize {
        self.size
    }
}

impl Drop for NaiveBestFit {
    fn drop(&mut self) {
        // SAFETY: the region came from this resource with this size; its allocations end with
        // it (the benchmarks free everything and synchronize before they drop it).
        let r = unsafe {
            CudaMemoryResource::new().deallocate(
                CudaStreamView::legacy(),
                self.region,
                self.size,
                ALLOCATION_ALIGNMENT,
            )
        };
        if let Err(e) = r {
            eprintln!("naive baseline: could not free its region: {e}");
        }
    }
}

// SAFETY: `NaiveRegion` hands out disjoint, 256-aligned sub-ranges of the region (256-aligned:
// it came from `cuMemAlloc`), which this resource holds until it is dropped. Frees are not
// checked and streams are not ordered (see the module documentation): the benchmarks that use
// it never touch the memory.
unsafe impl DeviceMemoryResource for NaiveBestFit {
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        self.naive.allocate(stream, bytes, alignment)
    }

    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()> {
        // SAFETY: forwarded contract (`ptr` came from `allocate`, which is `naive`'s).
        unsafe { self.naive.deallocate(stream, ptr, bytes, alignment) }
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
