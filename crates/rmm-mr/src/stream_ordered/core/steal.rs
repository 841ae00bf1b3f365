//! Stealing: an allocation that missed its own list takes a block from another stream's list
//! (after making its stream wait for that list's event), else merges whole lists into its own
//! ([`StreamOrdered::take_from_others`]); a resource that cannot grow reclaims the blocks no
//! event covers, after one device synchronization ([`StreamOrdered::reclaim_or_wait`]). The
//! rules: `docs/internals/stream-ordered.md`, "Algorithm" and "Synchronizing without locks".

use rmm_stream::CudaStreamView;
use rmm_sys::DeviceGuard;

use super::StreamOrdered;
use crate::error::{MrError, MrResult};
use crate::stream_ordered::free_blocks::FreeBlocks;
use crate::stream_ordered::stream_lists::{device_synchronize, Steal, StreamKey, StreamList};

/// What a search of the other lists ([`StreamOrdered::take_from_others`]) found.
#[derive(Debug)]
pub(super) enum Search<T> {
    /// A block, taken.
    Taken((u64, T)),
    /// Nothing taken; `withheld`: some list holds a fitting block that no event covers yet.
    Missed {
        /// See [`GrowthCause::decide`].
        withheld: bool,
    },
}

/// Treats "no driver / no device" as success: without a device no stream work can be pending
/// (this is what lets host-memory tests run the release paths on machines without a GPU).
pub(super) fn settle(r: MrResult<()>) -> MrResult<()> {
    match r {
        Err(e) if e.is_no_device() => Ok(()),
        other => other,
    }
}

impl<L: FreeBlocks> StreamOrdered<L> {
    /// Steals one fitting block from another stream's list (the remainder stays there), else
    /// merges other lists into `own` until one fits; the stream waits on each victim's event.
    /// The blocks a thief moves into `own` (a merge, a share) are taken out under the
    /// victim's lock and put in under its own, and then report to a searching grower (see
    /// [`patience`](crate::stream_ordered::patience)). A victim that needs a device
    /// synchronization is skipped unless `may_sync` (false under the growth lock); then the
    /// blocks are taken out under its lock and the device is synchronized with no lock held.
    /// When nothing is taken, says whether a fitting block was withheld for want of an event
    /// (the growth that follows is then [`GrowthCause::Pressure`]).
    ///
    /// [`GrowthCause::Pressure`]: crate::stream_ordered::pressure::GrowthCause::Pressure
    pub(super) fn take_from_others(
        &self,
        own: &StreamList<L>,
        key: StreamKey,
        stream: CudaStreamView<'_>,
        size: usize,
        may_sync: bool,
    ) -> MrResult<Search<L::Tag>> {
        let others: Vec<&StreamList<L>> = self.lists().filter(|l| !std::ptr::eq(*l, own)).collect();
        let mut withheld = false;
        // Steal one block; the remainder stays with its stream.
        for victim in &others {
            let mut st = victim.lock();
            // Nothing is taken before the stream waits, so a failed wait takes nothing.
            if !st.blocks.fits(size) {
                continue;
            }
            let sync = match st.prepare_steal(stream, may_sync)? {
                // The block is there, but no event covers it yet (its owner was asked to
                // record, or only a device synchronization would do).
                Steal::NotNow => {
                    withheld = true;
                    continue;
                }
                Steal::Now => None,
                Steal::AfterSync(snapshot) => Some(snapshot),
            };
            let victim_key = st.key();
            let Some(block) = st.blocks.take(size) else {
                continue;
            };
            let mut share = self.empty.clone();
            if sync.is_none() {
                st.blocks.share_with_thief(size, &mut share);
            }
            st.after_take();
            drop(st);
            if let Some(snapshot) = sync {
                let _busy = self.in_flight.begin();
                if let Err(e) = self.synchronize_device() {
                    let mut back = self.empty.clone();
                    match back.put(block.0, size, block.1) {
                        Ok(()) => self.give_back(victim, victim_key, back),
                        Err(put) => log::error!(
                            "rmm: block {:#x} lost after a failed synchronization: {put}",
                            block.0
                        ),
                    }
                    return Err(e);
                }
                victim.lock().synchronized_since(snapshot);
            } else if !share.is_empty() {
                if let Err((rest, e)) = self.deposit(own, key, stream, share, None) {
                    log::error!("rmm: inconsistent free lists after a steal: {e}");
                    self.give_back(victim, victim_key, rest);
                }
            }
            return Ok(Search::Taken(block));
        }
        // Merge whole lists into this one, retrying after each.
        for victim in &others {
            let mut st = victim.lock();
            if st.blocks.is_empty() {
                continue;
            }
            let sync = match st.prepare_steal(stream, may_sync)? {
                Steal::NotNow => continue,
                Steal::Now => None,
                Steal::AfterSync(snapshot) => Some(snapshot),
            };
            let moved = std::mem::replace(&mut st.blocks, self.empty.clone());
            st.after_take();
            let victim_key = st.key();
            drop(st);
            // Behind a synchronization: out of every list until the device is done (counted
            // in `in_flight`), no lock held.
            let _busy = sync.map(|_| self.in_flight.begin());
            if let Some(snapshot) = sync {
                if let Err(e) = self.synchronize_device() {
                    self.give_back(victim, victim_key, moved);
                    return Err(e);
                }
                victim.lock().synchronized_since(snapshot);
            }
            match self.deposit(own, key, stream, moved, Some(size)) {
                Ok(Some(block)) => return Ok(Search::Taken(block)),
                Ok(None) => {}
                Err((rest, e)) => {
                    self.give_back(victim, victim_key, rest);
                    return Err(MrError::bad_alloc(format!(
                        "inconsistent free lists while merging: {e}"
                    )));
                }
            }
        }
        Ok(Search::Missed { withheld })
    }

    /// The resource cannot grow: reclaims the blocks no event covers (one device
    /// synchronization, no lock held), and if there are none while other threads'
    /// synchronizations hold blocks out of every list, waits once for those, looks again and
    /// reclaims again (a reclaim's blocks enter its thief's list uncovered). Once: after the
    /// wait every block they held out is in a list or in use; a synchronization begun since
    /// took blocks the searches saw in a list, or that were freed after them.
    /// `Ok(None)`: nothing to take.
    #[cold]
    pub(super) fn reclaim_or_wait(
        &self,
        own: &StreamList<L>,
        key: StreamKey,
        stream: CudaStreamView<'_>,
        size: usize,
    ) -> MrResult<Option<(u64, L::Tag)>> {
        let busy = self.in_flight.is_busy();
        if let Some(block) = self.reclaim_unrecorded(own, key, stream, size)? {
            return Ok(Some(block));
        }
        if !busy && !self.in_flight.is_busy() {
            return Ok(None);
        }
        self.in_flight.wait_idle();
        if let Some(block) = self.take_own(own, key, size) {
            return Ok(Some(block));
        }
        if let Search::Taken(block) = self.take_from_others(own, key, stream, size, false)? {
            return Ok(Some(block));
        }
        self.reclaim_unrecorded(own, key, stream, size)
    }

    /// Moves the blocks of every other list that an event does not cover into `own` after one
    /// device synchronization (which covers them all; made with no lock held), then takes
    /// `size` bytes from `own`.
    #[cold]
    fn reclaim_unrecorded(
        &self,
        own: &StreamList<L>,
        key: StreamKey,
        stream: CudaStreamView<'_>,
        size: usize,
    ) -> MrResult<Option<(u64, L::Tag)>> {
        let mut moved = Vec::new();
        for victim in self.lists().filter(|l| !std::ptr::eq(*l, own)) {
            let mut st = victim.lock();
            if st.policy.is_uncovered() && !st.blocks.is_empty() {
                let snapshot = st.policy.entered();
                let blocks = std::mem::replace(&mut st.blocks, self.empty.clone());
                st.after_take();
                moved.push((victim, st.key(), snapshot, blocks));
            }
        }
        if moved.is_empty() {
            return Ok(None);
        }
        let _busy = self.in_flight.begin();
        // Every moved block entered its list before this point, so once the device has
        // finished the work queued so far no stream uses it.
        if let Err(e) = settle(self.synchronize_device()) {
            // Not proven safe: every block goes back where it came from, still unrecorded.
            for (victim, victim_key, _, blocks) in moved {
                self.give_back(victim, victim_key, blocks);
            }
            return Err(e);
        }
        let mut all = self.empty.clone();
        let mut rejected = Vec::new();
        for (victim, victim_key, snapshot, mut blocks) in moved {
            victim.lock().synchronized_since(snapshot);
            if let Err(e) = all.absorb(&mut blocks) {
                log::error!("rmm: inconsistent free lists while reclaiming: {e}");
                rejected.push((victim, victim_key, blocks));
            }
        }
        let block = match self.deposit(own, key, stream, all, Some(size)) {
            Ok(block) => block,
            Err((rest, e)) => {
                log::error!("rmm: inconsistent free lists while reclaiming: {e}");
                // Synchronized: safe for any stream, but whose they were is lost.
                self.to_orphan(rest);
                None
            }
        };
        for (victim, victim_key, blocks) in rejected {
            self.give_back(victim, victim_key, blocks);
        }
        Ok(block)
    }

    /// Synchronizes the device of this resource (made current for the call), with no lock of
    /// the resource held by the caller.
    fn synchronize_device(&self) -> MrResult<()> {
        let _device = match self.device.map(DeviceGuard::new) {
            Some(Err(e)) if !e.is_no_device() => return Err(e.into()),
            guard => guard,
        };
        // Relaxed capture mode: not refused while another thread holds a global capture.
        crate::graph::relaxed(device_synchronize).map_err(MrError::from)
    }
}
