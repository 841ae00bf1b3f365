//! The pool's engine, which the pool and the VMM pool share whole: the stream-ordered core over
//! [`PoolBlocks`] (the per-stream boundary lists, `boundary_list` with its size classes,
//! `size_index`, and address tables, `crate::util::addr_table`, with the record of handed-out
//! blocks, `handed`), allocations above 256-byte alignment, the hot paths of `allocate` and
//! `deallocate` (after the graph pools' routing), the release of wholly free chunks and the
//! drop. The two resources differ only in where a new
//! chunk comes from and where a released one goes ([`Growth`]): the pool takes separate chunks
//! from its upstream; the VMM pool maps chunks at the end of one reserved range, where they
//! merge with the free block before them.

use rmm_stream::CudaStreamView;
use rmm_sys::{checked_align_up, DevicePtr, ALLOCATION_ALIGNMENT};

use self::blocks::PoolBlocks;
use crate::error::{MrError, MrResult};
use crate::resource::DeviceMemoryResource;
use crate::stream_ordered::core::{Expand, StreamOrdered};
use crate::util::alignment::{self, OverAligned, MAX_OVER_ALIGNMENT};

mod blocks;
mod boundary_list;
mod handed;
mod size_index;

pub(crate) use blocks::{ChunkLayout, Contiguous, Separate};
pub use boundary_list::{Block, FreeListError};
#[cfg(any(test, feature = "testing"))]
pub(crate) use size_index::{NodeId, SizeIndex};

/// Where a pool's chunks come from and go back to.
pub(crate) trait Growth: Send + Sync + 'static {
    /// The resource's name in messages.
    const NAME: &'static str;

    /// How the chunks lie (whether they merge).
    type Layout: ChunkLayout;

    /// The resource that hands out the chunks [`grow`](Self::grow) returns and takes them back
    /// (`release_unused`, the drop, a chunk the core refused).
    fn source(&self) -> &dyn DeviceMemoryResource;

    /// The largest request for which giving the wholly free chunks back can make room to grow
    /// (the maximum pool size), or `None` when it cannot be known (no maximum: the source
    /// refused): see `StreamOrdered::release_before_failing`.
    fn release_limit(&self) -> Option<usize>;

    /// A new chunk for a request of `size` bytes (a multiple of 256; `bytes` is the caller's
    /// request, for the error) on `stream`, when the pool holds `ask.pool_size` bytes and the
    /// stream's list has a free block of `ask.tail` bytes at the end of the memory (always 0
    /// for chunks that never merge; see [`FreeBlocks::extendable_tail`]). For
    /// [`GrowthCause::Ordinary`] the chunk follows the resource's growth rule; for
    /// [`GrowthCause::Pressure`] (memory that fits exists but waits on its owner's event) it is
    /// only what the request needs, rounded to the resource's granularity. Called with the
    /// core's growth lock held.
    ///
    /// [`FreeBlocks::extendable_tail`]: crate::stream_ordered::core::FreeBlocks::extendable_tail
    /// [`GrowthCause::Ordinary`]: crate::stream_ordered::core::GrowthCause::Ordinary
    /// [`GrowthCause::Pressure`]: crate::stream_ordered::core::GrowthCause::Pressure
    fn grow(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        size: usize,
        ask: Expand,
    ) -> MrResult<(DevicePtr, usize)>;
}

/// A coalescing best-fit pool over the stream-ordered core, growing through `G`. See the
/// [module documentation](self).
pub(crate) struct Pool<G: Growth> {
    pub(crate) core: StreamOrdered<PoolBlocks<G::Layout>>,
    pub(crate) growth: G,
    /// Allocations made with an alignment above 256.
    over_aligned: OverAligned,
}

impl<G: Growth> Pool<G> {
    /// A pool without chunks whose chunks will lie as `chunks` says.
    pub(crate) fn new(growth: G, chunks: G::Layout) -> Self {
        Self {
            core: StreamOrdered::new(PoolBlocks::new(chunks))
                .release_before_failing(growth.release_limit()),
            growth,
            over_aligned: OverAligned::default(),
        }
    }

    /// [`DeviceMemoryResource::allocate`] of both resources: from a graph pool when `stream`
    /// is in an rmm-rs capture, else from this pool.
    #[inline]
    pub(crate) fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        if let Some(routed) = crate::graph::route_allocate(stream, bytes, alignment) {
            return routed;
        }
        let alignment = alignment::check(alignment, MAX_OVER_ALIGNMENT)?;
        if alignment > ALLOCATION_ALIGNMENT {
            return self.allocate_over_aligned(stream, bytes, alignment);
        }
        self.allocate_block(stream, bytes)
    }

    /// [`DeviceMemoryResource::deallocate`] of both resources: to its graph pool when one owns
    /// `ptr` (or refused, see `crate::graph::route_deallocate`), else to this pool.
    ///
    /// # Safety
    /// As [`DeviceMemoryResource::deallocate`].
    #[inline]
    pub(crate) unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()> {
        // SAFETY: the caller's contract.
        let routed = unsafe { crate::graph::route_deallocate(stream, ptr, bytes, alignment) };
        if let Some(routed) = routed {
            return routed;
        }
        if let Some(alignment) = alignment::over_aligned(alignment, MAX_OVER_ALIGNMENT) {
            return self
                .over_aligned
                .deallocate(ptr, bytes, alignment, |block, size| {
                    // SAFETY: the caller's contract, for the block the allocation lies in.
                    unsafe { self.core.deallocate(stream, block, size) }
                });
        }
        // SAFETY: the caller's contract.
        unsafe { self.core.deallocate(stream, ptr, bytes) }
    }

    /// Releases every wholly free chunk to the source (after a device synchronization) and
    /// returns the bytes released.
    pub(crate) fn release_unused(&self) -> MrResult<usize> {
        self.core.release_unused(self.growth.source())
    }

    /// A block of `bytes` (rounded up to 256) on `stream`.
    #[inline]
    fn allocate_block(&self, stream: CudaStreamView<'_>, bytes: usize) -> MrResult<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let size = checked_align_up(bytes, ALLOCATION_ALIGNMENT)
            .ok_or_else(|| MrError::max_allocation_exceeded(bytes))?;
        self.core
            .allocate(stream, size, self.growth.source(), |ask| {
                self.growth.grow(stream, bytes, size, ask)
            })
            .map_err(|e| self.with_oom_report(e))
    }

    /// `bytes` aligned to `alignment` (above 256), from a larger block.
    #[cold]
    fn allocate_over_aligned(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        let give_back = |block, size| {
            // SAFETY: the block was just allocated here on `stream` and never handed out.
            if let Err(e) = unsafe { self.core.deallocate(stream, block, size) } {
                log::error!("rmm: {} could not take back block {block}: {e}", G::NAME);
            }
        };
        self.over_aligned.allocate(
            bytes,
            alignment,
            G::NAME,
            |size| self.allocate_block(stream, size),
            give_back,
        )
    }
}

impl<G: Growth> Drop for Pool<G> {
    fn drop(&mut self) {
        // Every chunk goes back to the source (after a device synchronization if a block was
        // ever handed out), allocations outstanding or not.
        self.core.release_all(self.growth.source(), G::NAME);
    }
}
