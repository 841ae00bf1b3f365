//! The naive baseline of the GPU benchmarks: a best-fit coalescing allocator over one region,
//! the simplest one a program could write, measured in the same run as the real resources so
//! that "how much faster than doing the obvious thing" is a ratio machine drift cancels from.
//!
//! [`NaiveBestFit`] takes one region of device memory from `cuMemAlloc` at construction and
//! keeps its free blocks in a `BTreeMap` by address (coalescing on free) and a `BTreeSet` by
//! `(size, address)` (best fit, ties to the lowest address, as the pool), both behind one
//! `Mutex`; sizes are rounded up to 256. It keeps no record of what it handed out (a free is
//! trusted to be right), knows nothing of streams (a block freed on one stream is handed to
//! the next caller whatever its stream) and never grows: a benchmark baseline for operation
//! sequences that never touch the memory, not a resource to use.
//!
//! Pure bookkeeping apart from the one region ([`FreeBlocks`], unit-tested without a GPU).

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};

use rmm_mr::{CudaMemoryResource, DeviceMemoryResource, MrError, MrResult};
use rmm_stream::CudaStreamView;
use rmm_sys::{DevicePtr, ALLOCATION_ALIGNMENT};

/// Free blocks of one region: by address (for coalescing) and by `(size, address)` (for best
/// fit). Blocks are `[addr, addr + size)`, sizes multiples of 256.
#[derive(Debug, Default)]
pub struct FreeBlocks {
    by_addr: BTreeMap<u64, usize>,
    by_size: BTreeSet<(usize, u64)>,
}

impl FreeBlocks {
    /// One free block: the whole region.
    #[must_use]
    pub fn new(addr: u64, size: usize) -> Self {
        let mut blocks = Self::default();
        blocks.put(addr, size);
        blocks
    }

    fn put(&mut self, addr: u64, size: usize) {
        self.by_addr.insert(addr, size);
        self.by_size.insert((size, addr));
    }

    fn remove(&mut self, addr: u64, size: usize) {
        self.by_addr.remove(&addr);
        self.by_size.remove(&(size, addr));
    }

    /// Takes `size` bytes (a multiple of 256, not 0) from the best-fitting block; `None` when
    /// no block is large enough.
    pub fn take(&mut self, size: usize) -> Option<u64> {
        let &(found, addr) = self.by_size.range((size, 0)..).next()?;
        self.remove(addr, found);
        if found > size {
            self.put(addr + size as u64, found - size);
        }
        Some(addr)
    }

    /// Gives back `[addr, addr + size)`, merging it with the free blocks on both sides.
    pub fn give(&mut self, addr: u64, size: usize) {
        let (mut start, mut len) = (addr, size);
        if let Some((&before, &before_size)) = self.by_addr.range(..addr).next_back() {
            if before + before_size as u64 == addr {
                self.remove(before, before_size);
                start = before;
                len += before_size;
            }
        }
        let end = addr + size as u64;
        if let Some(&after_size) = self.by_addr.get(&end) {
            self.remove(end, after_size);
            len += after_size;
        }
        self.put(start, len);
    }

    /// Number of free blocks and their bytes.
    #[must_use]
    pub fn totals(&self) -> (usize, usize) {
        (self.by_addr.len(), self.by_addr.values().sum())
    }
}

/// The naive baseline (see the [module documentation](self)).
#[derive(Debug)]
pub struct NaiveBestFit {
    region: DevicePtr,
    size: usize,
    free: Mutex<FreeBlocks>,
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
            free: Mutex::new(FreeBlocks::new(region.addr(), size)),
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

// SAFETY: blocks are disjoint, 256-aligned sub-ranges of the region, which this resource holds
// until it is dropped; a block is handed out again only after it was freed. Frees are not
// checked and streams are not ordered (see the module documentation): the benchmarks that use
// it never touch the memory.
unsafe impl DeviceMemoryResource for NaiveBestFit {
    fn allocate(
        &self,
        _stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        if alignment > ALLOCATION_ALIGNMENT {
            return Err(MrError::bad_alloc(format!(
                "naive baseline: alignment {alignment} above 256"
            )));
        }
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let size = bytes.div_ceil(ALLOCATION_ALIGNMENT) * ALLOCATION_ALIGNMENT;
        let taken = self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take(size);
        taken.map(DevicePtr::from_raw).ok_or_else(|| {
            MrError::out_of_memory(
                bytes,
                format!("naive baseline: no free block of {size} bytes"),
            )
        })
    }

    unsafe fn deallocate(
        &self,
        _stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
    ) -> MrResult<()> {
        if ptr.is_null() || bytes == 0 {
            return Ok(());
        }
        let size = bytes.div_ceil(ALLOCATION_ALIGNMENT) * ALLOCATION_ALIGNMENT;
        self.free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .give(ptr.addr(), size);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_and_coalescing() {
        let mut f = FreeBlocks::new(0, 4096);
        let a = f.take(1024).unwrap();
        let b = f.take(512).unwrap();
        let c = f.take(256).unwrap();
        assert_eq!((a, b, c), (0, 1024, 1536));
        assert_eq!(f.totals(), (1, 4096 - 1792));
        // A hole of 512 and the tail of 2304: best fit takes the hole.
        f.give(b, 512);
        assert_eq!(f.take(256), Some(1024));
        assert_eq!(f.take(4096), None);
        // Everything back: one block again, whatever the order.
        f.give(1024, 256);
        f.give(c, 256);
        f.give(a, 1024);
        assert_eq!(f.totals(), (1, 4096));
        assert_eq!(f.take(4096), Some(0));
        assert_eq!(f.totals(), (0, 0));
    }
}
