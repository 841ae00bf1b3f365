//! The binning resource's routes, readable without a lock: [`BinRoutes`] publishes, for each
//! bin count, an immutable size-ordered version of the bins in a write-once slot (bins are only
//! ever added), so a request does one acquire load and a look-up: each version keeps, per
//! power-of-two size class, the first bin a request of that class can go to, so a request
//! compares with one bin (more only when several bins share its class). Capacity is
//! [`BinRoutes::CAPACITY`] bins; an insertion beyond it *closes* the routes (every look-up
//! answers `None` from then on, [`BinRoutes::is_closed`]) and the resource routes through its
//! locked [`BinTable`](crate::binning::table::BinTable). Design: `docs/internals/binning.md`.
//!
//! Pure bookkeeping: no CUDA calls.

use std::fmt;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

/// The most bins [`BinRoutes`] holds.
const CAPACITY: usize = 64;

/// The bit of [`BinRoutes`]' count that says the routes are closed (a bin did not fit).
const CLOSED: usize = 1 << (usize::BITS - 1);

/// Number of size classes: class 0 holds the requests of 0 and 1 bytes, class `k >= 1` those
/// of `2^(k-1) + 1 ..= 2^k` bytes (see [`class_of`]).
const CLASSES: usize = usize::BITS as usize + 1;

/// The size class of a request of `bytes` bytes: the least `k` with `bytes <= 2^k`.
#[inline]
fn class_of(bytes: usize) -> usize {
    (usize::BITS - bytes.saturating_sub(1).leading_zeros()) as usize
}

/// One published version: `(size, payload)` by increasing size, and per size class the index
/// of the first bin a request of that class can go to (the smallest bin at least as large as
/// the class's smallest request; `bins.len()` when there is none).
struct Version<B> {
    bins: Box<[(usize, B)]>,
    first: [u8; CLASSES],
}

impl<B> Version<B> {
    fn new(bins: Box<[(usize, B)]>) -> Self {
        let mut first = [0u8; CLASSES];
        for (k, f) in first.iter_mut().enumerate() {
            // The smallest request of class `k`.
            let least = if k == 0 { 0 } else { (1usize << (k - 1)) + 1 };
            let at = bins.partition_point(|(s, _)| *s < least);
            // At most CAPACITY (64) bins: fits.
            *f = u8::try_from(at).unwrap_or(u8::MAX);
        }
        Self { bins, first }
    }
}

/// Per bin count, the bins by increasing size (see the module documentation).
pub struct BinRoutes<B> {
    /// `versions[n - 1]`: the first `n` bins added. On the heap, so that `current` stays
    /// valid when the routes move; a version, once set, is neither changed nor dropped
    /// before the routes are. A `Vec`, not a `Box`: moving a `Box` asserts that it is the only
    /// pointer to its heap memory, which would invalidate `current` (Miri's Stacked Borrows
    /// reports it); moving a `Vec` asserts nothing.
    versions: Vec<OnceLock<Version<B>>>,
    /// The latest version (null: no bin yet, or closed): what a request reads, one load.
    current: AtomicPtr<Version<B>>,
    /// Number of bins published, with [`CLOSED`] set once a bin did not fit.
    published: AtomicUsize,
    write: Mutex<()>,
}

impl<B> Default for BinRoutes<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B> BinRoutes<B> {
    /// The most bins the routes hold.
    pub const CAPACITY: usize = CAPACITY;

    /// Routes without bins.
    #[must_use]
    pub fn new() -> Self {
        Self {
            versions: (0..CAPACITY).map(|_| OnceLock::new()).collect(),
            current: AtomicPtr::new(ptr::null_mut()),
            published: AtomicUsize::new(0),
            write: Mutex::new(()),
        }
    }

    /// Number of bins.
    #[must_use]
    pub fn len(&self) -> usize {
        self.published.load(Ordering::Acquire) & !CLOSED
    }

    /// Whether a bin did not fit (then [`route`](Self::route) answers `None` for every
    /// request, and the caller routes by its own table). Once closed, always closed.
    #[inline]
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.published.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Whether there is no bin.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The version of the first `n` bins, if `n` is at least 1 (and below [`CLOSED`]).
    #[inline]
    fn version_of(&self, n: usize) -> Option<&Version<B>> {
        n.checked_sub(1).and_then(|v| self.versions.get(v)?.get())
    }

    /// The current bins by increasing size (closed or not).
    #[inline]
    fn current(&self) -> &[(usize, B)] {
        self.version_of(self.len()).map_or(&[], |v| &v.bins[..])
    }

    /// The smallest bin whose size is at least `bytes`, with its size, or `None` when the
    /// request belongs to the upstream (as [`BinTable::route`](crate::binning::table::BinTable::route))
    /// or the routes are [closed](Self::is_closed).
    #[inline]
    #[must_use]
    pub fn route(&self, bytes: usize) -> Option<(usize, &B)> {
        let v = self.current.load(Ordering::Acquire);
        // SAFETY: `current` is null or was stored (release, after the slot was set) by `insert`
        // from `OnceLock::get` of a slot of `self.versions`: a heap slot that is never set
        // again, moved or dropped while `self` lives, so the shared reference is valid for
        // the borrow of `self`, and the acquire load sees the version complete.
        let v = unsafe { v.as_ref() }?;
        // The first bin of the request's class, then (only when several bins share the class)
        // the next ones: for power-of-two bins the first is the one.
        let from = usize::from(*v.first.get(class_of(bytes))?);
        let (size, bin) = v.bins.get(from)?;
        if *size >= bytes {
            return Some((*size, bin));
        }
        Self::route_past(v, from + 1, bytes)
    }

    /// The rest of [`route`](Self::route): the first bin from `from` on that is at least
    /// `bytes` (several bins share the request's class).
    #[cold]
    #[inline(never)]
    fn route_past(v: &Version<B>, from: usize, bytes: usize) -> Option<(usize, &B)> {
        let (size, bin) = v.bins.get(from..)?.iter().find(|(s, _)| *s >= bytes)?;
        Some((*size, bin))
    }

    /// The bins by increasing size.
    pub fn bins(&self) -> impl ExactSizeIterator<Item = (usize, &B)> + '_ {
        self.current().iter().map(|(s, p)| (*s, p))
    }
}

impl<B: Clone> BinRoutes<B> {
    /// Adds a bin of `size` bytes (taken as it is: the caller rounds), published for readers
    /// at once. `Ok(false)` (and `payload` dropped) when a bin of that size exists.
    ///
    /// # Errors
    ///
    /// `payload` back when the routes already hold [`CAPACITY`](Self::CAPACITY) bins: the
    /// routes are then [closed](Self::is_closed).
    pub fn insert(&self, size: usize, payload: B) -> Result<bool, B> {
        let _serial = self.write.lock().unwrap_or_else(PoisonError::into_inner);
        let n = self.published.load(Ordering::Relaxed) & !CLOSED;
        let current = self.current();
        let at = current.partition_point(|(s, _)| *s < size);
        if current.get(at).is_some_and(|(s, _)| *s == size) {
            return Ok(false);
        }
        if n == Self::CAPACITY {
            // Readers that saw the last version may still route by it (the bins it holds are
            // still bins); from now on they route by the caller's table.
            self.current.store(ptr::null_mut(), Ordering::Release);
            self.published.fetch_or(CLOSED, Ordering::Release);
            return Err(payload);
        }
        let bins: Box<[(usize, B)]> = current[..at]
            .iter()
            .cloned()
            .chain(std::iter::once((size, payload)))
            .chain(current[at..].iter().cloned())
            .collect();
        // Writers are serialized and `n` only grows, so the slot is still empty.
        let Some(slot) = self.versions.get(n) else {
            return Err(payload_of(bins, at));
        };
        if let Err(version) = slot.set(Version::new(bins)) {
            return Err(payload_of(version.bins, at));
        }
        if let Some(version) = slot.get() {
            // Only ever read through (see `route`).
            self.current
                .store(ptr::from_ref(version).cast_mut(), Ordering::Release);
        }
        self.published.store(n + 1, Ordering::Release);
        Ok(true)
    }
}

/// The payload at `at` of bins that were not published.
fn payload_of<B>(bins: Box<[(usize, B)]>, at: usize) -> B {
    bins.into_vec().swap_remove(at).1
}

impl<B: fmt::Debug> fmt::Debug for BinRoutes<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.bins()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binning::table::BinTable;
    use proptest::prelude::*;

    #[test]
    fn routes_to_the_smallest_fitting_bin() {
        let r = BinRoutes::new();
        assert!(r.is_empty());
        assert_eq!(r.route(0), None);
        assert_eq!(r.insert(1 << 20, "1M"), Ok(true));
        assert_eq!(r.insert(1 << 18, "256K"), Ok(true));
        assert_eq!(r.insert(1 << 22, "4M"), Ok(true));
        assert_eq!(r.insert(1 << 18, "dup"), Ok(false));
        assert_eq!(r.len(), 3);
        assert_eq!(r.route(0), Some((1 << 18, &"256K")));
        assert_eq!(r.route(1 << 18), Some((1 << 18, &"256K")));
        assert_eq!(r.route((1 << 18) + 1), Some((1 << 20, &"1M")));
        assert_eq!(r.route(1 << 22), Some((1 << 22, &"4M")));
        assert_eq!(r.route((1 << 22) + 1), None);
        assert_eq!(
            r.bins().map(|(s, p)| (s, *p)).collect::<Vec<_>>(),
            [(1 << 18, "256K"), (1 << 20, "1M"), (1 << 22, "4M")]
        );
        assert!(format!("{r:?}").contains("256K"));
        // Moved, the routes still route (their versions are on the heap).
        let moved = Box::new(r);
        assert_eq!(moved.route(1 << 22), Some((1 << 22, &"4M")));
        assert_eq!(moved.route(1), Some((1 << 18, &"256K")));
    }

    #[test]
    fn size_classes_split_at_powers_of_two() {
        assert_eq!(
            (class_of(0), class_of(1), class_of(2), class_of(3)),
            (0, 0, 1, 2)
        );
        for k in 1..usize::BITS as usize {
            assert_eq!(class_of(1 << k), k);
            assert_eq!(class_of((1 << k) + 1), k + 1);
        }
        assert_eq!(class_of(usize::MAX), CLASSES - 1);
    }

    #[test]
    fn routes_near_powers_of_two_match_the_bin_table() {
        // Bins that share a class, bins on and off powers of two, requests around each.
        let sizes = [
            256usize,
            512,
            768,
            1024,
            1280,
            4096,
            1 << 18,
            3 << 18,
            1 << 22,
        ];
        let routes = BinRoutes::new();
        let mut table = BinTable::new();
        for &s in &sizes {
            routes.insert(s, s).unwrap();
            table.add_bin(s, s).unwrap();
        }
        for k in 0..usize::BITS {
            let p = 1usize << k;
            for bytes in [p - 1, p, p + 1, p.saturating_add(255), usize::MAX] {
                assert_eq!(
                    routes.route(bytes).map(|(s, p)| (s, *p)),
                    table.route(bytes).map(|(s, p)| (*s, *p)),
                    "{bytes}"
                );
            }
        }
    }

    #[test]
    fn capacity_is_reported_not_exceeded() {
        let r = BinRoutes::new();
        for i in 0..BinRoutes::<usize>::CAPACITY {
            assert_eq!(r.insert(256 * (i + 1), i), Ok(true));
        }
        assert!(!r.is_closed());
        assert_eq!(r.route(256), Some((256, &0)));
        assert_eq!(r.insert(1 << 40, 99), Err(99));
        assert_eq!(
            r.insert(256, 7),
            Ok(false),
            "an existing size is not a new bin"
        );
        assert_eq!(r.len(), BinRoutes::<usize>::CAPACITY);
        assert!(r.is_closed(), "a bin that did not fit closes the routes");
        assert_eq!(r.route(1 << 30), None);
        assert_eq!(r.route(256), None, "closed routes route nothing");
        assert_eq!(r.bins().len(), BinRoutes::<usize>::CAPACITY);
    }

    #[test]
    fn readers_see_bins_appear_while_routing() {
        let r = BinRoutes::new();
        r.insert(1024, 1024usize).unwrap();
        std::thread::scope(|s| {
            for _ in 0..2 {
                let r = &r;
                s.spawn(move || {
                    for i in 0..20_000usize {
                        let bytes = 1 + i % (1 << 20);
                        if let Some((size, &payload)) = r.route(bytes) {
                            assert!(size >= bytes && payload == size, "{bytes} -> {size}");
                        }
                    }
                });
            }
            for e in (11..21).rev() {
                r.insert(1 << e, 1 << e).unwrap();
            }
        });
        assert_eq!(r.len(), 11);
    }

    proptest! {
        #[test]
        fn routes_match_the_bin_table(
            sizes in proptest::collection::vec(0usize..1 << 24, 0..20),
            requests in proptest::collection::vec(0usize..1 << 25, 1..40),
        ) {
            let routes = BinRoutes::new();
            let mut table = BinTable::new();
            for &s in &sizes {
                let size = crate::binning::table::rounded_bin_size(s).unwrap();
                let inserted = table.add_bin(size, s).unwrap();
                prop_assert_eq!(routes.insert(size, s), Ok(inserted));
            }
            prop_assert_eq!(
                routes.bins().map(|(s, p)| (s, *p)).collect::<Vec<_>>(),
                table.bins().map(|(s, p)| (*s, *p)).collect::<Vec<_>>()
            );
            for r in requests {
                prop_assert_eq!(
                    routes.route(r).map(|(s, p)| (s, *p)),
                    table.route(r).map(|(s, p)| (*s, *p))
                );
            }
        }
    }
}
