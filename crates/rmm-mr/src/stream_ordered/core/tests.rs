//! The core on a model free list (a FIFO of equal blocks with a shared record), rmm-sys's
//! simulated driver and rmm-stream's simulated streams: failures leave it as it was (the
//! fault tests here), lists of dead owners are retired (`retire`), growth under pressure
//! (`pressure`). The model's operations can be made to fail (`Switches`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rmm_stream::CudaStreamView;
use rmm_sys::fault::{self, DriverCall, Fault, FaultScope};
use rmm_sys::DevicePtr;

use super::{FreeBlocks, Origin, StreamKey, StreamOrdered};
use crate::error::{InvalidFree, MrError, MrResult};
use crate::resource::DeviceMemoryResource;
use crate::stream_ordered::patience::Patience;
use crate::testing::HostMockResource;

/// Everything a core keeps, for tests that check a failed call changed nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CoreState {
    /// The free blocks of every list that holds some, by stream key, legacy list first.
    pub(crate) lists: Vec<(StreamKey, Vec<(u64, usize)>)>,
    /// The upstream chunks, by address.
    pub(crate) chunks: Vec<(u64, usize)>,
    /// The sum of the chunks.
    pub(crate) pool_size: usize,
    /// Blocks handed out and their bytes.
    pub(crate) handed_out: (usize, usize),
}

impl CoreState {
    /// The free memory as merged address ranges `[start, end)`, whichever lists hold it.
    pub(crate) fn free_ranges(&self) -> Vec<(u64, u64)> {
        let mut blocks: Vec<(u64, u64)> = self
            .lists
            .iter()
            .flat_map(|(_, blocks)| blocks.iter().map(|&(a, s)| (a, a + s as u64)))
            .collect();
        blocks.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (start, end) in blocks {
            match merged.last_mut() {
                Some(last) if last.1 == start => last.1 = end,
                _ => merged.push((start, end)),
            }
        }
        merged
    }

    /// What a failed call must leave as it was: the free memory (a failed allocation may have
    /// merged stream lists, as RMM's does, so not which list holds it), the chunks, the pool
    /// size and the handed-out blocks.
    pub(crate) fn memory(&self) -> CoreMemory {
        CoreMemory {
            free: self.free_ranges(),
            chunks: self.chunks.clone(),
            pool_size: self.pool_size,
            handed_out: self.handed_out,
        }
    }
}

/// [`CoreState::memory`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CoreMemory {
    /// [`CoreState::free_ranges`].
    pub(crate) free: Vec<(u64, u64)>,
    /// The upstream chunks, by address.
    pub(crate) chunks: Vec<(u64, usize)>,
    /// The sum of the chunks.
    pub(crate) pool_size: usize,
    /// Blocks handed out and their bytes.
    pub(crate) handed_out: (usize, usize),
}

/// What tests read of a core (a child module sees its private fields).
impl<L: FreeBlocks> StreamOrdered<L> {
    /// Number of list slots ever made (live and free).
    pub(crate) fn slot_count(&self) -> usize {
        self.lists.len()
    }

    /// The grower's patience (tests set its hook).
    pub(crate) fn patience(&self) -> &Patience {
        &self.patience
    }

    /// Everything the core keeps (tests).
    pub(crate) fn state(&self) -> CoreState {
        CoreState {
            lists: self.free_lists(),
            chunks: self.chunk_list(),
            pool_size: self.pool_size(),
            handed_out: self.empty.handed_out(),
        }
    }

    /// The free list holding `addr` as a free block, by key (tests).
    pub(crate) fn list_holding(&self, addr: u64) -> Option<StreamKey> {
        self.lists().find_map(|l| {
            let st = l.lock();
            if st.blocks.holds(addr) {
                st.key()
            } else {
                None
            }
        })
    }
}

/// Every block has this size; requests are at most this.
pub(super) const BLOCK: usize = 256;
/// Chunks hold this many blocks.
pub(super) const CHUNK: usize = 4 * BLOCK;

/// Failures to inject, shared by every list of a core.
#[derive(Debug, Default)]
pub(super) struct Switches {
    pub(super) puts: AtomicUsize,
    pub(super) add_chunks: AtomicUsize,
}

fn fires(n: &AtomicUsize) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
        .is_ok()
}

/// A FIFO of equal blocks with a shared record, as simple as can be.
#[derive(Debug, Clone, Default)]
pub(super) struct ModelBlocks {
    pub(super) free: Vec<u64>,
    record: Arc<Mutex<BTreeMap<u64, (usize, u64)>>>,
    switches: Arc<Switches>,
}

impl FreeBlocks for ModelBlocks {
    type Tag = ();

    fn take(&mut self, size: usize) -> Option<(u64, ())> {
        (size <= BLOCK && !self.free.is_empty()).then(|| (self.free.remove(0), ()))
    }

    fn fits(&self, size: usize) -> bool {
        size <= BLOCK && !self.free.is_empty()
    }

    fn put(&mut self, addr: u64, _size: usize, _tag: ()) -> Result<(), String> {
        if fires(&self.switches.puts) || self.free.contains(&addr) {
            return Err(format!("{addr:#x} overlaps a free block"));
        }
        self.free.push(addr);
        Ok(())
    }

    fn add_chunk(&mut self, addr: u64, size: usize) -> Result<(), String> {
        if fires(&self.switches.add_chunks) {
            return Err(format!("chunk {addr:#x} overlaps another"));
        }
        self.free
            .extend((0..size / BLOCK).map(|i| addr + (i * BLOCK) as u64));
        Ok(())
    }

    fn absorb(&mut self, other: &mut Self) -> Result<(), String> {
        self.free.append(&mut other.free);
        Ok(())
    }

    fn is_empty(&self) -> bool {
        self.free.is_empty()
    }

    fn holds(&self, addr: u64) -> bool {
        self.free.contains(&addr)
    }

    fn remove_chunk(&mut self, _addr: u64, _size: usize) -> bool {
        false
    }

    fn hand_out(&mut self, addr: u64, size: usize, _: (), origin: Origin) -> Result<(), String> {
        let mut record = self.record.lock().unwrap();
        if record.contains_key(&addr) {
            return Err(format!("{addr:#x} is handed out already"));
        }
        record.insert(addr, (size, origin.to_word()));
        Ok(())
    }

    fn take_back(&mut self, addr: u64, size: usize) -> Result<((), Origin), Option<InvalidFree>> {
        let mut record = self.record.lock().unwrap();
        match record.get(&addr).copied() {
            Some((s, origin)) if s == size => {
                record.remove(&addr);
                Ok(((), Origin::from_word(origin)))
            }
            Some((allocated, _)) => Err(Some(InvalidFree::SizeMismatch { allocated })),
            None => Err(None),
        }
    }

    fn handed_out(&self) -> (usize, usize) {
        let record = self.record.lock().unwrap();
        (record.len(), record.values().map(|&(s, _)| s).sum())
    }

    fn free_blocks(&self) -> Vec<(u64, usize)> {
        self.free.iter().map(|&a| (a, BLOCK)).collect()
    }

    fn handed_blocks(&self) -> Vec<(u64, usize)> {
        let record = self.record.lock().unwrap();
        record.iter().map(|(&a, &(s, _))| (a, s)).collect()
    }
}

/// A core over a host mock with one chunk in the legacy list.
pub(super) fn core() -> (StreamOrdered<ModelBlocks>, HostMockResource, Arc<Switches>) {
    let blocks = ModelBlocks::default();
    let switches = Arc::clone(&blocks.switches);
    let core = StreamOrdered::new(blocks);
    let mock = HostMockResource::new();
    let chunk = mock.allocate(CudaStreamView::legacy(), CHUNK, 256).unwrap();
    core.add_initial_chunk(chunk, CHUNK).unwrap();
    (core, mock, switches)
}

pub(super) fn allocate(
    core: &StreamOrdered<ModelBlocks>,
    mock: &HostMockResource,
    stream: CudaStreamView<'_>,
) -> MrResult<DevicePtr> {
    core.allocate(stream, BLOCK, mock, |_| {
        mock.allocate(stream, CHUNK, 256).map(|p| (p, CHUNK))
    })
}

pub(super) fn drop_core(core: StreamOrdered<ModelBlocks>, mock: &HostMockResource) {
    core.release_all(mock, "model");
    assert_eq!(mock.live_allocations(), 0, "a chunk leaked");
}

#[test]
fn a_free_whose_block_cannot_return_stays_allocated() {
    let (core, mock, switches) = core();
    let s = CudaStreamView::legacy();
    let a = allocate(&core, &mock, s).unwrap();
    let before = core.state();
    switches.puts.store(1, Ordering::SeqCst);
    // SAFETY: `a` came from `core`; the free fails and `a` stays allocated.
    let e = unsafe { core.deallocate(s, a, BLOCK) }.unwrap_err();
    assert!(matches!(e, MrError::InvalidArgument(_)), "{e}");
    assert_eq!(core.state(), before, "the block was lost");
    // SAFETY: `a` is still allocated.
    unsafe { core.deallocate(s, a, BLOCK).unwrap() };
    assert_eq!(core.list_holding(a.addr()), Some(StreamKey::Legacy));
    assert_eq!(core.outstanding(), 0);
    drop_core(core, &mock);
}

#[test]
fn a_cross_thread_free_whose_block_cannot_return_stays_allocated() {
    let (core, mock, switches) = core();
    let pt = CudaStreamView::per_thread();
    // Blocks handed out on this thread's per-thread stream come from its own chunk.
    let a = allocate(&core, &mock, pt).unwrap_or_else(|e| {
        // Stealing from the legacy list records an event: needs a GPU or the simulation.
        let _sim = FaultScope::simulated();
        allocate(&core, &mock, pt).unwrap_or_else(|_| panic!("{e}"))
    });
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let before = core.state();
            switches.puts.store(1, Ordering::SeqCst);
            // SAFETY: `a` came from `core`; freed on another thread's per-thread stream,
            // it goes to the legacy list, which refuses it once.
            let e = unsafe { core.deallocate(pt, a, BLOCK) }.unwrap_err();
            assert!(matches!(e, MrError::InvalidArgument(_)), "{e}");
            assert_eq!(core.state(), before);
            // SAFETY: `a` is still allocated.
            unsafe { core.deallocate(pt, a, BLOCK).unwrap() };
        });
    });
    assert_eq!(core.list_holding(a.addr()), Some(StreamKey::Legacy));
    drop_core(core, &mock);
}

#[test]
fn a_block_recorded_as_handed_out_is_not_handed_out_again() {
    let (core, mock, _) = core();
    let s = CudaStreamView::legacy();
    let a = allocate(&core, &mock, s).unwrap();
    // An inconsistency: `a` is free in the list while the record holds it.
    core.legacy.lock().blocks.free.insert(0, a.addr());
    let record_before = core.state().handed_out;
    let e = allocate(&core, &mock, s).unwrap_err();
    assert!(matches!(e, MrError::BadAlloc { .. }), "{e}");
    assert_eq!(core.state().handed_out, record_before, "the record changed");
    assert_eq!(core.list_holding(a.addr()), None);
    // Its owner's free returns it, and it is handed out again normally.
    // SAFETY: `a` came from `core`.
    unsafe { core.deallocate(s, a, BLOCK).unwrap() };
    let b = allocate(&core, &mock, s).unwrap();
    assert_ne!(b, a, "FIFO order: the other blocks come first");
    // SAFETY: `b` came from `core`.
    unsafe { core.deallocate(s, b, BLOCK).unwrap() };
    drop_core(core, &mock);
}

#[test]
fn a_chunk_the_list_refuses_goes_back_upstream() {
    let (core, mock, switches) = core();
    let s = CudaStreamView::legacy();
    let held: Vec<DevicePtr> = (0..CHUNK / BLOCK)
        .map(|_| allocate(&core, &mock, s).unwrap())
        .collect();
    let before = core.state();
    switches.add_chunks.store(1, Ordering::SeqCst);
    let e = allocate(&core, &mock, s).unwrap_err();
    assert!(matches!(e, MrError::BadAlloc { .. }), "{e}");
    assert_eq!(core.state(), before, "the growth stayed");
    assert_eq!(mock.live_allocations(), 1, "the refused chunk leaked");
    let grown = allocate(&core, &mock, s).unwrap();
    assert_eq!(core.pool_size(), 2 * CHUNK);
    for p in held.into_iter().chain([grown]) {
        // SAFETY: every block came from `core`.
        unsafe { core.deallocate(s, p, BLOCK).unwrap() };
    }
    drop_core(core, &mock);
}

#[test]
fn a_steal_whose_wait_fails_takes_nothing() {
    let _sim = FaultScope::simulated();
    let (core, mock, switches) = core();
    let pt = CudaStreamView::per_thread();
    for call in [
        DriverCall::EventCreate,
        DriverCall::EventRecord,
        DriverCall::StreamWait,
    ] {
        let before = core.state();
        fault::inject(Fault::next(call));
        // And the list would refuse a block put back: nothing may be taken at all.
        switches.puts.store(1, Ordering::SeqCst);
        let e = allocate(&core, &mock, pt).unwrap_err();
        assert!(matches!(e, MrError::Cuda(_)), "{call:?}: {e}");
        assert_eq!(fault::injected(call), 1, "{call:?}");
        assert_eq!(core.state(), before, "{call:?}");
        switches.puts.store(0, Ordering::SeqCst);
    }
    // Without faults the steal works, from the legacy list.
    let a = allocate(&core, &mock, pt).unwrap();
    assert_eq!(core.pool_size(), CHUNK, "grew instead of stealing");
    // SAFETY: `a` came from `core`.
    unsafe { core.deallocate(pt, a, BLOCK).unwrap() };
    drop_core(core, &mock);
}

mod retire {
    //! Lists of dead owners are retired (their blocks stay reachable, behind the right order), and a
    //! thief synchronizes the device with no lock held; on the model free list of `tests`,
    //! rmm-sys's simulated driver and rmm-stream's simulated streams.

    use std::sync::atomic::Ordering;
    use std::sync::{mpsc, Arc};

    use proptest::prelude::*;
    use rmm_stream::{CudaStream, CudaStreamView};
    use rmm_sys::fault::{self, DriverCall, Fault, FaultScope};
    use rmm_sys::DevicePtr;

    use super::{allocate, core, drop_core, ModelBlocks, BLOCK, CHUNK};
    use crate::error::{MrError, MrResult};
    use crate::stream_ordered::core::{StreamKey, StreamOrdered};
    use crate::stream_ordered::tuning::WAIT_TIME;
    use crate::testing::HostMockResource;

    /// An allocation on `stream` that may not grow the core (its upstream is full).
    fn allocate_full(
        core: &StreamOrdered<ModelBlocks>,
        mock: &HostMockResource,
        stream: CudaStreamView<'_>,
    ) -> MrResult<DevicePtr> {
        core.allocate(stream, BLOCK, mock, |_| {
            Err(MrError::out_of_memory(BLOCK, "the test's upstream is full"))
        })
    }

    fn free(core: &StreamOrdered<ModelBlocks>, stream: CudaStreamView<'_>, p: DevicePtr) {
        // SAFETY: every caller frees a block it allocated from `core` and still holds.
        unsafe { core.deallocate(stream, p, BLOCK).unwrap() };
    }

    #[test]
    fn lists_of_exited_threads_are_retired_into_the_legacy_list() {
        let (core, mock, _) = core();
        let core = Arc::new(core);
        for i in 0..20 {
            let (c, m) = (Arc::clone(&core), mock.clone());
            // Joined through its handle: its thread-local destructors have run.
            std::thread::spawn(move || {
                let _sim = FaultScope::simulated();
                let pt = CudaStreamView::per_thread();
                // Steals from the legacy list (an event recorded on the legacy stream).
                let p = allocate(&c, &m, pt).unwrap();
                free(&c, pt, p);
                let lists = c.stream_lists(false);
                assert_eq!(
                    lists.alive, 2,
                    "thread {i}: the dead threads' lists are alive"
                );
            })
            .join()
            .unwrap();
            // Its list is dead, retired by the next thread's registration.
            assert_eq!(core.list_count(), 2);
            assert_eq!(core.slot_count(), 1, "a dead thread's slot was not reused");
        }
        let lists = core.stream_lists(true);
        assert_eq!((lists.alive, lists.slots), (1, 1));
        // Every block is back in the legacy list; nothing grew.
        assert_eq!(core.pool_size(), CHUNK);
        let state = core.state();
        assert_eq!(state.lists.len(), 1);
        assert_eq!(state.lists[0].0, StreamKey::Legacy);
        assert_eq!(state.lists[0].1.len(), CHUNK / BLOCK);
        let core = Arc::try_unwrap(core).unwrap_or_else(|_| panic!("the core is still shared"));
        drop_core(core, &mock);
    }

    /// Stream A takes the whole chunk and frees one block on itself; returns the others.
    fn a_takes_everything(
        core: &StreamOrdered<ModelBlocks>,
        mock: &HostMockResource,
        a: CudaStreamView<'_>,
    ) -> (DevicePtr, Vec<DevicePtr>) {
        let mut held: Vec<DevicePtr> = (0..CHUNK / BLOCK)
            .map(|_| allocate(core, mock, a).unwrap())
            .collect();
        let freed = held.pop().unwrap();
        free(core, a, freed);
        (freed, held)
    }

    #[test]
    fn a_destroyed_streams_unrecorded_list_is_taken_after_a_synchronization() {
        let _sim = FaultScope::simulated();
        let (core, mock, _) = core();
        let legacy = CudaStreamView::legacy();
        free(&core, legacy, allocate(&core, &mock, legacy).unwrap());
        let a = CudaStream::simulated(0x7a01);
        let (freed, held) = a_takes_everything(&core, &mock, a.view());
        let a_key = StreamKey::of(a.view()).unwrap();
        assert_eq!(core.list_holding(freed.addr()), Some(a_key));
        drop(a);
        let b = CudaStreamView::simulated(0x7a02);
        let syncs = fault::calls(DriverCall::Synchronize);
        // B's registration retires A's list: its block is in the orphan list, which nobody can
        // record for, so B synchronizes the device (and does not grow).
        let got = allocate(&core, &mock, b).unwrap();
        assert_eq!(got, freed);
        assert_eq!(fault::calls(DriverCall::Synchronize), syncs + 1);
        assert_eq!(core.pool_size(), CHUNK);
        assert_eq!(core.list_count(), 2, "legacy and B");
        for p in held {
            free(&core, b, p);
        }
        free(&core, b, got);
        drop_core(core, &mock);
    }

    #[test]
    fn a_destroyed_streams_recorded_list_is_taken_behind_its_event() {
        let _sim = FaultScope::simulated();
        let (core, mock, _) = core();
        let legacy = CudaStreamView::legacy();
        free(&core, legacy, allocate(&core, &mock, legacy).unwrap());
        let a = CudaStream::simulated(0x7b01);
        let b = CudaStreamView::simulated(0x7b02);
        let (first, mut held) = a_takes_everything(&core, &mock, a.view());
        let second = held.pop().unwrap();
        free(&core, a.view(), second);
        // A's list is lazy (nothing recorded), but A is an owning stream: B pins it, records A's
        // event on it itself (covering both blocks), waits on it and takes one; nothing grows.
        let records = fault::calls(DriverCall::EventRecord);
        let b_first = allocate(&core, &mock, b).unwrap();
        assert!(
            b_first == first || b_first == second,
            "{b_first} is not A's"
        );
        assert_eq!(fault::calls(DriverCall::EventRecord), records + 1);
        assert_eq!(core.pool_size(), CHUNK, "B grew instead of recording on A");
        // A dies with its list covered by that event.
        drop(a);
        let syncs = fault::calls(DriverCall::Synchronize);
        let waits = fault::calls(DriverCall::StreamWait);
        let got = allocate(&core, &mock, b).unwrap();
        let other = if b_first == first { second } else { first };
        assert_eq!(got, other, "B did not take A's other block");
        assert_eq!(
            fault::calls(DriverCall::Synchronize),
            syncs,
            "synchronized where an event covers the blocks"
        );
        assert!(
            fault::calls(DriverCall::StreamWait) > waits,
            "B did not wait on A's event"
        );
        assert_eq!(core.pool_size(), CHUNK);
        for p in held.into_iter().chain([b_first, got]) {
            free(&core, b, p);
        }
        drop_core(core, &mock);
    }

    #[test]
    fn a_foreign_streams_unrecorded_list_makes_a_thief_ask_and_grow() {
        // The same start with A a foreign stream (a view of a handle rmm-stream did not create):
        // nobody can keep it alive, so B asks A to record and grows instead.
        let _sim = FaultScope::simulated();
        let (core, mock, _) = core();
        let legacy = CudaStreamView::legacy();
        free(&core, legacy, allocate(&core, &mock, legacy).unwrap());
        let a = CudaStreamView::simulated(0x7b11);
        let b = CudaStreamView::simulated(0x7b12);
        let (first, mut held) = a_takes_everything(&core, &mock, a);
        let records = fault::calls(DriverCall::EventRecord);
        let grown = allocate(&core, &mock, b).unwrap();
        assert_ne!(grown, first);
        assert_eq!(core.pool_size(), 2 * CHUNK, "B did not grow");
        assert_eq!(
            fault::calls(DriverCall::EventRecord),
            records,
            "B recorded on A"
        );
        // A's next free answers the request.
        let second = held.pop().unwrap();
        free(&core, a, second);
        assert_eq!(fault::calls(DriverCall::EventRecord), records + 1);
        for p in held {
            free(&core, a, p);
        }
        free(&core, b, grown);
        drop_core(core, &mock);
    }

    /// Runs `thief` on its own thread; when its device synchronization starts, checks on this
    /// thread that no lock of the core is held and runs `meanwhile` (which must complete while the
    /// thief waits), then lets the synchronization finish. Returns the thief's result.
    fn while_the_thief_waits<T: Send>(
        core: &StreamOrdered<ModelBlocks>,
        thief: impl FnOnce() -> T + Send,
        meanwhile: impl FnOnce(),
    ) -> T {
        let (in_sync_tx, in_sync_rx) = mpsc::channel::<()>();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        std::thread::scope(|sc| {
            let t = sc.spawn(move || {
                let _sim = FaultScope::simulated();
                fault::watch(DriverCall::Synchronize, move |_| {
                    let _ = in_sync_tx.send(());
                    let _ = go_rx.recv();
                });
                let r = thief();
                fault::unwatch(DriverCall::Synchronize);
                r
            });
            in_sync_rx.recv().expect("the thief never synchronized");
            let locked: Vec<usize> = core
                .lists()
                .enumerate()
                .filter(|(_, l)| l.try_lock().is_none())
                .map(|(i, _)| i)
                .collect();
            assert!(
                locked.is_empty(),
                "lists {locked:?} locked while the thief waits"
            );
            assert!(core.chunks.try_lock().is_ok(), "the growth lock is held");
            assert!(core.registry.try_lock().is_some(), "the registry is locked");
            meanwhile();
            go_tx.send(()).unwrap();
            // Any later synchronization of the thief's goes on without waiting.
            drop(go_tx);
            t.join().unwrap()
        })
    }

    #[test]
    fn a_reclaiming_thief_waits_with_no_lock_held() {
        let _sim = FaultScope::simulated();
        let (core, mock, _) = core();
        let a = CudaStreamView::simulated(0x7c01);
        let b = CudaStreamView::simulated(0x7c02);
        let mut held: Vec<DevicePtr> = (0..CHUNK / BLOCK)
            .map(|_| allocate(&core, &mock, a).unwrap())
            .collect();
        let kept = held.pop().unwrap();
        for &p in &held {
            free(&core, a, p);
        }
        // B cannot grow: after asking A, it reclaims A's unrecorded blocks with a synchronization.
        let got = while_the_thief_waits(
            &core,
            || allocate_full(&core, &mock, b),
            || {
                // The owner frees on A and allocates there again, from its own list.
                free(&core, a, kept);
                let again = allocate(&core, &mock, a).unwrap();
                assert_eq!(again, kept, "the owner did not get its own block back");
            },
        )
        .unwrap();
        assert!(held.contains(&got));
        assert_eq!(core.pool_size(), CHUNK);
        free(&core, b, got);
        free(&core, a, kept);
        drop_core(core, &mock);
    }

    #[test]
    fn a_thief_past_the_grace_period_waits_with_no_lock_held() {
        let _sim = FaultScope::simulated();
        let (core, mock, _) = core();
        let a = CudaStreamView::simulated(0x7d01);
        let b = CudaStreamView::simulated(0x7d02);
        let mut held: Vec<DevicePtr> = (0..CHUNK / BLOCK)
            .map(|_| allocate(&core, &mock, a).unwrap())
            .collect();
        let kept = held.pop().unwrap();
        for &p in &held {
            free(&core, a, p);
        }
        // B's first allocation asks A to record and grows; B takes its whole chunk.
        let b_held: Vec<DevicePtr> = (0..CHUNK / BLOCK)
            .map(|_| allocate(&core, &mock, b).unwrap())
            .collect();
        assert_eq!(core.pool_size(), 2 * CHUNK);
        // A stays idle past the grace period: B's next allocation steals one block of A's after a
        // device synchronization, which it makes with A's list unlocked.
        std::thread::sleep(WAIT_TIME * 2);
        let got = while_the_thief_waits(
            &core,
            || allocate(&core, &mock, b),
            || {
                let own = allocate(&core, &mock, a).unwrap();
                assert!(
                    held.contains(&own),
                    "the owner's block did not come from its list"
                );
                free(&core, a, own);
            },
        )
        .unwrap();
        assert!(held.contains(&got));
        assert_eq!(core.pool_size(), 2 * CHUNK, "grew instead of stealing");
        for p in b_held.into_iter().chain([got]) {
            free(&core, b, p);
        }
        free(&core, a, kept);
        drop_core(core, &mock);
    }

    #[test]
    fn a_full_resource_waits_for_a_reclaim_in_flight_instead_of_failing() {
        let _sim = FaultScope::simulated();
        let (core, mock, _) = core();
        let a = CudaStreamView::simulated(0x7901);
        let b = CudaStreamView::simulated(0x7902);
        let c = CudaStreamView::simulated(0x7903);
        let held: Vec<DevicePtr> = (0..CHUNK / BLOCK)
            .map(|_| allocate(&core, &mock, a).unwrap())
            .collect();
        for &p in &held {
            free(&core, a, p);
        }
        let (in_sync_tx, in_sync_rx) = mpsc::channel::<()>();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (p1, p2) = std::thread::scope(|sc| {
            // B reclaims A's blocks and is held inside its synchronization.
            let t1 = sc.spawn(|| {
                let _sim = FaultScope::simulated();
                fault::watch(DriverCall::Synchronize, move |_| {
                    let _ = in_sync_tx.send(());
                    let _ = go_rx.recv();
                });
                let r = allocate_full(&core, &mock, b);
                fault::unwatch(DriverCall::Synchronize);
                r
            });
            in_sync_rx.recv().expect("B never synchronized");
            // C finds the resource full and every block out of the lists: it must wait for B's
            // synchronization and look again, not report out-of-memory.
            let t2 = sc.spawn(|| {
                let _sim = FaultScope::simulated();
                allocate_full(&core, &mock, c)
            });
            // Let C reach its wait (if it has not by then, it finds the blocks later: the checks
            // below hold either way).
            std::thread::sleep(WAIT_TIME * 10);
            go_tx.send(()).unwrap();
            drop(go_tx);
            let p1 = t1.join().unwrap().unwrap();
            let p2 = t2
                .join()
                .unwrap()
                .expect("out of memory while a reclaim held the free blocks");
            (p1, p2)
        });
        assert_ne!(p1, p2);
        assert!(held.contains(&p1) && held.contains(&p2));
        free(&core, b, p1);
        free(&core, c, p2);
        drop_core(core, &mock);
    }

    #[test]
    fn a_failed_synchronization_takes_nothing() {
        let _sim = FaultScope::simulated();
        let (core, mock, _) = core();
        let a = CudaStreamView::simulated(0x7e01);
        let b = CudaStreamView::simulated(0x7e02);
        let held: Vec<DevicePtr> = (0..CHUNK / BLOCK)
            .map(|_| allocate(&core, &mock, a).unwrap())
            .collect();
        for &p in &held[1..] {
            free(&core, a, p);
        }
        let a_key = StreamKey::of(a).unwrap();
        // The reclaim's synchronization fails: A keeps its blocks.
        let before = core.state();
        fault::inject(Fault::next(DriverCall::Synchronize));
        let e = allocate_full(&core, &mock, b).unwrap_err();
        assert!(matches!(e, MrError::Cuda(_)), "{e}");
        assert_eq!(fault::injected(DriverCall::Synchronize), 1);
        assert_eq!(core.state().memory(), before.memory());
        assert!(held[1..]
            .iter()
            .all(|p| core.list_holding(p.addr()) == Some(a_key)));
        // The steal's synchronization (past the grace period) fails: the same.
        std::thread::sleep(WAIT_TIME * 2);
        let before = core.state();
        fault::inject(Fault::next(DriverCall::Synchronize));
        let e = allocate_full(&core, &mock, b).unwrap_err();
        assert!(matches!(e, MrError::Cuda(_)), "{e}");
        assert_eq!(fault::injected(DriverCall::Synchronize), 2);
        assert_eq!(core.state().memory(), before.memory());
        assert!(held[1..]
            .iter()
            .all(|p| core.list_holding(p.addr()) == Some(a_key)));
        // Without the fault it works.
        let got = allocate_full(&core, &mock, b).unwrap();
        assert!(held[1..].contains(&got));
        free(&core, b, got);
        free(&core, a, held[0]);
        drop_core(core, &mock);
    }

    /// What a step of the model does.
    #[derive(Debug, Clone)]
    enum Op {
        /// Stream `n` is created if it is not alive.
        Create(u8),
        /// Stream `n` is destroyed if it is alive.
        Destroy(u8),
        /// An allocation on stream `n` if alive, else on the legacy stream.
        Allocate(u8),
        /// Allocation `i` (modulo the live ones) is freed on stream `n` if alive, else on the
        /// legacy stream.
        Free(u16, u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            1 => (0u8..6).prop_map(Op::Create),
            1 => (0u8..6).prop_map(Op::Destroy),
            3 => (0u8..6).prop_map(Op::Allocate),
            3 => (any::<u16>(), 0u8..6).prop_map(|(i, n)| Op::Free(i, n)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Streams come and go while blocks are allocated and freed on them: no block is lost or
        /// handed out twice, the lists alive never exceed the live streams by more than the legacy
        /// list and those of streams that died since the last registration, and the slots never
        /// exceed the most streams alive at once.
        #[test]
        fn streams_that_die_leave_nothing_behind(ops in proptest::collection::vec(op(), 1..120)) {
            let _sim = FaultScope::simulated();
            let (core, mock, _) = core();
            let mut streams: Vec<Option<CudaStream>> = (0..6).map(|_| None).collect();
            let mut live: Vec<DevicePtr> = Vec::new();
            let mut peak = 0;
            let mut died_since_sweep = 0;
            for (i, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Create(n) => {
                        if streams[n as usize].is_none() {
                            streams[n as usize] = Some(CudaStream::simulated(0x7f00 + u32::from(n)));
                        }
                    }
                    Op::Destroy(n) => {
                        if streams[n as usize].take().is_some() {
                            died_since_sweep += 1;
                        }
                    }
                    Op::Allocate(n) => {
                        let s = streams[n as usize].as_ref().map_or(CudaStreamView::legacy(), CudaStream::view);
                        let p = allocate(&core, &mock, s).unwrap();
                        prop_assert!(!live.contains(&p), "{} handed out twice", p);
                        live.push(p);
                    }
                    Op::Free(i, n) => {
                        if !live.is_empty() {
                            let p = live.swap_remove(usize::from(i) % live.len());
                            let s = streams[n as usize].as_ref().map_or(CudaStreamView::legacy(), CudaStream::view);
                            free(&core, s, p);
                        }
                    }
                }
                let alive_streams = streams.iter().filter(|s| s.is_some()).count();
                peak = peak.max(alive_streams);
                let state = core.state();
                let free_bytes: u64 = state.free_ranges().iter().map(|(a, b)| b - a).sum();
                prop_assert_eq!(free_bytes as usize + state.handed_out.1, state.pool_size, "a block was lost");
                prop_assert_eq!(state.handed_out.0, live.len());
                let lists = core.stream_lists(false);
                prop_assert!(lists.alive <= 1 + alive_streams + died_since_sweep,
                    "{} lists for {} live streams", lists.alive, alive_streams);
                if i % 4 == 3 {
                    // Retiring the dead leaves the legacy list and the live streams' lists.
                    let lists = core.stream_lists(true);
                    prop_assert!(lists.alive <= 1 + alive_streams,
                        "{} lists after retiring, for {} live streams", lists.alive, alive_streams);
                    died_since_sweep = 0;
                }
                prop_assert!(core.slot_count() <= peak.max(1), "{} slots for a peak of {}", core.slot_count(), peak);
            }
            for p in live {
                free(&core, CudaStreamView::legacy(), p);
            }
            prop_assert_eq!(core.outstanding(), 0);
            drop(streams);
            drop_core(core, &mock);
        }
    }

    #[test]
    fn an_orphan_join_counts_as_an_entry() {
        // The switches of the model list stay off here; this checks the wiring of `adopt`.
        let (core, mock, switches) = core();
        assert_eq!(switches.puts.load(Ordering::SeqCst), 0);
        let mut st = core.orphan.lock();
        let before = st.policy.entered();
        let mut blocks = ModelBlocks::default();
        blocks.free.push(0x1000);
        st.adopt(blocks, None, true).unwrap();
        assert!(st.policy.entered() != before);
        assert!(
            !st.policy.is_uncovered(),
            "covered blocks without an event need nothing"
        );
        let mut more = ModelBlocks::default();
        more.free.push(0x2000);
        st.adopt(more, None, false).unwrap();
        assert!(st.policy.is_uncovered());
        st.blocks.free.clear();
        st.after_take();
        assert!(
            !st.policy.is_uncovered(),
            "an empty orphan list still needs a synchronization"
        );
        drop(st);
        drop_core(core, &mock);
    }
}

mod pressure {
    //! Growth under pressure ([`crate::stream_ordered::pressure`]) in the core: a thief that found a
    //! fitting block no event covers asks its resource for what the request needs, an ordinary miss
    //! for the resource's own growth; on the model free list of `tests`, rmm-sys's simulated
    //! driver and simulated streams.

    use std::cell::RefCell;

    use rmm_stream::CudaStreamView;
    use rmm_sys::fault::FaultScope;
    use rmm_sys::DevicePtr;

    use super::{allocate, core, drop_core, ModelBlocks, BLOCK, CHUNK};
    use crate::error::MrResult;
    use crate::resource::DeviceMemoryResource;
    use crate::stream_ordered::core::{Expand, GrowthCause, StreamOrdered};
    use crate::stream_ordered::pressure::PressureScope;
    use crate::testing::HostMockResource;

    /// An allocation of one block on `stream` whose growth (if any) takes a chunk of one block for
    /// [`GrowthCause::Pressure`] and of [`CHUNK`] bytes otherwise, and logs what it was asked and
    /// whether a pressure scope was active meanwhile.
    fn allocate_logged(
        core: &StreamOrdered<ModelBlocks>,
        mock: &HostMockResource,
        stream: CudaStreamView<'_>,
        log: &RefCell<Vec<(Expand, bool)>>,
    ) -> MrResult<DevicePtr> {
        core.allocate(stream, BLOCK, mock, |ask| {
            log.borrow_mut().push((ask, PressureScope::is_active()));
            let size = match ask.cause {
                GrowthCause::Pressure => BLOCK,
                GrowthCause::Ordinary => CHUNK,
            };
            mock.allocate(stream, size, 256).map(|p| (p, size))
        })
    }

    fn free(core: &StreamOrdered<ModelBlocks>, stream: CudaStreamView<'_>, p: DevicePtr) {
        // SAFETY: every caller frees a block it allocated from `core` and still holds.
        unsafe { core.deallocate(stream, p, BLOCK).unwrap() };
    }

    /// Stream A (the second stream key: the core is eager) takes the whole chunk and frees one
    /// block, which no event covers (A's list is lazy). Returns A's blocks still held.
    fn a_frees_one_unrecorded_block(
        core: &StreamOrdered<ModelBlocks>,
        mock: &HostMockResource,
        a: CudaStreamView<'_>,
    ) -> Vec<DevicePtr> {
        let legacy = CudaStreamView::legacy();
        free(core, legacy, allocate(core, mock, legacy).unwrap());
        let mut held: Vec<DevicePtr> = (0..CHUNK / BLOCK)
            .map(|_| allocate(core, mock, a).unwrap())
            .collect();
        assert_eq!(core.pool_size(), CHUNK, "A grew");
        free(core, a, held.pop().unwrap());
        held
    }

    #[test]
    fn a_thief_that_finds_an_unrecorded_fitting_block_grows_by_the_request() {
        let _sim = FaultScope::simulated();
        let (core, mock, _) = core();
        let a = CudaStreamView::simulated(0x7e01);
        let b = CudaStreamView::simulated(0x7e02);
        let held = a_frees_one_unrecorded_block(&core, &mock, a);
        let log = RefCell::new(Vec::new());
        // B finds A's free block uncovered: it asks A to record and grows, by one block only.
        let got = allocate_logged(&core, &mock, b, &log).unwrap();
        let asked = log.take();
        assert_eq!(asked.len(), 1, "{asked:?}");
        let (ask, scoped) = asked[0];
        assert_eq!(ask.cause, GrowthCause::Pressure, "{ask:?}");
        assert_eq!((ask.pool_size, ask.tail), (CHUNK, 0));
        assert!(
            scoped,
            "the growth under pressure ran outside a pressure scope"
        );
        assert!(!PressureScope::is_active(), "the scope outlived the growth");
        assert_eq!(core.pool_size(), CHUNK + BLOCK);
        // A's next operation records; B's next allocation steals A's block behind the event.
        let again = allocate(&core, &mock, a).unwrap();
        free(&core, a, again);
        let stolen = allocate_logged(&core, &mock, b, &log).unwrap();
        assert!(log.take().is_empty(), "B grew instead of stealing");
        assert_eq!(stolen, again);
        assert_eq!(core.pool_size(), CHUNK + BLOCK);
        for p in held {
            free(&core, a, p);
        }
        free(&core, b, got);
        free(&core, b, stolen);
        drop_core(core, &mock);
    }

    #[test]
    fn a_miss_with_no_fitting_block_anywhere_grows_as_usual() {
        let _sim = FaultScope::simulated();
        let (core, mock, _) = core();
        let a = CudaStreamView::simulated(0x7e11);
        let b = CudaStreamView::simulated(0x7e12);
        let mut held = a_frees_one_unrecorded_block(&core, &mock, a);
        // A takes its block back: no list holds a free block.
        held.push(allocate(&core, &mock, a).unwrap());
        let log = RefCell::new(Vec::new());
        let got = allocate_logged(&core, &mock, b, &log).unwrap();
        let asked = log.take();
        assert_eq!(asked.len(), 1, "{asked:?}");
        assert_eq!(asked[0].0.cause, GrowthCause::Ordinary, "{asked:?}");
        assert!(!asked[0].1, "an ordinary growth ran in a pressure scope");
        assert_eq!(core.pool_size(), 2 * CHUNK);
        for p in held {
            free(&core, a, p);
        }
        free(&core, b, got);
        drop_core(core, &mock);
    }

    #[test]
    fn a_growth_that_serves_a_growth_under_pressure_is_under_pressure() {
        let _sim = FaultScope::simulated();
        let (core, mock, _) = core();
        let s = CudaStreamView::legacy();
        let held: Vec<DevicePtr> = (0..CHUNK / BLOCK)
            .map(|_| allocate(&core, &mock, s).unwrap())
            .collect();
        let log = RefCell::new(Vec::new());
        // Nothing is withheld here, but a resource above grows under pressure on this thread.
        let got = {
            let _outer = PressureScope::enter(GrowthCause::Pressure);
            allocate_logged(&core, &mock, s, &log).unwrap()
        };
        let asked = log.take();
        assert_eq!(asked.len(), 1, "{asked:?}");
        assert_eq!(asked[0].0.cause, GrowthCause::Pressure, "{asked:?}");
        assert_eq!(core.pool_size(), CHUNK + BLOCK);
        for p in held.into_iter().chain([got]) {
            free(&core, s, p);
        }
        drop_core(core, &mock);
    }
}
