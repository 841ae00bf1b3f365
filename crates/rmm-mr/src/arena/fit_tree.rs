//! An address-ordered map that answers "lowest address that fits `n` bytes" in `O(log n)`: a
//! treap by address (deterministic priorities) whose nodes also record the largest fit of their
//! subtree, kept in a slab with parent links and item handles. It gives RMM's address-ordered
//! first fit (same placements) without RMM's linear scans. Design: `docs/internals/arena.md`.

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

/// Index of a node in the slab.
type Idx = u32;
/// No node.
const NIL: Idx = Idx::MAX;

/// Where an item sits in its [`FitTree`]. It stays valid while its item is in the tree (other
/// insertions, removals and updates do not move items); once the item is removed the handle is
/// stale and may later name another item or none, never anything unsafe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handle(Idx);

struct Node {
    key: u64,
    fit: usize,
    /// Largest `fit` in the subtree rooted here.
    max_fit: usize,
    priority: u32,
    left: Idx,
    right: Idx,
    parent: Idx,
}

/// SplitMix64 finaliser (a bijective mixer), high half: well-spread priorities.
fn priority_of(key: u64) -> u32 {
    let mut z = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 32) as u32
}

/// Address-ordered treap augmented with the largest fit per subtree.
///
/// | operation | cost |
/// |---|---|
/// | `insert`, `remove`, `get`, `floor`, `ceiling`, `first_fit`, `last_fit_at_or_before` | `O(log n)` expected |
/// | `update` (by key) | `O(log n)` |
/// | `update_at`, `prev`, `next`, `insert_after`, `remove_at` (by handle) | `O(1)` expected, plus the walk up while maxima change (`O(log n)`) |
/// | `max_fit`, `len` | `O(1)` |
/// | `iter`, `take_all` | `O(n)` |
pub(crate) struct FitTree<T> {
    nodes: Vec<Node>,
    /// The item of each node; `None` for a vacant slot, whose `left` then links the next
    /// vacant slot.
    items: Vec<Option<T>>,
    root: Idx,
    /// First vacant slot of `nodes` (`NIL`: none).
    vacant: Idx,
    len: u32,
    /// How many items have a non-zero fit.
    fitting: u32,
}

impl<T> Default for FitTree<T> {
    fn default() -> Self {
        Self {
            nodes: Vec::new(),
            items: Vec::new(),
            root: NIL,
            vacant: NIL,
            len: 0,
            fitting: 0,
        }
    }
}

impl<T> FitTree<T> {
    fn at(&self, i: Idx) -> &Node {
        &self.nodes[i as usize]
    }

    fn at_mut(&mut self, i: Idx) -> &mut Node {
        &mut self.nodes[i as usize]
    }

    fn max_of(&self, i: Idx) -> usize {
        if i == NIL {
            0
        } else {
            self.at(i).max_fit
        }
    }

    /// The subtree maximum of `i` from its own fit and its children's maxima.
    fn recompute(&self, i: Idx) -> usize {
        let node = self.at(i);
        node.fit
            .max(self.max_of(node.left))
            .max(self.max_of(node.right))
    }

    fn pull(&mut self, i: Idx) {
        let max = self.recompute(i);
        self.at_mut(i).max_fit = max;
    }

    /// The maxima from `i` up after a fit in `i`'s subtree rose to `fit` (nothing else
    /// changed): each ancestor below `fit` takes it, up to the first at or above it. One
    /// comparison per level, no look at the siblings.
    fn raise(&mut self, mut i: Idx, fit: usize) {
        while i != NIL {
            let node = &mut self.nodes[i as usize];
            if node.max_fit >= fit {
                return;
            }
            node.max_fit = fit;
            i = node.parent;
        }
    }

    /// The maxima from `i` up after a fit `old` in `i`'s subtree fell or left (nothing else
    /// changed): only a subtree whose maximum was exactly `old` can change, and once one still
    /// has `old` (another item has that fit) or had more, none above changes either.
    fn lower(&mut self, mut i: Idx, old: usize) {
        if i == NIL || self.at(i).max_fit != old {
            return;
        }
        let mut max = self.recompute(i);
        loop {
            let node = self.at_mut(i);
            node.max_fit = max;
            let parent = node.parent;
            if max == old || parent == NIL {
                return;
            }
            let up = self.at(parent);
            if up.max_fit != old {
                return;
            }
            // Only the subtree of `i` changed: the sibling's maximum still holds.
            let sibling = if up.left == i { up.right } else { up.left };
            max = up.fit.max(max).max(self.max_of(sibling));
            i = parent;
        }
    }

    /// The maxima from `i` up after `i`'s own fit changed from `old` to `new`.
    fn refit(&mut self, i: Idx, old: usize, new: usize) {
        match new.cmp(&old) {
            Ordering::Greater => self.raise(i, new),
            Ordering::Less => self.lower(i, old),
            Ordering::Equal => {}
        }
    }

    /// Make `new` the child of `parent` that `old` was (or the root).
    fn replace_child(&mut self, parent: Idx, old: Idx, new: Idx) {
        if parent == NIL {
            self.root = new;
        } else if self.at(parent).left == old {
            self.at_mut(parent).left = new;
        } else {
            self.at_mut(parent).right = new;
        }
        if new != NIL {
            self.at_mut(new).parent = parent;
        }
    }

    /// Rotate `x` above its parent; the maxima of both are recomputed.
    fn rotate_up(&mut self, x: Idx) {
        let p = self.at(x).parent;
        let g = self.at(p).parent;
        if self.at(p).left == x {
            let moved = self.at(x).right;
            self.at_mut(p).left = moved;
            if moved != NIL {
                self.at_mut(moved).parent = p;
            }
            self.at_mut(x).right = p;
        } else {
            let moved = self.at(x).left;
            self.at_mut(p).right = moved;
            if moved != NIL {
                self.at_mut(moved).parent = p;
            }
            self.at_mut(x).left = p;
        }
        self.at_mut(p).parent = x;
        self.replace_child(g, p, x);
        self.pull(p);
        self.pull(x);
    }

    /// The node with exactly `key`, or `NIL`.
    fn find(&self, key: u64) -> Idx {
        let mut cur = self.root;
        while cur != NIL {
            let node = self.at(cur);
            cur = match key.cmp(&node.key) {
                Ordering::Less => node.left,
                Ordering::Greater => node.right,
                Ordering::Equal => return cur,
            };
        }
        NIL
    }

    fn item(&self, i: Idx) -> Option<&T> {
        self.items.get(i as usize)?.as_ref()
    }

    fn leftmost(&self, mut i: Idx) -> Idx {
        while i != NIL && self.at(i).left != NIL {
            i = self.at(i).left;
        }
        i
    }

    fn rightmost(&self, mut i: Idx) -> Idx {
        while i != NIL && self.at(i).right != NIL {
            i = self.at(i).right;
        }
        i
    }

    /// In-order successor of `i`.
    fn successor(&self, i: Idx) -> Idx {
        let right = self.at(i).right;
        if right != NIL {
            return self.leftmost(right);
        }
        let (mut child, mut parent) = (i, self.at(i).parent);
        while parent != NIL && self.at(parent).right == child {
            child = parent;
            parent = self.at(parent).parent;
        }
        parent
    }

    /// In-order predecessor of `i`.
    fn predecessor(&self, i: Idx) -> Idx {
        let left = self.at(i).left;
        if left != NIL {
            return self.rightmost(left);
        }
        let (mut child, mut parent) = (i, self.at(i).parent);
        while parent != NIL && self.at(parent).left == child {
            child = parent;
            parent = self.at(parent).parent;
        }
        parent
    }

    /// Whether `h` names an item of this tree.
    fn live(&self, h: Handle) -> bool {
        self.items.get(h.0 as usize).is_some_and(Option::is_some)
    }

    /// The lowest-keyed node of subtree `t` whose fit is at least `size`.
    fn first_fit_in(&self, mut t: Idx, size: usize) -> Idx {
        while t != NIL {
            let node = self.at(t);
            if node.max_fit < size {
                return NIL;
            }
            if node.left != NIL && self.at(node.left).max_fit >= size {
                t = node.left;
            } else if node.fit >= size {
                return t;
            } else {
                t = node.right;
            }
        }
        NIL
    }

    /// The highest-keyed node of subtree `t` whose fit is at least `size`.
    fn last_fit_in(&self, mut t: Idx, size: usize) -> Idx {
        while t != NIL {
            let node = self.at(t);
            if node.max_fit < size {
                return NIL;
            }
            if node.right != NIL && self.at(node.right).max_fit >= size {
                t = node.right;
            } else if node.fit >= size {
                return t;
            } else {
                t = node.left;
            }
        }
        NIL
    }

    fn last_fit_upto_in(&self, t: Idx, hi: u64, size: usize) -> Idx {
        if t == NIL || self.at(t).max_fit < size {
            return NIL;
        }
        let node = self.at(t);
        if node.key > hi {
            return self.last_fit_upto_in(node.left, hi, size);
        }
        let found = self.last_fit_upto_in(node.right, hi, size);
        if found != NIL {
            return found;
        }
        if node.fit >= size {
            return t;
        }
        self.last_fit_in(node.left, size)
    }

    fn handle(i: Idx) -> Option<Handle> {
        (i != NIL).then_some(Handle(i))
    }
}

impl<T: FitItem> FitTree<T> {
    /// An empty tree.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Number of items.
    pub(crate) fn len(&self) -> usize {
        self.len as usize
    }

    /// Number of nodes the slab can hold without growing.
    pub(crate) fn capacity(&self) -> usize {
        self.nodes.capacity()
    }

    /// Number of items whose fit is not zero (`O(1)`).
    pub(crate) fn fitting_len(&self) -> usize {
        self.fitting as usize
    }

    /// Whether the tree holds no items.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The largest fit of all items (0 when empty).
    pub(crate) fn max_fit(&self) -> usize {
        self.max_of(self.root)
    }

    /// Insert `item`; gives it back if an item with the same key is already present (or, in
    /// theory, when the tree already holds `u32::MAX - 1` items).
    pub(crate) fn insert(&mut self, item: T) -> Result<(), T> {
        let key = item.key();
        let (mut parent, mut cur, mut go_left) = (NIL, self.root, false);
        while cur != NIL {
            parent = cur;
            let node = self.at(cur);
            (cur, go_left) = match key.cmp(&node.key) {
                Ordering::Less => (node.left, true),
                Ordering::Greater => (node.right, false),
                Ordering::Equal => return Err(item),
            };
        }
        self.link_new(parent, go_left, item)
    }

    /// Insert `item` right after the item `h` names (falls back to [`insert`](Self::insert)
    /// when its key does not belong there): no search from the root.
    pub(crate) fn insert_after(&mut self, h: Handle, item: T) -> Result<(), T> {
        if !self.live(h) {
            return self.insert(item);
        }
        let key = item.key();
        let this = h.0;
        if key <= self.at(this).key {
            return self.insert(item);
        }
        // The new node goes where the successor search ends: the leftmost slot of the right
        // subtree, or the right slot of `this`.
        let right = self.at(this).right;
        let (parent, go_left, successor) = if right == NIL {
            (this, false, self.successor(this))
        } else {
            let leftmost = self.leftmost(right);
            (leftmost, true, leftmost)
        };
        if successor != NIL && self.at(successor).key <= key {
            return self.insert(item);
        }
        self.link_new(parent, go_left, item)
    }

    /// Link a new node for `item` as a child of `parent` (whose slot on that side is free),
    /// restore the heap order and the maxima.
    fn link_new(&mut self, parent: Idx, go_left: bool, item: T) -> Result<(), T> {
        if self.vacant == NIL && self.nodes.len() >= NIL as usize {
            return Err(item);
        }
        let key = item.key();
        let fit = item.fit();
        let node = Node {
            key,
            fit,
            max_fit: fit,
            priority: priority_of(key),
            left: NIL,
            right: NIL,
            parent,
        };
        let idx = if self.vacant == NIL {
            self.nodes.push(node);
            self.items.push(Some(item));
            (self.nodes.len() - 1) as Idx
        } else {
            let idx = self.vacant;
            self.vacant = self.at(idx).left;
            *self.at_mut(idx) = node;
            self.items[idx as usize] = Some(item);
            idx
        };
        if parent == NIL {
            self.root = idx;
        } else if go_left {
            self.at_mut(parent).left = idx;
        } else {
            self.at_mut(parent).right = idx;
        }
        loop {
            let parent = self.at(idx).parent;
            if parent == NIL || self.at(idx).priority <= self.at(parent).priority {
                break;
            }
            self.rotate_up(idx);
        }
        // Rotations kept the maxima of the subtrees they moved; above them only `fit` is new.
        self.raise(self.at(idx).parent, fit);
        self.len += 1;
        self.fitting += u32::from(fit > 0);
        Ok(())
    }

    /// Remove and return the item at `key`.
    pub(crate) fn remove(&mut self, key: u64) -> Option<T> {
        self.remove_at(Handle(self.find(key)))
    }

    /// Remove and return the item `h` names.
    pub(crate) fn remove_at(&mut self, h: Handle) -> Option<T> {
        if !self.live(h) {
            return None;
        }
        let idx = h.0;
        // Rotate it down until it has at most one child, then splice it out.
        loop {
            let (l, r) = (self.at(idx).left, self.at(idx).right);
            if l == NIL || r == NIL {
                break;
            }
            let up = if self.at(l).priority > self.at(r).priority {
                l
            } else {
                r
            };
            self.rotate_up(up);
        }
        let node = self.at(idx);
        let child = if node.left != NIL {
            node.left
        } else {
            node.right
        };
        let (parent, fit) = (node.parent, node.fit);
        self.replace_child(parent, idx, child);
        // Rotations kept the maxima of the subtrees they moved; above them only `fit` left.
        self.lower(parent, fit);
        self.len -= 1;
        self.fitting -= u32::from(fit > 0);
        let vacant = self.vacant;
        self.vacant = idx;
        let node = self.at_mut(idx);
        node.left = vacant;
        node.right = NIL;
        node.parent = NIL;
        self.items[idx as usize].take()
    }

    /// Mutate the item at `key` in place (its key must stay the same) and refresh the fits on
    /// the path to it. Returns `None` when no item has that key.
    #[cfg(test)]
    pub(crate) fn update<R>(&mut self, key: u64, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        self.update_at(Handle(self.find(key)), f)
    }

    /// [`update`](Self::update) the item `h` names.
    pub(crate) fn update_at<R>(&mut self, h: Handle, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        let item = self.items.get_mut(h.0 as usize)?.as_mut()?;
        let result = f(item);
        let fit = item.fit();
        let key = item.key();
        let node = self.at_mut(h.0);
        debug_assert_eq!(key, node.key, "FitTree item key changed in update");
        let old = std::mem::replace(&mut node.fit, fit);
        if old != fit {
            self.fitting = self.fitting + u32::from(fit > 0) - u32::from(old > 0);
            self.refit(h.0, old, fit);
        }
        Some(result)
    }

    /// The handle of the item at exactly `key`.
    pub(crate) fn find_handle(&self, key: u64) -> Option<Handle> {
        Self::handle(self.find(key))
    }

    /// The item `h` names.
    pub(crate) fn get_at(&self, h: Handle) -> Option<&T> {
        if self.live(h) {
            self.item(h.0)
        } else {
            None
        }
    }

    /// The item before (lower key) the one `h` names.
    pub(crate) fn prev(&self, h: Handle) -> Option<Handle> {
        if !self.live(h) {
            return None;
        }
        Self::handle(self.predecessor(h.0))
    }

    /// The item after (higher key) the one `h` names.
    pub(crate) fn next(&self, h: Handle) -> Option<Handle> {
        if !self.live(h) {
            return None;
        }
        Self::handle(self.successor(h.0))
    }

    /// The item at exactly `key`.
    pub(crate) fn get(&self, key: u64) -> Option<&T> {
        self.item(self.find(key))
    }

    /// The node with the greatest key `<= key`.
    fn floor_idx(&self, key: u64) -> Idx {
        let mut cur = self.root;
        let mut best = NIL;
        while cur != NIL {
            let node = self.at(cur);
            if node.key <= key {
                best = cur;
                cur = node.right;
            } else {
                cur = node.left;
            }
        }
        best
    }

    /// The item with the greatest key `<= key`.
    pub(crate) fn floor(&self, key: u64) -> Option<&T> {
        self.item(self.floor_idx(key))
    }

    /// The handle of the item with the greatest key `<= key`.
    pub(crate) fn floor_handle(&self, key: u64) -> Option<Handle> {
        Self::handle(self.floor_idx(key))
    }

    /// The item with the smallest key `>= key`.
    pub(crate) fn ceiling(&self, key: u64) -> Option<&T> {
        let mut cur = self.root;
        let mut best = NIL;
        while cur != NIL {
            let node = self.at(cur);
            if node.key >= key {
                best = cur;
                cur = node.left;
            } else {
                cur = node.right;
            }
        }
        self.item(best)
    }

    /// The item with the greatest key strictly below `key`.
    #[cfg(test)]
    pub(crate) fn before(&self, key: u64) -> Option<&T> {
        self.floor(key.checked_sub(1)?)
    }

    /// The lowest-keyed item whose fit is at least `size` (address-ordered first fit).
    #[cfg(test)]
    pub(crate) fn first_fit(&self, size: usize) -> Option<&T> {
        self.item(self.first_fit_in(self.root, size))
    }

    /// The handle of the lowest-keyed item whose fit is at least `size` (address-ordered first
    /// fit).
    pub(crate) fn first_fit_handle(&self, size: usize) -> Option<Handle> {
        Self::handle(self.first_fit_in(self.root, size))
    }

    /// The highest-keyed item with key `<= hi` whose fit is at least `size`.
    pub(crate) fn last_fit_at_or_before(&self, hi: u64, size: usize) -> Option<&T> {
        self.item(self.last_fit_upto_in(self.root, hi, size))
    }

    /// In-order (ascending key) iterator.
    pub(crate) fn iter(&self) -> Iter<'_, T> {
        Iter {
            tree: self,
            next: self.leftmost(self.root),
        }
    }

    /// Remove every item, returning them in ascending key order. The slab keeps its capacity.
    pub(crate) fn take_all(&mut self) -> Vec<T> {
        let mut order = Vec::with_capacity(self.len());
        let mut cur = self.leftmost(self.root);
        while cur != NIL {
            order.push(cur);
            cur = self.successor(cur);
        }
        let out = order
            .into_iter()
            .filter_map(|i| self.items[i as usize].take())
            .collect();
        self.nodes.clear();
        self.items.clear();
        self.root = NIL;
        self.vacant = NIL;
        self.len = 0;
        self.fitting = 0;
        out
    }
}

/// In-order iterator over a [`FitTree`].
pub(crate) struct Iter<'a, T> {
    tree: &'a FitTree<T>,
    next: Idx,
}

impl<'a, T> Iterator for Iter<'a, T> {
    type Item = &'a T;

    fn next(&mut self) -> Option<&'a T> {
        let tree = self.tree;
        if self.next == NIL {
            return None;
        }
        let cur = self.next;
        self.next = tree.successor(cur);
        tree.item(cur)
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
    fn check_node(tree: &FitTree<Item>, link: Idx, low: Option<u64>, high: Option<u64>) -> usize {
        if link == NIL {
            return 0;
        }
        let node = tree.at(link);
        let Some(item) = tree.item(link) else {
            panic!("a linked node is vacant")
        };
        assert!(low.is_none_or(|l| node.key > l), "BST order (low)");
        assert!(high.is_none_or(|h| node.key < h), "BST order (high)");
        assert_eq!(node.key, item.key);
        assert_eq!(node.fit, item.fit);
        for child in [node.left, node.right].into_iter().filter(|&c| c != NIL) {
            assert!(tree.at(child).priority <= node.priority, "heap order");
            assert_eq!(tree.at(child).parent, link, "parent link");
        }
        let expected_max = node
            .fit
            .max(tree.max_of(node.left))
            .max(tree.max_of(node.right));
        assert_eq!(node.max_fit, expected_max);
        1 + check_node(tree, node.left, low, Some(node.key))
            + check_node(tree, node.right, Some(node.key), high)
    }

    fn depth(tree: &FitTree<Item>, link: Idx) -> usize {
        if link == NIL {
            return 0;
        }
        let node = tree.at(link);
        1 + depth(tree, node.left).max(depth(tree, node.right))
    }

    /// Vacant slots form one chain covering exactly the slots not in the tree.
    fn check_slab(tree: &FitTree<Item>) {
        let mut vacant = 0;
        let mut cur = tree.vacant;
        while cur != NIL {
            assert!(
                tree.items[cur as usize].is_none(),
                "a vacant slot holds an item"
            );
            vacant += 1;
            cur = tree.at(cur).left;
        }
        assert_eq!(vacant + tree.len(), tree.nodes.len());
        assert_eq!(tree.items.len(), tree.nodes.len());
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
    fn zero_fits_serve_zero_size_requests() {
        let mut tree = FitTree::new();
        assert!(tree.insert(Item { key: 0, fit: 0 }).is_ok());
        assert!(tree.insert(Item { key: 9, fit: 3 }).is_ok());
        assert_eq!(tree.first_fit(0).map(|i| i.key), Some(0));
        assert_eq!(tree.first_fit(1).map(|i| i.key), Some(9));
        assert_eq!(tree.fitting_len(), 1);
    }

    #[test]
    fn vacant_slots_are_reused_and_handles_stay_valid() {
        let mut tree = FitTree::new();
        for key in 0..100u64 {
            assert!(tree.insert(Item { key, fit: 1 }).is_ok());
        }
        let kept = tree
            .find_handle(77)
            .unwrap_or_else(|| panic!("77 is there"));
        for key in (0..100u64).step_by(2) {
            assert!(tree.remove(key).is_some());
        }
        for key in 100..150u64 {
            assert!(tree.insert(Item { key, fit: 2 }).is_ok());
        }
        // The slab did not grow: the 50 vacant slots were reused.
        assert_eq!(tree.nodes.len(), 100);
        check_slab(&tree);
        // A handle survives other insertions and removals.
        assert_eq!(tree.get_at(kept).map(|i| i.key), Some(77));
        assert_eq!(tree.update_at(kept, |i| i.fit = 9), Some(()));
        assert_eq!(tree.max_fit(), 9);
        assert_eq!(tree.remove_at(kept).map(|i| i.key), Some(77));
        assert!(
            tree.update_at(kept, |i| i.fit = 1).is_none(),
            "stale handle"
        );
        assert_eq!(tree.max_fit(), 2);
        assert_eq!(check_node(&tree, tree.root, None, None), tree.len());
        let all: Vec<u64> = tree.take_all().into_iter().map(|i| i.key).collect();
        assert_eq!(all.len(), 99);
        assert!(all.windows(2).all(|w| w[0] < w[1]));
        assert!(tree.get_at(kept).is_none());
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
        assert!(
            depth(&tree, tree.root) < 64,
            "depth {}",
            depth(&tree, tree.root)
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, usize),
        Remove(u64),
        Update(u64, usize),
        FirstFit(usize),
        Floor(u64),
        Ceiling(u64),
        LastFitUpTo(u64, usize),
        Neighbours(u64),
        InsertAfter(u64, u64, usize),
        UpdateAt(u64, usize),
        RemoveAt(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        let key = 0u64..64;
        prop_oneof![
            (key.clone(), 0usize..100).prop_map(|(k, f)| Op::Insert(k, f)),
            key.clone().prop_map(Op::Remove),
            (key.clone(), 0usize..100).prop_map(|(k, f)| Op::Update(k, f)),
            (0usize..110).prop_map(Op::FirstFit),
            key.clone().prop_map(Op::Floor),
            key.clone().prop_map(Op::Ceiling),
            (key.clone(), 0usize..110).prop_map(|(k, s)| Op::LastFitUpTo(k, s)),
            key.clone().prop_map(Op::Neighbours),
            (key.clone(), key.clone(), 0usize..100).prop_map(|(a, k, f)| Op::InsertAfter(a, k, f)),
            (key.clone(), 0usize..100).prop_map(|(k, f)| Op::UpdateAt(k, f)),
            key.prop_map(Op::RemoveAt),
        ]
    }

    /// Maxima follow fits that rise, fall to a tie, fall below it and leave, wherever the
    /// items sit (the walks up stop early only when nothing above can change).
    #[test]
    fn maxima_follow_ties_rises_and_falls() {
        let mut tree = FitTree::new();
        for key in 0..32u64 {
            assert!(tree.insert(Item { key, fit: 1 }).is_ok());
        }
        let check = |tree: &FitTree<Item>| {
            assert_eq!(check_node(tree, tree.root, None, None), tree.len());
        };
        for (key, fit, max) in [
            (5, 50, 50),
            (27, 50, 50),
            (5, 10, 50),
            (27, 20, 20),
            (27, 20, 20),
            (5, 0, 20),
            (27, 1, 1),
            (31, 70, 70),
        ] {
            assert!(tree.update(key, |i| i.fit = fit).is_some());
            check(&tree);
            assert_eq!(tree.max_fit(), max);
        }
        assert_eq!(tree.first_fit(2).map(|i| i.key), Some(31));
        assert_eq!(tree.remove(31).map(|i| i.fit), Some(70));
        check(&tree);
        assert_eq!(tree.max_fit(), 1);
        assert_eq!(tree.fitting_len(), 30);
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
                    Op::LastFitUpTo(hi, size) => {
                        let expected = model
                            .range(..=hi)
                            .rev()
                            .find(|(_, f)| **f >= size)
                            .map(|(k, _)| *k);
                        prop_assert_eq!(
                            tree.last_fit_at_or_before(hi, size).map(|i| i.key),
                            expected
                        );
                    }
                    Op::Neighbours(key) => {
                        let h = tree.find_handle(key);
                        prop_assert_eq!(h.is_some(), model.contains_key(&key));
                        if let Some(h) = h {
                            prop_assert_eq!(tree.get_at(h).map(|i| i.key), Some(key));
                            let prev = model.range(..key).next_back().map(|(k, _)| *k);
                            let next = model.range(key + 1..).next().map(|(k, _)| *k);
                            let key_of = |h| tree.get_at(h).map(|i| i.key);
                            prop_assert_eq!(tree.prev(h).and_then(key_of), prev);
                            prop_assert_eq!(tree.next(h).and_then(key_of), next);
                        }
                        let floor = model.range(..=key).next_back().map(|(k, _)| *k);
                        let floor_handle = tree.floor_handle(key);
                        prop_assert_eq!(floor_handle.and_then(|h| tree.get_at(h)).map(|i| i.key), floor);
                    }
                    Op::InsertAfter(after, key, fit) => {
                        // Right after an item, or (wrong place, stale handle) a plain insert.
                        let h = tree.find_handle(after).or(tree.first_fit_handle(0));
                        let inserted = match h {
                            Some(h) => tree.insert_after(h, Item { key, fit }).is_ok(),
                            None => tree.insert(Item { key, fit }).is_ok(),
                        };
                        prop_assert_eq!(inserted, !model.contains_key(&key));
                        model.entry(key).or_insert(fit);
                    }
                    Op::UpdateAt(key, fit) => {
                        if let Some(h) = tree.find_handle(key) {
                            prop_assert_eq!(tree.update_at(h, |i| i.fit = fit), Some(()));
                            model.insert(key, fit);
                        }
                    }
                    Op::RemoveAt(key) => {
                        let h = tree.first_fit_handle(0);
                        let first = model.keys().next().copied();
                        prop_assert_eq!(h.and_then(|h| tree.get_at(h)).map(|i| i.key), first);
                        if let Some(h) = tree.find_handle(key) {
                            prop_assert_eq!(tree.remove_at(h).map(|i| i.key), Some(key));
                            model.remove(&key);
                            // The handle is stale now.
                            prop_assert!(tree.get_at(h).is_none_or(|i| i.key != key));
                        }
                    }
                }
                prop_assert_eq!(check_node(&tree, tree.root, None, None), model.len());
                check_slab(&tree);
                prop_assert_eq!(tree.len(), model.len());
                prop_assert_eq!(tree.fitting_len(), model.values().filter(|f| **f > 0).count());
                prop_assert_eq!(tree.max_fit(), model.values().copied().max().unwrap_or(0));
                let keys: Vec<u64> = tree.iter().map(|i| i.key).collect();
                let model_keys: Vec<u64> = model.keys().copied().collect();
                prop_assert_eq!(keys, model_keys);
            }
        }
    }
}
