//! Simulated memory: addresses from a counter, no GPU (RMM's `simulated_memory_resource` of its
//! replay benchmark).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rmm_stream::CudaStreamView;
use rmm_sys::{DevicePtr, ALLOCATION_ALIGNMENT};

use crate::error::{InvalidFree, MrError, MrResult};
use crate::resource::{check_base_alignment, DeviceMemoryResource, ResourceProperties};

/// Where simulated addresses start: 2^62. No real allocation can have an address from
/// `[2^62, 2^63)`: it is not a canonical user-space address on x86-64 (48- or 57-bit) nor a
/// user address on AArch64 (at most 52 bits), where host and device (unified) addresses live.
/// So a simulated address is never mistaken for, or equal to, real memory.
const BASE: u64 = 1 << 62;

/// The largest simulated memory: the whole range from [`BASE`] to 2^63.
const MAX_SIZE: u64 = 1 << 62;

#[derive(Debug)]
struct Simulated {
    /// Bytes of simulated memory (a multiple of 256).
    size: u64,
    /// Bytes allocated and not freed (a multiple of 256; at most `size`).
    used: AtomicU64,
    /// Addresses handed out so far, from [`BASE`] (a multiple of 256; only grows, at most
    /// [`MAX_SIZE`]: addresses are never reused).
    next: AtomicU64,
}

/// Memory that is only numbers (RMM's `simulated_memory_resource`): a bump allocator over fake
/// addresses, so that a workload can be replayed against a pool, arena, binning or fixed-size
/// resource **as if** the device had `size` bytes, on any machine, with no GPU and no CUDA call.
///
/// - `allocate` hands out the next `bytes` (rounded up to 256) of a fake address range that
///   starts at 2^62, a range no real host or device allocation can have; past `size` bytes it
///   fails with [`MrError::OutOfMemory`] ("Simulated memory size exceeded"). The alignment is
///   0 (the default) or a power of two up to 256, as for every base resource (every address
///   is 256-aligned).
/// - `deallocate` accepts any address it handed out and gives its bytes back to the simulated
///   memory (as a device does: a pool that releases chunks, or gives them back before it
///   fails, can take that memory again), but **never reuses an address**: every allocation gets
///   fresh ones, so a stale pointer never equals a live one. (RMM's never counts frees: its pool
///   never gives memory back.) It models a device for resources that take memory from their
///   upstream (pool, arena, fixed-size, binning), not a resource to replay a workload on
///   directly.
/// - If the addresses run out (2^62 bytes handed out in all, over any number of frees), an
///   allocation fails with out-of-memory.
/// - Nothing ever touches the memory, and nothing may: [`properties`](Self::properties) says
///   it is accessible neither from the host nor from the device, and containers refuse such
///   a resource (and any sub-allocator over it, which inherits its properties), so they never
///   copy into a simulated address. No CUDA call is made, `allocate_sync` and
///   `deallocate_sync` included (there is no work to wait for).
/// - Thread-safe and lock-free; copies share the counter and are equal, separately built
///   resources are not.
///
/// ```
/// use rmm_mr::{DeviceMemoryResource, PoolMemoryResource, PoolOptions, SimulatedMemoryResource};
/// use rmm_stream::CudaStreamView;
///
/// // Does a pool of at most 1 GiB hold 3 x 300 MiB? Answered without a GPU (on the legacy
/// // default stream, which the pool serves without any CUDA call).
/// let gpu = SimulatedMemoryResource::new(1 << 30).unwrap();
/// let options = PoolOptions::new(0).maximum_pool_size(1 << 30);
/// let pool = PoolMemoryResource::with_options(gpu.clone(), options).unwrap();
/// let s = CudaStreamView::legacy();
/// let a = pool.allocate(s, 300 << 20, 256).unwrap(); // the pool takes 512 MiB (half its maximum)
/// let b = pool.allocate(s, 300 << 20, 256).unwrap(); // 212 MiB free there: it takes 300 MiB more
/// assert_eq!(gpu.used(), 812 << 20);
/// // No: no chunk has 300 MiB free, and only 212 MiB are left to take.
/// assert!(pool.allocate(s, 300 << 20, 256).unwrap_err().is_out_of_memory());
/// // SAFETY: allocated above with these sizes; simulated memory is never used.
/// unsafe {
///     pool.deallocate(s, a, 300 << 20, 256).unwrap();
///     pool.deallocate(s, b, 300 << 20, 256).unwrap();
/// }
/// ```
#[doc(alias = "rmm::mr::simulated_memory_resource")]
#[derive(Clone)]
pub struct SimulatedMemoryResource {
    inner: Arc<Simulated>,
}

impl SimulatedMemoryResource {
    /// Simulated memory of `size` bytes, rounded down to a multiple of 256.
    ///
    /// # Errors
    ///
    /// [`MrError::InvalidArgument`] when `size` is over 2^62 bytes (4 EiB), the most that has
    /// room among addresses no real memory can have.
    pub fn new(size: usize) -> MrResult<Self> {
        let size = size as u64;
        if size > MAX_SIZE {
            return Err(MrError::invalid_argument(format!(
                "simulated memory of {size} bytes is larger than the {MAX_SIZE} bytes it can have"
            )));
        }
        Ok(Self {
            inner: Arc::new(Simulated {
                size: size & !(ALLOCATION_ALIGNMENT as u64 - 1),
                used: AtomicU64::new(0),
                next: AtomicU64::new(0),
            }),
        })
    }

    /// The size of the simulated memory, in bytes (a multiple of 256).
    #[must_use]
    pub fn size(&self) -> usize {
        // At most MAX_SIZE, and `new` took it from a usize.
        self.inner.size as usize
    }

    /// Bytes allocated and not yet freed (each allocation rounded up to 256).
    #[must_use]
    pub fn used(&self) -> usize {
        self.inner.used.load(Ordering::Acquire) as usize
    }

    /// Bytes left to hand out.
    #[must_use]
    pub fn available(&self) -> usize {
        self.size() - self.used()
    }
}

impl fmt::Debug for SimulatedMemoryResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimulatedMemoryResource")
            .field("size", &self.size())
            .field("used", &self.used())
            .finish()
    }
}

fn exceeded(bytes: usize) -> MrError {
    MrError::out_of_memory(
        bytes,
        format!("Simulated memory size exceeded (failed to allocate {bytes} bytes)"),
    )
}

// SAFETY: the contract promises, for a pointer `allocate` returns, a region valid for reads and
// writes *where `properties` says*: this resource's properties say neither on the host nor on
// the device, so it promises no access at all, and nothing in rmm-rs ever dereferences its
// addresses: containers (the only safe code that reads or writes through a resource's pointer)
// refuse a resource whose memory is not device-accessible, sub-allocators only do arithmetic
// on their upstream's addresses and pass its properties on, and adaptors forward them. The
// remaining promises hold as bookkeeping: every address is 256-aligned (a larger alignment is
// refused), ranges never overlap (a bump counter that never goes back, updated atomically), no
// real memory can have such an address (they lie in [2^62, 2^63), see `BASE`), and nothing is
// queued on any stream, so an address is usable "at once" on any stream.
unsafe impl DeviceMemoryResource for SimulatedMemoryResource {
    fn allocate(
        &self,
        _stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        check_base_alignment(alignment)?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let size = self.inner.size;
        let rounded = (bytes as u64)
            .checked_next_multiple_of(ALLOCATION_ALIGNMENT as u64)
            .filter(|&r| r <= size)
            .ok_or_else(|| exceeded(bytes))?;
        self.inner
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(rounded).filter(|&end| end <= size)
            })
            .map_err(|_| exceeded(bytes))?;
        match self
            .inner
            .next
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |next| {
                next.checked_add(rounded).filter(|&end| end <= MAX_SIZE)
            }) {
            Ok(start) => Ok(DevicePtr::from_raw(BASE + start)),
            Err(_) => {
                self.inner.used.fetch_sub(rounded, Ordering::AcqRel);
                Err(exceeded(bytes))
            }
        }
    }

    unsafe fn deallocate(
        &self,
        _stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
    ) -> MrResult<()> {
        if ptr.is_null() {
            return Ok(());
        }
        let handed_out = BASE..BASE + self.inner.next.load(Ordering::Acquire);
        if handed_out.contains(&ptr.addr()) && ptr.is_aligned(ALLOCATION_ALIGNMENT) {
            // The contract gives the allocation's size; a wrong one cannot take more than
            // everything back.
            let rounded = (bytes as u64).next_multiple_of(ALLOCATION_ALIGNMENT as u64);
            let _ = self
                .inner
                .used
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                    Some(used.saturating_sub(rounded))
                });
            Ok(())
        } else {
            Err(MrError::InvalidFree {
                ptr,
                bytes,
                kind: InvalidFree::UnknownPointer,
            })
        }
    }

    /// As [`allocate`](Self::allocate): there is nothing to synchronize.
    fn allocate_sync(&self, bytes: usize, alignment: usize) -> MrResult<DevicePtr> {
        self.allocate(CudaStreamView::default(), bytes, alignment)
    }

    /// As [`deallocate`](Self::deallocate): there is nothing to synchronize.
    unsafe fn deallocate_sync(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()> {
        // SAFETY: the caller's contract.
        unsafe { self.deallocate(CudaStreamView::default(), ptr, bytes, alignment) }
    }

    /// Neither host- nor device-accessible: the addresses are bookkeeping only.
    fn properties(&self) -> ResourceProperties {
        ResourceProperties {
            device_accessible: false,
            host_accessible: false,
        }
    }

    crate::resource::resource_tail! {
        is_equal: shared(inner),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        shared, ArenaMemoryResource, ArenaOptions, BinningMemoryResource, BinningOptions,
        FixedSizeMemoryResource, FixedSizeOptions, PoolMemoryResource, PoolOptions,
    };

    const MIB: usize = 1 << 20;

    fn s() -> CudaStreamView<'static> {
        CudaStreamView::legacy()
    }

    #[test]
    fn hands_out_disjoint_aligned_fake_addresses_until_full() {
        let mr = SimulatedMemoryResource::new(4096 + 100).unwrap();
        assert_eq!(mr.size(), 4096);
        let a = mr.allocate(s(), 1, 256).unwrap();
        let b = mr.allocate(s(), 1000, 64).unwrap();
        let c = mr.allocate(s(), 256, 1).unwrap();
        assert_eq!(a.addr(), 1 << 62);
        assert_eq!(b.addr(), (1 << 62) + 256);
        assert_eq!(c.addr(), (1 << 62) + 256 + 1024);
        assert_eq!(mr.used(), 256 + 1024 + 256);
        assert_eq!(mr.available(), 4096 - 1536);
        for p in [a, b, c] {
            assert!(p.is_aligned(256), "{p}");
        }
        // 2560 bytes are left: 2560 fits exactly, then nothing does.
        let e = mr.allocate(s(), 2561, 256).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        assert!(
            e.to_string().contains("Simulated memory size exceeded"),
            "{e}"
        );
        assert_eq!(mr.used(), 1536, "a refused allocation takes nothing");
        mr.allocate(s(), 2560, 256).unwrap();
        assert!(mr.allocate(s(), 1, 256).unwrap_err().is_out_of_memory());
        assert!(mr
            .allocate(s(), usize::MAX, 256)
            .unwrap_err()
            .is_out_of_memory());
    }

    #[test]
    fn zero_bytes_bad_alignments_and_sizes() {
        let mr = SimulatedMemoryResource::new(MIB).unwrap();
        assert_eq!(mr.allocate(s(), 0, 256).unwrap(), DevicePtr::NULL);
        assert!(
            mr.allocate(s(), 8, 0).unwrap().is_aligned(256),
            "0 is the default"
        );
        assert!(matches!(
            mr.allocate(s(), 8, 512),
            Err(MrError::BadAlloc { .. })
        ));
        assert!(matches!(
            mr.allocate(s(), 8, 3),
            Err(MrError::BadAlloc { .. })
        ));
        assert_eq!(mr.used(), 256);
        assert!(matches!(
            SimulatedMemoryResource::new(usize::MAX),
            Err(MrError::InvalidArgument(_))
        ));
        let huge = SimulatedMemoryResource::new(1 << 62).unwrap();
        let p = huge.allocate(s(), (1 << 62) - 256, 256).unwrap();
        assert_eq!(p.addr(), 1 << 62);
        assert!(huge.allocate(s(), 512, 256).unwrap_err().is_out_of_memory());
        let last = huge.allocate(s(), 256, 256).unwrap();
        assert_eq!(last.addr(), (1 << 63) - 256);
        // Freed, the bytes are available again, but no address is left to give.
        // SAFETY: simulated memory is never touched.
        unsafe { huge.deallocate(s(), last, 256, 256).unwrap() };
        assert_eq!(huge.available(), 256);
        assert!(huge.allocate(s(), 256, 256).unwrap_err().is_out_of_memory());
        assert_eq!(huge.available(), 256, "a refused allocation takes nothing");
    }

    #[test]
    fn frees_are_checked_against_what_was_handed_out() {
        let mr = SimulatedMemoryResource::new(MIB).unwrap();
        let p = mr.allocate(s(), 512, 256).unwrap();
        // SAFETY: simulated memory is never touched; these calls only check bookkeeping.
        unsafe {
            mr.deallocate(s(), p, 512, 256).unwrap();
            mr.deallocate_sync(DevicePtr::NULL, 0, 256).unwrap();
            for wrong in [0x1000, (1 << 62) + 512, (1 << 62) + 1] {
                let e = mr
                    .deallocate(s(), DevicePtr::from_raw(wrong), 8, 256)
                    .unwrap_err();
                assert!(
                    matches!(
                        e,
                        MrError::InvalidFree {
                            kind: InvalidFree::UnknownPointer,
                            ..
                        }
                    ),
                    "{wrong:#x}: {e}"
                );
            }
        }
        // Its bytes are available again, its address is never reused.
        assert_eq!(mr.used(), 0);
        assert_ne!(mr.allocate(s(), 512, 256).unwrap(), p);
        let all = mr.allocate(s(), MIB - 512, 256).unwrap();
        assert!(all.addr() > p.addr());
        assert!(mr.allocate(s(), 256, 256).unwrap_err().is_out_of_memory());
    }

    #[test]
    fn nothing_may_access_it_and_clones_are_equal() {
        let mr = SimulatedMemoryResource::new(MIB).unwrap();
        let props = mr.properties();
        assert!(!props.device_accessible && !props.host_accessible);
        let pool = PoolMemoryResource::new(mr.clone(), 0).unwrap();
        assert_eq!(pool.properties(), props, "sub-allocators inherit it");
        let copy = mr.clone();
        assert!(mr.is_equal(&copy));
        assert!(!mr.is_equal(&SimulatedMemoryResource::new(MIB).unwrap()));
        assert!(!mr.is_equal(&crate::CudaMemoryResource::new()));
        copy.allocate(s(), 256, 256).unwrap();
        assert_eq!(mr.used(), 256, "copies share the counter");
        assert!(format!("{mr:?}").contains("used: 256"));
    }

    #[test]
    fn concurrent_allocations_never_overlap() {
        let mr = SimulatedMemoryResource::new(64 * MIB).unwrap();
        let mut all: Vec<u64> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let mr = mr.clone();
                    scope.spawn(move || {
                        (0..1000)
                            .map(|_| mr.allocate(s(), 300, 256).unwrap().addr())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        all.sort_unstable();
        assert_eq!(all.len(), 4000);
        assert!(all.windows(2).all(|w| w[1] - w[0] >= 512), "overlap");
        assert_eq!(mr.used(), 4000 * 512);
    }

    /// The sub-allocators a replay builds over it work without a GPU, and fail with
    /// out-of-memory when the simulated device is full.
    #[test]
    fn sub_allocators_run_over_it() {
        let gpu = SimulatedMemoryResource::new(64 * MIB).unwrap();
        let pool = PoolMemoryResource::with_options(
            gpu.clone(),
            PoolOptions::new(0).maximum_pool_size(64 * MIB),
        )
        .unwrap();
        let a = pool.allocate(s(), 40 * MIB, 256).unwrap();
        assert!(pool
            .allocate(s(), 40 * MIB, 256)
            .unwrap_err()
            .is_out_of_memory());
        // SAFETY: allocated above with this size; simulated memory is never used.
        unsafe { pool.deallocate(s(), a, 40 * MIB, 256).unwrap() };
        assert!(gpu.used() <= 64 * MIB);

        let gpu = SimulatedMemoryResource::new(64 * MIB).unwrap();
        let arena = ArenaMemoryResource::with_options(
            gpu.clone(),
            ArenaOptions::new().arena_size(16 * MIB),
        )
        .unwrap();
        assert_eq!(gpu.used(), 16 * MIB);
        let b = arena.allocate(s(), 3 * MIB, 256).unwrap();
        assert!(arena
            .allocate(s(), 15 * MIB, 256)
            .unwrap_err()
            .is_out_of_memory());
        // SAFETY: as above.
        unsafe { arena.deallocate(s(), b, 3 * MIB, 256).unwrap() };

        let gpu = SimulatedMemoryResource::new(64 * MIB).unwrap();
        let fixed = FixedSizeMemoryResource::with_options(
            gpu.clone(),
            FixedSizeOptions::new()
                .block_size(MIB)
                .blocks_to_preallocate(4),
        )
        .unwrap();
        let blocks: Vec<_> = (0..8)
            .map(|_| fixed.allocate(s(), MIB, 256).unwrap())
            .collect();
        assert_eq!(gpu.used(), 8 * MIB);
        for p in blocks {
            // SAFETY: as above.
            unsafe { fixed.deallocate(s(), p, MIB, 256).unwrap() };
        }

        let gpu = SimulatedMemoryResource::new(1024 * MIB).unwrap();
        let binning = BinningMemoryResource::with_options(
            shared(gpu.clone()),
            BinningOptions::new()
                .min_size_exponent(18)
                .max_size_exponent(20),
        )
        .unwrap();
        let small = binning.allocate(s(), 1000, 256).unwrap();
        let large = binning.allocate(s(), 2 * MIB, 256).unwrap();
        // SAFETY: as above.
        unsafe {
            binning.deallocate(s(), small, 1000, 256).unwrap();
            binning.deallocate(s(), large, 2 * MIB, 256).unwrap();
        }
    }
}
