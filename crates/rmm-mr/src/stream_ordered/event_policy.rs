//! When an ordinary stream's free list records its event, and what a thief may do with the
//! list: the lazy rule of the stream-ordered sub-allocators as a pure state machine (no CUDA
//! calls; [`ListState`](crate::stream_ordered::stream_lists::ListState) carries one per list and
//! makes the calls it asks for). Only the owner of a stream ever records on it; a list is *lazy*
//! (frees record nothing) until a thief takes from it or asks, then *recording* for
//! [`RECORD_RUN`] frees; a thief that finds unrecorded blocks asks and looks elsewhere, and after
//! [`WAIT_TIME`] synchronizes the device instead. A thief synchronizes with no lock held, so
//! the policy counts the blocks that entered ([`EventPolicy::entered`]) and takes a
//! synchronization into account only if none entered after the thief let go of the list
//! ([`EventPolicy::synchronized_since`]). The list of a dead owner's blocks (the *orphan* list)
//! follows the same policy without an owner ([`EventPolicy::on_orphaned`]). The rule and why it
//! is safe: `docs/internals/stream-ordered.md`, "The lazy event rule as a state machine".
//!
//! When the owner's stream is an rmm-stream [`CudaStream`](rmm_stream::CudaStream), a thief can
//! keep it from being destroyed for a moment ([`rmm_stream::StreamLife::pin`]) and record the
//! list's event on it itself, after every block in the list ([`EventPolicy::on_steal_pinned`]):
//! then nobody asks, waits for the owner, synchronizes or starts a recording run.

use std::time::Instant;

use crate::stream_ordered::tuning::{RECORD_RUN, WAIT_TIME};

/// What a thief may do with a list's blocks now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StealAction {
    /// Every block is covered by the list's event: wait on it (if it was ever recorded), take.
    WaitEvent,
    /// The thief holds the owner's stream alive: record the list's event on it (after every
    /// block in the list), wait on it, take. If the record fails, report it
    /// ([`EventPolicy::record_failed`]) and take nothing.
    RecordThenWait,
    /// Some blocks are not covered; the owner has been asked to record. Look elsewhere.
    Ask,
    /// The owner did not answer within [`WAIT_TIME`]: synchronize the device, then take
    /// (and report it with [`EventPolicy::synchronized`]).
    SyncDevice,
}

/// The lazy-recording state of one ordinary stream's list (see the [module docs](self)).
#[derive(Debug, Clone, Default)]
pub(crate) struct EventPolicy {
    /// A record failed (the event may miss some blocks' work), or blocks no event covers joined
    /// the orphan list: the next thief synchronizes the device whatever else the state says.
    record_failed: bool,
    /// Blocks entered the list after its event was last recorded.
    unrecorded: bool,
    /// When a thief found the list unrecorded and asked the owner to record.
    wanted_since: Option<Instant>,
    /// Frees that still record before the list goes back to lazy.
    recording_left: u32,
    /// How many times blocks entered (wrapping): a thief that synchronizes with no lock held
    /// compares it before and after.
    entered: u64,
}

impl EventPolicy {
    /// Blocks enter the list on the owner's (live) stream: a free, a merge into it, a new
    /// chunk. Returns whether to record the event now (then the blocks are covered); otherwise
    /// the list is marked unrecorded.
    #[inline]
    pub(crate) fn on_enter(&mut self) -> bool {
        self.entered = self.entered.wrapping_add(1);
        if self.wanted_since.take().is_some() {
            self.recording_left = RECORD_RUN;
            self.unrecorded = false;
            return true;
        }
        if self.recording_left > 0 {
            self.recording_left -= 1;
            self.unrecorded = false;
            return true;
        }
        self.unrecorded = true;
        false
    }

    /// The owner allocates on its (live) stream: returns whether to record now, to answer a
    /// thief's request (which covers every block in the list).
    #[inline]
    pub(crate) fn on_owner_allocate(&mut self) -> bool {
        if self.wanted_since.is_none() {
            return false;
        }
        self.wanted_since = None;
        self.recording_left = RECORD_RUN;
        self.unrecorded = false;
        true
    }

    /// A record the policy asked for failed.
    pub(crate) fn record_failed(&mut self) {
        self.record_failed = true;
    }

    /// A thief (another stream) wants blocks of this list at `now`.
    pub(crate) fn on_steal(&mut self, now: Instant) -> StealAction {
        if self.record_failed {
            return StealAction::SyncDevice;
        }
        if !self.unrecorded {
            // Someone takes this stream's blocks: keep them covered for a while.
            self.recording_left = RECORD_RUN;
            return StealAction::WaitEvent;
        }
        match self.wanted_since {
            None => {
                self.wanted_since = Some(now);
                StealAction::Ask
            }
            Some(since) if now.saturating_duration_since(since) < WAIT_TIME => StealAction::Ask,
            Some(_) => StealAction::SyncDevice,
        }
    }

    /// A thief that holds the owner's stream alive (a pin, so it may record on that stream
    /// itself) wants blocks of this list. Uncovered blocks, or a failed record, make it record
    /// the event on the owner's stream now, which covers every block in the list; covered
    /// blocks need only the wait. No request to the owner and no recording run: the next thief
    /// records again if blocks entered since.
    pub(crate) fn on_steal_pinned(&mut self) -> StealAction {
        if self.unrecorded || self.record_failed {
            self.unrecorded = false;
            self.record_failed = false;
            self.wanted_since = None;
            return StealAction::RecordThenWait;
        }
        StealAction::WaitEvent
    }

    /// The device was synchronized after every block now in the list entered it: they are all
    /// safe for any stream.
    pub(crate) fn synchronized(&mut self) {
        self.record_failed = false;
        self.unrecorded = false;
        self.wanted_since = None;
        self.recording_left = RECORD_RUN;
    }

    /// Blocks entered without an event while no thief could exist (the resource had seen one
    /// stream only): they count as unrecorded from now on.
    pub(crate) fn mark_unrecorded(&mut self) {
        self.entered = self.entered.wrapping_add(1);
        self.unrecorded = true;
    }

    /// The count of entries, taken under the list's lock by a thief about to synchronize the
    /// device with the lock released (see [`synchronized_since`](Self::synchronized_since)).
    pub(crate) fn entered(&self) -> u64 {
        self.entered
    }

    /// A thief that read [`entered`](Self::entered) as `snapshot`, then released the list's lock
    /// and synchronized the device, reports it. Every block in the list entered before the
    /// synchronization began only if no block entered since the snapshot: then they are all safe
    /// for any stream ([`synchronized`](Self::synchronized)) and this returns `true`; otherwise
    /// nothing changes (later blocks may still be in use).
    pub(crate) fn synchronized_since(&mut self, snapshot: u64) -> bool {
        if self.entered != snapshot {
            return false;
        }
        self.synchronized();
        true
    }

    /// Blocks of a retired list joined the orphan list (which has no owner to record): `covered`
    /// when an event recorded after every one of them comes with them and the list has room
    /// for it. Returns whether to keep that event as one more wait; `false`: blocks no event
    /// covers are in the list now (or the list already needs one), so its next thief
    /// synchronizes the device and the events may go.
    pub(crate) fn on_orphaned(&mut self, covered: bool) -> bool {
        self.entered = self.entered.wrapping_add(1);
        if self.record_failed || !covered {
            self.record_failed = true;
            return false;
        }
        true
    }

    /// The orphan list became empty: nothing in it needs covering any more.
    pub(crate) fn on_emptied(&mut self) {
        self.record_failed = false;
        self.unrecorded = false;
        self.wanted_since = None;
    }

    /// Whether some blocks are not covered by the event (never recorded after them, or the
    /// record failed): only a device synchronization makes them safe for another stream now.
    pub(crate) fn is_uncovered(&self) -> bool {
        self.unrecorded || self.record_failed
    }

    /// Whether the next thief must synchronize the device (a record failed, or uncovered blocks
    /// joined the orphan list) until a synchronization is reported.
    pub(crate) fn is_record_failed(&self) -> bool {
        self.record_failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// What the tests read of the structure.
    impl EventPolicy {
        /// Whether a thief's request is open.
        pub(crate) fn is_wanted(&self) -> bool {
            self.wanted_since.is_some()
        }
    }

    #[test]
    fn lazy_frees_record_nothing() {
        let mut p = EventPolicy::default();
        for _ in 0..1000 {
            assert!(!p.on_enter(), "a lazy list recorded");
            assert!(!p.on_owner_allocate());
        }
        assert!(p.unrecorded && !p.is_wanted());
    }

    #[test]
    fn a_covered_list_is_stolen_and_then_records_for_a_run() {
        let mut p = EventPolicy::default();
        let t = Instant::now();
        assert_eq!(
            p.on_steal(t),
            StealAction::WaitEvent,
            "empty history is covered"
        );
        for i in 0..RECORD_RUN {
            assert!(p.on_enter(), "free {i} of the run did not record");
            assert!(!p.unrecorded);
        }
        assert!(!p.on_enter(), "the run did not end");
        assert!(p.unrecorded);
    }

    #[test]
    fn an_unrecorded_list_asks_the_owner_who_answers_at_its_next_free() {
        let mut p = EventPolicy::default();
        assert!(!p.on_enter());
        let t = Instant::now();
        assert_eq!(p.on_steal(t), StealAction::Ask);
        assert!(p.is_wanted());
        // A second thief within the grace period asks again; nothing else changes.
        assert_eq!(p.on_steal(t + WAIT_TIME / 2), StealAction::Ask);
        assert!(p.on_enter(), "the owner's free did not answer the request");
        assert!(!p.unrecorded && !p.is_wanted());
        assert_eq!(p.on_steal(t), StealAction::WaitEvent);
        // Recording now: the next frees keep the list covered.
        assert!(p.on_enter());
        assert_eq!(p.on_steal(t), StealAction::WaitEvent);
    }

    #[test]
    fn the_owner_answers_at_its_next_allocation_too() {
        let mut p = EventPolicy::default();
        p.on_enter();
        let t = Instant::now();
        assert_eq!(p.on_steal(t), StealAction::Ask);
        assert!(p.on_owner_allocate());
        assert!(!p.on_owner_allocate(), "answered twice");
        assert_eq!(p.on_steal(t), StealAction::WaitEvent);
    }

    #[test]
    fn an_idle_owner_makes_a_late_thief_synchronize() {
        let mut p = EventPolicy::default();
        p.on_enter();
        let t = Instant::now();
        assert_eq!(p.on_steal(t), StealAction::Ask);
        assert_eq!(p.on_steal(t + WAIT_TIME), StealAction::SyncDevice);
        // Until a thief reports the synchronization, the answer stays.
        assert_eq!(p.on_steal(t + WAIT_TIME * 2), StealAction::SyncDevice);
        p.synchronized();
        assert!(!p.unrecorded && !p.is_wanted());
        assert_eq!(p.on_steal(t + WAIT_TIME * 3), StealAction::WaitEvent);
    }

    #[test]
    fn a_clock_going_backwards_only_asks() {
        let mut p = EventPolicy::default();
        p.on_enter();
        let t = Instant::now() + Duration::from_secs(1);
        assert_eq!(p.on_steal(t), StealAction::Ask);
        assert_eq!(p.on_steal(t - Duration::from_millis(500)), StealAction::Ask);
    }

    #[test]
    fn a_failed_record_makes_the_next_thief_synchronize() {
        let mut p = EventPolicy::default();
        let t = Instant::now();
        assert_eq!(p.on_steal(t), StealAction::WaitEvent);
        assert!(p.on_enter(), "the run after a steal records");
        p.record_failed();
        assert!(p.is_uncovered());
        assert_eq!(p.on_steal(t), StealAction::SyncDevice);
        p.synchronized();
        assert!(!p.is_uncovered());
        assert_eq!(p.on_steal(t), StealAction::WaitEvent);
    }

    #[test]
    fn marking_unrecorded_makes_thieves_ask() {
        let mut p = EventPolicy::default();
        p.mark_unrecorded();
        assert_eq!(p.on_steal(Instant::now()), StealAction::Ask);
    }

    #[test]
    fn a_synchronization_counts_only_if_nothing_entered_since() {
        let mut p = EventPolicy::default();
        p.on_enter();
        let t = Instant::now();
        assert_eq!(p.on_steal(t), StealAction::Ask);
        assert_eq!(p.on_steal(t + WAIT_TIME), StealAction::SyncDevice);
        let snapshot = p.entered();
        // The owner frees again while the thief synchronizes with the lock released; the
        // request is answered by a record, but the thief's synchronization says nothing.
        assert!(p.on_enter());
        assert!(!p.synchronized_since(snapshot));
        assert_eq!(p.on_steal(t), StealAction::WaitEvent);
        // A lazy free after the snapshot: the synchronization must not cover it.
        let mut p = EventPolicy::default();
        p.on_enter();
        p.on_steal(t);
        assert_eq!(p.on_steal(t + WAIT_TIME), StealAction::SyncDevice);
        let snapshot = p.entered();
        p.mark_unrecorded();
        assert!(!p.synchronized_since(snapshot));
        assert!(p.is_uncovered());
        // Nothing entered: it counts.
        let snapshot = p.entered();
        assert!(p.synchronized_since(snapshot));
        assert!(!p.is_uncovered());
    }

    #[test]
    fn the_orphan_list_waits_on_events_or_synchronizes() {
        let mut p = EventPolicy::default();
        let t = Instant::now();
        for _ in 0..3 {
            assert!(p.on_orphaned(true), "covered blocks need their event only");
            assert_eq!(p.on_steal(t), StealAction::WaitEvent);
        }
        // No room for one more event: the blocks count as uncovered.
        assert!(!p.on_orphaned(false), "an uncovered join keeps no event");
        assert_eq!(p.on_steal(t), StealAction::SyncDevice);
        p.on_emptied();
        assert_eq!(p.on_steal(t), StealAction::WaitEvent);
        // Uncovered blocks: a synchronization, and later events are not kept either.
        assert!(!p.on_orphaned(false));
        assert!(!p.on_orphaned(true));
        assert_eq!(p.on_steal(t), StealAction::SyncDevice);
        let snapshot = p.entered();
        assert!(!p.on_orphaned(true));
        assert!(
            !p.synchronized_since(snapshot),
            "a join after the snapshot was ignored"
        );
        let snapshot = p.entered();
        assert!(p.synchronized_since(snapshot));
        assert_eq!(p.on_steal(t), StealAction::WaitEvent);
    }

    #[test]
    fn a_pinned_thief_records_itself_and_starts_no_run() {
        let mut p = EventPolicy::default();
        assert!(!p.on_enter());
        assert_eq!(p.on_steal_pinned(), StealAction::RecordThenWait);
        assert!(!p.is_uncovered() && !p.is_wanted());
        // Covered now: the next pinned thief only waits; the owner keeps freeing lazily.
        assert_eq!(p.on_steal_pinned(), StealAction::WaitEvent);
        assert!(!p.on_enter(), "a pinned steal started a recording run");
        assert_eq!(p.on_steal_pinned(), StealAction::RecordThenWait);
        // A failed record is mended by the next pinned thief's own record, not a
        // synchronization.
        p.record_failed();
        assert_eq!(p.on_steal_pinned(), StealAction::RecordThenWait);
        assert!(!p.is_record_failed());
        // An open request of an unpinned thief is answered by the pinned thief's record.
        assert!(!p.on_enter());
        assert_eq!(p.on_steal(Instant::now()), StealAction::Ask);
        assert_eq!(p.on_steal_pinned(), StealAction::RecordThenWait);
        assert!(!p.is_wanted());
        assert!(
            !p.on_owner_allocate(),
            "the owner answered a request already answered"
        );
    }

    #[test]
    fn every_unrecorded_block_is_either_asked_for_or_covered() {
        // Model check over all sequences of length 8 of the five events: a thief is told
        // WaitEvent only when no block entered since the last record or synchronization.
        #[derive(Clone, Copy, Debug)]
        enum Op {
            Free,
            OwnerAllocate,
            Steal,
            LateSteal,
            PinnedSteal,
        }
        let ops = [
            Op::Free,
            Op::OwnerAllocate,
            Op::Steal,
            Op::LateSteal,
            Op::PinnedSteal,
        ];
        for mut code in 0..ops.len().pow(8) {
            let mut p = EventPolicy::default();
            let mut uncovered = false; // the model: a block entered after the last record
            let t0 = Instant::now();
            let mut clock = t0;
            let mut seq = Vec::new();
            for _ in 0..8 {
                let op = ops[code % ops.len()];
                code /= ops.len();
                seq.push(op);
                match op {
                    Op::Free => uncovered = !p.on_enter(),
                    Op::PinnedSteal => match p.on_steal_pinned() {
                        StealAction::WaitEvent => {
                            assert!(!uncovered, "uncovered blocks handed over: {seq:?}")
                        }
                        // The thief's record covers every block in the list.
                        StealAction::RecordThenWait => uncovered = false,
                        other => panic!("a pinned thief was told {other:?}: {seq:?}"),
                    },
                    Op::OwnerAllocate => {
                        if p.on_owner_allocate() {
                            uncovered = false;
                        }
                    }
                    Op::Steal | Op::LateSteal => {
                        if matches!(op, Op::LateSteal) {
                            clock += WAIT_TIME * 2;
                        }
                        match p.on_steal(clock) {
                            StealAction::WaitEvent => {
                                assert!(!uncovered, "uncovered blocks handed over: {seq:?}")
                            }
                            StealAction::Ask => assert!(p.is_wanted(), "{seq:?}"),
                            StealAction::SyncDevice => {
                                p.synchronized();
                                uncovered = false;
                            }
                            StealAction::RecordThenWait => {
                                panic!("an unpinned thief was told to record: {seq:?}")
                            }
                        }
                    }
                }
                assert_eq!(p.unrecorded, uncovered, "{seq:?}");
            }
        }
    }

    #[test]
    fn a_synchronization_without_the_lock_never_covers_a_later_block() {
        // Model check over all sequences of length 7 of six events, where a thief synchronizes
        // with the list's lock released (`BeginSync` takes the snapshot, `EndSync` reports it)
        // and frees may come in between: a thief is told WaitEvent only when every block that
        // entered was recorded after or synchronized after.
        #[derive(Clone, Copy, Debug)]
        enum Op {
            Free,
            OwnerAllocate,
            Steal,
            LateSteal,
            BeginSync,
            EndSync,
            PinnedSteal,
        }
        let ops = [
            Op::Free,
            Op::OwnerAllocate,
            Op::Steal,
            Op::LateSteal,
            Op::BeginSync,
            Op::EndSync,
            Op::PinnedSteal,
        ];
        const LEN: u32 = 7;
        for mut code in 0..ops.len().pow(LEN) {
            let mut p = EventPolicy::default();
            // The model: some block entered after the last record or effective
            // synchronization.
            let mut uncovered = false;
            // A synchronization in flight: its snapshot, and whether a block entered since.
            let mut sync: Option<(u64, bool)> = None;
            let mut clock = Instant::now();
            let mut seq = Vec::new();
            for _ in 0..LEN {
                let op = ops[code % ops.len()];
                code /= ops.len();
                seq.push(op);
                match op {
                    Op::Free => {
                        uncovered = !p.on_enter();
                        if let Some((_, entered)) = &mut sync {
                            *entered = true;
                        }
                    }
                    Op::OwnerAllocate => {
                        if p.on_owner_allocate() {
                            uncovered = false;
                        }
                    }
                    Op::Steal | Op::LateSteal => {
                        if matches!(op, Op::LateSteal) {
                            clock += WAIT_TIME * 2;
                        }
                        if p.on_steal(clock) == StealAction::WaitEvent {
                            assert!(!uncovered, "uncovered blocks handed over: {seq:?}");
                        }
                    }
                    Op::PinnedSteal => match p.on_steal_pinned() {
                        StealAction::WaitEvent => {
                            assert!(!uncovered, "uncovered blocks handed over: {seq:?}")
                        }
                        StealAction::RecordThenWait => uncovered = false,
                        other => panic!("a pinned thief was told {other:?}: {seq:?}"),
                    },
                    Op::BeginSync => {
                        if sync.is_none() {
                            sync = Some((p.entered(), false));
                        }
                    }
                    Op::EndSync => {
                        if let Some((snapshot, entered)) = sync.take() {
                            let counted = p.synchronized_since(snapshot);
                            assert_eq!(counted, !entered, "{seq:?}");
                            if counted {
                                uncovered = false;
                            }
                        }
                    }
                }
                assert_eq!(p.unrecorded, uncovered, "{seq:?}");
            }
        }
    }
}
