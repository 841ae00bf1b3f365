//! An address-ordered map that answers "lowest address that fits `n` bytes" in `O(log n)`.
//!
//! RMM keeps its free blocks and superblocks in `std::set`s ordered by address and finds the first
//! fit with a linear `std::find_if`. To keep address-ordered first fit (same placements as RMM) but
//! make it logarithmic, this module stores the items in a treap (a binary search tree by address
//! whose shape is fixed by pseudo-random priorities, expected depth `O(log n)`) where every node
//! also records the largest "fit" (free size) found in its subtree. The first fit then walks one
//! root-to-leaf path: go left while the left subtree can serve the request, else take the node,
//! else go right.
//!
//! The priorities are a fixed hash of the key, so the shape (and therefore every test) is
//! deterministic.

use std::cmp::Ordering;

/// An item kept in a [`FitTree`]: it has an address (the key, never changed while in the tree)
/// and a "fit", the largest request it can serve.
pub(crate) trait FitItem {
    /// The address the tree is ordered by. Must not change while the item is in a tree.
    fn key(&self) -> u64;
    /// The largest request this item can serve (a free block's size, a superblock's largest free
    /// block).
    fn fit(&self) -> usize;
}

type Link<T> = Option<Box<Node<T>>>;

struct Node<T> {
    key: u64,
    fit: usize,
    max_fit: usize,
    priority: u64,
    item: T,
    left: Link<T>,
    right: Link<T>,
}

impl<T> Node<T> {
    /// Recompute the subtree maximum from the node's own fit and its children.
    fn pull(&mut self) {
        self.max_fit = self.fit.max(max_fit(&self.left)).max(max_fit(&self.right));
    }
}

fn max_fit<T>(link: &Link<T>) -> usize {
    link.as_ref().map_or(0, |node| node.max_fit)
}

/// SplitMix64 finaliser: a bijective mixer, so distinct keys get well-spread priorities.
fn priority_of(key: u64) -> u64 {
    let mut z = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Split into (keys `< key`, keys `>= key`).
fn split<T>(link: Link<T>, key: u64) -> (Link<T>, Link<T>) {
    match link {
        None => (None, None),
        Some(mut node) => {
            if node.key < key {
                let (low, high) = split(node.right.take(), key);
                node.right = low;
                node.pull();
                (Some(node), high)
            } else {
                let (low, high) = split(node.left.take(), key);
                node.left = high;
                node.pull();
                (low, Some(node))
            }
        }
    }
}

/// Join two treaps where every key of `low` is below every key of `high`.
fn merge<T>(low: Link<T>, high: Link<T>) -> Link<T> {
    match (low, high) {
        (None, high) => high,
        (low, None) => low,
        (Some(mut low), Some(mut high)) => {
            if low.priority >= high.priority {
                low.right = merge(low.right.take(), Some(high));
                low.pull();
                Some(low)
            } else {
                high.left = merge(Some(low), high.left.take());
                high.pull();
                Some(high)
            }
        }
    }
}

fn remove<T>(link: &mut Link<T>, key: u64) -> Option<T> {
    let node = link.as_mut()?;
    match key.cmp(&node.key) {
        Ordering::Less => {
            let item = remove(&mut node.left, key)?;
            node.pull();
            Some(item)
        }
        Ordering::Greater => {
            let item = remove(&mut node.right, key)?;
            node.pull();
            Some(item)
        }
        Ordering::Equal => {
            let mut boxed = link.take()?;
            *link = merge(boxed.left.take(), boxed.right.take());
            Some(boxed.item)
        }
    }
}

fn update<T: FitItem, R>(link: &mut Link<T>, key: u64, f: impl FnOnce(&mut T) -> R) -> Option<R> {
    let node = link.as_mut()?;
    let result = match key.cmp(&node.key) {
        Ordering::Less => update(&mut node.left, key, f)?,
        Ordering::Greater => update(&mut node.right, key, f)?,
        Ordering::Equal => {
            let result = f(&mut node.item);
            debug_assert_eq!(node.item.key(), key, "FitTree item key changed in update");
            node.fit = node.item.fit();
            result
        }
    };
    node.pull();
    Some(result)
}

/// Address-ordered treap augmented with the largest fit per subtree.
///
/// | operation | cost |
/// |---|---|
/// | `insert`, `remove`, `update`, `get`, `floor`, `ceiling`, `first_fit` | `O(log n)` expected |
/// | `max_fit`, `len` | `O(1)` |
/// | `iter`, `take_all` | `O(n)` |
pub(crate) struct FitTree<T> {
    root: Link<T>,
    len: usize,
}

impl<T> Default for FitTree<T> {
    fn default() -> Self {
        Self { root: None, len: 0 }
    }
}

impl<T: FitItem> FitTree<T> {
    /// An empty tree.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Number of items.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the tree holds no items.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The largest fit of all items (0 when empty).
    pub(crate) fn max_fit(&self) -> usize {
        max_fit(&self.root)
    }

    /// Insert `item`; gives it back if an item with the same key is already present.
    pub(crate) fn insert(&mut self, item: T) -> Result<(), T> {
        let key = item.key();
        if self.get(key).is_some() {
            return Err(item);
        }
        let fit = item.fit();
        let node = Box::new(Node {
            key,
            fit,
            max_fit: fit,
            priority: priority_of(key),
            item,
            left: None,
            right: None,
        });
        let (low, high) = split(self.root.take(), key);
        self.root = merge(merge(low, Some(node)), high);
        self.len += 1;
        Ok(())
    }

    /// Remove and return the item at `key`.
    pub(crate) fn remove(&mut self, key: u64) -> Option<T> {
        let item = remove(&mut self.root, key)?;
        self.len -= 1;
        Some(item)
    }

    /// Mutate the item at `key` in place (its key must stay the same) and refresh the fits on
    /// the path to it. Returns `None` when no item has that key.
    pub(crate) fn update<R>(&mut self, key: u64, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        update(&mut self.root, key, f)
    }

    /// The item at exactly `key`.
    pub(crate) fn get(&self, key: u64) -> Option<&T> {
        let mut cur = self.root.as_deref();
        while let Some(node) = cur {
            cur = match key.cmp(&node.key) {
                Ordering::Less => node.left.as_deref(),
                Ordering::Greater => node.right.as_deref(),
                Ordering::Equal => return Some(&node.item),
            };
        }
        None
    }

    /// The item with the greatest key `<= key`.
    pub(crate) fn floor(&self, key: u64) -> Option<&T> {
        let mut cur = self.root.as_deref();
        let mut best = None;
        while let Some(node) = cur {
            if node.key <= key {
                best = Some(&node.item);
                cur = node.right.as_deref();
            } else {
                cur = node.left.as_deref();
            }
        }
        best
    }

    /// The item with the smallest key `>= key`.
    pub(crate) fn ceiling(&self, key: u64) -> Option<&T> {
        let mut cur = self.root.as_deref();
        let mut best = None;
        while let Some(node) = cur {
            if node.key >= key {
                best = Some(&node.item);
                cur = node.left.as_deref();
            } else {
                cur = node.right.as_deref();
            }
        }
        best
    }

    /// The item with the greatest key strictly below `key`.
    pub(crate) fn before(&self, key: u64) -> Option<&T> {
        self.floor(key.checked_sub(1)?)
    }

    /// The lowest-keyed item whose fit is at least `size` (address-ordered first fit).
    pub(crate) fn first_fit(&self, size: usize) -> Option<&T> {
        let mut cur = self.root.as_deref();
        while let Some(node) = cur {
            if node.max_fit < size {
                return None;
            }
            if node.left.as_ref().is_some_and(|left| left.max_fit >= size) {
                cur = node.left.as_deref();
            } else if node.fit >= size {
                return Some(&node.item);
            } else {
                cur = node.right.as_deref();
            }
        }
        None
    }

    /// In-order (ascending key) iterator.
    pub(crate) fn iter(&self) -> Iter<'_, T> {
        let mut iter = Iter { stack: Vec::new() };
        iter.push_left(self.root.as_deref());
        iter
    }

    /// Remove every item, returning them in ascending key order.
    pub(crate) fn take_all(&mut self) -> Vec<T> {
        let mut out = Vec::with_capacity(self.len);
        let mut stack: Vec<Box<Node<T>>> = Vec::new();
        let mut cur = self.root.take();
        loop {
            while let Some(mut node) = cur {
                cur = node.left.take();
                stack.push(node);
            }
            let Some(mut node) = stack.pop() else {
                break;
            };
            cur = node.right.take();
            out.push(node.item);
        }
        self.len = 0;
        out
    }
}

/// In-order iterator over a [`FitTree`].
pub(crate) struct Iter<'a, T> {
    stack: Vec<&'a Node<T>>,
}

impl<'a, T> Iter<'a, T> {
    fn push_left(&mut self, mut cur: Option<&'a Node<T>>) {
        while let Some(node) = cur {
            self.stack.push(node);
            cur = node.left.as_deref();
        }
    }
}

impl<'a, T> Iterator for Iter<'a, T> {
    type Item = &'a T;

    fn next(&mut self) -> Option<&'a T> {
        let node = self.stack.pop()?;
        self.push_left(node.right.as_deref());
        Some(&node.item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone, PartialEq)]
    struct Item {
        key: u64,
        fit: usize,
    }

    impl FitItem for Item {
        fn key(&self) -> u64 {
            self.key
        }
        fn fit(&self) -> usize {
            self.fit
        }
    }

    /// Checks BST order, heap order on priorities, cached fits and subtree maxima; returns the
    /// node count.
    fn check_node(link: &Link<Item>, low: Option<u64>, high: Option<u64>) -> usize {
        let Some(node) = link else { return 0 };
        assert!(low.is_none_or(|l| node.key > l), "BST order (low)");
        assert!(high.is_none_or(|h| node.key < h), "BST order (high)");
        assert_eq!(node.fit, node.item.fit);
        for child in [&node.left, &node.right].into_iter().flatten() {
            assert!(child.priority <= node.priority, "heap order");
        }
        let expected_max = node.fit.max(max_fit(&node.left)).max(max_fit(&node.right));
        assert_eq!(node.max_fit, expected_max);
        1 + check_node(&node.left, low, Some(node.key))
            + check_node(&node.right, Some(node.key), high)
    }

    fn depth(link: &Link<Item>) -> usize {
        link.as_ref()
            .map_or(0, |n| 1 + depth(&n.left).max(depth(&n.right)))
    }

    #[test]
    fn first_fit_prefers_lowest_address() {
        let mut tree = FitTree::new();
        for (key, fit) in [(10, 5), (20, 50), (30, 7), (40, 100)] {
            assert!(tree.insert(Item { key, fit }).is_ok());
        }
        assert_eq!(tree.first_fit(6).map(|i| i.key), Some(20));
        assert_eq!(tree.first_fit(51).map(|i| i.key), Some(40));
        assert_eq!(tree.first_fit(5).map(|i| i.key), Some(10));
        assert!(tree.first_fit(101).is_none());
        assert_eq!(tree.max_fit(), 100);
        assert_eq!(tree.update(40, |i| i.fit = 1), Some(()));
        assert_eq!(tree.max_fit(), 50);
        assert!(tree.first_fit(51).is_none());
    }

    #[test]
    fn duplicate_insert_is_refused() {
        let mut tree = FitTree::new();
        assert!(tree.insert(Item { key: 1, fit: 1 }).is_ok());
        assert_eq!(
            tree.insert(Item { key: 1, fit: 9 }),
            Err(Item { key: 1, fit: 9 })
        );
        assert_eq!(tree.len(), 1);
        assert_eq!(tree.get(1).map(|i| i.fit), Some(1));
    }

    #[test]
    fn neighbours_and_extremes() {
        let mut tree = FitTree::new();
        for key in [0, 256, u64::MAX] {
            assert!(tree.insert(Item { key, fit: 1 }).is_ok());
        }
        assert_eq!(tree.floor(255).map(|i| i.key), Some(0));
        assert_eq!(tree.before(256).map(|i| i.key), Some(0));
        assert!(tree.before(0).is_none());
        assert_eq!(tree.ceiling(257).map(|i| i.key), Some(u64::MAX));
        assert_eq!(tree.remove(u64::MAX).map(|i| i.key), Some(u64::MAX));
        assert!(tree.ceiling(257).is_none());
        let all: Vec<u64> = tree.take_all().into_iter().map(|i| i.key).collect();
        assert_eq!(all, vec![0, 256]);
        assert!(tree.is_empty());
    }

    #[test]
    fn sequential_keys_stay_shallow() {
        let mut tree = FitTree::new();
        for key in 0..10_000u64 {
            assert!(tree
                .insert(Item {
                    key: key * 256,
                    fit: 1
                })
                .is_ok());
        }
        // A plain BST would have depth 10 000 here; the treap stays logarithmic.
        assert!(depth(&tree.root) < 64, "depth {}", depth(&tree.root));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, usize),
        Remove(u64),
        Update(u64, usize),
        FirstFit(usize),
        Floor(u64),
        Ceiling(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        let key = 0u64..64;
        prop_oneof![
            (key.clone(), 0usize..100).prop_map(|(k, f)| Op::Insert(k, f)),
            key.clone().prop_map(Op::Remove),
            (key.clone(), 0usize..100).prop_map(|(k, f)| Op::Update(k, f)),
            (0usize..110).prop_map(Op::FirstFit),
            key.clone().prop_map(Op::Floor),
            key.prop_map(Op::Ceiling),
        ]
    }

    proptest! {
        #[test]
        fn matches_btreemap_model(ops in proptest::collection::vec(op(), 0..200)) {
            let mut tree = FitTree::new();
            let mut model: BTreeMap<u64, usize> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Insert(key, fit) => {
                        let inserted = tree.insert(Item { key, fit }).is_ok();
                        prop_assert_eq!(inserted, !model.contains_key(&key));
                        model.entry(key).or_insert(fit);
                    }
                    Op::Remove(key) => {
                        prop_assert_eq!(tree.remove(key).map(|i| i.fit), model.remove(&key));
                    }
                    Op::Update(key, fit) => {
                        let done = tree.update(key, |i| i.fit = fit).is_some();
                        prop_assert_eq!(done, model.contains_key(&key));
                        if let Some(f) = model.get_mut(&key) { *f = fit; }
                    }
                    Op::FirstFit(size) => {
                        let expected = model.iter().find(|(_, f)| **f >= size).map(|(k, _)| *k);
                        prop_assert_eq!(tree.first_fit(size).map(|i| i.key), expected);
                    }
                    Op::Floor(key) => {
                        let expected = model.range(..=key).next_back().map(|(k, _)| *k);
                        prop_assert_eq!(tree.floor(key).map(|i| i.key), expected);
                    }
                    Op::Ceiling(key) => {
                        let expected = model.range(key..).next().map(|(k, _)| *k);
                        prop_assert_eq!(tree.ceiling(key).map(|i| i.key), expected);
                    }
                }
                prop_assert_eq!(check_node(&tree.root, None, None), model.len());
                prop_assert_eq!(tree.len(), model.len());
                prop_assert_eq!(tree.max_fit(), model.values().copied().max().unwrap_or(0));
                let keys: Vec<u64> = tree.iter().map(|i| i.key).collect();
                let model_keys: Vec<u64> = model.keys().copied().collect();
                prop_assert_eq!(keys, model_keys);
            }
        }
    }
}
