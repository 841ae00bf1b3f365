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

/// What a thief may do with a list it has locked (the answer of
/// [`ListState::prepare_steal`](crate::stream_ordered::stream_lists::ListState::prepare_steal),
/// through [`EventPolicy::on_steal`] for an ordinary stream's list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Steal {
    /// The thief's stream now waits for the list's pending work (every block is covered by the
    /// list's event, if it was ever recorded): take blocks.
    Now,
    /// Not now (some blocks are not covered, and the owner has been asked to record, or only a
    /// device synchronization would do where the thief may not make one): look elsewhere.
    NotNow,
    /// Only after a device synchronization (the owner did not answer within [`WAIT_TIME`], or a
    /// record failed): take the blocks out, release the lock, synchronize the device, then
    /// report it (`ListState::synchronized_since`, then [`EventPolicy::synchronized_since`])
    /// with this snapshot of [`entered`](EventPolicy::entered) (or, if it failed, give the
    /// blocks back).
    AfterSync(u64),
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
        if self.on_owner_allocate() {
            return true;
        }
        // Within a recording run, one more free of it records.
        self.unrecorded = self.recording_left == 0;
        self.recording_left = self.recording_left.saturating_sub(1);
        !self.unrecorded
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

    /// A thief (another stream) wants blocks of this list at `now`; `may_sync`: whether it may
    /// synchronize the device for them (else it is told [`Steal::NotNow`] where it would).
    pub(crate) fn on_steal(&mut self, now: Instant, may_sync: bool) -> Steal {
        if !self.record_failed && !self.unrecorded {
            // Someone takes this stream's blocks: keep them covered for a while.
            self.recording_left = RECORD_RUN;
            return Steal::Now;
        }
        // A failed record, or a request the owner left unanswered for `WAIT_TIME`: only a
        // device synchronization covers the blocks now.
        let late = |since: Instant| now.saturating_duration_since(since) >= WAIT_TIME;
        if self.record_failed || self.wanted_since.is_some_and(late) {
            return if may_sync {
                Steal::AfterSync(self.entered)
            } else {
                Steal::NotNow
            };
        }
        // Ask the owner to record (or wait for its answer).
        self.wanted_since.get_or_insert(now);
        Steal::NotNow
    }

    /// A thief that holds the owner's stream alive (a pin, so it may record on that stream
    /// itself) wants blocks of this list: returns whether it must record the list's event on the
    /// owner's stream first (uncovered blocks, or a failed record), which covers every block in
    /// the list; then, or for covered blocks at once, it waits on the event and takes. If the
    /// record fails it reports it ([`record_failed`](Self::record_failed)) and takes nothing.
    /// No request to the owner and no recording run: the next thief records again if blocks
    /// entered since.
    pub(crate) fn on_steal_pinned(&mut self) -> bool {
        let record = self.is_uncovered();
        if record {
            self.unrecorded = false;
            self.record_failed = false;
            self.wanted_since = None;
        }
        record
    }

    /// Every block now in the list is safe for any stream: the device was synchronized after
    /// they all entered, or (the orphan list) none is left. Nothing needs covering, and a
    /// thief's request is void; an ordinary list records for a run, as after a steal.
    pub(crate) fn covered_all(&mut self) {
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
    /// for any stream ([`covered_all`](Self::covered_all)) and this returns `true`; otherwise
    /// nothing changes (later blocks may still be in use).
    pub(crate) fn synchronized_since(&mut self, snapshot: u64) -> bool {
        let all = self.entered == snapshot;
        if all {
            self.covered_all();
        }
        all
    }

    /// Blocks of a retired list joined the orphan list (which has no owner to record): `covered`
    /// when an event recorded after every one of them comes with them and the list has room
    /// for it. Returns whether to keep that event as one more wait; `false`: blocks no event
    /// covers are in the list now (or the list already needs one), so its next thief
    /// synchronizes the device and the events may go.
    pub(crate) fn on_orphaned(&mut self, covered: bool) -> bool {
        self.entered = self.entered.wrapping_add(1);
        self.record_failed |= !covered;
        !self.record_failed
    }

    /// Whether some blocks are not covered by the event (never recorded after them, or the
    /// record failed): only a device synchronization makes them safe for another stream now.
    pub(crate) fn is_uncovered(&self) -> bool {
        self.unrecorded || self.record_failed
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

        /// Whether the next thief must synchronize the device (a record failed, or uncovered
        /// blocks joined the orphan list) until a synchronization is reported.
        pub(crate) fn is_record_failed(&self) -> bool {
            self.record_failed
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
        assert_eq!(p.on_steal(t, true), Steal::Now, "empty history is covered");
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
        assert_eq!(p.on_steal(t, true), Steal::NotNow);
        assert!(p.is_wanted());
        // A second thief within the grace period asks again; nothing else changes.
        assert_eq!(p.on_steal(t + WAIT_TIME / 2, true), Steal::NotNow);
        assert!(p.on_enter(), "the owner's free did not answer the request");
        assert!(!p.unrecorded && !p.is_wanted());
        assert_eq!(p.on_steal(t, true), Steal::Now);
        // Recording now: the next frees keep the list covered.
        assert!(p.on_enter());
        assert_eq!(p.on_steal(t, true), Steal::Now);
    }

    #[test]
    fn the_owner_answers_at_its_next_allocation_too() {
        let mut p = EventPolicy::default();
        p.on_enter();
        let t = Instant::now();
        assert_eq!(p.on_steal(t, true), Steal::NotNow);
        assert!(p.on_owner_allocate());
        assert!(!p.on_owner_allocate(), "answered twice");
        assert_eq!(p.on_steal(t, true), Steal::Now);
    }

    #[test]
    fn an_idle_owner_makes_a_late_thief_synchronize() {
        let mut p = EventPolicy::default();
        p.on_enter();
        let t = Instant::now();
        assert_eq!(p.on_steal(t, true), Steal::NotNow);
        // A thief that may not synchronize looks elsewhere, and changes nothing.
        assert_eq!(p.on_steal(t + WAIT_TIME, false), Steal::NotNow);
        assert_eq!(
            p.on_steal(t + WAIT_TIME, true),
            Steal::AfterSync(p.entered())
        );
        // Until a thief reports the synchronization, the answer stays.
        assert_eq!(
            p.on_steal(t + WAIT_TIME * 2, true),
            Steal::AfterSync(p.entered())
        );
        p.covered_all();
        assert!(!p.unrecorded && !p.is_wanted());
        assert_eq!(p.on_steal(t + WAIT_TIME * 3, true), Steal::Now);
    }

    #[test]
    fn a_clock_going_backwards_only_asks() {
        let mut p = EventPolicy::default();
        p.on_enter();
        let t = Instant::now() + Duration::from_secs(1);
        assert_eq!(p.on_steal(t, true), Steal::NotNow);
        assert_eq!(
            p.on_steal(t - Duration::from_millis(500), true),
            Steal::NotNow
        );
    }

    #[test]
    fn a_failed_record_makes_the_next_thief_synchronize() {
        let mut p = EventPolicy::default();
        let t = Instant::now();
        assert_eq!(p.on_steal(t, true), Steal::Now);
        assert!(p.on_enter(), "the run after a steal records");
        p.record_failed();
        assert!(p.is_uncovered());
        assert_eq!(p.on_steal(t, true), Steal::AfterSync(p.entered()));
        p.covered_all();
        assert!(!p.is_uncovered());
        assert_eq!(p.on_steal(t, true), Steal::Now);
    }

    #[test]
    fn marking_unrecorded_makes_thieves_ask() {
        let mut p = EventPolicy::default();
        p.mark_unrecorded();
        assert_eq!(p.on_steal(Instant::now(), true), Steal::NotNow);
    }

    #[test]
    fn a_synchronization_counts_only_if_nothing_entered_since() {
        let mut p = EventPolicy::default();
        p.on_enter();
        let t = Instant::now();
        assert_eq!(p.on_steal(t, true), Steal::NotNow);
        assert_eq!(
            p.on_steal(t + WAIT_TIME, true),
            Steal::AfterSync(p.entered())
        );
        let snapshot = p.entered();
        // The owner frees again while the thief synchronizes with the lock released; the
        // request is answered by a record, but the thief's synchronization says nothing.
        assert!(p.on_enter());
        assert!(!p.synchronized_since(snapshot));
        assert_eq!(p.on_steal(t, true), Steal::Now);
        // A lazy free after the snapshot: the synchronization must not cover it.
        let mut p = EventPolicy::default();
        p.on_enter();
        p.on_steal(t, true);
        assert_eq!(
            p.on_steal(t + WAIT_TIME, true),
            Steal::AfterSync(p.entered())
        );
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
            assert_eq!(p.on_steal(t, true), Steal::Now);
        }
        // No room for one more event: the blocks count as uncovered.
        assert!(!p.on_orphaned(false), "an uncovered join keeps no event");
        assert_eq!(p.on_steal(t, true), Steal::AfterSync(p.entered()));
        p.covered_all();
        assert_eq!(p.on_steal(t, true), Steal::Now);
        // Uncovered blocks: a synchronization, and later events are not kept either.
        assert!(!p.on_orphaned(false));
        assert!(!p.on_orphaned(true));
        assert_eq!(p.on_steal(t, true), Steal::AfterSync(p.entered()));
        let snapshot = p.entered();
        assert!(!p.on_orphaned(true));
        assert!(
            !p.synchronized_since(snapshot),
            "a join after the snapshot was ignored"
        );
        let snapshot = p.entered();
        assert!(p.synchronized_since(snapshot));
        assert_eq!(p.on_steal(t, true), Steal::Now);
    }

    #[test]
    fn a_pinned_thief_records_itself_and_starts_no_run() {
        let mut p = EventPolicy::default();
        assert!(!p.on_enter());
        assert!(
            p.on_steal_pinned(),
            "an unrecorded list was taken without a record"
        );
        assert!(!p.is_uncovered() && !p.is_wanted());
        // Covered now: the next pinned thief only waits; the owner keeps freeing lazily.
        assert!(!p.on_steal_pinned());
        assert!(!p.on_enter(), "a pinned steal started a recording run");
        assert!(p.on_steal_pinned());
        // A failed record is mended by the next pinned thief's own record, not a
        // synchronization.
        p.record_failed();
        assert!(p.on_steal_pinned());
        assert!(!p.is_record_failed());
        // An open request of an unpinned thief is answered by the pinned thief's record.
        assert!(!p.on_enter());
        assert_eq!(p.on_steal(Instant::now(), true), Steal::NotNow);
        assert!(p.on_steal_pinned());
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
        // Under Miri, which interprets the 5^8 sequences for about an hour, those of length 5.
        const LEN: u32 = if cfg!(miri) { 5 } else { 8 };
        for mut code in 0..ops.len().pow(LEN) {
            let mut p = EventPolicy::default();
            let mut uncovered = false; // the model: a block entered after the last record
            let t0 = Instant::now();
            let mut clock = t0;
            let mut seq = Vec::new();
            for _ in 0..LEN {
                let op = ops[code % ops.len()];
                code /= ops.len();
                seq.push(op);
                match op {
                    Op::Free => uncovered = !p.on_enter(),
                    // The thief's record covers every block in the list.
                    Op::PinnedSteal if p.on_steal_pinned() => uncovered = false,
                    Op::PinnedSteal => assert!(!uncovered, "uncovered blocks handed over: {seq:?}"),
                    Op::OwnerAllocate => {
                        if p.on_owner_allocate() {
                            uncovered = false;
                        }
                    }
                    Op::Steal | Op::LateSteal => {
                        if matches!(op, Op::LateSteal) {
                            clock += WAIT_TIME * 2;
                        }
                        match p.on_steal(clock, true) {
                            Steal::Now => {
                                assert!(!uncovered, "uncovered blocks handed over: {seq:?}")
                            }
                            Steal::NotNow => assert!(p.is_wanted(), "{seq:?}"),
                            Steal::AfterSync(_) => {
                                p.covered_all();
                                uncovered = false;
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
        // Under Miri, which interprets the 7^7 sequences too slowly, the sequences of length 4.
        const LEN: u32 = if cfg!(miri) { 4 } else { 7 };
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
                        if p.on_steal(clock, true) == Steal::Now {
                            assert!(!uncovered, "uncovered blocks handed over: {seq:?}");
                        }
                    }
                    Op::PinnedSteal if p.on_steal_pinned() => uncovered = false,
                    Op::PinnedSteal => assert!(!uncovered, "uncovered blocks handed over: {seq:?}"),
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
