//! The VMM pool resource: the stream-ordered core over a [`Mapper`].

use std::fmt;
use std::sync::Arc;

use rmm_stream::CudaStreamView;
use rmm_sys::vmm::{self as sys_vmm, Granularity};
use rmm_sys::{AllocationHandleType, DeviceId, DevicePtr, ALLOCATION_ALIGNMENT};

use crate::error::{MrError, MrResult};
use crate::pool::engine::{Contiguous, Growth, Pool};
use crate::resource::DeviceMemoryResource;
use crate::stream_ordered::core::{Expand, GrowthCause};
use crate::vmm::mapper::{Mapper, VmmGrowthStatistics, NAME};
use crate::vmm::options::{Geometry, VmmPoolOptions};

/// The granularity of a simulated pool unless its options name one: what current GPUs
/// recommend.
const SIMULATED_GRANULARITY: usize = 2 << 20;

impl Growth for Mapper {
    const NAME: &'static str = NAME;
    type Layout = Contiguous;

    fn source(&self) -> &dyn DeviceMemoryResource {
        self
    }

    fn release_limit(&self) -> Option<usize> {
        Some(self.capacity())
    }

    /// One chunk at the end of the mapped memory, of what the free block there (`tail`) lacks
    /// for the request, rounded up to the granularity, or the minimum growth if more
    /// ([`Mapper::grow`]); under pressure, without the minimum growth.
    fn grow(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        size: usize,
        ask: Expand,
    ) -> MrResult<(DevicePtr, usize)> {
        // Refused under a capture not begun through a `GraphPool` (mapping would invalidate it).
        crate::graph::growth(stream, bytes, || {
            Mapper::grow(self, bytes, size, ask.tail, ask.cause)
        })
    }
}

/// A pool that grows by mapping physical memory into one reserved range of addresses, so that
/// its memory stays contiguous however it grew: a free block at the end merges with the memory
/// mapped after it, and a request up to the maximum size can always be served once the blocks
/// before it are free. RMM has no such resource; the nearest thing is PyTorch's caching
/// allocator with `expandable_segments:True`.
///
/// # How it works
///
/// - Construction reserves `maximum_pool_size` bytes of device addresses
///   (`cuMemAddressReserve`; rounded down to the granularity) and maps the initial size.
/// - Allocation is [`PoolMemoryResource`](crate::PoolMemoryResource)'s, on the same
///   stream-ordered core: per-stream coalescing best-fit free lists, stealing and merging across
///   streams with events, the record of handed-out blocks, over-alignment up to
///   [`MAX_OVER_ALIGNMENT`](crate::MAX_OVER_ALIGNMENT), wrong frees reported as [`MrError::InvalidFree`].
/// - When no list can serve a request, the pool maps one more chunk of physical memory
///   (`cuMemCreate`, `cuMemMap`, `cuMemSetAccess` for the device and its peers) right after
///   the mapped memory, of what the free block at the end lacks for the request, rounded up to
///   the granularity, or at least [`VmmPoolOptions::min_growth_percent`] of what is mapped
///   (doubling by default) where the range has room. A chunk the device refuses is halved down
///   to what the request lacks (as RMM's pool halves a refused growth). Failure is
///   out-of-memory (`"Maximum pool size exceeded"` at the maximum, or the device's own
///   out-of-memory).
/// - [`release_unused`](Self::release_unused) synchronizes the device, then unmaps and
///   releases every chunk no allocation uses, at the end or not; a chunk released in the
///   middle leaves a hole that growth maps again when the end has no room.
/// - Dropping the pool synchronizes the device (if it was used), unmaps and releases every
///   chunk, outstanding allocations or not, then frees the address range.
///
/// Where the device or its driver lacks virtual memory management, construction fails with
/// [`MrError::Unsupported`]. [`simulated`](Self::simulated) builds the same pool over fake
/// addresses, for replays and sizing questions on machines without a GPU.
///
/// # Compared with the other pools
///
/// [`PoolMemoryResource`](crate::PoolMemoryResource) grows by taking separate chunks from its
/// upstream, whose blocks never merge: with an initial size set it cannot serve its own maximum
/// size (RMM issue 1957), and two large requests can fail where they would fit (RMM issue 496).
/// This pool serves both. Its hot path is the pool's; growing costs a few driver calls per
/// chunk ([`growth_statistics`](Self::growth_statistics)). The design and the measurements:
/// `docs/internals/vmm-pool.md` and the guide's page "Fragmentation and how to avoid it".
///
/// ```no_run
/// use rmm_mr::{DeviceMemoryResource, VmmPoolMemoryResource, VmmPoolOptions};
/// use rmm_stream::CudaStreamView;
///
/// # fn main() -> rmm_mr::MrResult<()> {
/// // RMM issue 1957: 2 MiB up front, at most 64 MiB, then one allocation of 64 MiB.
/// let pool =
///     VmmPoolMemoryResource::with_options(VmmPoolOptions::new(64 << 20).initial_pool_size(2 << 20))?;
/// let s = CudaStreamView::default();
/// let all = pool.allocate(s, 64 << 20, 256)?;
/// // SAFETY: allocated above with this size on `s`.
/// unsafe { pool.deallocate(s, all, 64 << 20, 256)? };
/// # Ok(())
/// # }
/// ```
#[doc(alias = "expandable_segments")]
#[doc(alias = "vmm_pool_memory_resource")]
#[derive(Clone)]
pub struct VmmPoolMemoryResource {
    inner: Arc<Pool<Mapper>>,
}

impl VmmPoolMemoryResource {
    /// A pool of at most `maximum_pool_size` bytes on the current device, with the defaults of
    /// [`VmmPoolOptions::new`] (nothing mapped until the first allocation, the recommended
    /// granularity): `with_options(VmmPoolOptions::new(maximum_pool_size))`.
    ///
    /// # Errors
    /// As [`with_options`](Self::with_options).
    pub fn new(maximum_pool_size: usize) -> MrResult<Self> {
        Self::with_options(VmmPoolOptions::new(maximum_pool_size))
    }

    /// A pool on the current device built with `options` (see [`VmmPoolOptions`]).
    ///
    /// # Errors
    /// [`MrError::Unsupported`] when the device or its driver lacks virtual memory management,
    /// or the export handle type is not supported; [`MrError::InvalidArgument`] for sizes or a
    /// granularity [`VmmPoolOptions`] describes as invalid; out-of-memory when the address
    /// range or the initial memory cannot be had; the driver's error otherwise.
    pub fn with_options(options: VmmPoolOptions) -> MrResult<Self> {
        let device = rmm_sys::current_device()?;
        if !sys_vmm::vmm_supported(device)? {
            return Err(MrError::Unsupported(format!(
                "{NAME}: device {device} or its driver does not support virtual memory management"
            )));
        }
        let handle_type = options
            .export_handle_type
            .unwrap_or(AllocationHandleType::None);
        match handle_type {
            AllocationHandleType::None => {}
            AllocationHandleType::PosixFileDescriptor
                if cfg!(unix) && sys_vmm::posix_fd_supported(device)? => {}
            AllocationHandleType::Fabric if rmm_sys::ipc::fabric_supported(device)? => {}
            other => {
                return Err(MrError::Unsupported(format!(
                    "{NAME}: export handle type {other:?} is not supported here (POSIX file \
                     descriptors and fabric handles are, where the device supports them)"
                )))
            }
        }
        let minimum = sys_vmm::allocation_granularity(device, handle_type, Granularity::Minimum)?;
        let recommended =
            sys_vmm::allocation_granularity(device, handle_type, Granularity::Recommended)?;
        let geometry = Geometry::new(
            options.maximum_pool_size,
            options.initial_pool_size,
            options.granularity,
            recommended,
            minimum,
        )
        .map_err(MrError::invalid_argument)?;
        let mut access = vec![device];
        for peer in options.peer_access {
            if !access.contains(&peer) {
                access.push(peer);
            }
        }
        let mapper = Mapper::device(
            device,
            handle_type,
            access,
            geometry.capacity,
            geometry.granularity,
            minimum,
        )?;
        mapper.set_min_growth_percent(options.min_growth_percent);
        Self::build(mapper, geometry)
    }

    /// The same pool over simulated memory: fake addresses that nothing may touch (its
    /// [`properties`](DeviceMemoryResource::properties) say so, and containers refuse it), no
    /// CUDA call on the legacy default stream, no GPU needed. For replays and "does this fit?"
    /// questions, like [`SimulatedMemoryResource`](crate::SimulatedMemoryResource). The
    /// granularity is the options' (any positive multiple of 256) or 2 MiB; peers are ignored.
    ///
    /// # Errors
    /// [`MrError::InvalidArgument`] for invalid sizes, an export handle type (simulated memory
    /// cannot be exported), or when the simulated address space is used up.
    pub fn simulated(options: VmmPoolOptions) -> MrResult<Self> {
        if options
            .export_handle_type
            .is_some_and(|t| t != AllocationHandleType::None)
        {
            return Err(MrError::invalid_argument(format!(
                "{NAME}: simulated memory cannot be exported"
            )));
        }
        let geometry = Geometry::new(
            options.maximum_pool_size,
            options.initial_pool_size,
            options.granularity,
            SIMULATED_GRANULARITY,
            ALLOCATION_ALIGNMENT,
        )
        .map_err(MrError::invalid_argument)?;
        let mapper = Mapper::simulated(geometry.capacity, geometry.granularity)?;
        mapper.set_min_growth_percent(options.min_growth_percent);
        Self::build(mapper, geometry)
    }

    fn build(mapper: Mapper, geometry: Geometry) -> MrResult<Self> {
        let chunks = Contiguous::new(mapper.end());
        let vmm = Pool::new(mapper, chunks);
        if geometry.initial > 0 {
            let (ptr, size) =
                vmm.growth
                    .grow(geometry.initial, geometry.initial, 0, GrowthCause::Ordinary)?;
            vmm.core.add_initial_chunk(ptr, size)?;
        }
        Ok(Self {
            inner: Arc::new(vmm),
        })
    }

    /// Bytes mapped now (the sum of the chunks).
    #[must_use]
    pub fn pool_size(&self) -> usize {
        self.inner.core.pool_size()
    }

    /// The most the pool maps: the maximum pool size rounded down to the granularity, which is
    /// also the size of its address range.
    #[must_use]
    pub fn maximum_pool_size(&self) -> usize {
        self.inner.growth.capacity()
    }

    /// The granularity chunks are mapped in.
    #[must_use]
    pub fn granularity(&self) -> usize {
        self.inner.growth.granularity()
    }

    /// The first address of the reserved range: every allocation lies in
    /// `[address_base, address_base + maximum_pool_size)`.
    #[must_use]
    pub fn address_base(&self) -> DevicePtr {
        self.inner.growth.base()
    }

    /// Number of chunks mapped now.
    #[must_use]
    pub fn chunk_count(&self) -> usize {
        self.inner.growth.chunk_count()
    }

    /// The device the pool maps memory on (`None` for a [simulated](Self::simulated) pool).
    #[must_use]
    pub fn device(&self) -> Option<DeviceId> {
        self.inner.growth.device_id()
    }

    /// Number of allocations handed out and not yet freed.
    #[must_use]
    pub fn outstanding_allocations(&self) -> usize {
        self.inner.core.outstanding()
    }

    /// How long growers held this resource's growth lock so far (each hold: the search, the
    /// waits for frees and merges to land, the upstream call). With the `testing`
    /// feature only; `gpu_alloc` prints it.
    #[cfg(any(test, feature = "testing"))]
    #[must_use]
    pub fn growth_lock_holds(&self) -> crate::testing::GrowthLockHolds {
        self.inner.core.growth_lock_holds()
    }

    /// How often the pool mapped and unmapped chunks, and the time that took.
    #[must_use]
    pub fn growth_statistics(&self) -> VmmGrowthStatistics {
        self.inner.growth.statistics()
    }

    /// Unmaps and releases every chunk no allocation uses and returns the bytes released. The
    /// device is synchronized first, so no pending work on any stream can still use the memory
    /// (unmapping memory in use is undefined behaviour on the device). Chunks released before
    /// the last mapped one leave holes in the range, which growth maps again when needed.
    ///
    /// # Errors
    ///
    /// A failed synchronization (nothing is released) or the first failed unmapping (that
    /// chunk stays mapped and in the pool; the others are released).
    pub fn release_unused(&self) -> MrResult<usize> {
        self.inner.release_unused()
    }

    /// Everything the pool's core keeps (tests).
    #[cfg(test)]
    pub(crate) fn core_state(&self) -> crate::stream_ordered::core::tests::CoreState {
        self.inner.core.state()
    }

    /// The mapper (tests, and `export`'s IPC exports).
    pub(crate) fn mapper(&self) -> &Mapper {
        &self.inner.growth
    }
}

impl fmt::Debug for VmmPoolMemoryResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VmmPoolMemoryResource")
            .field("pool_size", &self.pool_size())
            .field("maximum_pool_size", &self.maximum_pool_size())
            .field("chunks", &self.chunk_count())
            .field("core", &self.inner.core)
            .field("mapper", &self.inner.growth)
            .finish()
    }
}

// SAFETY: blocks are disjoint, 256-byte aligned sub-ranges of chunks mapped into this
// resource's reserved range (or of simulated addresses, which the properties forbid touching);
// a chunk stays mapped while any block of it is handed out (release_unused unmaps only wholly
// free chunks, after a device synchronization), and a block is handed out again only after it
// was freed, ordered after the freeing stream's work.
unsafe impl DeviceMemoryResource for VmmPoolMemoryResource {
    #[inline]
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        self.inner.allocate(stream, bytes, alignment)
    }

    crate::resource::resource_tail! {
        deallocate: forward(inner),
        is_equal: shared(inner),
        properties: forward(inner.growth),
        snapshot: forward(inner),
    }
}
