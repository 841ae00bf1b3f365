//! The CUDA glue of the pinned host pool: chunks from `cuMemHostAlloc`, events from rmm-stream,
//! the bookkeeping in [`super::core`].

use std::collections::HashMap;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use rmm_stream::{CudaEvent, CudaStreamView};
use rmm_sys::{memory, DeviceId, DevicePtr};

use super::core::{chunk_bytes_for, class_of, LedgerError, PinnedLedger, PinnedPoolStatistics};
use crate::error::{InvalidFree, MrError, MrResult};
use crate::sync::Mutex;

/// The alignment every block of a [`PinnedHostPool`] has (the page size, which
/// `cuMemHostAlloc` aligns chunks to): blocks of 4 KiB and larger are 4 KiB-aligned, smaller
/// ones are aligned to their size (at least 256 B).
pub const PINNED_MAX_ALIGNMENT: usize = 4096;

/// Spare events kept per device for reuse.
const SPARE_EVENTS: usize = 1024;

/// Options of a [`PinnedHostPool`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PinnedPoolOptions {
    /// The most bytes of chunks the pool holds; a request that would need more is
    /// [`MrError::OutOfMemory`] (after idle chunks are given back). `None`: as many as the
    /// driver gives.
    pub max_reserved_bytes: Option<usize>,
}

impl PinnedPoolOptions {
    /// The defaults: no limit.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            max_reserved_bytes: None,
        }
    }

    /// Sets [`max_reserved_bytes`](Self::max_reserved_bytes).
    #[must_use]
    pub const fn max_reserved_bytes(mut self, bytes: usize) -> Self {
        self.max_reserved_bytes = Some(bytes);
        self
    }
}

/// A caching, stream-ordered pool of pinned (page-locked) host memory.
///
/// Chunks come from `cuMemHostAlloc` and are cut into blocks of power-of-two size classes (a
/// request of `n` bytes takes a block of `n.next_power_of_two()`, at least 256 B; classes below
/// 2 MiB share 2 MiB chunks, larger ones get a chunk each). A freed block is reused for a later
/// request of its class, so only the first request of a class pays for `cuMemHostAlloc`
/// (hundreds of microseconds and more) and none pays for `cuMemFreeHost`.
///
/// **Stream ordering through events.** [`record_stream`](Self::record_stream) records an event
/// on a stream for a block in use, covering the work enqueued on that stream *so far*: call it
/// after enqueuing the copies or kernels that use the block. A block freed with recorded events
/// is reused only once every one of them has completed (the pool polls them with
/// `cuEventQuery` on later requests: it never blocks for them, it takes a new chunk instead).
/// This is PyTorch's `CachingHostAllocator::record_event` contract, except that the event is
/// recorded at the call, not when the block is freed, so no stream handle is kept.
///
/// **Use.** As an allocator for [`PinnedVec`] and `allocator_api2::boxed::Box` through
/// [`allocator`](Self::allocator); as a [`DeviceMemoryResource`](crate::DeviceMemoryResource)
/// whose `deallocate(stream, ..)` records an event on `stream`. rmm-containers copies between
/// device containers and a [`PinnedVec`] asynchronously through a [`PinnedTransfer`], which
/// holds the vector until the copy has completed, so no host access can race with the copy.
///
/// Thread-safe (one lock around the bookkeeping; the driver calls are made outside it except
/// `cuEventQuery`). Clones share the pool; the chunks are given back when the last clone, and
/// the last vector allocated from it, are gone (after waiting for the events still pending).
/// The memory is pinned for the device current when the pool was created (`cuMemHostAlloc` with
/// no flags).
#[doc(alias = "rmm::mr::pinned_host_memory_resource")]
#[doc(alias = "CachingHostAllocator")]
#[doc(alias = "cudaHostAlloc")]
#[derive(Clone)]
pub struct PinnedHostPool {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    ledger: Mutex<PinnedLedger<CudaEvent>>,
    spare: Mutex<HashMap<i32, Vec<CudaEvent>>>,
    options: PinnedPoolOptions,
}

impl fmt::Debug for PinnedHostPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedHostPool")
            .field("statistics", &self.statistics())
            .field("options", &self.inner.options)
            .finish()
    }
}

impl Default for PinnedHostPool {
    fn default() -> Self {
        Self::new()
    }
}

fn ledger_error(e: LedgerError, bytes: usize) -> MrError {
    match e {
        LedgerError::UnknownBlock(addr) => MrError::InvalidFree {
            ptr: DevicePtr::from_raw(addr as u64),
            bytes,
            kind: InvalidFree::UnknownPointer,
        },
        LedgerError::TooLarge(n) => MrError::out_of_memory(n, "larger than the largest size class"),
        LedgerError::BadChunk { base, bytes } => MrError::bad_alloc(format!(
            "cuMemHostAlloc returned a chunk the pool cannot use ({bytes} bytes at {base:#x})"
        )),
    }
}

impl PinnedHostPool {
    /// An empty pool (no driver call until the first request).
    #[must_use]
    pub fn new() -> Self {
        Self::with_options(PinnedPoolOptions::new())
    }

    /// An empty pool with `options`.
    #[must_use]
    pub fn with_options(options: PinnedPoolOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                ledger: Mutex::new(PinnedLedger::new()),
                spare: Mutex::new(HashMap::new()),
                options,
            }),
        }
    }

    /// The allocator of this pool, for [`PinnedVec`] and `allocator_api2::boxed::Box`.
    #[must_use]
    pub fn allocator(&self) -> PinnedAllocator {
        PinnedAllocator { pool: self.clone() }
    }

    /// An empty [`PinnedVec`] allocating from this pool.
    #[must_use]
    pub fn vec<T>(&self) -> PinnedVec<T> {
        PinnedVec::new_in(self.allocator())
    }

    /// The counters: bytes reserved, in use, pending, cached, the peak in use, hits, misses.
    #[must_use]
    pub fn statistics(&self) -> PinnedPoolStatistics {
        self.inner.ledger.lock().statistics()
    }

    /// Sets the peak to the bytes in use now.
    pub fn reset_peak(&self) {
        self.inner.ledger.lock().reset_peak();
    }

    /// Gives back to the driver (`cuMemFreeHost`) every chunk none of whose blocks is in use or
    /// waiting for an event that has not completed. Returns the bytes given back. Never blocks
    /// for events.
    #[doc(alias = "trim")]
    #[doc(alias = "empty_cache")]
    #[doc(alias = "emptyCache")]
    pub fn release(&self) -> MrResult<usize> {
        let chunks = {
            let mut l = self.inner.ledger.lock();
            let done = l.reclaim(event_done);
            let chunks = l.release();
            drop(l);
            self.recycle(done);
            chunks
        };
        free_chunks(&chunks)
    }

    /// Records an event on `stream` for the block holding `ptr` (any address inside a block in
    /// use): the block is not reused until the work enqueued on `stream` before this call has
    /// completed. Call it after enqueuing work that reads or writes the block.
    /// [`MrError::InvalidFree`] (unknown pointer) when `ptr` is not in a block in use here.
    #[doc(alias = "record_event")]
    pub fn record_stream(&self, ptr: *const u8, stream: CudaStreamView<'_>) -> MrResult<()> {
        let start = self
            .inner
            .ledger
            .lock()
            .containing(ptr as usize)
            .ok_or_else(|| ledger_error(LedgerError::UnknownBlock(ptr as usize), 0))?;
        let event = self.event()?;
        if let Err(e) = event.record(stream) {
            self.recycle(vec![event]);
            return Err(e.into());
        }
        let r = self.inner.ledger.lock().record(start, event);
        r.map_err(|(e, event)| {
            self.recycle(vec![event]);
            ledger_error(e, 0)
        })
    }

    /// Blocks the host until every event recorded on the block holding `ptr` has completed
    /// (then the block may be read and written by the host without racing with device work the
    /// events covered).
    pub fn synchronize(&self, ptr: *const u8) -> MrResult<()> {
        let mut l = self.inner.ledger.lock();
        let start = l
            .containing(ptr as usize)
            .ok_or_else(|| ledger_error(LedgerError::UnknownBlock(ptr as usize), 0))?;
        let events = l.take_events(start).map_err(|e| ledger_error(e, 0))?;
        drop(l);
        for (i, e) in events.iter().enumerate() {
            if let Err(err) = e.synchronize() {
                // Keep the ones not waited for on the block, so it is not reused early.
                let mut l = self.inner.ledger.lock();
                for e in events.into_iter().skip(i) {
                    let _ = l.record(start, e);
                }
                return Err(err.into());
            }
        }
        self.recycle(events);
        Ok(())
    }

    /// Whether every event recorded on the block holding `ptr` has completed.
    pub fn is_complete(&self, ptr: *const u8) -> MrResult<bool> {
        let mut l = self.inner.ledger.lock();
        let start = l
            .containing(ptr as usize)
            .ok_or_else(|| ledger_error(LedgerError::UnknownBlock(ptr as usize), 0))?;
        let events = l.take_events(start).map_err(|e| ledger_error(e, 0))?;
        let mut done = Vec::new();
        let mut all = true;
        let mut first_error = None;
        for e in events {
            match e.is_complete() {
                Ok(true) => done.push(e),
                other => {
                    all = false;
                    if let Err(err) = other {
                        first_error.get_or_insert(err);
                    }
                    // Still pending (or unknown): back on the block, so it is not reused early.
                    let _ = l.record(start, e);
                }
            }
        }
        drop(l);
        self.recycle(done);
        match first_error {
            Some(e) => Err(e.into()),
            None => Ok(all),
        }
    }

    /// A block of at least `bytes` (its class size): its address. Reclaims completed pending
    /// blocks, then takes a new chunk when the class is empty.
    pub(crate) fn allocate_block(&self, bytes: usize) -> MrResult<NonNull<u8>> {
        let class = class_of(bytes).ok_or_else(|| ledger_error(LedgerError::TooLarge(bytes), 0))?;
        {
            let mut l = self.inner.ledger.lock();
            if let Some(a) = l.take(bytes).map_err(|e| ledger_error(e, 0))? {
                return Ok(addr_ptr(a));
            }
            if l.has_pending() {
                let done = l.reclaim(event_done);
                let hit = l.take(bytes).map_err(|e| ledger_error(e, 0))?;
                drop(l);
                self.recycle(done);
                if let Some(a) = hit {
                    return Ok(addr_ptr(a));
                }
            }
        }
        let chunk = chunk_bytes_for(class);
        if let Some(max) = self.inner.options.max_reserved_bytes {
            let reserved = self.inner.ledger.lock().statistics().reserved_bytes;
            if reserved + chunk > max {
                self.release()?;
                let reserved = self.inner.ledger.lock().statistics().reserved_bytes;
                if reserved + chunk > max {
                    return Err(MrError::out_of_memory(
                        bytes,
                        format!(
                            "the pinned pool's limit of {max} bytes would be exceeded \
                             (reserved {reserved}, chunk {chunk})"
                        ),
                    ));
                }
            }
        }
        let base = match memory::mem_host_alloc(chunk) {
            Ok(p) => p,
            Err(e) => {
                // Give idle chunks back and try once more.
                if self.release()? == 0 {
                    return Err(MrError::from_allocation(e, chunk));
                }
                memory::mem_host_alloc(chunk).map_err(|e| MrError::from_allocation(e, chunk))?
            }
        };
        if !base.is_aligned(PINNED_MAX_ALIGNMENT) {
            // The blocks' alignment (and the allocator's promise) rests on page-aligned chunks.
            // SAFETY: the chunk was just allocated and never handed out.
            let _ = unsafe { memory::mem_free_host(base) };
            return Err(MrError::bad_alloc(
                "cuMemHostAlloc returned memory that is not page (4 KiB) aligned",
            ));
        }
        let added = {
            let mut l = self.inner.ledger.lock();
            let over = self
                .inner
                .options
                .max_reserved_bytes
                .is_some_and(|max| l.statistics().reserved_bytes + chunk > max);
            if over {
                Err(MrError::out_of_memory(
                    bytes,
                    "the pinned pool's limit would be exceeded",
                ))
            } else {
                l.add_chunk(base.addr() as usize, chunk, bytes)
                    .map_err(|e| ledger_error(e, 0))
            }
        };
        match added {
            Ok(a) => Ok(addr_ptr(a)),
            Err(e) => {
                // SAFETY: the chunk was just allocated and never handed out.
                let _ = unsafe { memory::mem_free_host(base) };
                Err(e)
            }
        }
    }

    /// Frees the block at `ptr` (its start): reused once the events recorded on it completed.
    pub(crate) fn free_block(&self, ptr: *const u8, bytes: usize) -> MrResult<()> {
        self.inner
            .ledger
            .lock()
            .free(ptr as usize)
            .map(|_| ())
            .map_err(|e| ledger_error(e, bytes))
    }

    /// A spare event of the current device, or a new one.
    fn event(&self) -> MrResult<CudaEvent> {
        let device = DeviceId::current()?.value();
        if let Some(e) = self.inner.spare.lock().get_mut(&device).and_then(Vec::pop) {
            return Ok(e);
        }
        Ok(CudaEvent::new()?)
    }

    /// Keeps completed events for reuse (each under the device current now: events come back
    /// on the thread and device that polled them, which is where most of them were made).
    fn recycle(&self, events: Vec<CudaEvent>) {
        if events.is_empty() {
            return;
        }
        let Ok(device) = DeviceId::current() else {
            return;
        };
        let mut spare = self.inner.spare.lock();
        let list = spare.entry(device.value()).or_default();
        let room = SPARE_EVENTS.saturating_sub(list.len());
        list.extend(events.into_iter().take(room));
    }
}

/// An event that has completed (a failed query counts as not completed: the block stays
/// pending, which is never unsafe).
fn event_done(e: &CudaEvent) -> bool {
    e.is_complete().unwrap_or(false)
}

fn addr_ptr(addr: usize) -> NonNull<u8> {
    NonNull::new(addr as *mut u8).expect("the ledger never hands out address 0")
}

fn free_chunks(chunks: &[(usize, usize)]) -> MrResult<usize> {
    let mut freed = 0;
    let mut first_error = None;
    for &(base, bytes) in chunks {
        // SAFETY: the ledger gave the chunk back: none of its blocks is in use or waits for an
        // event, so no host or device work uses it; it came from `cuMemHostAlloc`.
        match unsafe { memory::mem_free_host(DevicePtr::from_raw(base as u64)) } {
            Ok(()) => freed += bytes,
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e.into()),
        None => Ok(freed),
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // `lock`, not `get_mut`: the loom build's mutex has no `get_mut` (and nobody else holds
        // the lock of a pool being dropped).
        let mut l = self.ledger.lock();
        let mut waited = true;
        for e in l.drain_pending() {
            waited &= e.synchronize().is_ok();
        }
        if !waited || l.blocks_in_use() != 0 {
            // Device work may still use a block: leaking the chunks is the only safe choice.
            log::error!(
                "rmm: pinned host pool dropped with work it could not wait for; its {} chunks \
                 are leaked",
                l.all_chunks().len()
            );
            return;
        }
        if let Err(e) = free_chunks(&l.all_chunks()) {
            log::error!("rmm: pinned host pool: cuMemFreeHost failed: {e}");
        }
    }
}

/// The [`PinnedHostPool`] as an `allocator_api2` allocator, for [`PinnedVec`] and
/// `allocator_api2::boxed::Box<T, PinnedAllocator>`.
///
/// **Synchronous semantics.** `deallocate` returns the block to the pool at once; the pool
/// hands it out again only after every event recorded on it
/// ([`PinnedAllocator::record_stream`]) has completed. Memory used by device work without a
/// recorded event is the caller's to protect, as with any allocator. Alignments up to
/// [`PINNED_MAX_ALIGNMENT`] (4 KiB); larger ones and sizes above the largest class fail with
/// `AllocError`. Zero-size requests allocate nothing.
#[doc(alias = "HostAllocator")]
#[derive(Clone, Debug)]
pub struct PinnedAllocator {
    pool: PinnedHostPool,
}

impl PinnedAllocator {
    /// The pool this allocator draws from.
    #[must_use]
    pub fn pool(&self) -> &PinnedHostPool {
        &self.pool
    }

    /// [`PinnedHostPool::record_stream`].
    pub fn record_stream(&self, ptr: *const u8, stream: CudaStreamView<'_>) -> MrResult<()> {
        self.pool.record_stream(ptr, stream)
    }
}

impl PartialEq for PinnedAllocator {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.pool.inner, &other.pool.inner)
    }
}

impl Eq for PinnedAllocator {}

// SAFETY: a returned block is `layout.size()` bytes or more (its class), aligned to
// `layout.align()` (the request is at least the alignment, and a block of class `c` sits at a
// multiple of `min(c, 4096)` in a page-aligned chunk; larger alignments are refused), and it is
// not handed out again until deallocated here. Clones share the pool, so a block may be freed
// through any clone. Moving the allocator does not move the pool.
unsafe impl allocator_api2::alloc::Allocator for PinnedAllocator {
    fn allocate(
        &self,
        layout: std::alloc::Layout,
    ) -> Result<NonNull<[u8]>, allocator_api2::alloc::AllocError> {
        if layout.align() > PINNED_MAX_ALIGNMENT {
            return Err(allocator_api2::alloc::AllocError);
        }
        if layout.size() == 0 {
            // A dangling, aligned pointer, as the global allocator's contract allows.
            let p =
                NonNull::new(layout.align() as *mut u8).ok_or(allocator_api2::alloc::AllocError)?;
            return Ok(NonNull::slice_from_raw_parts(p, 0));
        }
        let bytes = layout.size().max(layout.align());
        let p = self
            .pool
            .allocate_block(bytes)
            .map_err(|_| allocator_api2::alloc::AllocError)?;
        debug_assert_eq!(p.as_ptr() as usize % layout.align(), 0);
        Ok(NonNull::slice_from_raw_parts(p, layout.size()))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: std::alloc::Layout) {
        if layout.size() == 0 {
            return;
        }
        if let Err(e) = self.pool.free_block(ptr.as_ptr(), layout.size()) {
            log::error!("PinnedAllocator::deallocate: {e}");
        }
    }
}

/// A vector in pinned host memory from a [`PinnedHostPool`].
pub type PinnedVec<T> = allocator_api2::vec::Vec<T, PinnedAllocator>;

/// A [`PinnedVec`] held while an asynchronous copy reads or writes it: the host cannot touch it
/// until [`wait`](Self::wait) (or a true [`is_complete`](Self::is_complete)) gives it back, so no
/// host access races with the copy. Dropping a transfer drops the vector without waiting: its
/// block goes back to the pool, which reuses it only after the copy's event completed.
#[must_use = "the vector comes back from `wait`"]
#[derive(Debug)]
pub struct PinnedTransfer<T> {
    vec: PinnedVec<T>,
}

impl<T> PinnedTransfer<T> {
    /// Holds `vec` until the events recorded on its block (with
    /// [`PinnedAllocator::record_stream`]) have completed. A vector with no recorded events is
    /// handed back by [`wait`](Self::wait) at once.
    pub fn new(vec: PinnedVec<T>) -> Self {
        Self { vec }
    }

    /// Blocks until the copies recorded on the vector completed; the vector.
    pub fn wait(self) -> MrResult<PinnedVec<T>> {
        if self.vec.capacity() != 0 && std::mem::size_of::<T>() != 0 {
            self.vec
                .allocator()
                .pool()
                .synchronize(self.vec.as_ptr().cast())?;
        }
        Ok(self.vec)
    }

    /// The vector, if the copies recorded on it completed; the transfer otherwise.
    pub fn try_take(self) -> MrResult<Result<PinnedVec<T>, Self>> {
        Ok(if self.is_complete()? {
            Ok(self.vec)
        } else {
            Err(self)
        })
    }

    /// Whether the copies recorded on the vector completed.
    pub fn is_complete(&self) -> MrResult<bool> {
        if self.vec.capacity() == 0 || std::mem::size_of::<T>() == 0 {
            return Ok(true);
        }
        self.vec
            .allocator()
            .pool()
            .is_complete(self.vec.as_ptr().cast())
    }

    /// The vector's length.
    #[must_use]
    pub fn len(&self) -> usize {
        self.vec.len()
    }

    /// Whether the vector is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.vec.is_empty()
    }
}

// SAFETY: `allocate` returns a block of the pool (at least `bytes`, 256-byte aligned at least:
// the smallest class is 256 B and blocks sit at multiples of `min(class, 4096)` in page-aligned
// chunks), accessible from the host and, being pinned, from the device; the pool hands it out
// to no one else until it is deallocated here and the event recorded on the deallocating
// stream has completed.
unsafe impl crate::DeviceMemoryResource for PinnedHostPool {
    fn allocate(
        &self,
        _stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        crate::resource::check_base_alignment(alignment)?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let p = self.allocate_block(bytes)?;
        Ok(DevicePtr::from_host_ptr(p.as_ptr()))
    }

    /// Records an event on `stream` for the block, then frees it: it is reused once the work
    /// enqueued on `stream` before the call has completed.
    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
    ) -> MrResult<()> {
        if ptr.is_null() || bytes == 0 {
            return Ok(());
        }
        let p: *const u8 = ptr.as_host_ptr::<u8>();
        self.record_stream(p, stream).map_err(|e| match e {
            MrError::InvalidFree { ptr: _, kind, .. } => MrError::InvalidFree { ptr, bytes, kind },
            e => e,
        })?;
        self.free_block(p, bytes)
    }

    crate::resource::resource_tail! {
        is_equal: shared(inner),
        properties: HOST_DEVICE,
    }
}
