//! The best-fit index of the pool's free list ([`CoalescingFreeList`]): its free blocks by
//! `(size, address)`, split into size classes (64 per power of two; exact below 64 bytes) with
//! a two-level bitmap of the classes that hold a block. Best fit is one look into the
//! request's own class and, when that has nothing large enough, a bit search for the next
//! class that holds a block, whose smallest block is the answer. A class usually holds one to
//! three blocks, kept inline and sorted, so the common operations touch no tree and allocate
//! nothing; a class with more keeps up to 64 in a vector sorted by `(size, address)`
//! descending (the best fit usually its last entry) and beyond that a `BTreeMap`, so ties still
//! go to the lowest address and a class of many equal blocks stays O(log n). Why:
//! `docs/internals/pool.md`, "The free list".
//!
//! Pure bookkeeping: no CUDA calls.
//!
//! [`CoalescingFreeList`]: crate::testing::coalescing_model::CoalescingFreeList

use std::collections::BTreeMap;

/// The free list's handle of a block (an index into its slab of blocks).
pub(crate) type NodeId = u32;

/// Size classes per power of two (`1 << SUB_BITS`).
const SUB_BITS: u32 = 6;

/// Number of 64-bit words of the class bitmap: enough for the class of `usize::MAX`.
const GROUPS: usize = 64;

// `move_entry` masks group indices with `GROUPS - 1`.
const _: () = assert!(GROUPS.is_power_of_two());

/// The class of a block or request of `size` bytes: sizes below 64 have a class each; above,
/// every power of two is cut into 64 classes of equal width. Larger sizes never have smaller
/// classes.
#[inline]
pub(crate) fn class_of(size: usize) -> usize {
    let s = size as u64;
    if s < (1 << SUB_BITS) {
        return s as usize;
    }
    let e = 63 - s.leading_zeros();
    let sub = (s >> (e - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    ((e + 1 - SUB_BITS) as usize) * (1 << SUB_BITS) + sub as usize
}

/// Blocks a class keeps inline, sorted, before it needs a vector.
const FEW: usize = 3;

/// Blocks a class keeps in a sorted vector before it needs a map (insertion and removal move
/// at most this many entries: a short `memmove`, cheaper than a tree's rebalancing).
const SORTED: usize = 64;

/// A class with a map goes back to a sorted vector at this many blocks (below [`SORTED`], so
/// that a class at the boundary does not convert at every operation).
const SORTED_AGAIN: usize = SORTED / 2;

/// One block of a class: `(size, address, node)`.
type Entry = (usize, u64, NodeId);

/// The blocks of one class.
#[derive(Debug, Clone)]
enum Class {
    /// Up to [`FEW`] blocks, sorted by `(size, address)` (the first `len`).
    Few { len: u8, blocks: [Entry; FEW] },
    /// More, up to [`SORTED`]: sorted by `(size, address)` *descending*, so that the best fit
    /// of a request below every block (the usual case) is the last entry, taken by a pop. It
    /// stays until the class is down to 2 blocks (so that a class at the boundary does not
    /// convert at every operation).
    Sorted(Vec<Entry>),
    /// More than [`SORTED`]: a map, until the class is down to [`SORTED_AGAIN`] blocks.
    Many(BTreeMap<(usize, u64), NodeId>),
}

impl Default for Class {
    fn default() -> Self {
        Class::Few {
            len: 0,
            blocks: [(0, 0, 0); FEW],
        }
    }
}

impl Class {
    /// The smallest block of the class with at least `request` bytes (ties: lowest address).
    #[inline(always)]
    fn fit(&self, request: usize) -> Option<Entry> {
        match self {
            Class::Few { len, blocks } => blocks[..usize::from(*len)]
                .iter()
                .find(|b| b.0 >= request)
                .copied(),
            _ => self.fit_crowded(request),
        }
    }

    /// [`fit`](Self::fit) in a sorted vector or a map.
    #[inline(never)]
    fn fit_crowded(&self, request: usize) -> Option<Entry> {
        match self {
            Class::Few { .. } => None,
            Class::Sorted(v) => {
                let last = *v.last()?;
                if last.0 >= request {
                    return Some(last);
                }
                // The entries with at least `request` bytes are a prefix; the last of it.
                let k = v.partition_point(|e| e.0 >= request);
                k.checked_sub(1).map(|i| v[i])
            }
            Class::Many(m) => m
                .range((request, 0)..)
                .next()
                .map(|(&(s, a), &n)| (s, a, n)),
        }
    }

    /// The largest block (ties: highest address).
    fn last(&self) -> Option<Entry> {
        match self {
            Class::Few { len, blocks } => blocks[..usize::from(*len)].last().copied(),
            Class::Sorted(v) => v.first().copied(),
            Class::Many(m) => m.last_key_value().map(|(&(s, a), &n)| (s, a, n)),
        }
    }

    fn is_empty(&self) -> bool {
        matches!(self, Class::Few { len: 0, .. })
    }

    /// Adds a block (not in the class).
    #[inline]
    fn insert(&mut self, entry: Entry) {
        match self {
            Class::Few { len, blocks } => {
                let n = usize::from(*len);
                if n < FEW {
                    // Insertion into a sorted array of at most three: element moves, no call.
                    let mut at = n;
                    while at > 0 && (blocks[at - 1].0, blocks[at - 1].1) > (entry.0, entry.1) {
                        blocks[at] = blocks[at - 1];
                        at -= 1;
                    }
                    blocks[at] = entry;
                    *len += 1;
                } else {
                    let mut v = Vec::with_capacity(2 * FEW);
                    v.extend(blocks.iter().rev().copied());
                    *self = Class::Sorted(v);
                    self.insert(entry);
                }
            }
            Class::Sorted(v) => {
                if v.len() < SORTED {
                    let at = v.partition_point(|e| (e.0, e.1) > (entry.0, entry.1));
                    v.insert(at, entry);
                } else {
                    let mut m: BTreeMap<(usize, u64), NodeId> =
                        v.iter().map(|&(s, a, n)| ((s, a), n)).collect();
                    m.insert((entry.0, entry.1), entry.2);
                    *self = Class::Many(m);
                }
            }
            Class::Many(m) => {
                m.insert((entry.0, entry.1), entry.2);
            }
        }
    }

    /// Removes the block `(size, addr)` and returns its node, if the class holds it.
    #[inline]
    fn remove(&mut self, size: usize, addr: u64) -> Option<NodeId> {
        match self {
            Class::Few { len, blocks } => {
                let n = usize::from(*len);
                let at = blocks[..n]
                    .iter()
                    .position(|b| (b.0, b.1) == (size, addr))?;
                let node = blocks[at].2;
                for i in at..n - 1 {
                    blocks[i] = blocks[i + 1];
                }
                *len -= 1;
                Some(node)
            }
            Class::Sorted(v) => {
                let at = match v.last() {
                    Some(&(s, a, _)) if (s, a) == (size, addr) => v.len() - 1,
                    _ => {
                        let at = v.partition_point(|e| (e.0, e.1) > (size, addr));
                        if v.get(at).is_none_or(|e| (e.0, e.1) != (size, addr)) {
                            return None;
                        }
                        at
                    }
                };
                let node = v.remove(at).2;
                if v.len() <= 2 {
                    let mut few = [(0, 0, 0); FEW];
                    for (slot, &e) in few.iter_mut().zip(v.iter().rev()) {
                        *slot = e;
                    }
                    *self = Class::Few {
                        len: v.len() as u8,
                        blocks: few,
                    };
                }
                Some(node)
            }
            Class::Many(m) => {
                let node = m.remove(&(size, addr))?;
                if m.len() <= SORTED_AGAIN {
                    let v = m.iter().rev().map(|(&(s, a), &n)| (s, a, n)).collect();
                    *self = Class::Sorted(v);
                }
                Some(node)
            }
        }
    }

    /// Replaces the block `old` by `new` when the class holds one block only (then `true`).
    #[inline(always)]
    fn replace_single(&mut self, old: (usize, u64), new: Entry) -> bool {
        match self {
            Class::Few { len: 1, blocks } if (blocks[0].0, blocks[0].1) == old => {
                blocks[0] = new;
                true
            }
            _ => false,
        }
    }
}

/// Free blocks by `(size, address)` in size classes (see the [module documentation](self)).
#[derive(Debug, Clone)]
pub(crate) struct SizeIndex {
    /// By class number; grown on demand (the largest block seen so far sets the length).
    classes: Vec<Class>,
    /// Bit `c % 64` of word `c / 64`: class `c` holds a block.
    groups: [u64; GROUPS],
    /// Bit `g`: word `g` of `groups` is not 0.
    summary: u64,
}

impl Default for SizeIndex {
    fn default() -> Self {
        Self {
            classes: Vec::new(),
            groups: [0; GROUPS],
            summary: 0,
        }
    }
}

impl SizeIndex {
    /// Adds block `node` of `size` bytes at `addr` (not already in the index).
    #[inline]
    pub(crate) fn insert(&mut self, size: usize, addr: u64, node: NodeId) {
        self.insert_in(class_of(size), size, addr, node);
    }

    /// [`insert`](Self::insert) into class `c`, the class of `size`.
    #[inline]
    fn insert_in(&mut self, c: usize, size: usize, addr: u64, node: NodeId) {
        if c >= self.classes.len() {
            self.classes.resize_with(c + 1, Class::default);
        }
        let class = &mut self.classes[c];
        if class.is_empty() {
            self.groups[c / 64] |= 1 << (c % 64);
            self.summary |= 1 << (c / 64);
        }
        class.insert((size, addr, node));
    }

    /// Removes the block of `size` bytes at `addr` and returns its node, if the index holds it.
    #[inline(always)]
    pub(crate) fn remove(&mut self, size: usize, addr: u64) -> Option<NodeId> {
        self.remove_in(class_of(size), size, addr)
    }

    /// [`remove`](Self::remove) from class `c`, the class of `size`.
    #[inline(always)]
    fn remove_in(&mut self, c: usize, size: usize, addr: u64) -> Option<NodeId> {
        let class = self.classes.get_mut(c)?;
        let node = class.remove(size, addr)?;
        if class.is_empty() {
            self.groups[c / 64] &= !(1 << (c % 64));
            if self.groups[c / 64] == 0 {
                self.summary &= !(1 << (c / 64));
            }
        }
        Some(node)
    }

    /// Replaces block `node`'s entry `old` (`(size, address)`, in the index) by `new`: in place
    /// when both fall in the same class and that class holds only this block (a block split
    /// or grown by a little, the common case).
    #[inline(always)]
    pub(crate) fn replace(&mut self, old: (usize, u64), new: (usize, u64), node: NodeId) {
        self.replace_from(class_of(old.0), old, new, node);
    }

    /// [`replace`](Self::replace) of an entry `old` of class `c` (its class, as
    /// [`best_fit_in_class`](Self::best_fit_in_class) returned it).
    #[inline(always)]
    pub(crate) fn replace_from(
        &mut self,
        c: usize,
        old: (usize, u64),
        new: (usize, u64),
        node: NodeId,
    ) {
        debug_assert_eq!(c, class_of(old.0));
        let d = class_of(new.0);
        if c == d
            && self
                .classes
                .get_mut(c)
                .is_some_and(|class| class.replace_single(old, (new.0, new.1, node)))
        {
            return;
        }
        self.move_entry(c, d, old, new, node);
    }

    /// [`replace`](Self::replace) past its in-place case: from class `c` to class `d`.
    ///
    /// The usual case, a large block split or grown back, alone in its class and moving to an
    /// empty class, changes two lengths, one entry and two bits in place (writing a whole
    /// `Class` would write its three entries and drop the old value, and both classes are
    /// random slots of a table of a thousand or more: the stores and their cache lines are
    /// what this path cost, `docs/internals/pool.md`, "The free list"). That case is inlined
    /// into the caller; the general one is [`move_entry_slow`](Self::move_entry_slow).
    #[inline(always)]
    fn move_entry(
        &mut self,
        c: usize,
        d: usize,
        old: (usize, u64),
        new: (usize, u64),
        node: NodeId,
    ) {
        let alone = c != d
            && matches!(self.classes.get(d), Some(Class::Few { len: 0, .. }))
            && matches!(
                self.classes.get(c),
                Some(Class::Few { len: 1, blocks }) if (blocks[0].0, blocks[0].1) == old
            );
        if alone {
            if let Some(Class::Few { len, .. }) = self.classes.get_mut(c) {
                *len = 0;
            }
            if let Some(Class::Few { len, blocks }) = self.classes.get_mut(d) {
                blocks[0] = (new.0, new.1, node);
                *len = 1;
            }
            // Classes are below 64 * GROUPS (`class_of(usize::MAX) / 64 < GROUPS`): the masks
            // only spare the bounds checks.
            let (gc, gd) = ((c / 64) & (GROUPS - 1), (d / 64) & (GROUPS - 1));
            self.groups[gc] &= !(1 << (c % 64));
            if self.groups[gc] == 0 {
                self.summary &= !(1 << gc);
            }
            self.groups[gd] |= 1 << (d % 64);
            self.summary |= 1 << gd;
            return;
        }
        self.move_entry_slow(c, d, old, new, node);
    }

    /// [`move_entry`](Self::move_entry) past its usual case: a removal and an insertion.
    #[inline(never)]
    fn move_entry_slow(
        &mut self,
        c: usize,
        d: usize,
        old: (usize, u64),
        new: (usize, u64),
        node: NodeId,
    ) {
        self.remove_in(c, old.0, old.1);
        self.insert_in(d, new.0, new.1, node);
    }

    /// The smallest block with at least `request` bytes, ties to the lowest address, left in
    /// the index, with its class: `(class, (size, address, node))`.
    #[inline(always)]
    pub(crate) fn best_fit_in_class(&self, request: usize) -> Option<(usize, Entry)> {
        let c = class_of(request);
        if let Some(found) = self.classes.get(c).and_then(|class| class.fit(request)) {
            return Some((c, found));
        }
        // Every block of a higher class is larger than the request: the next class's smallest.
        let next = self.next_class(c + 1)?;
        self.classes[next].fit(0).map(|found| (next, found))
    }

    /// A largest block (the one with the highest address among equals).
    pub(crate) fn largest(&self) -> Option<(usize, u64, NodeId)> {
        if self.summary == 0 {
            return None;
        }
        let g = 63 - self.summary.leading_zeros() as usize;
        let c = g * 64 + 63 - self.groups[g].leading_zeros() as usize;
        self.classes[c].last()
    }

    /// The first class from `from` on that holds a block.
    #[inline(always)]
    fn next_class(&self, from: usize) -> Option<usize> {
        let g = from / 64;
        if g >= GROUPS {
            return None;
        }
        let here = self.groups[g] & (u64::MAX << (from % 64));
        if here != 0 {
            return Some(g * 64 + here.trailing_zeros() as usize);
        }
        // The groups after `g` (two shifts: `g + 1` may be 64).
        let later = self.summary >> g >> 1;
        if later == 0 {
            return None;
        }
        let g = g + 1 + later.trailing_zeros() as usize;
        Some(g * 64 + self.groups[g].trailing_zeros() as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// What the tests read of the structure.
    impl Class {
        fn entries(&self) -> Vec<Entry> {
            match self {
                Class::Few { len, blocks } => blocks[..usize::from(*len)].to_vec(),
                Class::Sorted(v) => v.iter().rev().copied().collect(),
                Class::Many(m) => m.iter().map(|(&(s, a), &n)| (s, a, n)).collect(),
            }
        }
    }

    /// What the tests read of the structure.
    impl SizeIndex {
        /// The smallest block with at least `request` bytes, ties to the lowest address, left
        /// in the index: `(size, address, node)`.
        fn best_fit(&self, request: usize) -> Option<(usize, u64, NodeId)> {
            self.best_fit_in_class(request).map(|(_, found)| found)
        }

        /// Every block, `(size, address, node)`, by class (tests), after checking the classes
        /// and the bitmap.
        pub(crate) fn entries(&self) -> Vec<(usize, u64, NodeId)> {
            let mut out = Vec::new();
            for (c, class) in self.classes.iter().enumerate() {
                let bit = self.groups[c / 64] >> (c % 64) & 1 == 1;
                assert_eq!(bit, !class.is_empty(), "class {c} marked wrongly");
                let entries = class.entries();
                match class {
                    Class::Sorted(v) => {
                        assert!(
                            v.len() > 2 && v.len() <= SORTED,
                            "class {c}: {} sorted",
                            v.len()
                        );
                    }
                    Class::Many(m) => {
                        assert!(m.len() > SORTED_AGAIN, "class {c}: {} in a map", m.len());
                    }
                    Class::Few { .. } => {}
                }
                assert!(entries
                    .windows(2)
                    .all(|w| (w[0].0, w[0].1) < (w[1].0, w[1].1)));
                for &(s, a, n) in &entries {
                    assert_eq!(class_of(s), c, "block of {s} bytes in class {c}");
                    out.push((s, a, n));
                }
            }
            for (g, &word) in self.groups.iter().enumerate() {
                assert_eq!(self.summary >> g & 1 == 1, word != 0, "summary bit {g}");
                if g * 64 >= self.classes.len() {
                    assert_eq!(word, 0, "classes marked past the end");
                }
            }
            out
        }
    }

    #[test]
    fn classes_are_monotonic_and_fine() {
        let mut sizes: Vec<usize> = (1..5000).collect();
        for e in 12..64 {
            let b = 1usize << e;
            sizes.extend([b - 1, b, b + 1, b + (b >> 6), b + (b >> 1)]);
        }
        sizes.push(usize::MAX);
        sizes.sort_unstable();
        for w in sizes.windows(2) {
            assert!(class_of(w[0]) <= class_of(w[1]), "{} > {}", w[0], w[1]);
        }
        assert!(class_of(usize::MAX) < GROUPS * 64);
        // Exact below 64, 64 classes per power of two above.
        assert_eq!(class_of(63), 63);
        assert_eq!(class_of(64), 64);
        assert_eq!(class_of(127), 127);
        assert_eq!(class_of(128), 128);
        assert_eq!(class_of(129), 128);
        assert_eq!(class_of(130), 129);
        // 256-byte multiples below 16 KiB all differ.
        let mut seen = BTreeSet::new();
        for units in 1..64 {
            assert!(seen.insert(class_of(units * 256)));
        }
    }

    #[test]
    fn best_fit_ties_and_classes() {
        let mut x = SizeIndex::default();
        x.insert(512, 4096, 1);
        x.insert(512, 1024, 2);
        x.insert(1 << 30, 0, 3);
        x.insert(768, 8192, 4);
        assert_eq!(x.best_fit(1), Some((512, 1024, 2)));
        assert_eq!(x.best_fit(513), Some((768, 8192, 4)));
        assert_eq!(x.best_fit(769), Some((1 << 30, 0, 3)));
        assert_eq!(x.best_fit((1 << 30) + 1), None);
        assert_eq!(x.largest(), Some((1 << 30, 0, 3)));
        x.replace((768, 8192), (769, 8192), 4);
        assert_eq!(x.best_fit(513), Some((769, 8192, 4)));
        x.replace((769, 8192), (1 << 20, 8192), 4);
        assert_eq!(x.best_fit(513), Some((1 << 20, 8192, 4)));
        x.replace((1 << 20, 8192), (768, 8192), 4);
        assert_eq!(x.remove(512, 1024), Some(2));
        assert_eq!(x.remove(512, 1024), None);
        assert_eq!(x.remove(513, 4096), None);
        assert_eq!(x.best_fit(1), Some((512, 4096, 1)));
        assert_eq!(x.entries().len(), 3);
        x = SizeIndex::default();
        assert_eq!(
            (x.best_fit(1), x.largest(), x.entries()),
            (None, None, vec![])
        );
    }

    #[test]
    fn a_crowded_class_goes_through_every_form_and_back() {
        let mut x = SizeIndex::default();
        let c = class_of(1 << 20);
        let form = |x: &SizeIndex| match &x.classes[c] {
            Class::Few { .. } => "few",
            Class::Sorted(_) => "sorted",
            Class::Many(_) => "many",
        };
        // Two sizes of one class, addresses interleaved: ties go to the lowest address.
        let n = 2 * SORTED as u64;
        for i in (0..n).rev() {
            let size = (1 << 20) + if i % 2 == 0 { 4096 } else { 0 };
            x.insert(size, i * 256, i as NodeId);
            // The smallest blocks are the odd ones; the lowest inserted so far wins.
            let j = i | 1;
            assert_eq!(x.best_fit(1 << 20), Some((1 << 20, j * 256, j as NodeId)));
        }
        assert_eq!(form(&x), "many");
        assert_eq!(x.best_fit(1 << 20), Some((1 << 20, 256, 1)));
        assert_eq!(x.best_fit((1 << 20) + 1), Some(((1 << 20) + 4096, 0, 0)));
        assert_eq!(
            x.largest(),
            Some(((1 << 20) + 4096, (n - 2) * 256, (n - 2) as NodeId))
        );
        let mut seen = vec![form(&x)];
        for i in 0..n {
            let size = (1 << 20) + if i % 2 == 0 { 4096 } else { 0 };
            assert_eq!(x.remove(size, i * 256), Some(i as NodeId));
            assert_eq!(x.remove(size, i * 256), None);
            if seen.last() != Some(&form(&x)) {
                seen.push(form(&x));
            }
            x.entries();
            if i + 2 < n {
                // A larger block (an even one) is left.
                let best = x.best_fit((1 << 20) + 1).unwrap();
                assert_eq!(best.0, (1 << 20) + 4096);
            }
        }
        assert_eq!(seen, ["many", "sorted", "few"]);
        assert_eq!(x.best_fit(1), None);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(usize, u64),
        Remove(usize),
        Replace(usize, usize),
        Fit(usize),
    }

    fn size() -> impl Strategy<Value = usize> {
        prop_oneof![
            1..300usize,
            (1..64usize).prop_map(|u| u * 256),
            (0..63u32, any::<u64>()).prop_map(|(e, r)| (1usize << e) + (r as usize % (1 << e))),
            Just(usize::MAX),
        ]
    }

    proptest! {
        /// Against a `BTreeSet` of `(size, address)`: the same best fit, largest and contents.
        #[test]
        fn matches_an_ordered_set(ops in proptest::collection::vec(
            prop_oneof![
                3 => (size(), 0..64u64).prop_map(|(s, a)| Op::Insert(s, a * 256)),
                // Crowded classes: past the sorted vector into a map and back.
                3 => (prop_oneof![Just(512usize), Just(1 << 20), Just((1 << 20) + 4096)], 0..256u64)
                    .prop_map(|(s, a)| Op::Insert(s, a * 256)),
                2 => any::<usize>().prop_map(Op::Remove),
                2 => (any::<usize>(), size()).prop_map(|(i, s)| Op::Replace(i, s)),
                2 => size().prop_map(Op::Fit),
            ],
            1..400,
        )) {
            let mut x = SizeIndex::default();
            let mut model: BTreeSet<(usize, u64)> = BTreeSet::new();
            let mut next_node = 0;
            for op in ops {
                match op {
                    Op::Insert(s, a) => {
                        if model.insert((s, a)) {
                            x.insert(s, a, next_node);
                            next_node += 1;
                        }
                    }
                    Op::Remove(i) => {
                        if let Some(&(s, a)) = model.iter().nth(i % model.len().max(1)) {
                            model.remove(&(s, a));
                            prop_assert!(x.remove(s, a).is_some());
                        }
                    }
                    Op::Replace(i, new) => {
                        if let Some(&(s, a)) = model.iter().nth(i % model.len().max(1)) {
                            if !model.contains(&(new, a)) {
                                let node = x.best_fit(s).filter(|&(fs, fa, _)| (fs, fa) == (s, a));
                                let node = node.map_or(u32::MAX, |(_, _, n)| n);
                                model.remove(&(s, a));
                                model.insert((new, a));
                                x.replace((s, a), (new, a), node);
                            }
                        }
                    }
                    Op::Fit(r) => {
                        let expected = model.range((r, 0)..).next().copied();
                        prop_assert_eq!(x.best_fit(r).map(|(s, a, _)| (s, a)), expected);
                    }
                }
                prop_assert_eq!(x.largest().map(|(s, a, _)| (s, a)), model.last().copied());
                let mut got: Vec<(usize, u64)> =
                    x.entries().into_iter().map(|(s, a, _)| (s, a)).collect();
                got.sort_unstable();
                prop_assert_eq!(got, model.iter().copied().collect::<Vec<_>>());
            }
        }
    }
}
