//! Model tests: random allocate/free sequences over several local arenas and the global arena,
//! with random `clean`/`defragment` calls and deliberately wrong frees, checked against a plain
//! model (live allocations) and brute-force first fit after every step.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::size_class::ALLOCATION_ALIGNMENT;
use super::{
    align_up, ArenaError, Block, GlobalArena, LocalArena, Superblock, SuperblockLocation,
    SUPERBLOCK_MIN_SIZE,
};

const MIN: usize = SUPERBLOCK_MIN_SIZE;
const ARENAS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        arena: usize,
        size: usize,
    },
    Free {
        pick: usize,
        via: usize,
    },
    FreeTwice {
        pick: usize,
        via: usize,
    },
    StaleFree {
        pick: usize,
        via: usize,
    },
    WrongSize {
        pick: usize,
        via: usize,
    },
    InteriorFree {
        pick: usize,
        via: usize,
    },
    UnknownFree {
        below: bool,
        offset: u64,
        via: usize,
    },
    Clean {
        arena: usize,
    },
    Defragment {
        arena: usize,
    },
    /// A free on arena `via`'s stream that lets it keep the emptied superblock when it can.
    FreeKeep {
        pick: usize,
        via: usize,
    },
    ReleaseKept {
        arena: usize,
    },
    /// The resource's reclaim: the empty superblocks (kept ones included) taken out, then
    /// released to the global arena.
    TakeEmpty {
        arena: usize,
    },
}

fn size_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => 1usize..=4096,
        3 => 4097usize..=(256 << 10),
        1 => (256usize << 10)..=MIN,
        1 => Just(MIN),
        1 => (MIN + 1)..=(3 * MIN),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let arena = 0..ARENAS;
    let pick = any::<usize>();
    prop_oneof![
        12 => (arena.clone(), size_strategy()).prop_map(|(arena, size)| Op::Alloc { arena, size }),
        8 => (pick, arena.clone()).prop_map(|(pick, via)| Op::Free { pick, via }),
        1 => (pick, arena.clone()).prop_map(|(pick, via)| Op::FreeTwice { pick, via }),
        1 => (pick, arena.clone()).prop_map(|(pick, via)| Op::StaleFree { pick, via }),
        1 => (pick, arena.clone()).prop_map(|(pick, via)| Op::WrongSize { pick, via }),
        1 => (pick, arena.clone()).prop_map(|(pick, via)| Op::InteriorFree { pick, via }),
        1 => (any::<bool>(), 0u64..(64 << 20), arena.clone())
            .prop_map(|(below, offset, via)| Op::UnknownFree { below, offset, via }),
        1 => arena.clone().prop_map(|arena| Op::Clean { arena }),
        1 => arena.clone().prop_map(|arena| Op::Defragment { arena }),
        3 => (pick, arena.clone()).prop_map(|(pick, via)| Op::FreeKeep { pick, via }),
        1 => arena.clone().prop_map(|arena| Op::ReleaseKept { arena }),
        1 => arena.prop_map(|arena| Op::TakeEmpty { arena }),
    ]
}

/// The first free block (address order) of at least `size` bytes, by linear scan.
fn brute_first_fit<'a>(
    superblocks: impl Iterator<Item = &'a Superblock>,
    size: usize,
) -> Option<u64> {
    superblocks
        .flat_map(Superblock::free_blocks)
        .find(|b| b.size >= size)
        .map(|b| b.addr)
}

struct World {
    global: GlobalArena,
    arenas: Vec<LocalArena>,
    /// The model: live allocations, address -> rounded size.
    live: BTreeMap<u64, usize>,
    /// Blocks freed earlier (for stale frees).
    freed: Vec<(u64, usize)>,
}

/// Per superblock of a local arena (owner: the arena's index) and per block the global arena
/// holds (owner `None`): span, free and live blocks.
type Snapshot = Vec<(Option<usize>, Block, Vec<Block>, Vec<Block>)>;

impl World {
    fn new(base: u64, size: usize) -> Self {
        let global = GlobalArena::new(base, size).unwrap_or_else(|e| panic!("arena: {e}"));
        Self {
            global,
            arenas: (0..ARENAS).map(|_| LocalArena::new()).collect(),
            live: BTreeMap::new(),
            freed: Vec::new(),
        }
    }

    fn snapshot(&self) -> Snapshot {
        let describe = |owner: Option<usize>, sb: &Superblock| {
            (
                owner,
                sb.span(),
                sb.free_blocks().collect(),
                sb.live_blocks().collect(),
            )
        };
        // The global arena's own blocks, one entry each.
        let mut snap: Snapshot = self
            .global
            .free_blocks()
            .map(|b| (None, b, vec![b], vec![]))
            .chain(
                self.global
                    .live_blocks()
                    .map(|b| (None, b, vec![], vec![b])),
            )
            .collect();
        for (i, arena) in self.arenas.iter().enumerate() {
            snap.extend(arena.superblocks().map(|sb| describe(Some(i), sb)));
        }
        snap.sort_by_key(|entry| entry.1.addr);
        snap
    }

    /// The free block of the global arena a request of `size` goes to, by brute force: best
    /// fit, the lowest address among equals.
    fn brute_best_fit(&self, size: usize) -> Option<Block> {
        self.global
            .free_blocks()
            .filter(|b| b.size >= size)
            .min_by_key(|b| (b.size, b.addr))
    }

    /// The expected placement by brute force: address-ordered first fit in the arena's own
    /// superblocks as RMM does it with linear scans, then best fit in the global arena. The
    /// address, and the block taken out of the global arena when one is (the loan, or the
    /// large block).
    fn expected_alloc(&self, arena: usize, size: usize) -> Option<(u64, Option<Block>)> {
        let size = align_up(size).filter(|&s| s > 0)?;
        if !GlobalArena::handles(size) {
            let small = self.arenas[arena].superblocks().filter(|sb| {
                !self.arenas[arena]
                    .kept_superblocks()
                    .any(|k| k.addr() == sb.addr())
            });
            if let Some(addr) = brute_first_fit(small, size) {
                return Some((addr, None));
            }
            // A fresh superblock: max(size, 1 MiB), or the whole free block when less than a
            // superblock would be left.
            let head = size.max(MIN);
            let taken = match self.brute_best_fit(head) {
                Some(source) if source.size - head >= MIN => Block::new(source.addr, head),
                Some(source) => source,
                // No room for a superblock: the best fit for the request itself, lent whole.
                None => self.brute_best_fit(size)?,
            };
            return Some((taken.addr, Some(taken)));
        }
        if let Some(addr) = brute_first_fit(self.arenas[arena].kept_superblocks(), size) {
            // Large requests try the superblocks the arena kept first.
            return Some((addr, None));
        }
        let source = self.brute_best_fit(size)?;
        Some((source.addr, Some(Block::new(source.addr, size))))
    }

    /// The resource's free path: large frees try the global arena first; then the arena of the
    /// calling thread/stream, the other arenas, the global arena. Also checks `find`.
    fn free(&mut self, via: usize, addr: u64, size: usize) -> Result<(), ArenaError> {
        let holders: Vec<usize> = (0..ARENAS)
            .filter(|&i| self.arenas[i].contains(addr))
            .collect();
        assert!(holders.len() <= 1, "address in several arenas");
        match self.global.find(addr) {
            Some(SuperblockLocation::Global(span)) => {
                assert!(span.contains_addr(addr) && self.global.contains(addr));
                assert!(holders.is_empty());
            }
            Some(SuperblockLocation::Lent(span)) => {
                assert!(span.contains_addr(addr) && !self.global.contains(addr));
                assert_eq!(holders.len(), 1);
                let holder = &self.arenas[holders[0]];
                assert!(holder.superblocks().any(|sb| sb.span() == span));
            }
            None => {
                assert!(!self.global.span().contains_addr(addr));
                assert!(holders.is_empty() && !self.global.contains(addr));
            }
        }

        let large = align_up(size).is_some_and(GlobalArena::handles);
        if large && self.global.deallocate(addr, size)? {
            return Ok(());
        }
        let order = std::iter::once(via).chain((0..ARENAS).filter(|&i| i != via));
        for i in order {
            if self.arenas[i].deallocate(addr, size)? {
                return Ok(());
            }
        }
        self.global.deallocate_large(addr, size)
    }

    fn pick_live(&self, pick: usize) -> Option<(u64, usize)> {
        if self.live.is_empty() {
            return None;
        }
        self.live
            .iter()
            .nth(pick % self.live.len())
            .map(|(&a, &s)| (a, s))
    }

    fn free_live(&mut self, via: usize, addr: u64, size: usize) {
        assert_eq!(self.free(via, addr, size), Ok(()), "free {addr:#x} {size}");
        self.live.remove(&addr);
        self.freed.push((addr, size));
    }

    /// A free that must fail and leave everything unchanged.
    fn wrong_free(&mut self, via: usize, addr: u64, size: usize) -> ArenaError {
        let before = self.snapshot();
        let result = self.free(via, addr, size);
        assert_eq!(self.snapshot(), before, "a failed free changed the arena");
        match result {
            Ok(()) => panic!("wrong free of {addr:#x} + {size} succeeded"),
            Err(error) => error,
        }
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Alloc { arena, size } => {
                let expected = self.expected_alloc(arena, size);
                let got = self.arenas[arena].allocate(size, &mut self.global);
                assert_eq!(
                    got,
                    expected.map(|e| e.0),
                    "allocate {size} in arena {arena}"
                );
                if let Some((addr, Some(taken))) = expected {
                    // The superblock taken from the global arena: lent to this arena (small) or
                    // kept in the global arena (large).
                    let now_in = if GlobalArena::handles(align_up(size).unwrap_or(0)) {
                        self.global.find(addr)
                    } else {
                        assert!(self.arenas[arena].contains(addr));
                        self.global
                            .find(addr)
                            .filter(|loc| matches!(loc, SuperblockLocation::Lent(_)))
                    };
                    let span = match now_in {
                        Some(SuperblockLocation::Global(span) | SuperblockLocation::Lent(span)) => {
                            span
                        }
                        None => panic!("allocated block {addr:#x} not found"),
                    };
                    assert_eq!(span, taken, "superblock taken for {size} B");
                }
                if let Some(addr) = got {
                    let rounded = align_up(size).unwrap_or(0);
                    assert!(
                        self.live.insert(addr, rounded).is_none(),
                        "handed out twice"
                    );
                }
            }
            Op::Free { pick, via } => {
                if let Some((addr, size)) = self.pick_live(pick) {
                    self.free_live(via, addr, size);
                }
            }
            Op::FreeTwice { pick, via } => {
                if let Some((addr, size)) = self.pick_live(pick) {
                    self.free_live(via, addr, size);
                    let error = self.wrong_free((via + 1) % ARENAS, addr, size);
                    assert_eq!(error, ArenaError::DoubleFree { addr, size });
                }
            }
            Op::StaleFree { pick, via } => {
                if self.freed.is_empty() {
                    return;
                }
                let (addr, size) = self.freed[pick % self.freed.len()];
                match self.live.get(&addr) {
                    // Reallocated with the same size: indistinguishable from a valid free.
                    Some(&s) if s == size => {}
                    Some(&allocated) => {
                        let error = self.wrong_free(via, addr, size);
                        assert_eq!(
                            error,
                            ArenaError::SizeMismatch {
                                addr,
                                size,
                                allocated
                            }
                        );
                    }
                    None => {
                        let error = self.wrong_free(via, addr, size);
                        assert!(
                            matches!(
                                error,
                                ArenaError::DoubleFree { .. } | ArenaError::NotFound { .. }
                            ),
                            "{error:?}"
                        );
                    }
                }
            }
            Op::WrongSize { pick, via } => {
                if let Some((addr, size)) = self.pick_live(pick) {
                    let wrong = if size > ALLOCATION_ALIGNMENT {
                        size - ALLOCATION_ALIGNMENT
                    } else {
                        size + ALLOCATION_ALIGNMENT
                    };
                    let error = self.wrong_free(via, addr, wrong);
                    assert_eq!(
                        error,
                        ArenaError::SizeMismatch {
                            addr,
                            size: wrong,
                            allocated: size
                        }
                    );
                }
            }
            Op::InteriorFree { pick, via } => {
                if let Some((addr, size)) = self.pick_live(pick) {
                    if size > ALLOCATION_ALIGNMENT {
                        let inner = addr + ALLOCATION_ALIGNMENT as u64;
                        let error = self.wrong_free(via, inner, ALLOCATION_ALIGNMENT);
                        assert_eq!(
                            error,
                            ArenaError::NotFound {
                                addr: inner,
                                size: ALLOCATION_ALIGNMENT
                            }
                        );
                    }
                }
            }
            Op::UnknownFree { below, offset, via } => {
                let span = self.global.span();
                let addr = if below {
                    span.addr.saturating_sub(offset + 1)
                } else {
                    span.end() + offset
                };
                let error = self.wrong_free(via, addr, 256);
                assert_eq!(error, ArenaError::NotFound { addr, size: 256 });
            }
            Op::Clean { arena } => {
                let count = self.arenas[arena].superblock_count();
                assert_eq!(self.arenas[arena].clean(&mut self.global), Ok(count));
                assert_eq!(self.arenas[arena].superblock_count(), 0);
            }
            Op::FreeKeep { pick, via } => {
                let Some((addr, size)) = self.pick_live(pick) else {
                    return;
                };
                // Kept exactly when the global arena holds the block and it is at least a
                // superblock.
                let expected = self
                    .global
                    .live_blocks()
                    .find(|b| b.addr == addr)
                    .filter(|b| b.size >= MIN);
                let before = self.snapshot();
                match self.global.reclaim(addr, size, usize::MAX) {
                    Some(sb) => {
                        assert_eq!(Some(sb.span()), expected);
                        assert!(sb.is_empty());
                        let kept = self.arenas[via].kept_superblock_count();
                        assert!(self.arenas[via].keep(sb).is_ok());
                        assert_eq!(self.arenas[via].kept_superblock_count(), kept + 1);
                        self.live.remove(&addr);
                        self.freed.push((addr, size));
                    }
                    None => {
                        assert_eq!(expected, None, "reclaim of {addr:#x} refused");
                        assert_eq!(
                            self.snapshot(),
                            before,
                            "a refused reclaim changed the arena"
                        );
                        self.free_live(via, addr, size);
                    }
                }
            }
            Op::ReleaseKept { arena } => {
                let local = &mut self.arenas[arena];
                let empties = local.kept_superblocks().filter(|sb| sb.is_empty()).count();
                let kept = local.kept_superblock_count();
                assert_eq!(local.release_empty_kept(&mut self.global), Ok(empties));
                assert_eq!(local.kept_superblock_count(), kept - empties);
                let free: usize = local
                    .kept_superblocks()
                    .map(Superblock::total_free_size)
                    .sum();
                assert_eq!(local.kept_free_bytes(), free);
            }
            Op::TakeEmpty { arena } => {
                let local = &mut self.arenas[arena];
                let empties: Vec<u64> = local
                    .superblocks()
                    .filter(|sb| sb.is_empty())
                    .map(Superblock::addr)
                    .collect();
                let count = local.superblock_count();
                let taken = local.take_empty();
                assert_eq!(
                    taken
                        .iter()
                        .map(Superblock::addr)
                        .collect::<std::collections::BTreeSet<_>>(),
                    empties.iter().copied().collect(),
                );
                assert_eq!(local.superblock_count(), count - empties.len());
                assert!(!local.has_empty());
                assert!(self.global.release_all(taken).is_ok());
            }
            Op::Defragment { arena } => {
                let local = &mut self.arenas[arena];
                let empties = local.superblocks().filter(|sb| sb.is_empty()).count();
                let count = local.superblock_count();
                assert_eq!(local.defragment(&mut self.global), Ok(empties));
                assert_eq!(local.superblock_count(), count - empties);
                assert!(local.superblocks().all(|sb| !sb.is_empty()));
            }
        }
    }

    fn check_invariants(&self) {
        let span = self.global.span();
        let snap = self.snapshot();

        // The global arena's blocks and the local arenas' superblocks partition the span; lent
        // superblocks are exactly those the local arenas hold.
        let mut cursor = span.addr;
        for (_, sb_span, _, _) in &snap {
            assert_eq!(
                sb_span.addr, cursor,
                "blocks and superblocks do not tile the span"
            );
            cursor = sb_span.end();
        }
        assert_eq!(cursor, span.end());
        let lent: Vec<Block> = self.global.lent_superblocks().collect();
        let held_by_arenas: Vec<Block> = snap
            .iter()
            .filter(|entry| entry.0.is_some())
            .map(|entry| entry.1)
            .collect();
        assert_eq!(lent, held_by_arenas);

        // Each superblock: free and live blocks tile it; free blocks fully coalesced.
        let mut all_live = BTreeMap::new();
        let (mut free_total, mut live_total) = (0usize, 0usize);
        for (owner, sb_span, free, live) in &snap {
            for pair in free.windows(2) {
                assert!(pair[0].end() < pair[1].addr, "free blocks not coalesced");
            }
            let mut blocks: Vec<Block> = free.iter().chain(live.iter()).copied().collect();
            blocks.sort();
            let mut at = sb_span.addr;
            for b in &blocks {
                assert_eq!(b.addr, at, "free + live do not tile superblock {sb_span}");
                assert!(b.size > 0 && b.size % ALLOCATION_ALIGNMENT == 0);
                assert_eq!(b.addr % ALLOCATION_ALIGNMENT as u64, 0);
                at = b.end();
            }
            assert_eq!(at, sb_span.end());
            for b in live {
                all_live.insert(b.addr, b.size);
            }
            let sb_free: usize = free.iter().map(|b| b.size).sum();
            let sb_live: usize = live.iter().map(|b| b.size).sum();
            free_total += sb_free;
            live_total += sb_live;
            // Cached values match the blocks.
            let Some(i) = owner else {
                continue;
            };
            let Some(sb) = self.arenas[*i].superblocks().find(|s| s.span() == *sb_span) else {
                panic!("superblock vanished")
            };
            assert_eq!(sb.total_free_size(), sb_free);
            assert_eq!(sb.live_bytes(), sb_live);
            assert_eq!(
                sb.max_free_size(),
                free.iter().map(|b| b.size).max().unwrap_or(0)
            );
            assert_eq!(sb.is_empty(), live.is_empty());
        }
        assert_eq!(
            all_live, self.live,
            "arena live blocks differ from the model"
        );
        assert_eq!(free_total + live_total, span.size, "byte accounting");

        // Global arena: free blocks never touch.
        let free: Vec<Block> = self.global.free_blocks().collect();
        for pair in free.windows(2) {
            assert!(pair[0].end() < pair[1].addr, "free blocks not coalesced");
        }
        let global_stats = self.global.stats();
        assert_eq!(
            global_stats.free_bytes,
            free.iter().map(|b| b.size).sum::<usize>()
        );
        assert_eq!(self.global.free_bytes(), global_stats.free_bytes);
        assert_eq!(self.global.free_block_count(), free.len());
        assert_eq!(
            global_stats.total_bytes + self.global.lent_bytes(),
            span.size
        );
        for arena in &self.arenas {
            let free: usize = arena
                .kept_superblocks()
                .map(Superblock::total_free_size)
                .sum();
            assert_eq!(arena.kept_free_bytes(), free, "kept free bytes");
            assert!(arena
                .kept_superblocks()
                .all(|k| arena.superblocks().any(|sb| sb.addr() == k.addr())));
        }
        let local_total: usize = self.arenas.iter().map(|a| a.stats().total_bytes).sum();
        assert_eq!(local_total, self.global.lent_bytes());
        assert_eq!(
            self.global.max_free_size(),
            free.iter().map(|b| b.size).max().unwrap_or(0)
        );
    }

    /// Free everything, clean every arena: the global arena must be whole again.
    fn drain(&mut self) {
        let live: Vec<(u64, usize)> = self.live.iter().map(|(&a, &s)| (a, s)).collect();
        for (i, (addr, size)) in live.into_iter().enumerate() {
            self.free_live(i % ARENAS, addr, size);
        }
        for arena in &mut self.arenas {
            let count = arena.superblock_count();
            assert_eq!(arena.clean(&mut self.global), Ok(count));
        }
        self.check_invariants();
        assert!(self.global.is_fully_coalesced(), "{}", self.global);
        assert_eq!(
            self.global.free_blocks().collect::<Vec<_>>(),
            vec![self.global.span()]
        );
        let stats = self.global.stats();
        assert_eq!(stats.free_bytes, self.global.span().size);
        assert_eq!(stats.max_free_block, self.global.span().size);
    }
}

/// `PROPTEST_CASES` when set (Miri, or a longer hunt), else `default`.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(200)))]

    #[test]
    fn arenas_match_the_model(
        base_granules in 0u64..4096,
        size in MIN..=(8 * MIN + 1000),
        ops in proptest::collection::vec(op_strategy(), 1..160),
    ) {
        let mut world = World::new((1 << 32) + base_granules * ALLOCATION_ALIGNMENT as u64, size);
        world.check_invariants();
        for op in ops {
            world.apply(op);
            world.check_invariants();
        }
        world.drain();
    }
}

/// Fill an arena with small allocations from several arenas until it is full, then check that
/// only cleaning makes room for an arena-sized large allocation.
#[test]
fn fill_then_defragment_everything() {
    let mut world = World::new(1 << 32, 4 * MIN);
    let (mut turn, mut failures_in_a_row) = (0, 0);
    while failures_in_a_row < ARENAS {
        let arena = turn % ARENAS;
        turn += 1;
        let expected = world.expected_alloc(arena, 64 << 10);
        let got = world.arenas[arena].allocate(64 << 10, &mut world.global);
        assert_eq!(got, expected.map(|e| e.0));
        match got {
            Some(addr) => {
                world.live.insert(addr, 64 << 10);
                failures_in_a_row = 0;
            }
            None => failures_in_a_row += 1,
        }
    }
    assert_eq!(world.live.len(), 64, "4 MiB / 64 KiB");
    world.check_invariants();
    let live: Vec<(u64, usize)> = world.live.iter().map(|(&a, &s)| (a, s)).collect();
    for (addr, size) in live {
        world.free_live(0, addr, size);
    }
    assert_eq!(world.global.allocate_large(4 * MIN), None);
    for arena in &mut world.arenas {
        assert!(arena.clean(&mut world.global).is_ok());
    }
    assert_eq!(world.global.allocate_large(4 * MIN), Some(1 << 32));
    assert_eq!(world.global.deallocate_large(1 << 32, 4 * MIN), Ok(()));
    world.drain();
}
