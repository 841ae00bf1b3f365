//! The FIFO of one stream's free fixed-size blocks: a ring buffer whose push and pop are a few
//! inlined instructions (growing, the rare case, is out of line).
//!
//! Pure bookkeeping: no CUDA calls.

/// A first-in first-out queue of `Copy` items in a power-of-two ring buffer.
#[derive(Debug, Clone)]
pub(crate) struct Ring<T> {
    /// The storage; its length is 0 or a power of two.
    buf: Box<[T]>,
    /// Where the oldest item is.
    head: usize,
    /// Number of items.
    len: usize,
}

impl<T> Default for Ring<T> {
    fn default() -> Self {
        Self {
            buf: Box::new([]),
            head: 0,
            len: 0,
        }
    }
}

impl<T: Copy + Default> Ring<T> {
    /// An empty ring.
    #[must_use]
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Whether the ring holds no item.
    #[must_use]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of items.
    #[must_use]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Appends `item` at the back.
    #[inline]
    pub(crate) fn push_back(&mut self, item: T) {
        if self.len == self.buf.len() {
            self.grow();
        }
        // At least one slot is free, so the storage is not empty and the masked index is in
        // bounds (the compiler sees it when the mask comes from the same length).
        let cap = self.buf.len();
        let at = (self.head + self.len) & cap.wrapping_sub(1);
        if let Some(slot) = self.buf.get_mut(at) {
            *slot = item;
            self.len += 1;
        }
    }

    /// Removes and returns the front (oldest) item.
    #[inline]
    pub(crate) fn pop_front(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let item = self.buf[self.head];
        self.head = (self.head + 1) & (self.buf.len() - 1);
        self.len -= 1;
        Some(item)
    }

    /// The items, front first.
    pub(crate) fn iter(&self) -> impl ExactSizeIterator<Item = T> + '_ {
        let mask = self.buf.len().wrapping_sub(1);
        (0..self.len).map(move |i| self.buf[(self.head + i) & mask])
    }

    /// Moves every item of `other` to the back of `self`, in order; `other` ends empty.
    pub(crate) fn append(&mut self, other: &mut Self) {
        if self.is_empty() {
            std::mem::swap(self, other);
            return;
        }
        self.reserve(other.len);
        while let Some(item) = other.pop_front() {
            self.push_back(item);
        }
    }

    /// Appends every item of `items` at the back.
    pub(crate) fn extend(&mut self, items: impl ExactSizeIterator<Item = T>) {
        self.reserve(items.len());
        for item in items {
            self.push_back(item);
        }
    }

    /// Makes room for `more` items without growing again.
    fn reserve(&mut self, more: usize) {
        let need = self.len.saturating_add(more);
        if need > self.buf.len() {
            self.resize(need.next_power_of_two());
        }
    }

    /// Doubles the storage (to 8 items at first).
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        self.resize((self.buf.len() * 2).max(8));
    }

    /// Moves the items, front first, to new storage of `cap` (a power of two, at least `len`).
    fn resize(&mut self, cap: usize) {
        let mut buf = vec![T::default(); cap].into_boxed_slice();
        for (to, item) in buf.iter_mut().zip(self.iter()) {
            *to = item;
        }
        self.buf = buf;
        self.head = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[derive(Debug, Clone)]
    enum Op {
        Push(u32),
        Pop,
        Append(Vec<u32>),
        Extend(Vec<u32>),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => any::<u32>().prop_map(Op::Push),
            5 => Just(Op::Pop),
            1 => proptest::collection::vec(any::<u32>(), 0..20).prop_map(Op::Append),
            1 => proptest::collection::vec(any::<u32>(), 0..20).prop_map(Op::Extend),
        ]
    }

    #[test]
    fn fifo_across_wraps_and_growth() {
        let mut r = Ring::new();
        assert_eq!(r.pop_front(), None);
        for i in 0..5u64 {
            r.push_back(i);
        }
        assert_eq!(r.pop_front(), Some(0));
        assert_eq!(r.pop_front(), Some(1));
        // Wraps around, then grows while wrapped.
        for i in 5..20u64 {
            r.push_back(i);
        }
        assert_eq!(r.iter().len(), 18);
        assert_eq!(r.iter().collect::<Vec<_>>(), (2..20).collect::<Vec<_>>());
        let mut other = Ring::new();
        other.extend([100u64, 101].into_iter());
        r.append(&mut other);
        assert!(other.is_empty());
        let mut empty = Ring::new();
        empty.append(&mut r);
        assert!(r.is_empty());
        let all: Vec<u64> = std::iter::from_fn(|| empty.pop_front()).collect();
        let want: Vec<u64> = (2..20).chain([100, 101]).collect();
        assert_eq!(all, want);
    }

    proptest! {
        #[test]
        fn ring_matches_a_vec_deque(ops in proptest::collection::vec(op(), 1..300)) {
            let mut ring = Ring::new();
            let mut model = VecDeque::new();
            for op in ops {
                match op {
                    Op::Push(x) => {
                        ring.push_back(x);
                        model.push_back(x);
                    }
                    Op::Pop => prop_assert_eq!(ring.pop_front(), model.pop_front()),
                    Op::Append(items) => {
                        let mut other = Ring::new();
                        other.extend(items.iter().copied());
                        ring.append(&mut other);
                        prop_assert!(other.is_empty());
                        model.extend(items);
                    }
                    Op::Extend(items) => {
                        ring.extend(items.iter().copied());
                        model.extend(items);
                    }
                }
                prop_assert_eq!(ring.iter().len(), model.len());
                prop_assert_eq!(ring.is_empty(), model.is_empty());
                prop_assert!(ring.iter().eq(model.iter().copied()));
            }
        }
    }
}
