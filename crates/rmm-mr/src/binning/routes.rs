//! The binning resource's routes, readable without a lock, and the history that sends every
//! free to the bin that allocated it.
//!
//! [`BinRoutes`] publishes, for each bin count, an immutable size-ordered *version* of the bins
//! (bins are only ever added), so a request does one acquire load and a look-up: each version
//! keeps, per power-of-two size class, the first bin a request of that class can go to, so a
//! request compares with one bin (more only when several bins share its class).
//!
//! A bin added after memory was handed out changes where a free of that size goes, so a
//! version also records which size classes were **allocated while it was current**
//! ([`Version::mark_allocation`]), and a new version lists the earlier versions that handed out
//! memory. A free then asks every such version where that size went
//! ([`Version::candidates`]): with one answer (always, while no bin was added after the first
//! allocation) that is the bin; with several, the caller checks which one owns the block.
//! To make the list exact, [`BinRoutes::insert`] *seals* the current version before it builds
//! the next one, and an allocation that finds its version sealed waits for the insertion and
//! routes by the new version: so no allocation is made under a version after the versions
//! built on it were written. Design and proofs: `docs/internals/binning.md`.
//!
//! Pure bookkeeping: no CUDA calls.

use std::fmt;
use std::sync::OnceLock;

use crate::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use crate::sync::Mutex;

/// The most bins [`BinRoutes`] holds.
const MAX_BINS: usize = 255;

/// Number of size classes: class 0 holds the requests of 0 and 1 bytes, class `k >= 1` those
/// of `2^(k-1) + 1 ..= 2^k` bytes (see [`class_of`]).
const CLASSES: usize = usize::BITS as usize + 1;

/// The bit of a version's `allocated` word that says it is sealed (see the module docs).
const SEALED: u64 = 1 << 63;

/// The size class of a request of `bytes` bytes: the least `k` with `bytes <= 2^k`.
#[inline]
fn class_of(bytes: usize) -> usize {
    (usize::BITS - bytes.saturating_sub(1).leading_zeros()) as usize
}

/// The bit of a version's `allocated` word for requests of `bytes` bytes: bit `k - 1` for class
/// `k`, classes 0 and 1 sharing bit 0 and classes from 63 on sharing bit 62 (bit 63 is
/// [`SEALED`]). Coarser than a class only at the ends, so the set stays conservative.
#[inline]
fn class_bit(bytes: usize) -> u64 {
    1 << (class_of(bytes).clamp(1, 63) - 1)
}

/// The bits of every request size in `lo..=hi` (`lo <= hi`).
fn class_bits(lo: usize, hi: usize) -> u64 {
    let (a, b) = (class_bit(lo), class_bit(hi));
    // Every bit from `a`'s up to `b`'s, both included (`b >= a`, single bits).
    (b - a) | b
}

/// One published version: `(size, payload)` by increasing size, per size class the index of
/// the first bin a request of that class can go to (the smallest bin at least as large as the
/// class's smallest request; `bins.len()` when there is none), the size classes allocated while
/// it was current, and the earlier versions that had allocated anything.
pub struct Version<B> {
    bins: Box<[(usize, B)]>,
    first: [u8; CLASSES],
    /// [`class_bit`]s of the requests routed by this version, and [`SEALED`] once a newer
    /// version is being built (then no bit is added any more).
    allocated: AtomicU64,
    /// Indices (in [`BinRoutes`]' versions) of the earlier versions with any allocation,
    /// fixed when this version was built.
    earlier: Box<[usize]>,
}

impl<B> Version<B> {
    fn new(bins: Box<[(usize, B)]>, earlier: Box<[usize]>) -> Self {
        let mut first = [0u8; CLASSES];
        for (k, f) in first.iter_mut().enumerate() {
            // The smallest request of class `k`.
            let least = if k == 0 { 0 } else { (1usize << (k - 1)) + 1 };
            let at = bins.partition_point(|(s, _)| *s < least);
            // At most MAX_BINS (255) bins: fits.
            *f = u8::try_from(at).unwrap_or(u8::MAX);
        }
        Self {
            bins,
            first,
            allocated: AtomicU64::new(0),
            earlier,
        }
    }

    /// The smallest bin whose size is at least `bytes`, with its size, or `None` when the
    /// request belongs to the upstream (as [`BinTable::route`](crate::binning::table::BinTable::route)).
    #[inline]
    #[must_use]
    pub fn route(&self, bytes: usize) -> Option<(usize, &B)> {
        // The first bin of the request's class, then (only when several bins share the class)
        // the next ones: for power-of-two bins the first is the one.
        let from = usize::from(*self.first.get(class_of(bytes))?);
        let (size, bin) = self.bins.get(from)?;
        if *size >= bytes {
            return Some((*size, bin));
        }
        self.route_past(from + 1, bytes)
    }

    /// The rest of [`route`](Self::route): the first bin from `from` on that is at least
    /// `bytes` (several bins share the request's class).
    #[cold]
    #[inline(never)]
    fn route_past(&self, from: usize, bytes: usize) -> Option<(usize, &B)> {
        let (size, bin) = self.bins.get(from..)?.iter().find(|(s, _)| *s >= bytes)?;
        Some((*size, bin))
    }

    /// The bins by increasing size.
    pub fn bins(&self) -> impl ExactSizeIterator<Item = (usize, &B)> + '_ {
        self.bins.iter().map(|(s, p)| (*s, p))
    }

    /// Whether every block that can be freed now was allocated under this version (no earlier
    /// version handed out anything): then [`route`](Self::route) names the bin of every block.
    #[inline]
    #[must_use]
    pub fn is_only_era(&self) -> bool {
        self.earlier.is_empty()
    }

    /// Whether a request of `bytes` was routed by this version (or sealed it, see
    /// [`BinRoutes::for_allocation`]).
    fn allocated(&self, bytes: usize) -> bool {
        self.allocated.load(Ordering::Acquire) & class_bit(bytes) != 0
    }
}

/// Per bin count, the bins by increasing size, and which versions handed out memory (see the
/// module documentation).
pub struct BinRoutes<B> {
    /// Version 0: no bin.
    zero: Version<B>,
    /// `versions[n - 1]`: the first `n` bins added. Each set once, under `write`, before it is
    /// published; never changed or dropped before the routes are.
    versions: Box<[OnceLock<Version<B>>]>,
    /// Number of versions published (at least 1): the current one is the last.
    published: AtomicUsize,
    /// Serializes insertions; an allocation that finds its version sealed waits on it.
    write: Mutex<()>,
}

impl<B> Default for BinRoutes<B> {
    fn default() -> Self {
        Self::new()
    }
}

/// Why [`BinRoutes::insert`] did not add a bin.
#[derive(Debug, PartialEq, Eq)]
pub enum InsertError<B, E> {
    /// The routes already hold [`BinRoutes::MAX_BINS`] bins.
    Full(B),
    /// The caller's `admit` refused the bin.
    Refused(B, E),
}

impl<B> BinRoutes<B> {
    /// The most bins the routes hold.
    pub const MAX_BINS: usize = MAX_BINS;

    /// Routes without bins.
    #[must_use]
    pub fn new() -> Self {
        Self {
            zero: Version::new(Box::new([]), Box::new([])),
            versions: (0..MAX_BINS).map(|_| OnceLock::new()).collect(),
            published: AtomicUsize::new(1),
            write: Mutex::new(()),
        }
    }

    /// Number of bins.
    #[must_use]
    pub fn len(&self) -> usize {
        self.published.load(Ordering::Acquire).saturating_sub(1)
    }

    /// Whether there is no bin.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The current version: what a free routes by (with its earlier versions, see
    /// [`candidates`](Self::candidates)).
    #[inline]
    #[must_use]
    pub fn current(&self) -> &Version<B> {
        let n = self.published.load(Ordering::Acquire);
        // Set before `published` was raised to `n` (release), so set here.
        match self.version(n.saturating_sub(1)) {
            Some(v) => v,
            None => self.current_slow(),
        }
    }

    /// Version `i` (the first `i` bins), once published.
    #[inline]
    fn version(&self, i: usize) -> Option<&Version<B>> {
        match i.checked_sub(1) {
            None => Some(&self.zero),
            Some(slot) => self.versions.get(slot)?.get(),
        }
    }

    /// [`current`](Self::current) read after the writer's lock (never reached while the
    /// release-acquire publication holds; kept so no path can panic).
    #[cold]
    fn current_slow(&self) -> &Version<B> {
        let _serial = self.write.lock();
        let n = self.published.load(Ordering::Acquire);
        (0..n)
            .rev()
            .find_map(|i| self.version(i))
            .unwrap_or(&self.zero)
    }

    /// The version a request of `bytes` must route by, with its size class marked as
    /// allocated there. Waits (on the writer's lock) while an insertion seals the current
    /// version, then routes by the new one.
    #[inline]
    pub fn for_allocation(&self, bytes: usize) -> &Version<B> {
        let v = self.current();
        let bit = class_bit(bytes);
        // Set bits stay set: one relaxed load on the hot path.
        if v.allocated.load(Ordering::Relaxed) & bit != 0 {
            return v;
        }
        self.mark_slow(v, bit)
    }

    #[cold]
    #[inline(never)]
    fn mark_slow<'a>(&'a self, mut v: &'a Version<B>, bit: u64) -> &'a Version<B> {
        loop {
            let seen = v
                .allocated
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                    (a & SEALED == 0).then_some(a | bit)
                });
            if seen.is_ok() {
                return v;
            }
            // Sealed: an insertion is building the next version under the lock. Wait for it;
            // if it published, route by the new version; if it refused, the seal is gone.
            drop(self.write.lock());
            v = self.current();
        }
    }

    /// The routes a free of `bytes` may have been allocated by: the current version's first,
    /// then each earlier version that allocated a request of `bytes`' size class, with
    /// repeats left in (the caller compares payloads). `None` is the upstream.
    pub fn candidates<'a>(
        &'a self,
        current: &'a Version<B>,
        bytes: usize,
    ) -> impl Iterator<Item = Option<&'a B>> + 'a {
        let earlier = current
            .earlier
            .iter()
            .filter_map(move |&i| self.version(i))
            .filter(move |v| v.allocated(bytes));
        std::iter::once(current)
            .chain(earlier)
            .map(move |v| v.route(bytes).map(|(_, b)| b))
    }

    /// The bins by increasing size.
    pub fn bins(&self) -> impl ExactSizeIterator<Item = (usize, &B)> + '_ {
        self.current().bins()
    }
}

impl<B: Clone> BinRoutes<B> {
    /// Adds a bin of `size` bytes (taken as it is: the caller rounds), published for readers
    /// at once. `Ok(false)` (and `payload` dropped) when a bin of that size exists.
    ///
    /// Before publishing, `admit` sees every route that an earlier version which allocated in
    /// the new bin's size range gave to a request of that range (`None`: the upstream), with
    /// repeats: a free of such a block will have the new bin among its candidates. Refusing
    /// leaves the routes unchanged.
    ///
    /// # Errors
    ///
    /// [`InsertError::Full`] with the payload when the routes hold
    /// [`MAX_BINS`](Self::MAX_BINS) bins; [`InsertError::Refused`] with it and `admit`'s error.
    pub fn insert<E>(
        &self,
        size: usize,
        payload: B,
        admit: impl FnOnce(&B, &mut dyn Iterator<Item = Option<&B>>) -> Result<(), E>,
    ) -> Result<bool, InsertError<B, E>> {
        let _serial = self.write.lock();
        let n = self.published.load(Ordering::Relaxed);
        let current = self.current();
        let at = current.bins.partition_point(|(s, _)| *s < size);
        if current.bins.get(at).is_some_and(|(s, _)| *s == size) {
            return Ok(false);
        }
        if n > MAX_BINS {
            return Err(InsertError::Full(payload));
        }
        // Seal: from here no allocation marks `current`; those that find it sealed wait on
        // `write` (held) and then route by what is current.
        let before = current.allocated.fetch_or(SEALED, Ordering::AcqRel);
        let mut earlier = current.earlier.to_vec();
        if before & !SEALED != 0 {
            earlier.push(n - 1);
        }
        // The new bin serves `lo..=size`: from just above the next smaller bin.
        let lo = match at.checked_sub(1).and_then(|i| current.bins.get(i)) {
            Some((below, _)) => below + 1,
            None => 0,
        };
        let range = class_bits(lo, size);
        let served = earlier
            .iter()
            .filter_map(|&i| self.version(i))
            .filter(|v| v.allocated.load(Ordering::Acquire) & range != 0)
            .flat_map(|v| {
                // Every route of `lo..=size` in `v`: its bins in that range, and the first
                // above it (or the upstream).
                let from = v.bins.partition_point(|(s, _)| *s < lo);
                let to = v.bins.partition_point(|(s, _)| *s < size);
                let above = v.bins.get(to).map(|(_, b)| b);
                v.bins[from..to]
                    .iter()
                    .map(|(_, b)| Some(b))
                    .chain(std::iter::once(above))
            });
        if let Err(e) = admit(&payload, &mut { served }) {
            if before & SEALED == 0 {
                current.allocated.fetch_and(!SEALED, Ordering::AcqRel);
            }
            return Err(InsertError::Refused(payload, e));
        }
        let bins: Box<[(usize, B)]> = current.bins[..at]
            .iter()
            .cloned()
            .chain(std::iter::once((size, payload)))
            .chain(current.bins[at..].iter().cloned())
            .collect();
        let Some(slot) = self.versions.get(n - 1) else {
            return Err(InsertError::Full(payload_of(bins, at)));
        };
        // Writers are serialized and `n` only grows, so the slot is still empty.
        if let Err(version) = slot.set(Version::new(bins, earlier.into_boxed_slice())) {
            return Err(InsertError::Full(payload_of(version.bins, at)));
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

#[cfg(all(test, loom))]
mod loom_tests;

#[cfg(all(test, not(loom)))]
mod tests;
