//! The naive baseline of the benchmarks: a best-fit coalescing allocator over one region, the
//! simplest one a program could write, measured beside the real resources so that "how much
//! faster than doing the obvious thing" is a ratio machine drift cancels from.
//!
//! [`FreeBlocks`] keeps the free blocks of the region in a `BTreeMap` by address (coalescing on
//! free) and a `BTreeSet` by `(size, address)` (best fit, ties to the lowest address, as the
//! pool); [`NaiveRegion`] is the resource: those blocks behind one `Mutex`, sizes rounded up to
//! 256. It keeps no record of what it handed out (a free is trusted to be right), knows nothing
//! of streams (a block freed on one stream is handed to the next caller whatever its stream)
//! and never grows: a benchmark baseline for operation sequences that never touch the memory,
//! not a resource to use.
//!
//! It makes no CUDA call and owns no memory: the region is addresses only. The GPU benchmarks
//! put it over a region of `cuMemAlloc` (`rmm_benches::naive::NaiveBestFit`), the host
//! instruction counts (`benches/pair_count.rs`) over a fake one.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};

use rmm_stream::CudaStreamView;
use rmm_sys::{checked_align_up, DevicePtr, ALLOCATION_ALIGNMENT};

use crate::error::{MrError, MrResult};
use crate::resource::DeviceMemoryResource;

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

    #[inline]
    fn put(&mut self, addr: u64, size: usize) {
        self.by_addr.insert(addr, size);
        self.by_size.insert((size, addr));
    }

    #[inline]
    fn remove(&mut self, addr: u64, size: usize) {
        self.by_addr.remove(&addr);
        self.by_size.remove(&(size, addr));
    }

    /// Takes `size` bytes (a multiple of 256, not 0) from the best-fitting block; `None` when
    /// no block is large enough.
    #[inline]
    pub fn take(&mut self, size: usize) -> Option<u64> {
        let &(found, addr) = self.by_size.range((size, 0)..).next()?;
        self.remove(addr, found);
        if found > size {
            self.put(addr + size as u64, found - size);
        }
        Some(addr)
    }

    /// Gives back `[addr, addr + size)`, merging it with the free blocks on both sides.
    #[inline]
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

/// The naive baseline (see the [module documentation](self)) over the region
/// `[addr, addr + size)`, which it neither allocates nor frees.
#[derive(Debug)]
pub struct NaiveRegion {
    free: Mutex<FreeBlocks>,
}

impl NaiveRegion {
    /// The baseline over `[addr, addr + size)`, all of it free; `addr` and `size` should be
    /// multiples of 256.
    #[must_use]
    pub fn new(addr: u64, size: usize) -> Self {
        Self {
            free: Mutex::new(FreeBlocks::new(addr, size)),
        }
    }
}

// SAFETY: blocks handed out are disjoint, 256-aligned (when the region is) sub-ranges of the
// region, a block handed out again only after it was freed. The region is addresses only:
// whoever makes the resource keeps the memory behind it (if any) for its life. Frees are not
// checked and streams are not ordered (see the module documentation): the benchmarks that use
// it never touch the memory.
unsafe impl DeviceMemoryResource for NaiveRegion {
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
        let Some(size) = checked_align_up(bytes, ALLOCATION_ALIGNMENT) else {
            return Err(MrError::out_of_memory(
                bytes,
                format!("naive baseline: {bytes} bytes exceed the address space"),
            ));
        };
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
        // A size no allocation could have had: nothing of it was handed out.
        let Some(size) = checked_align_up(bytes, ALLOCATION_ALIGNMENT) else {
            return Ok(());
        };
        self.free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .give(ptr.addr(), size);
        Ok(())
    }

    crate::resource::resource_tail! {
        is_equal: identity,
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

    #[test]
    fn the_resource_rounds_to_256_and_refuses_what_does_not_fit() {
        let mr = NaiveRegion::new(1 << 20, 1024);
        let legacy = CudaStreamView::legacy();
        assert_eq!(mr.allocate(legacy, 0, 256).unwrap(), DevicePtr::NULL);
        let a = mr.allocate(legacy, 1, 256).unwrap();
        let b = mr.allocate(legacy, 257, 256).unwrap();
        assert_eq!((a.addr(), b.addr()), (1 << 20, (1 << 20) + 256));
        assert!(matches!(
            mr.allocate(legacy, 512, 256),
            Err(MrError::OutOfMemory { .. })
        ));
        assert!(matches!(
            mr.allocate(legacy, 1, 512),
            Err(MrError::BadAlloc { .. })
        ));
        // Rounding up would overflow: out of memory, not a panic or a wrapped size of 0.
        assert!(matches!(
            mr.allocate(legacy, usize::MAX, 256),
            Err(MrError::OutOfMemory { .. })
        ));
        // SAFETY: both came from `mr` with these sizes and are freed once.
        unsafe {
            mr.deallocate(legacy, a, 1, 256).unwrap();
            mr.deallocate(legacy, b, 257, 256).unwrap();
        }
        assert_eq!(mr.free.lock().unwrap().totals(), (1, 1024));
        assert!(mr.is_equal(&mr));
        assert!(!mr.is_equal(&NaiveRegion::new(0, 256)));
    }
}
