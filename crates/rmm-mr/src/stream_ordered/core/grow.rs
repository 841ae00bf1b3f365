//! Growing: an allocation that found no block anywhere takes the growth lock, searches again
//! (waiting, within one budget, for blocks to land: `patience`), and asks its
//! resource for a chunk ([`StreamOrdered::allocate_slow`]); and the way back: the wholly free
//! chunks go back to the upstream ([`StreamOrdered::release_unused`], and every chunk at the
//! drop, [`StreamOrdered::release_all`]). The rules: `docs/internals/stream-ordered.md`,
//! "Algorithm" and "The grower's patience".

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::Instant;

use rmm_stream::CudaStreamView;
use rmm_sys::{DeviceGuard, DevicePtr, ALLOCATION_ALIGNMENT};

use super::steal::{settle, Search};
use super::StreamOrdered;
use crate::error::{MrError, MrResult};
use crate::resource::DeviceMemoryResource;
use crate::stream_ordered::free_blocks::{Expand, FreeBlocks};
use crate::stream_ordered::patience::{Budget, Settled};
use crate::stream_ordered::pressure::{GrowthCause, PressureScope};
use crate::stream_ordered::stream_lists::{device_synchronize, StreamKey, StreamList};

/// The growth lock held by a grower ([`StreamOrdered::lock_growth`]): the chunk set, the
/// budget of the grower's waits for this hold, and (for benchmarks and tests) where its hold
/// time goes when it is released.
struct GrowthHold<'a> {
    chunks: MutexGuard<'a, BTreeMap<u64, usize>>,
    budget: Budget,
    /// The recorder, when the lock was taken, and the time spent in `expand` since.
    #[cfg(any(test, feature = "testing"))]
    record: (
        &'a crate::testing::growth_lock::HoldRecorder,
        Instant,
        std::time::Duration,
    ),
}

#[cfg(any(test, feature = "testing"))]
impl Drop for GrowthHold<'_> {
    fn drop(&mut self) {
        let (recorder, locked, upstream) = self.record;
        recorder.record(
            locked.elapsed(),
            upstream,
            self.budget.spent(),
            self.budget.ran_out(),
        );
    }
}

impl<L: FreeBlocks> StreamOrdered<L> {
    #[cold]
    pub(super) fn allocate_slow(
        &self,
        own: &StreamList<L>,
        key: StreamKey,
        stream: CudaStreamView<'_>,
        size: usize,
        upstream: &dyn DeviceMemoryResource,
        mut expand: impl FnMut(Expand) -> MrResult<(DevicePtr, usize)>,
    ) -> MrResult<(u64, L::Tag)> {
        self.sweep();
        if let Search::Taken(block) = self.take_from_others(own, key, stream, size, true)? {
            return Ok(block);
        }
        let (mut reclaimed, mut released) = (false, false);
        loop {
            // Grow, holding the growth lock. Threads that missed together queue here; each looks
            // again once it holds the lock, so memory another one just obtained is used instead
            // of growing the pool once per waiting thread (RMM serializes everything on one mutex
            // and so never races here). Nothing synchronizes the device under this lock.
            let mut chunks = self.lock_growth();
            let withheld = loop {
                let watch = self.patience.watch(size);
                if let Some(block) = self.take_own(own, key, size) {
                    return Ok(block);
                }
                match self.take_from_others(own, key, stream, size, false)? {
                    Search::Taken(block) => return Ok(block),
                    // Grow only once no block that landed since the watch (a free, or a merge
                    // from a list not yet searched into one searched) left a fitting one, and
                    // none did within the grower's patience; every wait and every search again
                    // comes out of the one budget of this hold of the lock; see `patience`.
                    Search::Missed { withheld } => {
                        if watch.settle(&mut chunks.budget) != Settled::SearchAgain {
                            break withheld;
                        }
                    }
                }
            };
            // Chunks that merge grow the free block at the end of the memory by what it lacks.
            // A fitting block withheld for want of an event (its owner will record at its next
            // operation) makes this growth a pressure growth: only what the request needs.
            let tail = self.own_tail(own, key);
            let cause = GrowthCause::decide(withheld, PressureScope::is_active());
            #[cfg(any(test, feature = "testing"))]
            let called = Instant::now();
            let grown = {
                // What `expand` allocates from a stream-ordered upstream grows it likewise.
                let _pressure = PressureScope::enter(cause);
                expand(Expand {
                    pool_size: self.pool_size(),
                    tail: tail.unwrap_or(0),
                    cause,
                })
            };
            #[cfg(any(test, feature = "testing"))]
            {
                chunks.record.2 += called.elapsed();
            }
            let (ptr, chunk_size) = match grown {
                Ok(chunk) => chunk,
                Err(e) if e.is_out_of_memory() => {
                    drop(chunks);
                    // Rather than report out-of-memory while blocks wait for an owner that may
                    // never record, synchronize once (no lock held) and take them all.
                    match self.reclaim_or_wait(own, key, stream, size)? {
                        Some(block) => return Ok(block),
                        // Chunks that merge: the reclaimed blocks grew the free block at the
                        // end, so a smaller chunk may now do; grow again from it, once.
                        None if !reclaimed && tail.is_some() && self.own_tail(own, key) != tail => {
                            reclaimed = true;
                            continue;
                        }
                        // Free memory split over chunks that never merge (or that the source
                        // still holds): give the wholly free chunks back, after a device
                        // synchronization, and grow once more from the room that made.
                        None if !released
                            && self.release_limit.is_some_and(|limit| size <= limit)
                            && self.release_for_growth(upstream) =>
                        {
                            released = true;
                            continue;
                        }
                        None => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            };
            chunks.chunks.insert(ptr.addr(), chunk_size);
            self.pool_size.fetch_add(chunk_size, Ordering::Relaxed);
            // Publish the chunk in this stream's list before letting other growers in.
            let mut st = own.lock();
            let added = if st.key() == Some(key) {
                // The chunk may still be in flight on `stream` (a stream-ordered upstream): its
                // rest must not be stolen before that, so the event is recorded after it.
                st.publish(stream, self.is_eager());
                st.blocks
                    .add_chunk(ptr.addr(), chunk_size)
                    .map(|()| st.blocks.take(size))
            } else {
                // This stream's list was retired meanwhile (its owner died): the block comes
                // from the chunk, the rest goes to the orphan list.
                drop(st);
                let mut fresh = self.empty.clone();
                fresh.add_chunk(ptr.addr(), chunk_size).map(|()| {
                    let block = fresh.take(size);
                    self.to_orphan(fresh);
                    block
                })
            };
            match added {
                Ok(Some(block)) => return Ok(block),
                Ok(None) if tail.is_some() => {
                    // The chunk merged with less than `tail` promised: it stays in this list,
                    // and the resource grows again (each round maps more, until `expand` runs
                    // out of room).
                }
                Ok(None) => {
                    return Err(MrError::bad_alloc(format!(
                        "a new upstream chunk of {chunk_size} bytes cannot serve {size} bytes"
                    )));
                }
                Err(e) => {
                    // Not the pool's: the chunk goes back, and the growth never happened.
                    chunks.chunks.remove(&ptr.addr());
                    self.pool_size.fetch_sub(chunk_size, Ordering::Relaxed);
                    drop(chunks);
                    // SAFETY: the upstream just handed out this chunk on `stream` for
                    // `chunk_size` bytes, and none of it was handed out.
                    let r = unsafe {
                        upstream.deallocate(stream, ptr, chunk_size, ALLOCATION_ALIGNMENT)
                    };
                    if let Err(e) = r {
                        log::error!("rmm: could not give a refused chunk {ptr} back: {e}");
                    }
                    return Err(MrError::bad_alloc(format!(
                        "new upstream chunk rejected: {e}"
                    )));
                }
            }
        }
    }

    /// [`FreeBlocks::extendable_tail`] of `own` if it is still `key`'s list.
    fn own_tail(&self, own: &StreamList<L>, key: StreamKey) -> Option<usize> {
        let st = own.lock();
        (st.key() == Some(key)).then(|| st.blocks.extendable_tail())?
    }

    /// Before an allocation fails for want of memory: [`release_unused`](Self::release_unused)
    /// (the device is synchronized before any chunk goes), so that growth can take one chunk
    /// where the free memory was split over several. Whether any chunk was released; a failure
    /// is logged (the allocation then reports its own out-of-memory).
    #[cold]
    fn release_for_growth(&self, upstream: &dyn DeviceMemoryResource) -> bool {
        let released = self.release_unused(upstream).inspect_err(|e| {
            log::warn!("rmm: releasing free chunks before failing an allocation failed: {e}");
        });
        released.is_ok_and(|bytes| bytes > 0)
    }

    /// Gives every wholly free upstream chunk back to `upstream` and returns the bytes released.
    /// The chunks are taken out of their lists under the locks; then, with no lock held, the
    /// resource's device is made current and synchronized (so no pending work on any stream can
    /// still use them) and they are freed; a chunk that cannot be released goes back.
    pub(crate) fn release_unused(&self, upstream: &dyn DeviceMemoryResource) -> MrResult<usize> {
        self.sweep();
        let mut taken = Vec::new();
        {
            let chunks = self.lock_chunks();
            for (&addr, &size) in chunks.iter() {
                for list in self.lists() {
                    let mut st = list.lock();
                    if st.blocks.remove_chunk(addr, size) {
                        st.after_take();
                        taken.push((list, st.key(), addr, size));
                        break;
                    }
                }
            }
        }
        if taken.is_empty() {
            return Ok(0);
        }
        let _busy = self.in_flight.begin();
        let put_back = |list: &StreamList<L>, key: Option<StreamKey>, addr: u64, size: usize| {
            let mut chunk = self.empty.clone();
            match chunk.add_chunk(addr, size) {
                Ok(()) => self.give_back(list, key, chunk),
                Err(e) => log::error!("rmm: could not return chunk {addr:#x} to a list: {e}"),
            }
        };
        // The device made current (and kept so for the frees below), then synchronized.
        let synchronized = match self.device.map(DeviceGuard::new) {
            Some(Err(e)) if !e.is_no_device() => Err(e.into()),
            guard => settle(device_synchronize().map_err(MrError::from)).map(|()| guard),
        };
        let _device = match synchronized {
            Ok(guard) => guard,
            Err(e) => {
                for (list, key, addr, size) in taken {
                    put_back(list, key, addr, size);
                }
                return Err(e);
            }
        };
        let mut released = Vec::new();
        let mut first_error = None;
        let stream = CudaStreamView::default();
        for (list, key, addr, size) in taken {
            // SAFETY: the chunk came from `upstream` with this size, is wholly free (no block of
            // it is handed out) and the device was synchronized, so no work uses it.
            let r = unsafe {
                upstream.deallocate(
                    stream,
                    DevicePtr::from_raw(addr),
                    size,
                    ALLOCATION_ALIGNMENT,
                )
            };
            match r {
                Ok(()) => released.push((addr, size)),
                Err(e) => {
                    // Still the pool's: back where it was.
                    put_back(list, key, addr, size);
                    first_error.get_or_insert(e);
                }
            }
        }
        let mut bytes = 0;
        if !released.is_empty() {
            let mut chunks = self.lock_chunks();
            for (addr, size) in released {
                chunks.remove(&addr);
                self.pool_size.fetch_sub(size, Ordering::Relaxed);
                bytes += size;
            }
            drop(chunks);
            // The chunks are released; waiting for a stream-ordered upstream to finish freeing
            // them can fail without making them the pool's again.
            if let Err(e) = settle(stream.synchronize().map_err(MrError::from)) {
                log::warn!("rmm: synchronizing after releasing {bytes} bytes failed: {e}");
            }
        }
        first_error.map_or(Ok(bytes), Err)
    }

    /// Returns every upstream chunk to `upstream`, outstanding allocations or not (called when
    /// the resource is dropped). Synchronizes the device first when a block was ever handed
    /// out, so no pending work uses the memory.
    pub(crate) fn release_all(&self, upstream: &dyn DeviceMemoryResource, name: &str) {
        let (outstanding, bytes) = self.empty.handed_out();
        if outstanding > 0 {
            log::warn!(
                "rmm: {name} dropped with {outstanding} allocations ({bytes} bytes) outstanding; \
                 their memory goes back to the upstream"
            );
        }
        let chunks = std::mem::take(&mut *self.lock_chunks());
        if chunks.is_empty() {
            return;
        }
        let _guard = self.device.and_then(|d| DeviceGuard::new(d).ok());
        if self.used.load(Ordering::Relaxed) {
            if let Err(e) = settle(device_synchronize().map_err(MrError::from)) {
                log::error!("rmm: {name} could not synchronize the device before release: {e}");
            }
        }
        for (addr, size) in chunks {
            // SAFETY: the chunk came from `upstream` with this size; the resource is being
            // dropped, and outstanding allocations in it are the caller's documented loss.
            let r = unsafe {
                upstream.deallocate_sync(DevicePtr::from_raw(addr), size, ALLOCATION_ALIGNMENT)
            };
            if let Err(e) = settle(r) {
                log::error!("rmm: {name} could not return chunk {addr:#x} ({size} bytes): {e}");
            }
        }
        self.pool_size.store(0, Ordering::Relaxed);
    }

    /// Takes the growth lock for a growth: the chunk set, with the budget of the grower's waits
    /// counted from now (see [`patience`](crate::stream_ordered::patience)).
    fn lock_growth(&self) -> GrowthHold<'_> {
        let chunks = self.lock_chunks();
        let locked = Instant::now();
        GrowthHold {
            chunks,
            budget: Budget::growth(locked),
            #[cfg(any(test, feature = "testing"))]
            record: (&self.holds, locked, std::time::Duration::ZERO),
        }
    }

    /// How long growers held the growth lock so far (benchmarks and tests).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn growth_lock_holds(&self) -> crate::testing::GrowthLockHolds {
        self.holds.snapshot()
    }
}
