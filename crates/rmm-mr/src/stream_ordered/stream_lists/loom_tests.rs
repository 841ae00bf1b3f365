//! Loom model of the lazy event rule as an ordinary stream's list runs it (`cargo xtask loom`):
//! the list's lock, [`ListState`](super::ListState)'s `publish`, `serve`, `prepare_steal` and
//! `synchronized_since` (a thief synchronizes the device with the lock released), the pure
//! [`EventPolicy`](crate::stream_ordered::event_policy::EventPolicy) they drive, and event
//! records that fail. The owner frees and allocates on its stream while a thief takes
//! blocks for another, on rmm-sys's simulated driver (fake streams and events, no GPU) with the
//! first or the second event record made to fail. It checks, on every interleaving: a thief
//! told to wait on the event takes only blocks the event covers (freed before a record that
//! succeeded); after a failed record the next thief synchronizes the device, and a
//! synchronization counts only for blocks that entered before it; no block is lost.
//!
//! The simulated driver's state and fault plan are per OS thread, and loom runs a model's
//! threads on one, so they are the model's. A thief whose request to the owner is still open
//! looks elsewhere rather than ask again: a second request would depend on the clock (the
//! owner's grace period), which a model must not (the rule's timing is checked exhaustively in
//! `event_policy`'s tests).

use loom::sync::Arc;
use loom::thread;

use rmm_stream::CudaStreamView;
use rmm_sys::fault::{self, DriverCall, Fault, FaultScope};

use super::{device_synchronize, new_list, Steal, StreamKey, StreamList};
use crate::sync::Seen;

const KEY: StreamKey = StreamKey::Stream(1);

/// The list's blocks, and a ghost of the owner's stream: each block is the number of its entry
/// into the list (the frees, counted); `covered` is the last entry a successful record or a
/// device synchronization covers; `failed` whether a record failed since the last
/// synchronization the list took into account.
#[derive(Debug, Default)]
struct Blocks {
    free: Vec<u64>,
    entries: u64,
    covered: u64,
    failed: bool,
    /// Every block freed, taken by the thief, and allocated by the owner.
    freed: Vec<u64>,
    taken: Vec<u64>,
    allocated: Vec<u64>,
}

/// Runs `f` and tells whether it made a driver call of kind `call` and whether one failed.
fn calls<R>(call: DriverCall, f: impl FnOnce() -> R) -> (R, bool, bool) {
    let (calls, injected) = (fault::calls(call), fault::injected(call));
    let r = f();
    (
        r,
        fault::calls(call) != calls,
        fault::injected(call) != injected,
    )
}

/// The owner's free of one block, as the core's free path does it.
fn free(list: &StreamList<Blocks>, stream: CudaStreamView<'_>) {
    let mut st = list.lock();
    st.blocks.entries += 1;
    let block = st.blocks.entries;
    st.blocks.free.push(block);
    st.blocks.freed.push(block);
    let ((), recorded, failed) = calls(DriverCall::EventRecord, || st.publish(stream, true));
    settle_record(&mut st.blocks, recorded, failed);
}

/// The owner's allocation from its own list, answering a thief's request first.
fn allocate(list: &StreamList<Blocks>, stream: CudaStreamView<'_>) {
    let mut st = list.lock();
    let ((), recorded, failed) = calls(DriverCall::EventRecord, || st.serve(stream));
    settle_record(&mut st.blocks, recorded, failed);
    if let Some(block) = st.blocks.free.pop() {
        st.blocks.allocated.push(block);
    }
}

fn settle_record(blocks: &mut Blocks, recorded: bool, failed: bool) {
    if failed {
        blocks.failed = true;
    } else if recorded {
        blocks.covered = blocks.entries;
    }
}

/// One steal attempt, as the core's steal path makes it: wait on the event and take, or take,
/// synchronize the device with the lock released, and report it.
fn steal(list: &StreamList<Blocks>, thief: CudaStreamView<'_>, seen: &Seen<3>) {
    let mut st = list.lock();
    if st.blocks.free.is_empty() || st.policy.is_wanted() {
        return;
    }
    match st.prepare_steal(thief, true) {
        Ok(Steal::NotNow) => seen.saw(2),
        Ok(Steal::Now) => {
            seen.saw(0);
            let b = &mut st.blocks;
            assert!(!b.failed, "waited on an event whose record failed: {b:?}");
            assert!(
                b.free.iter().all(|&block| block <= b.covered),
                "waited on an event that does not cover every block: {b:?}"
            );
            let block = b.free.remove(0);
            b.taken.push(block);
        }
        Ok(Steal::AfterSync(snapshot)) => {
            seen.saw(1);
            let block = st.blocks.free.remove(0);
            st.blocks.taken.push(block);
            let entries = st.blocks.entries;
            drop(st);
            let (synced, called, _) = calls(DriverCall::Synchronize, device_synchronize);
            assert!(synced.is_ok() && called, "{synced:?}");
            let mut st = list.lock();
            st.synchronized_since(snapshot);
            // Every block that entered before the lock was let go is covered now; the list
            // takes the synchronization into account only if none entered since.
            let b = &mut st.blocks;
            b.covered = b.covered.max(entries);
            if b.entries == entries {
                b.failed = false;
            }
        }
        Err(e) => panic!("the simulated driver failed a steal: {e}"),
    }
}

#[test]
fn loom_thieves_wait_only_on_events_that_cover_the_blocks() {
    static SEEN: Seen<3> = Seen::new([
        "a thief waited on the event",
        "a thief synchronized the device",
        "a thief asked the owner",
    ]);
    for (name, fail) in [
        ("event_rule::records_succeed", None),
        ("event_rule::first_record_fails", Some(0)),
        ("event_rule::second_record_fails", Some(1)),
    ] {
        crate::sync::model(name, move || {
            let _simulated = FaultScope::simulated();
            if let Some(n) = fail {
                fault::inject(Fault::nth(DriverCall::EventRecord, n));
            }
            let list = Arc::new(new_list(Some(KEY), Blocks::default()));
            let owner = {
                let list = Arc::clone(&list);
                thread::spawn(move || {
                    let stream = CudaStreamView::simulated(1);
                    free(&list, stream);
                    free(&list, stream);
                    allocate(&list, stream);
                    free(&list, stream);
                })
            };
            let thief = {
                let list = Arc::clone(&list);
                thread::spawn(move || {
                    let stream = CudaStreamView::simulated(2);
                    for _ in 0..3 {
                        steal(&list, stream, &SEEN);
                    }
                })
            };
            owner.join().unwrap();
            thief.join().unwrap();
            let st = list.lock();
            let b = &st.blocks;
            let mut all: Vec<u64> = [&b.free, &b.taken, &b.allocated]
                .into_iter()
                .flatten()
                .copied()
                .collect();
            all.sort_unstable();
            assert_eq!(all, b.freed, "a block was lost or duplicated: {b:?}");
        });
    }
    SEEN.check();
}
