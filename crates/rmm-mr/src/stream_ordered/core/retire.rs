//! Retiring: the lists of threads that exited and of streams that were destroyed give their
//! slots back, and their blocks go where stream order keeps them safe (the legacy list, or the
//! orphan list behind their event or a device synchronization); a new key registers its list
//! ([`StreamOrdered::register`]), reusing a retired slot. The rules:
//! `docs/internals/stream-ordered.md`, "Retiring lists".

use std::sync::atomic::Ordering;

use rmm_stream::CudaStreamView;

use super::StreamOrdered;
use crate::error::{MrError, MrResult};
use crate::stream_ordered::free_blocks::FreeBlocks;
use crate::stream_ordered::slot_table::{deaths, Life, Registry, StreamLists};
use crate::stream_ordered::stream_lists::{
    new_list, remember_list, ListGuard, StreamKey, StreamList,
};
use crate::util::thread_life;

impl<L: FreeBlocks> StreamOrdered<L> {
    /// Finds or creates the list of `key` (after retiring the lists of dead owners, whose slots
    /// a new key may reuse), counts the key as used (the second key turns the pool eager),
    /// remembers the list in this thread's cache and returns it locked (so no retirement can
    /// come between).
    #[cold]
    #[allow(clippy::type_complexity)]
    pub(super) fn register(
        &self,
        key: StreamKey,
        stream: CudaStreamView<'_>,
    ) -> MrResult<(&StreamList<L>, ListGuard<'_, L>)> {
        let mut reg = self.registry.lock();
        self.sweep_locked(&mut reg);
        let (index, first_use) = if key == StreamKey::Legacy {
            (None, !self.legacy_used.load(Ordering::Relaxed))
        } else if let Some(i) = reg.get(key) {
            (Some(i), false)
        } else {
            // The owner's life: this thread, or the stream's when rmm-stream made it (a
            // foreign stream's death cannot be known).
            let life = match key {
                StreamKey::PerThread(_) => Life::Thread(thread_life::current()),
                _ => stream.life().map_or(Life::Forever, Life::Stream),
            };
            // New slots are made only here, under the registry's lock: the storage's next index.
            let new_slot = || self.lists.push(new_list(None, self.empty.clone()));
            (Some(reg.insert(key, life, new_slot)), true)
        };
        let list = match index {
            None => &self.legacy,
            Some(i) => self
                .lists
                .get(i)
                .ok_or_else(|| MrError::bad_alloc(format!("stream list {i} is missing")))?,
        };
        if first_use {
            reg.users += 1;
            if reg.users == 1 {
                reg.first_user = index;
            } else if reg.users == 2 {
                // From now on blocks can change streams. Frees on ordinary streams record
                // (checked under each list's lock, so a free that already holds the first
                // list's lock finishes before the mark below, and one that comes later sees
                // `eager`). Blocks the first list got without an event count as unrecorded:
                // a thief asks its owner to record, or synchronizes the device.
                self.eager.store(true, Ordering::SeqCst);
                if let Some(first) = reg.first_user.take().and_then(|i| self.lists.get(i)) {
                    let mut f = first.lock();
                    if matches!(f.key(), Some(StreamKey::Stream(_))) {
                        f.policy.mark_unrecorded();
                    }
                }
            }
            if key == StreamKey::Legacy {
                self.legacy_used.store(true, Ordering::Release);
            }
        }
        let mut st = list.lock();
        if st.key().is_none() {
            st.assign(key, stream.life());
        }
        drop(reg);
        if index.is_some() {
            // `list` is an element of `self.lists` (see `lock_own`).
            remember_list(self.id, key, std::ptr::from_ref(list).cast());
        }
        Ok((list, st))
    }

    /// Retires the lists of dead owners if some thread exited or some stream was destroyed since
    /// the last look (one atomic load otherwise).
    pub(super) fn sweep(&self) {
        if self.swept.load(Ordering::Relaxed) != deaths() {
            let mut reg = self.registry.lock();
            self.sweep_locked(&mut reg);
        }
    }

    /// [`sweep`](Self::sweep) with the registry locked.
    fn sweep_locked(&self, reg: &mut Registry) {
        let now = deaths();
        if self.swept.swap(now, Ordering::Relaxed) == now {
            return;
        }
        for (key, slot) in reg.retire_dead(|_, life| life.is_alive()) {
            self.retire(key, slot);
        }
    }

    /// Retires `key`'s list in `slot` (its owner died; the registry freed the slot): its blocks go
    /// where stream order keeps them safe. A per-thread list's go to the legacy list: the
    /// legacy stream waits for all earlier work of every blocking stream, per-thread default
    /// streams included (as for a cross-thread free). An ordinary stream's go to the orphan list
    /// with the list's event when it covers them all, else marked for a device synchronization
    /// (the stream is gone: nobody can record on it any more).
    fn retire(&self, key: StreamKey, slot: usize) {
        let Some(list) = self.lists.get(slot) else {
            return;
        };
        // (An empty list needs no care: absorbing or adopting no block changes nothing.)
        let Some((mut blocks, event, covered)) = list.lock().retire(key, self.empty.clone()) else {
            log::error!("rmm: stream list {slot} is not {key:?}'s; nothing to retire");
            return;
        };
        if key.per_thread().is_some() {
            let absorbed = self.legacy.lock().blocks.absorb(&mut blocks);
            if let Err(e) = absorbed {
                log::error!("rmm: the legacy list refused a retired list's blocks: {e}");
                self.to_orphan(blocks);
            }
            return;
        }
        // Before the pool turned eager nothing was recorded at all.
        let covered = covered && self.is_eager();
        if let Err(e) = self.orphan.lock().adopt(blocks, event, covered) {
            log::error!("rmm: free blocks lost while retiring a stream list: {e}");
        }
    }

    /// Puts `blocks` in the orphan list, behind a device synchronization (for blocks whose list
    /// is gone, or whose cover is unknown).
    pub(super) fn to_orphan(&self, blocks: L) {
        if let Err(e) = self.orphan.lock().adopt(blocks, None, false) {
            log::error!("rmm: free blocks lost while moving them to the orphan list: {e}");
        }
    }

    /// Gives `blocks`, taken out of `victim` (then `key`'s list) for a synchronization that
    /// failed, back: to `victim` if it is still `key`'s (its policy still says what covers
    /// them), else to the orphan list.
    pub(super) fn give_back(&self, victim: &StreamList<L>, key: Option<StreamKey>, mut blocks: L) {
        let mut st = victim.lock();
        if key.is_some() && st.key() == key && key != Some(StreamKey::Orphan) {
            let Err(e) = st.blocks.absorb(&mut blocks) else {
                return;
            };
            log::error!("rmm: a list refused its own blocks back: {e}");
        }
        drop(st);
        self.to_orphan(blocks);
    }

    /// Number of stream lists alive: the legacy list and one per key with a list (a list whose
    /// owner died counts until it is retired, at the next allocation that misses its own list or
    /// the next new key).
    pub(crate) fn list_count(&self) -> usize {
        1 + self.registry.lock().live()
    }

    /// [`list_count`](Self::list_count) and the list slots ever made (live and free: bounded by
    /// the most lists alive at once), after retiring the lists of owners that died since the
    /// last look when `retire` (tests, figures).
    pub(crate) fn stream_lists(&self, retire: bool) -> StreamLists {
        if retire {
            self.sweep();
        }
        StreamLists {
            alive: self.list_count(),
            slots: self.lists.len(),
        }
    }
}
