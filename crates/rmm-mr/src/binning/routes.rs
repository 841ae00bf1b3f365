//! The binning resource's routes, readable without a lock: [`BinRoutes`] publishes, for each
//! bin count, an immutable size-ordered version of the bins in a write-once slot (bins are only
//! ever added), so a request does one acquire load and a search. Capacity is
//! [`BinRoutes::CAPACITY`] bins; beyond it the resource routes through its locked
//! [`BinTable`](crate::binning::table::BinTable). Design: `docs/internals/binning.md`.
//!
//! Pure bookkeeping: no CUDA calls.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

/// The most bins [`BinRoutes`] holds.
const CAPACITY: usize = 64;

/// One published version: `(size, payload)` by increasing size.
type Version<B> = Box<[(usize, B)]>;

/// Per bin count, the bins by increasing size (see the module documentation).
pub struct BinRoutes<B> {
    /// `versions[n - 1]`: the first `n` bins added.
    versions: [OnceLock<Version<B>>; CAPACITY],
    /// Number of bins published.
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
            versions: std::array::from_fn(|_| OnceLock::new()),
            published: AtomicUsize::new(0),
            write: Mutex::new(()),
        }
    }

    /// Number of bins.
    #[must_use]
    pub fn len(&self) -> usize {
        self.published.load(Ordering::Acquire)
    }

    /// Whether there is no bin.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The current bins by increasing size.
    #[inline]
    fn current(&self) -> &[(usize, B)] {
        self.len()
            .checked_sub(1)
            .and_then(|v| self.versions[v].get())
            .map_or(&[], |v| &v[..])
    }

    /// The smallest bin whose size is at least `bytes`, with its size, or `None` when the
    /// request belongs to the upstream (as [`BinTable::route`](crate::binning::table::BinTable::route)).
    #[inline]
    #[must_use]
    pub fn route(&self, bytes: usize) -> Option<(usize, &B)> {
        // A scan: a few bins (five in RMM's benchmark configuration), at most 64.
        let (size, bin) = self.current().iter().find(|(s, _)| *s >= bytes)?;
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
    /// `payload` back when the routes already hold [`CAPACITY`](Self::CAPACITY) bins.
    pub fn insert(&self, size: usize, payload: B) -> Result<bool, B> {
        let _serial = self.write.lock().unwrap_or_else(PoisonError::into_inner);
        let n = self.published.load(Ordering::Relaxed);
        let current = self.current();
        let at = current.partition_point(|(s, _)| *s < size);
        if current.get(at).is_some_and(|(s, _)| *s == size) {
            return Ok(false);
        }
        if n == Self::CAPACITY {
            return Err(payload);
        }
        let version: Version<B> = current[..at]
            .iter()
            .cloned()
            .chain(std::iter::once((size, payload)))
            .chain(current[at..].iter().cloned())
            .collect();
        // Writers are serialized and `n` only grows, so the slot is still empty.
        if let Err(version) = self.versions[n].set(version) {
            return Err(version.into_vec().swap_remove(at).1);
        }
        self.published.store(n + 1, Ordering::Release);
        Ok(true)
    }
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
    }

    #[test]
    fn capacity_is_reported_not_exceeded() {
        let r = BinRoutes::new();
        for i in 0..BinRoutes::<usize>::CAPACITY {
            assert_eq!(r.insert(256 * (i + 1), i), Ok(true));
        }
        assert_eq!(r.insert(1 << 40, 99), Err(99));
        assert_eq!(
            r.insert(256, 7),
            Ok(false),
            "an existing size is not a new bin"
        );
        assert_eq!(r.len(), BinRoutes::<usize>::CAPACITY);
        assert_eq!(r.route(1 << 30), None);
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
