//! The fixed-size resource (RMM's `fixed_size_memory_resource`).

use std::fmt;
use std::sync::Arc;

use rmm_stream::CudaStreamView;
use rmm_sys::{align_up, DevicePtr, ALLOCATION_ALIGNMENT};

use crate::error::{InvalidFree, MrError, MrResult};
use crate::fixed_size::block_table::{BlockId, BlockLedger, BlockTable};
use crate::fixed_size::chunk::{rounded_block_size, FixedSizeError};
use crate::fixed_size::ring::Ring;
use crate::resource::{DeviceMemoryResource, SharedResource};
use crate::stream_ordered::accept_chunk;
use crate::stream_ordered::core::{FreeBlocks, StreamLists, StreamOrdered};
use crate::stream_ordered::tuning::THIEF_SHARE;
use crate::util::alignment;
use crate::util::cross_thread::Origin;

/// RMM's default block size: 1 MiB.
pub const DEFAULT_BLOCK_SIZE: usize = 1 << 20;

/// RMM's default number of blocks per upstream chunk.
pub const DEFAULT_BLOCKS_TO_PREALLOCATE: usize = 128;

/// How to build a [`FixedSizeMemoryResource`] (RMM's constructor parameters).
///
/// Built with [`new`](Self::new) or `default()` (RMM's defaults) and the chained setters; the
/// fields are public to read. `#[non_exhaustive]`: later options do not break callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FixedSizeOptions {
    /// The size of every block, rounded up to 256 (default [`DEFAULT_BLOCK_SIZE`], 1 MiB).
    pub block_size: usize,
    /// How many blocks each upstream chunk holds; the first chunk is taken at construction
    /// (default [`DEFAULT_BLOCKS_TO_PREALLOCATE`], 128).
    pub blocks_to_preallocate: usize,
}

impl Default for FixedSizeOptions {
    fn default() -> Self {
        Self {
            block_size: DEFAULT_BLOCK_SIZE,
            blocks_to_preallocate: DEFAULT_BLOCKS_TO_PREALLOCATE,
        }
    }
}

impl FixedSizeOptions {
    /// RMM's defaults: blocks of 1 MiB, 128 per chunk.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the field `block_size`.
    #[must_use]
    pub fn block_size(mut self, bytes: usize) -> Self {
        self.block_size = bytes;
        self
    }

    /// Sets the field `blocks_to_preallocate`.
    #[must_use]
    pub fn blocks_to_preallocate(mut self, blocks: usize) -> Self {
        self.blocks_to_preallocate = blocks;
        self
    }
}

/// One stream's free blocks (a FIFO, as RMM's list: each block's address with the id of its
/// slot, so handing it out needs no search), with the resource-wide ledger of handed-out blocks
/// every list shares and this list's snapshot of its chunk table (refreshed only when a chunk
/// is missing from it: chunks are only ever added).
#[derive(Debug, Clone)]
pub(super) struct FixedBlocks {
    free: Ring<(u64, BlockId)>,
    ledger: Arc<BlockLedger>,
    table: BlockTable,
}

impl FixedBlocks {
    fn new(ledger: BlockLedger) -> Self {
        Self {
            free: Ring::new(),
            ledger: Arc::new(ledger),
            table: BlockTable::default(),
        }
    }

    /// Replaces this list's table by the ledger's latest (called when a chunk is missing from
    /// it: chunks are only ever added, so nothing else can make it stale).
    #[cold]
    #[inline(never)]
    fn refresh(&mut self) {
        self.table = self.ledger.table();
    }

    /// The rest of [`FreeBlocks::hand_out`] after the table refused it with `e`: again with the
    /// latest table when this one lacks the address.
    #[cold]
    #[inline(never)]
    fn hand_out_again(
        &mut self,
        id: BlockId,
        addr: u64,
        size: usize,
        origin: Origin,
        e: FixedSizeError,
    ) -> Result<(), String> {
        let mut r = Err(e);
        if let Err(FixedSizeError::UnknownAddress { .. }) = r {
            self.refresh();
            r = self.table.hand_out_id(id, addr, size, origin.to_word());
        }
        r.map_err(|e| e.to_string())
    }

    /// The rest of [`FreeBlocks::take_back`] after the table refused it with `e`: again with the
    /// latest table when this one lacks the address, then the kind of wrong free.
    #[cold]
    #[inline(never)]
    fn take_back_again(
        &mut self,
        addr: u64,
        size: usize,
        e: FixedSizeError,
    ) -> Result<(BlockId, Origin), Option<InvalidFree>> {
        let mut r = Err(e);
        if let Err(FixedSizeError::UnknownAddress { .. }) = r {
            self.refresh();
            r = self.table.take_back_id(addr, size);
        }
        r.map(|(id, origin)| (id, Origin::from_word(origin)))
            .map_err(|e| {
                Some(match e {
                    FixedSizeError::DoubleFree { .. } => InvalidFree::DoubleFree,
                    FixedSizeError::SizeMismatch { allocated, .. } => {
                        InvalidFree::SizeMismatch { allocated }
                    }
                    _ => InvalidFree::UnknownPointer,
                })
            })
    }
}

impl FreeBlocks for FixedBlocks {
    /// Where the block's slot is.
    type Tag = BlockId;

    #[inline]
    fn take(&mut self, _size: usize) -> Option<(u64, BlockId)> {
        self.free.pop_front()
    }

    fn fits(&self, _size: usize) -> bool {
        !self.free.is_empty()
    }

    #[inline]
    fn put(&mut self, addr: u64, _size: usize, id: BlockId) -> Result<(), String> {
        // Only blocks the ledger just took back, or blocks just taken from a list, come here.
        self.free.push_back((addr, id));
        Ok(())
    }

    fn add_chunk(&mut self, addr: u64, size: usize) -> Result<(), String> {
        let count = size / self.ledger.block_size();
        let (_, table) = self
            .ledger
            .add_numbered_chunk(addr, count)
            .map_err(|e| e.to_string())?;
        self.table = table;
        // The new chunk is the last numbered one.
        let chunk = self
            .table
            .numbered_chunks()
            .last()
            .ok_or("the ledger lost the chunk it just added")?;
        self.free.extend(chunk.blocks());
        Ok(())
    }

    fn absorb(&mut self, other: &mut Self) -> Result<(), String> {
        self.free.append(&mut other.free);
        Ok(())
    }

    fn is_empty(&self) -> bool {
        self.free.is_empty()
    }

    /// Half the victim's blocks, at most [`THIEF_SHARE`]: every block fits every request.
    fn share_with_thief(&mut self, _size: usize, into: &mut Self) {
        for _ in 0..(self.free.len() / 2).min(THIEF_SHARE) {
            match self.free.pop_front() {
                Some(block) => into.free.push_back(block),
                None => break,
            }
        }
    }

    fn holds(&self, addr: u64) -> bool {
        self.free.iter().any(|(a, _)| a == addr)
    }

    fn remove_chunk(&mut self, _addr: u64, _size: usize) -> bool {
        // Blocks of one chunk are scattered through the FIFOs; chunks are not given back early.
        false
    }

    #[inline]
    fn hand_out(
        &mut self,
        addr: u64,
        size: usize,
        id: BlockId,
        origin: Origin,
    ) -> Result<(), String> {
        match self.table.hand_out_id(id, addr, size, origin.to_word()) {
            Ok(()) => Ok(()),
            Err(e) => self.hand_out_again(id, addr, size, origin, e),
        }
    }

    #[inline]
    fn take_back(
        &mut self,
        addr: u64,
        size: usize,
    ) -> Result<(BlockId, Origin), Option<InvalidFree>> {
        match self.table.take_back_id(addr, size) {
            Ok((id, origin)) => Ok((id, Origin::from_word(origin))),
            Err(e) => self.take_back_again(addr, size, e),
        }
    }

    fn handed_out(&self) -> (usize, usize) {
        self.ledger.handed_out()
    }

    fn free_blocks(&self) -> Vec<(u64, usize)> {
        let size = self.ledger.block_size();
        self.free.iter().map(|(addr, _)| (addr, size)).collect()
    }

    fn handed_blocks(&self) -> Vec<(u64, usize)> {
        let table = self.ledger.table();
        table
            .chunks()
            .flat_map(|c| {
                c.blocks()
                    .enumerate()
                    .filter_map(|(i, (addr, _))| c.handed_size(i).map(|s| (addr, s)))
            })
            .collect()
    }
}

pub(super) struct FixedSize<U: DeviceMemoryResource> {
    pub(super) core: StreamOrdered<FixedBlocks>,
    pub(super) block_size: usize,
    chunk_size: usize,
    upstream: U,
}

impl<U: DeviceMemoryResource> Drop for FixedSize<U> {
    fn drop(&mut self) {
        self.core
            .release_all(&self.upstream, "fixed_size_memory_resource");
    }
}

/// The name in messages.
const NAME: &str = "fixed_size_memory_resource";

/// Hands out blocks of one size from chunks of its upstream (RMM's
/// `fixed_size_memory_resource`), with the same per-stream free lists, stealing, merging and
/// events as [`PoolMemoryResource`](crate::PoolMemoryResource) (the two share one
/// stream-ordered core, as RMM's share a CRTP base; the design notes there apply here).
///
/// - The block size is rounded up to 256; any request up to it takes one whole block, O(1)
///   (a FIFO list per stream); a larger request is out-of-memory `"Maximum allocation size
///   exceeded (failed to allocate X)"`. `allocate(_, 0, _)` is [`DevicePtr::NULL`]. Blocks are
///   256-aligned: beyond RMM (which ignores the alignment argument), a larger alignment is
///   refused with [`MrError::BadAlloc`] naming 256, and an upstream chunk that is not
///   256-aligned is given back and refused.
/// - Construction takes one chunk of `block_size * blocks_to_preallocate` bytes on the legacy
///   stream; when every block is in use, another whole chunk is taken on the requesting stream
///   (an upstream failure is passed on). Dropping the resource returns every chunk.
/// - Beyond RMM: wrong frees are [`MrError::InvalidFree`]; the resource is `Send + Sync` with
///   one lock per stream list rather than one mutex; a block allocated on one thread's
///   per-thread default stream and freed on another thread's goes to the legacy stream's list,
///   not the freeing thread's, so it is not reused before the allocating thread's work is done
///   (as in the pool, whose notes say more; RMM reuses it on the freeing thread at once).
/// - Copies share state and are equal; two resources are unequal.
#[doc(alias = "rmm::mr::fixed_size_memory_resource")]
pub struct FixedSizeMemoryResource<U: DeviceMemoryResource = SharedResource> {
    pub(super) inner: Arc<FixedSize<U>>,
}

impl<U: DeviceMemoryResource> Clone for FixedSizeMemoryResource<U> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<U: DeviceMemoryResource> FixedSizeMemoryResource<U> {
    /// RMM's defaults: blocks of 1 MiB, 128 of them preallocated.
    ///
    /// # Errors
    ///
    /// As [`with_options`](Self::with_options).
    pub fn new(upstream: U) -> MrResult<Self> {
        Self::with_options(upstream, FixedSizeOptions::default())
    }

    /// Blocks of [`block_size`](FixedSizeOptions::block_size) bytes (rounded up to 256), taken
    /// from the upstream [`blocks_to_preallocate`](FixedSizeOptions::blocks_to_preallocate) at
    /// a time; the first chunk is taken now.
    ///
    /// # Errors
    ///
    /// [`MrError::InvalidArgument`] for a zero block size or block count, or a chunk size that
    /// overflows; the upstream's error when it refuses the first chunk.
    pub fn with_options(upstream: U, options: FixedSizeOptions) -> MrResult<Self> {
        let FixedSizeOptions {
            block_size,
            blocks_to_preallocate,
        } = options;
        let block_size =
            rounded_block_size(block_size).map_err(|e| MrError::invalid_argument(e.to_string()))?;
        if blocks_to_preallocate == 0 {
            return Err(MrError::invalid_argument(
                "fixed_size_memory_resource needs at least one block per chunk",
            ));
        }
        let chunk_size = block_size
            .checked_mul(blocks_to_preallocate)
            .ok_or_else(|| {
                MrError::invalid_argument(format!(
                    "a chunk of {blocks_to_preallocate} blocks of {block_size} bytes overflows"
                ))
            })?;
        let fixed = FixedSize {
            core: StreamOrdered::new(FixedBlocks::new(
                BlockLedger::new(block_size)
                    .map_err(|e| MrError::invalid_argument(e.to_string()))?,
            )),
            block_size,
            chunk_size,
            upstream,
        };
        let stream = CudaStreamView::legacy();
        let ptr = fixed
            .upstream
            .allocate(stream, chunk_size, ALLOCATION_ALIGNMENT)?;
        // SAFETY: the upstream just handed out this chunk on `stream` for `chunk_size` bytes.
        let ptr = unsafe { accept_chunk(&fixed.upstream, stream, ptr, chunk_size, NAME)? };
        fixed.core.add_initial_chunk(ptr, chunk_size)?;
        Ok(Self {
            inner: Arc::new(fixed),
        })
    }

    /// The size of every block (RMM's `get_block_size()`).
    #[must_use]
    pub fn block_size(&self) -> usize {
        self.inner.block_size
    }

    /// The upstream resource (RMM's `get_upstream_resource()`).
    #[must_use]
    pub fn upstream(&self) -> &U {
        &self.inner.upstream
    }

    /// Bytes obtained from the upstream (whole chunks).
    #[must_use]
    pub fn pool_size(&self) -> usize {
        self.inner.core.pool_size()
    }

    /// Everything the resource's core keeps (tests).
    #[cfg(test)]
    pub(crate) fn core_state(&self) -> crate::stream_ordered::core::tests::CoreState {
        self.inner.core.state()
    }

    /// Number of blocks handed out and not yet freed.
    #[must_use]
    pub fn outstanding_allocations(&self) -> usize {
        self.inner.core.outstanding()
    }

    /// Whether `ptr` lies in one of this resource's chunks (handed out or free): for the
    /// binning resource, to find which of its bins a block belongs to. Takes the chunk lock.
    pub(crate) fn owns(&self, ptr: DevicePtr) -> bool {
        self.inner.core.owns(ptr.addr())
    }

    /// How long growers held this resource's growth lock so far (each hold: the search, the
    /// waits for frees and merges to land, the upstream call). With the `testing`
    /// feature only; `gpu_alloc` prints it.
    #[cfg(any(test, feature = "testing"))]
    #[must_use]
    pub fn growth_lock_holds(&self) -> crate::testing::GrowthLockHolds {
        self.inner.core.growth_lock_holds()
    }
}

/// How many stream lists `resource` keeps; with `retire`, after retiring those whose owner died
/// since the last look (for tests and figures, through `rmm_mr::__internals`).
pub fn stream_lists<U: DeviceMemoryResource>(
    resource: &FixedSizeMemoryResource<U>,
    retire: bool,
) -> StreamLists {
    resource.inner.core.stream_lists(retire)
}

impl<U: DeviceMemoryResource> fmt::Debug for FixedSizeMemoryResource<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FixedSizeMemoryResource")
            .field("block_size", &self.inner.block_size)
            .field("chunk_size", &self.inner.chunk_size)
            .field("core", &self.inner.core)
            .field("upstream", &self.inner.upstream)
            .finish()
    }
}

// SAFETY: blocks are disjoint, 256-byte aligned sub-ranges of chunks the upstream (bound by
// this trait's contract) handed out and this resource holds until it is dropped; a block is
// handed out again only after it was freed, ordered after the freeing stream's work.
unsafe impl<U: DeviceMemoryResource> DeviceMemoryResource for FixedSizeMemoryResource<U> {
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        if let Some(routed) = crate::graph::route_allocate(stream, bytes, alignment) {
            return routed;
        }
        alignment::check(alignment, ALLOCATION_ALIGNMENT)?;
        self.allocate_block(stream, bytes)
    }

    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()> {
        // SAFETY: the trait's contract.
        let routed = unsafe { crate::graph::route_deallocate(stream, ptr, bytes, alignment) };
        if let Some(routed) = routed {
            return routed;
        }
        // SAFETY: the trait's contract.
        unsafe { self.deallocate_block(stream, ptr, bytes) }
    }

    fn snapshot(&self) -> MrResult<crate::Snapshot> {
        Ok(self.diagnostics_snapshot())
    }

    crate::resource::resource_tail! {
        is_equal: shared(inner),
        properties: forward(inner.upstream),
    }
}

impl<U: DeviceMemoryResource> FixedSizeMemoryResource<U> {
    /// [`allocate`](DeviceMemoryResource::allocate) once the alignment is known to be at most
    /// 256 (every block is 256-aligned): for the binning resource, which checked it.
    #[inline]
    pub(crate) fn allocate_block(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
    ) -> MrResult<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let inner = &*self.inner;
        if bytes > inner.block_size {
            return Err(self.with_oom_report(MrError::max_allocation_exceeded(bytes)));
        }
        // `block_size` is a multiple of 256, so this cannot overflow past it.
        let size = align_up(bytes, ALLOCATION_ALIGNMENT);
        inner
            .core
            .allocate(stream, size, &inner.upstream, |_| {
                // One chunk of the configured block count, under pressure too (RMM's growth; it
                // never doubles). A pool beneath sees the pressure (`PressureScope`) and grows by
                // this chunk only.
                let size = inner.chunk_size;
                // Refused under a capture not begun through a `GraphPool`.
                let chunk = crate::graph::growth(stream, bytes, || {
                    inner.upstream.allocate(stream, size, ALLOCATION_ALIGNMENT)
                })?;
                // SAFETY: the upstream just handed out this chunk on `stream` for `size` bytes.
                let chunk = unsafe { accept_chunk(&inner.upstream, stream, chunk, size, NAME)? };
                Ok((chunk, size))
            })
            .map_err(|e| self.with_oom_report(e))
    }

    /// [`deallocate`](DeviceMemoryResource::deallocate), which ignores the alignment.
    ///
    /// # Safety
    /// As [`DeviceMemoryResource::deallocate`].
    #[inline]
    pub(crate) unsafe fn deallocate_block(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
    ) -> MrResult<()> {
        // SAFETY: the caller's contract.
        unsafe { self.inner.core.deallocate(stream, ptr, bytes) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::InvalidFree;
    use crate::resource::{resource_cast, shared};
    use crate::testing::HostMockResource;

    fn s() -> CudaStreamView<'static> {
        CudaStreamView::legacy()
    }

    /// A fixed-size resource over a pool (a binning resource's bin): when the bin grows under
    /// pressure (stream B misses while stream A's list holds a block no event covers yet), the
    /// pool beneath grows by the bin's chunk only, not by its own size.
    #[test]
    fn a_bins_growth_under_pressure_grows_the_pool_beneath_by_one_chunk() {
        use crate::{PoolMemoryResource, SimulatedMemoryResource};
        const MIB: usize = 1 << 20;
        let _sim = rmm_sys::fault::FaultScope::simulated();
        let device = SimulatedMemoryResource::new(1 << 40).unwrap();
        let pool = PoolMemoryResource::new(device.clone(), 0).unwrap();
        let held = pool.allocate(s(), 16 * MIB, 256).unwrap();
        // The bin's first chunk (4 MiB) makes the pool grow by its size: 16 + 16 MiB.
        let bin = FixedSizeMemoryResource::with_options(
            pool.clone(),
            FixedSizeOptions::new()
                .block_size(MIB)
                .blocks_to_preallocate(4),
        )
        .unwrap();
        assert_eq!(pool.pool_size(), 32 * MIB);
        // The rest of the pool is used: its next growth must come from the upstream.
        let filler = pool.allocate(s(), 12 * MIB, 256).unwrap();
        let [a, b] = [1, 2].map(CudaStreamView::simulated);
        let mut blocks: Vec<DevicePtr> =
            (0..4).map(|_| bin.allocate(a, MIB, 256).unwrap()).collect();
        assert_eq!(bin.pool_size(), 4 * MIB);
        let freed = blocks.pop().unwrap();
        // SAFETY: from `bin` with this size on `a`, freed once.
        unsafe { bin.deallocate(a, freed, MIB, 256).unwrap() };
        // B finds A's block uncovered: the bin grows one chunk under pressure, and the pool
        // beneath by that chunk (RMM's rule would have doubled it: 32 MiB more).
        let got = bin.allocate(b, MIB, 256).unwrap();
        assert_eq!(bin.pool_size(), 8 * MIB);
        assert_eq!(
            pool.pool_size(),
            36 * MIB,
            "the pool beneath grew by its own size"
        );
        assert_eq!(device.used(), 36 * MIB);
        // SAFETY: every block from `bin` or `pool` with these sizes, freed once.
        unsafe {
            for p in blocks {
                bin.deallocate(a, p, MIB, 256).unwrap();
            }
            bin.deallocate(b, got, MIB, 256).unwrap();
            pool.deallocate(s(), filler, 12 * MIB, 256).unwrap();
            pool.deallocate(s(), held, 16 * MIB, 256).unwrap();
        }
    }

    fn fixed(
        block_size: usize,
        blocks: usize,
    ) -> (FixedSizeMemoryResource<HostMockResource>, HostMockResource) {
        let mock = HostMockResource::new();
        let r = FixedSizeMemoryResource::with_options(
            mock.clone(),
            FixedSizeOptions::new()
                .block_size(block_size)
                .blocks_to_preallocate(blocks),
        )
        .unwrap();
        (r, mock)
    }

    fn invalid_free_kind(r: MrResult<()>) -> InvalidFree {
        match r {
            Err(MrError::InvalidFree { kind, .. }) => kind,
            other => panic!("expected an invalid free, got {other:?}"),
        }
    }

    /// A stream whose list is empty steals one block and takes half the victim's others
    /// along (at most `THIEF_SHARE`), so that its next allocations need no steal (and no wait).
    #[test]
    fn a_thief_takes_a_share_of_the_victims_blocks_along() {
        use crate::stream_ordered::stream_lists::StreamKey;
        let _sim = rmm_sys::fault::FaultScope::simulated();
        let (r, _mock) = fixed(1024, 9);
        let blocks: Vec<DevicePtr> = (0..9)
            .map(|_| r.allocate(s(), 1024, 256).unwrap())
            .collect();
        for &p in &blocks {
            // SAFETY: from `r` with this size, freed once.
            unsafe { r.deallocate(s(), p, 1024, 256).unwrap() };
        }
        let holder = |ptr: DevicePtr| r.inner.core.list_holding(ptr.addr());
        let count = |key: Option<StreamKey>| blocks.iter().filter(|&&p| holder(p) == key).count();
        assert_eq!(count(Some(StreamKey::Legacy)), 9);
        let b = CudaStreamView::simulated(2);
        let first = r.allocate(b, 1024, 256).unwrap();
        assert_eq!(r.pool_size(), 9 * 1024, "grew instead of stealing");
        // One taken, half of the other 8 moved to b's list.
        assert_eq!(count(Some(StreamKey::Legacy)), 4);
        assert_eq!(count(None), 1);
        let mine: Vec<DevicePtr> = (0..4).map(|_| r.allocate(b, 1024, 256).unwrap()).collect();
        assert_eq!(
            count(Some(StreamKey::Legacy)),
            4,
            "b stole again instead of using its share"
        );
        assert_eq!(count(None), 5);
        // SAFETY: from `r` with this size, each freed once.
        unsafe {
            for p in mine.into_iter().chain([first]) {
                r.deallocate(b, p, 1024, 256).unwrap();
            }
        }
    }

    #[test]
    fn a_per_thread_block_freed_on_another_thread_goes_to_the_legacy_list() {
        use crate::stream_ordered::stream_lists::{thread_number, StreamKey};
        let pt = CudaStreamView::per_thread();
        // One block per chunk: once the legacy stream holds the first, the per-thread stream
        // grows a chunk into its own list (no steal, so no CUDA call).
        let (r, _mock) = fixed(1024, 1);
        let first = r.allocate(s(), 1024, 256).unwrap();
        let a = r.allocate(pt, 1000, 256).unwrap();
        let b = r.allocate(pt, 1000, 256).unwrap();
        let holder = |ptr: DevicePtr| r.inner.core.list_holding(ptr.addr());
        // SAFETY: `b` came from `r`, freed once.
        unsafe { r.deallocate(pt, b, 1000, 256).unwrap() };
        assert_eq!(holder(b), Some(StreamKey::PerThread(thread_number())));
        std::thread::scope(|sc| {
            sc.spawn(|| {
                // SAFETY: `a` and `first` came from `r`, freed once each.
                unsafe {
                    r.deallocate(pt, a, 1000, 256).unwrap();
                    r.deallocate(pt, first, 1024, 256).unwrap();
                }
                // Allocated on the legacy stream: freed where the caller says.
                assert_eq!(holder(first), Some(StreamKey::PerThread(thread_number())));
            });
        });
        // Allocated on this thread's per-thread stream, freed on another's: the legacy list.
        assert_eq!(holder(a), Some(StreamKey::Legacy));
        assert_eq!(r.outstanding_allocations(), 0);
        // The legacy stream takes it from its own list.
        assert_eq!(r.allocate(s(), 1024, 256).unwrap(), a);
        // SAFETY: `a` came from `r` again.
        unsafe { r.deallocate(s(), a, 1024, 256).unwrap() };
    }

    /// A grower waiting after a real miss hears of every free that leaves a fitting block:
    /// into the freeing stream's list, or into the legacy list when another thread frees a
    /// per-thread block (`stream_ordered::patience`).
    #[test]
    fn frees_tell_a_watching_grower_wherever_the_block_goes() {
        let pt = CudaStreamView::per_thread();
        // One block per chunk: the legacy stream takes the first, the per-thread stream grows
        // its own (no steal, so no CUDA call).
        let (r, _mock) = fixed(1024, 1);
        let b = r.allocate(s(), 1024, 256).unwrap();
        let a = r.allocate(pt, 1024, 256).unwrap();
        let patience = r.inner.core.patience();
        let watch = patience.watch(1024);
        assert!(!patience.fit_landed());
        // SAFETY: `b` came from `r`, freed once.
        unsafe { r.deallocate(s(), b, 1024, 256).unwrap() };
        assert!(patience.fit_landed(), "an ordinary free");
        drop(watch);
        let watch = patience.watch(1024);
        std::thread::scope(|sc| {
            // SAFETY: `a` came from `r`, freed once.
            sc.spawn(|| unsafe { r.deallocate(pt, a, 1024, 256).unwrap() });
        });
        assert_eq!(
            r.inner.core.list_holding(a.addr()),
            Some(crate::stream_ordered::stream_lists::StreamKey::Legacy)
        );
        assert!(patience.fit_landed(), "a free sent to the legacy list");
        drop(watch);
    }

    #[test]
    fn construction_preallocates_one_chunk() {
        let (r, mock) = fixed(1000, 4);
        assert_eq!(r.block_size(), 1024);
        assert_eq!((mock.allocation_calls(), mock.live_bytes()), (1, 4096));
        assert_eq!(r.pool_size(), 4096);
        assert!(r.upstream().is_equal(&mock));

        let mock = HostMockResource::new();
        let d = FixedSizeMemoryResource::new(mock.clone()).unwrap();
        assert_eq!(d.block_size(), DEFAULT_BLOCK_SIZE);
        assert_eq!(
            mock.live_bytes(),
            DEFAULT_BLOCK_SIZE * DEFAULT_BLOCKS_TO_PREALLOCATE
        );
        drop(d);
        assert_eq!(mock.live_allocations(), 0);
    }

    #[test]
    fn bad_arguments_and_upstream_failure() {
        let mock = HostMockResource::new();
        for (bs, n) in [(0, 4), (256, 0), (usize::MAX, 2), (1 << 40, 1 << 40)] {
            let e = FixedSizeMemoryResource::with_options(
                mock.clone(),
                FixedSizeOptions::new()
                    .block_size(bs)
                    .blocks_to_preallocate(n),
            )
            .unwrap_err();
            assert!(matches!(e, MrError::InvalidArgument(_)), "{bs} x {n}: {e}");
        }
        assert_eq!(mock.allocation_calls(), 0);
        mock.fail_next_allocations(1);
        let e = FixedSizeMemoryResource::with_options(
            mock.clone(),
            FixedSizeOptions::new()
                .block_size(256)
                .blocks_to_preallocate(4),
        )
        .unwrap_err();
        assert!(
            e.is_out_of_memory() && e.to_string().contains("host mock"),
            "{e}"
        );
    }

    #[test]
    fn blocks_are_whole_distinct_and_grow_by_chunks() {
        let (r, mock) = fixed(1024, 4);
        assert_eq!(r.allocate(s(), 0, 256).unwrap(), DevicePtr::NULL);
        let e = r.allocate(s(), 1025, 256).unwrap_err();
        assert!(e.is_out_of_memory());
        assert!(
            e.to_string()
                .contains("Maximum allocation size exceeded (failed to allocate 1.000977 KiB)"),
            "{e}"
        );
        let mut blocks: Vec<DevicePtr> = [1, 256, 1000, 1024]
            .iter()
            .map(|&b| r.allocate(s(), b, 0).unwrap())
            .collect();
        let mut addrs: Vec<u64> = blocks.iter().map(|b| b.addr()).collect();
        addrs.sort_unstable();
        for w in addrs.windows(2) {
            assert_eq!(w[1] - w[0], 1024, "blocks overlap or leave gaps");
        }
        assert!(blocks.iter().all(|b| b.is_aligned(256)));
        assert_eq!(mock.allocation_calls(), 1);
        blocks.push(r.allocate(s(), 10, 256).unwrap());
        assert_eq!((mock.allocation_calls(), r.pool_size()), (2, 8192));
        for (b, bytes) in blocks.iter().zip([1, 256, 1000, 1024, 10]) {
            // SAFETY: each came from `r` with `bytes`.
            unsafe { r.deallocate(s(), *b, bytes, 256).unwrap() };
        }
        assert_eq!(r.outstanding_allocations(), 0);
    }

    #[test]
    fn free_list_is_fifo() {
        let (r, _mock) = fixed(256, 4);
        let b: Vec<DevicePtr> = (0..4).map(|_| r.allocate(s(), 256, 256).unwrap()).collect();
        // SAFETY: from `r`, freed once.
        unsafe {
            r.deallocate(s(), b[2], 256, 256).unwrap();
            r.deallocate(s(), b[0], 256, 256).unwrap();
        }
        assert_eq!(r.allocate(s(), 256, 256).unwrap(), b[2]);
        assert_eq!(r.allocate(s(), 256, 256).unwrap(), b[0]);
    }

    #[test]
    fn wrong_frees_are_reported() {
        let (r, _mock) = fixed(1024, 4);
        let a = r.allocate(s(), 100, 256).unwrap();
        // SAFETY: wrong frees the resource detects, then one correct free.
        unsafe {
            assert_eq!(
                invalid_free_kind(r.deallocate(s(), a, 1000, 256)),
                InvalidFree::SizeMismatch { allocated: 256 }
            );
            assert_eq!(
                invalid_free_kind(r.deallocate(s(), DevicePtr::from_raw(a.addr() + 256), 256, 256)),
                InvalidFree::UnknownPointer
            );
            assert_eq!(
                invalid_free_kind(r.deallocate(s(), DevicePtr::from_raw(0x1000), 256, 256)),
                InvalidFree::UnknownPointer
            );
            r.deallocate(s(), a, 100, 256).unwrap();
            assert_eq!(
                invalid_free_kind(r.deallocate(s(), a, 100, 256)),
                InvalidFree::DoubleFree
            );
        }
        assert_eq!(r.outstanding_allocations(), 0);
    }

    #[test]
    fn a_block_freed_on_two_streams_is_a_double_free() {
        // The per-thread default stream's list is special (no event at free time) and its
        // allocations below come from its own list, so no CUDA call is made.
        let pt = CudaStreamView::per_thread();
        let (r, _mock) = fixed(512, 4);
        let a = r.allocate(s(), 300, 256).unwrap();
        let b = r.allocate(s(), 512, 256).unwrap();
        // SAFETY: `a` and `b` came from `r`; the second free of each is a wrong free.
        unsafe {
            r.deallocate(pt, a, 300, 256).unwrap();
            assert_eq!(
                invalid_free_kind(r.deallocate(s(), a, 300, 256)),
                InvalidFree::DoubleFree
            );
            assert_eq!(
                invalid_free_kind(r.deallocate(pt, a, 300, 256)),
                InvalidFree::DoubleFree
            );
            r.deallocate(s(), b, 512, 256).unwrap();
            assert_eq!(
                invalid_free_kind(r.deallocate(pt, b, 512, 256)),
                InvalidFree::DoubleFree
            );
            // Wrong sizes and addresses are caught on the other stream too.
            assert_eq!(
                invalid_free_kind(r.deallocate(pt, DevicePtr::from_raw(b.addr() + 256), 256, 256)),
                InvalidFree::UnknownPointer
            );
        }
        // The block freed on the per-thread stream is handed out there again.
        let again = r.allocate(pt, 100, 256).unwrap();
        assert_eq!(again, a);
        // SAFETY: wrong size, then the right one.
        unsafe {
            assert_eq!(
                invalid_free_kind(r.deallocate(pt, again, 512, 256)),
                InvalidFree::SizeMismatch { allocated: 256 }
            );
            r.deallocate(pt, again, 100, 256).unwrap();
        }
        assert_eq!(r.outstanding_allocations(), 0);
    }

    #[test]
    fn concurrent_frees_on_two_streams_succeed_once() {
        // More blocks than rounds: whichever stream's free wins, the legacy list never runs dry,
        // so no round needs to steal from the per-thread list (which would need CUDA events).
        let (r, _mock) = fixed(256, 400);
        for round in 0..300 {
            let p = r.allocate(s(), 256, 256).unwrap();
            let ok: usize = std::thread::scope(|sc| {
                let streams = [s(), CudaStreamView::per_thread()];
                let handles: Vec<_> = streams
                    .into_iter()
                    .map(|stream| {
                        let r = &r;
                        sc.spawn(move || {
                            // SAFETY: one of the two frees is a double free the resource
                            // detects.
                            let freed = unsafe { r.deallocate(stream, p, 256, 256) };
                            usize::from(freed.is_ok())
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).sum()
            });
            assert_eq!(ok, 1, "round {round}: a block freed twice was accepted");
            assert_eq!(r.outstanding_allocations(), 0);
        }
    }

    #[test]
    fn drop_returns_every_chunk() {
        let (r, mock) = fixed(256, 2);
        let q = r.clone();
        assert!(r.is_equal(&q) && !r.is_equal(&fixed(256, 2).0));
        let erased = shared(q.clone());
        assert!(resource_cast::<FixedSizeMemoryResource<HostMockResource>>(&*erased).is_some());
        drop(erased);
        let _held: Vec<DevicePtr> = (0..5).map(|_| r.allocate(s(), 256, 256).unwrap()).collect();
        assert_eq!(mock.live_allocations(), 3);
        drop(r);
        drop(q);
        assert_eq!(mock.live_allocations(), 0);
    }

    #[test]
    fn many_threads_get_distinct_blocks() {
        let (r, mock) = fixed(512, 8);
        std::thread::scope(|sc| {
            for t in 1..=4u8 {
                let r = r.clone();
                sc.spawn(move || {
                    let mut live = Vec::new();
                    for i in 0..2000u32 {
                        if i % 3 == 2 || live.len() == 12 {
                            let (p, tag): (DevicePtr, u8) = live.remove((i as usize) % live.len());
                            // SAFETY: host memory of a block this thread owns, freed once.
                            unsafe {
                                let bytes = std::slice::from_raw_parts(p.as_host_ptr::<u8>(), 512);
                                assert!(bytes.iter().all(|&b| b == tag), "block {p} was shared");
                                r.deallocate(s(), p, 512, 256).unwrap();
                            }
                        } else {
                            let p = r.allocate(s(), 512, 256).unwrap();
                            let tag = t.wrapping_mul(37).wrapping_add(i as u8);
                            // SAFETY: host memory of a block this thread now owns.
                            unsafe { std::ptr::write_bytes(p.as_host_ptr::<u8>(), tag, 512) };
                            live.push((p, tag));
                        }
                    }
                    for (p, _) in live {
                        // SAFETY: from `r`, freed once.
                        unsafe { r.deallocate(s(), p, 512, 256).unwrap() };
                    }
                });
            }
        });
        assert_eq!(r.outstanding_allocations(), 0);
        drop(r);
        assert_eq!(mock.live_allocations(), 0);
    }
}
