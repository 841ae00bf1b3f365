//! Unit and model tests of the pinned pool's bookkeeping (no GPU; run under Miri).

use std::collections::{BTreeSet, HashMap};

use proptest::prelude::*;

use super::*;

/// A fake chunk allocator: chunks at increasing page-aligned addresses with a gap between.
struct Chunks(usize);

impl Chunks {
    fn next(&mut self, request: usize) -> (usize, usize) {
        let bytes = chunk_bytes_for(class_of(request).unwrap());
        let base = self.0;
        self.0 += bytes + 4096;
        (base, bytes)
    }
}

/// Takes a block for `bytes`, adding a chunk when the class is empty.
fn alloc(l: &mut PinnedLedger<u32>, c: &mut Chunks, bytes: usize) -> usize {
    if let Some(a) = l.take(bytes).unwrap() {
        return a;
    }
    let (base, size) = c.next(bytes);
    l.add_chunk(base, size, bytes).unwrap()
}

#[test]
fn sizes_round_to_powers_of_two_from_256() {
    assert_eq!(class_size(0), Some(256));
    assert_eq!(class_size(1), Some(256));
    assert_eq!(class_size(256), Some(256));
    assert_eq!(class_size(257), Some(512));
    assert_eq!(class_size((1 << 20) + 1), Some(2 << 20));
    assert_eq!(class_size(MAX_CLASS), Some(MAX_CLASS));
    assert_eq!(class_size(MAX_CLASS + 1), None);
    assert_eq!(chunk_bytes_for(class_of(300).unwrap()), CHUNK_BYTES);
    assert_eq!(chunk_bytes_for(class_of(5 << 20).unwrap()), 8 << 20);
}

#[test]
fn a_small_chunk_serves_its_whole_class_then_a_new_one_is_needed() {
    // Under Miri a class of few blocks per chunk: thousands take minutes there.
    let (bytes, class) = if cfg!(miri) {
        (600 << 10, 1 << 20)
    } else {
        (1000, 1024)
    };
    let mut l = PinnedLedger::<u32>::new();
    let mut c = Chunks(1 << 30);
    assert_eq!(l.take(bytes).unwrap(), None);
    let first = alloc(&mut l, &mut c, bytes);
    let per_chunk = CHUNK_BYTES / class;
    let mut addrs = BTreeSet::from([first]);
    for _ in 1..per_chunk {
        addrs.insert(l.take(bytes).unwrap().expect("the chunk still has blocks"));
    }
    assert_eq!(addrs.len(), per_chunk);
    assert!(addrs.iter().all(|a| a % class == 0));
    assert_eq!(l.take(bytes).unwrap(), None);
    let s = l.statistics();
    assert_eq!(
        (s.chunks, s.reserved_bytes, s.in_use_bytes),
        (1, CHUNK_BYTES, CHUNK_BYTES)
    );
    assert_eq!(s.requested_bytes, bytes * per_chunk);
    assert_eq!((s.hits, s.misses), (per_chunk as u64 - 1, 1));
}

#[test]
fn a_block_with_events_is_not_reused_until_they_complete() {
    let mut l = PinnedLedger::<u32>::new();
    let mut c = Chunks(1 << 30);
    let a = alloc(&mut l, &mut c, 4 << 20);
    l.record(a, 1).unwrap();
    l.record(a, 2).unwrap();
    l.free(a).unwrap();
    assert_eq!(l.statistics().pending_bytes, 4 << 20);
    // Not free yet: the class is empty, a new chunk would be needed.
    assert_eq!(l.take(4 << 20).unwrap(), None);
    assert_eq!(l.reclaim(|e| *e == 1), vec![1]);
    assert_eq!(l.take(4 << 20).unwrap(), None);
    assert_eq!(l.reclaim(|_| true), vec![2]);
    assert_eq!(l.take(4 << 20).unwrap(), Some(a));
    assert_eq!(l.statistics().pending_bytes, 0);
}

#[test]
fn a_block_freed_without_events_is_reused_at_once() {
    let mut l = PinnedLedger::<u32>::new();
    let mut c = Chunks(1 << 30);
    let a = alloc(&mut l, &mut c, 3 << 20);
    assert_eq!(l.free(a), Ok(3 << 20));
    assert_eq!(l.take(4 << 20).unwrap(), Some(a));
}

#[test]
fn wrong_frees_and_records_are_errors() {
    let mut l = PinnedLedger::<u32>::new();
    let mut c = Chunks(1 << 30);
    let a = alloc(&mut l, &mut c, 512);
    assert_eq!(l.free(a + 256), Err(LedgerError::UnknownBlock(a + 256)));
    assert_eq!(
        l.record(a + 1, 7),
        Err((LedgerError::UnknownBlock(a + 1), 7))
    );
    l.free(a).unwrap();
    assert_eq!(l.free(a), Err(LedgerError::UnknownBlock(a)));
    assert_eq!(l.take_events(a), Err(LedgerError::UnknownBlock(a)));
    assert_eq!(
        l.take(MAX_CLASS + 1),
        Err(LedgerError::TooLarge(MAX_CLASS + 1))
    );
}

#[test]
fn bad_chunks_are_rejected() {
    let mut l = PinnedLedger::<u32>::new();
    let base = 1 << 30;
    assert!(l.add_chunk(base, CHUNK_BYTES / 2, 512).is_err());
    assert!(l.add_chunk(base + 8, CHUNK_BYTES, 512).is_err());
    assert!(l.add_chunk(0, CHUNK_BYTES, 512).is_err());
    l.add_chunk(base, CHUNK_BYTES, 512).unwrap();
    assert!(l
        .add_chunk(base + CHUNK_BYTES / 2, CHUNK_BYTES, 512)
        .is_err());
    assert!(l
        .add_chunk(base - CHUNK_BYTES / 2, CHUNK_BYTES, 512)
        .is_err());
    assert!(l.add_chunk(base + CHUNK_BYTES, CHUNK_BYTES, 512).is_ok());
}

#[test]
fn release_gives_back_only_idle_chunks() {
    let mut l = PinnedLedger::<u32>::new();
    let mut c = Chunks(1 << 30);
    let busy = alloc(&mut l, &mut c, 4 << 20);
    let pending = alloc(&mut l, &mut c, 4 << 20);
    let idle = alloc(&mut l, &mut c, 4 << 20);
    l.record(pending, 9).unwrap();
    l.free(pending).unwrap();
    l.free(idle).unwrap();
    assert_eq!(l.release(), vec![(idle, 4 << 20)]);
    assert_eq!(l.statistics().reserved_bytes, 8 << 20);
    assert_eq!(l.drain_pending(), vec![9]);
    assert_eq!(l.release(), vec![(pending, 4 << 20)]);
    assert_eq!(l.containing(busy + 100), Some(busy));
    assert_eq!(l.containing(idle), None);
    let s = l.statistics();
    assert_eq!((s.chunks, s.cached_bytes, s.in_use_bytes), (1, 0, 4 << 20));
}

#[test]
fn a_shared_chunk_is_kept_while_any_of_its_blocks_is_out() {
    let mut l = PinnedLedger::<u32>::new();
    let mut c = Chunks(1 << 30);
    let a = alloc(&mut l, &mut c, 256);
    let b = l.take(256).unwrap().unwrap();
    l.free(a).unwrap();
    assert!(l.release().is_empty());
    assert_eq!(l.containing(b + 255), Some(b));
    l.free(b).unwrap();
    assert_eq!(l.release().len(), 1);
    assert_eq!(
        l.statistics(),
        PinnedPoolStatistics {
            peak_in_use_bytes: 512,
            hits: 1,
            misses: 1,
            ..PinnedPoolStatistics::default()
        }
    );
}

#[derive(Debug, Clone)]
enum Op {
    Alloc(usize),
    Free(usize),
    Record(usize),
    Complete(usize),
    Reclaim,
    Release,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        // Under Miri no class of more than 4 blocks a chunk (carving thousands is slow there).
        4 => prop_oneof![
            if cfg!(miri) { (300usize << 10)..(1 << 20) } else { 1usize..5000 },
            1usize..(6 << 20),
        ]
        .prop_map(Op::Alloc),
        3 => any::<usize>().prop_map(Op::Free),
        2 => any::<usize>().prop_map(Op::Record),
        2 => any::<usize>().prop_map(Op::Complete),
        2 => Just(Op::Reclaim),
        1 => Just(Op::Release),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: if cfg!(miri) { 4 } else { 256 }, ..ProptestConfig::default() })]

    /// Against a model: blocks in use never overlap, a block is never handed out while an
    /// event recorded on it before its free is incomplete, the counters add up, and release
    /// never returns a chunk holding a block in use or pending.
    #[test]
    fn the_ledger_matches_its_model(ops in prop::collection::vec(op(), 1..if cfg!(miri) { 24 } else { 160 })) {
        let mut l = PinnedLedger::<u32>::new();
        let mut c = Chunks(1 << 30);
        // addr -> (size, requested, events)
        let mut live: HashMap<usize, (usize, usize, Vec<u32>)> = HashMap::new();
        // Freed blocks whose events are not all complete: addr -> events.
        let mut waiting: HashMap<usize, Vec<u32>> = HashMap::new();
        let mut complete: BTreeSet<u32> = BTreeSet::new();
        let mut next_event = 0u32;
        let mut chunks: HashMap<usize, usize> = HashMap::new();
        for op in ops {
            match op {
                Op::Alloc(bytes) => {
                    let before = l.statistics().chunks;
                    let a = alloc(&mut l, &mut c, bytes);
                    if l.statistics().chunks > before {
                        chunks.insert(a, chunk_bytes_for(class_of(bytes).unwrap()));
                    }
                    let size = class_size(bytes).unwrap();
                    prop_assert_eq!(a % size.min(4096), 0);
                    for (&b, &(s, _, _)) in &live {
                        prop_assert!(a + size <= b || b + s <= a, "overlap");
                    }
                    if let Some(ev) = waiting.get(&a) {
                        prop_assert!(ev.iter().all(|e| complete.contains(e)), "reused early");
                        waiting.remove(&a);
                    }
                    prop_assert_eq!(l.block_size(a).unwrap(), (size, bytes));
                    live.insert(a, (size, bytes, Vec::new()));
                }
                Op::Free(i) if !live.is_empty() => {
                    let mut keys: Vec<_> = live.keys().copied().collect();
                    keys.sort_unstable();
                    let a = keys[i % keys.len()];
                    let (_, requested, events) = live.remove(&a).unwrap();
                    prop_assert_eq!(l.free(a), Ok(requested));
                    if !events.is_empty() {
                        waiting.insert(a, events);
                    }
                }
                Op::Record(i) if !live.is_empty() => {
                    let mut keys: Vec<_> = live.keys().copied().collect();
                    keys.sort_unstable();
                    let a = keys[i % keys.len()];
                    l.record(a, next_event).unwrap();
                    live.get_mut(&a).unwrap().2.push(next_event);
                    next_event += 1;
                }
                Op::Complete(i) if next_event > 0 => {
                    complete.insert((i % next_event as usize) as u32);
                }
                Op::Reclaim => {
                    for e in l.reclaim(|e| complete.contains(e)) {
                        prop_assert!(complete.contains(&e));
                    }
                }
                Op::Release => {
                    for (base, bytes) in l.release() {
                        prop_assert_eq!(chunks.remove(&base), Some(bytes));
                        for (&a, _) in live.iter() {
                            prop_assert!(a < base || a >= base + bytes, "released a live block");
                        }
                        for (&a, ev) in waiting.iter() {
                            if ev.iter().all(|e| complete.contains(e)) {
                                continue; // reclaimed (or reclaimable): no longer pending
                            }
                            prop_assert!(a < base || a >= base + bytes, "released a pending block");
                        }
                    }
                }
                _ => {}
            }
            let s = l.statistics();
            prop_assert_eq!(s.in_use_bytes, live.values().map(|v| v.0).sum::<usize>());
            prop_assert_eq!(s.requested_bytes, live.values().map(|v| v.1).sum::<usize>());
            prop_assert_eq!(s.reserved_bytes, chunks.values().sum::<usize>());
            prop_assert_eq!(s.reserved_bytes, s.in_use_bytes + s.pending_bytes + s.cached_bytes);
            prop_assert!(s.peak_in_use_bytes >= s.in_use_bytes);
            prop_assert_eq!(l.blocks_in_use(), live.len());
        }
    }
}
