//! A vector that only grows, readable without a lock: an element found once can be named by its
//! index or address (a plain number a thread-local cache can keep) and borrowed for as long as
//! the vector, with no reference count touched per operation. (The stream lists of the
//! stream-ordered core live in one.) Nothing here knows its elements.
//!
//! Elements live in segments of doubling size (8, 16, 32, ...), each created once and never
//! moved, so a reference handed out stays valid while the vector lives. Pushes are serialized by
//! a mutex; reads are two acquire loads.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

/// log2 of the first segment's length.
const FIRST_BITS: u32 = 3;
/// Enough segments for every index a `usize` can hold.
const SEGMENTS: usize = (usize::BITS - FIRST_BITS) as usize;

/// An append-only vector whose elements are never moved or removed (see the
/// [module documentation](self)).
pub(crate) struct AppendOnlyVec<T> {
    segments: [OnceLock<Box<[OnceLock<T>]>>; SEGMENTS],
    /// Number of elements published.
    len: AtomicUsize,
    push: Mutex<()>,
}

/// The segment of index `i` and the position in it.
fn locate(i: usize) -> (usize, usize) {
    // `i + 8` cannot overflow for any index below `usize::MAX - 8`; larger indices are never
    // reached (each element takes memory).
    let k = i.saturating_add(1 << FIRST_BITS);
    let bits = usize::BITS - 1 - k.leading_zeros();
    let segment = (bits - FIRST_BITS) as usize;
    (segment, k - (1 << bits))
}

impl<T> AppendOnlyVec<T> {
    /// An empty vector.
    pub(crate) fn new() -> Self {
        Self {
            segments: std::array::from_fn(|_| OnceLock::new()),
            len: AtomicUsize::new(0),
            push: Mutex::new(()),
        }
    }

    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Appends `value` and returns its index.
    pub(crate) fn push(&self, value: T) -> usize {
        let _serial = self.push.lock().unwrap_or_else(PoisonError::into_inner);
        let i = self.len.load(Ordering::Relaxed);
        let (segment, at) = locate(i);
        let slots = self.segments[segment].get_or_init(|| {
            (0..(1usize << (segment as u32 + FIRST_BITS)))
                .map(|_| OnceLock::new())
                .collect()
        });
        // Only pushes write, one at a time, each to a fresh index: the slot is empty.
        let _ = slots[at].set(value);
        self.len.store(i + 1, Ordering::Release);
        i
    }

    /// The element at `i`, if it was pushed.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        let (segment, at) = locate(i);
        self.segments.get(segment)?.get()?.get(at)?.get()
    }

    /// The elements in push order (those pushed when the iteration reaches them).
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        (0..self.len()).map_while(|i| self.get(i))
    }
}

impl<T: fmt::Debug> fmt::Debug for AppendOnlyVec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_indices_without_gaps() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(7), (0, 7));
        assert_eq!(locate(8), (1, 0));
        assert_eq!(locate(23), (1, 15));
        assert_eq!(locate(24), (2, 0));
        let mut expected = (0, 0);
        for i in 0..10_000 {
            assert_eq!(locate(i), expected, "index {i}");
            let len = 1 << (expected.0 as u32 + FIRST_BITS);
            expected = if expected.1 + 1 == len {
                (expected.0 + 1, 0)
            } else {
                (expected.0, expected.1 + 1)
            };
        }
        assert!(locate(usize::MAX).0 < SEGMENTS);
    }

    #[test]
    fn push_get_iter_and_stable_references() {
        let v = AppendOnlyVec::new();
        assert_eq!(v.len(), 0);
        assert!(v.get(0).is_none());
        let first = {
            assert_eq!(v.push(String::from("zero")), 0);
            v.get(0).unwrap() as *const String
        };
        for i in 1..100 {
            assert_eq!(v.push(i.to_string()), i);
        }
        assert_eq!(v.len(), 100);
        assert!(std::ptr::eq(first, v.get(0).unwrap()), "an element moved");
        assert_eq!(v.get(57).map(String::as_str), Some("57"));
        assert!(v.get(100).is_none());
        let all: Vec<&String> = v.iter().collect();
        assert_eq!(all.len(), 100);
        assert_eq!(all[99], "99");
        assert!(format!("{v:?}").contains("\"42\""));
    }

    #[test]
    fn concurrent_pushes_get_distinct_indices() {
        let v = AppendOnlyVec::new();
        std::thread::scope(|s| {
            for t in 0..4usize {
                let v = &v;
                s.spawn(move || {
                    for i in 0..500usize {
                        let at = v.push((t, i));
                        assert_eq!(v.get(at), Some(&(t, i)));
                    }
                });
            }
        });
        assert_eq!(v.len(), 2000);
        let mut seen: Vec<(usize, usize)> = v.iter().copied().collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 2000, "an element was lost or duplicated");
    }
}
