//! The binning resource's bin sizes: RMM's rounding ([`rounded_bin_size`]) and exponent rule
//! ([`exponent_sizes`]), and, for tests, `BinTable`: RMM's `std::map<size_t, resource_ref>`
//! (a request goes to the smallest bin at least its size, RMM's `lower_bound`, and to the
//! upstream when none is large enough), the model the lock-free routes are checked against.
//! Design: `docs/internals/binning.md`.
//!
//! Pure bookkeeping: no CUDA calls.

#[cfg(test)]
use std::collections::BTreeMap;
use std::fmt;

use rmm_sys::align::{checked_align_up, ALLOCATION_ALIGNMENT};

/// Errors of the bin table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinningError {
    /// `min_exponent > max_exponent`.
    ExponentOrder {
        /// The smallest exponent.
        min: u32,
        /// The largest exponent.
        max: u32,
    },
    /// The largest exponent does not give a bin size that fits in `usize` (`1 << max`).
    ExponentTooLarge {
        /// The rejected exponent.
        max: u32,
    },
    /// The bin size cannot be rounded up to 256 without overflowing.
    BinSizeOverflow {
        /// The requested bin size.
        size: usize,
    },
}

impl fmt::Display for BinningError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ExponentOrder { min, max } => write!(
                f,
                "minimum bin size exponent {min} exceeds the maximum exponent {max}"
            ),
            Self::ExponentTooLarge { max } => write!(
                f,
                "bin size exponent {max} is too large (must be below {})",
                usize::BITS
            ),
            Self::BinSizeOverflow { size } => {
                write!(f, "bin size {size} cannot be rounded up to 256 bytes")
            }
        }
    }
}

impl std::error::Error for BinningError {}

/// RMM's bin size rule: `align_up(size, 256)` (0 stays 0).
///
/// # Errors
///
/// [`BinningError::BinSizeOverflow`] when the rounded size does not fit in `usize`.
pub fn rounded_bin_size(size: usize) -> Result<usize, BinningError> {
    checked_align_up(size, ALLOCATION_ALIGNMENT).ok_or(BinningError::BinSizeOverflow { size })
}

/// The bin sizes of RMM's `binning_memory_resource(upstream, min_exponent, max_exponent)`:
/// `1 << i` for `i` in `min..=max`, before rounding (so exponents below 8 all end up in the
/// 256-byte bin).
///
/// # Errors
///
/// [`BinningError::ExponentOrder`] when `min > max`, [`BinningError::ExponentTooLarge`] when
/// `max >= usize::BITS`.
pub fn exponent_sizes(min: u32, max: u32) -> Result<Vec<usize>, BinningError> {
    if min > max {
        return Err(BinningError::ExponentOrder { min, max });
    }
    if max >= usize::BITS {
        return Err(BinningError::ExponentTooLarge { max });
    }
    Ok((min..=max).map(|i| 1usize << i).collect())
}

/// Bins by size, routing each request to the smallest bin that fits: the model the lock-free
/// routes are tested against.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BinTable<B> {
    bins: BTreeMap<usize, B>,
}

#[cfg(test)]
impl<B> Default for BinTable<B> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
impl<B> BinTable<B> {
    /// A table without bins (everything routes to the upstream).
    #[must_use]
    pub(crate) const fn new() -> Self {
        Self {
            bins: BTreeMap::new(),
        }
    }

    /// A table with one bin per size `1 << i`, `i` in `min..=max` (see [`exponent_sizes`]),
    /// each payload made by `make(rounded_size)`; sizes that round to an existing bin are made
    /// once.
    ///
    /// # Errors
    ///
    /// Those of [`exponent_sizes`].
    pub(crate) fn from_exponents(
        min: u32,
        max: u32,
        mut make: impl FnMut(usize) -> B,
    ) -> Result<Self, BinningError> {
        let mut table = Self::new();
        for size in exponent_sizes(min, max)? {
            table.add_bin_with(size, |s| Ok::<_, BinningError>(make(s)))?;
        }
        Ok(table)
    }

    /// Number of bins.
    #[must_use]
    pub(crate) fn len(&self) -> usize {
        self.bins.len()
    }

    /// Whether there is no bin.
    #[must_use]
    pub(crate) fn is_empty(&self) -> bool {
        self.bins.is_empty()
    }

    /// Adds a bin for `size` rounded up to 256. An existing bin of that size is kept (and
    /// `payload` dropped), as RMM does. Returns whether the bin was inserted.
    ///
    /// # Errors
    ///
    /// [`BinningError::BinSizeOverflow`] when `size` cannot be rounded.
    #[doc(alias = "rmm::mr::binning_memory_resource::add_bin")]
    pub(crate) fn add_bin(&mut self, size: usize, payload: B) -> Result<bool, BinningError> {
        self.add_bin_with(size, |_| Ok::<_, BinningError>(payload))
    }

    /// Adds a bin for `size` rounded up to 256 whose payload is made by `make(rounded_size)`,
    /// only when no bin of that size exists (RMM creates a fixed-size resource only then).
    /// Returns whether the bin was inserted.
    ///
    /// # Errors
    ///
    /// [`BinningError::BinSizeOverflow`] (converted into `E`), or `make`'s error; the table is
    /// then unchanged.
    pub(crate) fn add_bin_with<E: From<BinningError>>(
        &mut self,
        size: usize,
        make: impl FnOnce(usize) -> Result<B, E>,
    ) -> Result<bool, E> {
        let size = rounded_bin_size(size)?;
        if self.bins.contains_key(&size) {
            return Ok(false);
        }
        let payload = make(size)?;
        self.bins.insert(size, payload);
        Ok(true)
    }

    /// The bin of exactly `size` bytes (after rounding), if any.
    #[must_use]
    pub(crate) fn get(&self, size: usize) -> Option<&B> {
        rounded_bin_size(size).ok().and_then(|s| self.bins.get(&s))
    }

    /// The smallest bin whose size is at least `bytes` (RMM's `lower_bound`), or `None` when
    /// the request belongs to the upstream. A request of 0 bytes routes to the smallest bin.
    #[must_use]
    pub(crate) fn route(&self, bytes: usize) -> Option<(&usize, &B)> {
        self.bins.range(bytes..).next()
    }

    /// The bins in increasing size order.
    pub(crate) fn bins(
        &self,
    ) -> impl DoubleEndedIterator<Item = (&usize, &B)> + ExactSizeIterator + '_ {
        self.bins.iter()
    }

    /// The bin payloads, mutably, in increasing size order.
    pub(crate) fn payloads_mut(
        &mut self,
    ) -> impl DoubleEndedIterator<Item = &mut B> + ExactSizeIterator + '_ {
        self.bins.values_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn add_bin_rounds_and_keeps_existing() {
        let mut t = BinTable::new();
        assert_eq!(t.add_bin(1000, "a"), Ok(true));
        assert_eq!(t.add_bin(1024, "b"), Ok(false));
        assert_eq!(t.add_bin(1, "c"), Ok(true));
        assert_eq!(t.add_bin(0, "zero"), Ok(true));
        assert_eq!(
            t.bins().map(|(s, p)| (*s, *p)).collect::<Vec<_>>(),
            [(0, "zero"), (256, "c"), (1024, "a")]
        );
        assert_eq!(t.get(1000), Some(&"a"));
        assert_eq!(t.get(512), None);
        assert_eq!(
            t.add_bin(usize::MAX, "x"),
            Err(BinningError::BinSizeOverflow { size: usize::MAX })
        );
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn add_bin_with_makes_only_missing_bins() {
        let mut t: BinTable<usize> = BinTable::new();
        let mut made = Vec::new();
        for size in [300, 512, 400, 512] {
            t.add_bin_with(size, |s| {
                made.push(s);
                Ok::<_, BinningError>(s)
            })
            .unwrap();
        }
        assert_eq!(made, [512]);
        #[derive(Debug, PartialEq)]
        enum E {
            Bin(BinningError),
            Upstream,
        }
        impl From<BinningError> for E {
            fn from(e: BinningError) -> Self {
                E::Bin(e)
            }
        }
        assert_eq!(t.add_bin_with(4096, |_| Err(E::Upstream)), Err(E::Upstream));
        assert_eq!(t.len(), 1);
        assert!(matches!(
            t.add_bin_with(usize::MAX, |_| Ok::<usize, E>(0)),
            Err(E::Bin(_))
        ));
        for p in t.payloads_mut() {
            *p += 1;
        }
        assert_eq!(t.get(512), Some(&513));
    }

    #[test]
    fn routing_is_lower_bound() {
        let t = BinTable::from_exponents(18, 22, |s| s).unwrap();
        assert_eq!(
            t.bins().map(|(s, _)| *s).collect::<Vec<_>>(),
            [1 << 18, 1 << 19, 1 << 20, 1 << 21, 1 << 22]
        );
        assert_eq!(t.route(0).map(|(s, _)| *s), Some(1 << 18));
        assert_eq!(t.route(1).map(|(s, _)| *s), Some(1 << 18));
        assert_eq!(t.route(1 << 18).map(|(s, _)| *s), Some(1 << 18));
        assert_eq!(t.route((1 << 18) + 1).map(|(s, _)| *s), Some(1 << 19));
        assert_eq!(
            t.route(1 << 22).map(|(s, p)| (*s, *p)),
            Some((1 << 22, 1 << 22))
        );
        assert_eq!(t.route((1 << 22) + 1), None);
        let empty: BinTable<()> = BinTable::default();
        assert!(empty.is_empty());
        assert_eq!(empty.route(0), None);
    }

    #[test]
    fn exponents() {
        assert_eq!(exponent_sizes(3, 5), Ok(vec![8, 16, 32]));
        assert_eq!(
            exponent_sizes(5, 3),
            Err(BinningError::ExponentOrder { min: 5, max: 3 })
        );
        assert_eq!(
            exponent_sizes(0, usize::BITS),
            Err(BinningError::ExponentTooLarge { max: usize::BITS })
        );
        assert_eq!(exponent_sizes(63, 63), Ok(vec![1 << 63]));
        // Exponents below 8 share the 256-byte bin.
        let t = BinTable::from_exponents(0, 9, |s| s).unwrap();
        assert_eq!(t.bins().map(|(s, _)| *s).collect::<Vec<_>>(), [256, 512]);
        assert!(BinTable::from_exponents(2, 1, |s| s).is_err());
        assert!(BinningError::ExponentTooLarge { max: 64 }
            .to_string()
            .contains("64"));
    }

    proptest! {
        #[test]
        fn route_matches_linear_scan(
            sizes in proptest::collection::vec(0usize..1 << 24, 0..12),
            requests in proptest::collection::vec(0usize..1 << 25, 1..40),
        ) {
            let mut t = BinTable::new();
            for &s in &sizes {
                t.add_bin(s, s).unwrap();
            }
            let mut rounded: Vec<usize> = sizes.iter().map(|&s| rounded_bin_size(s).unwrap()).collect();
            rounded.sort_unstable();
            rounded.dedup();
            prop_assert_eq!(t.bins().map(|(s, _)| *s).collect::<Vec<_>>(), rounded.clone());
            for r in requests {
                let expected = rounded.iter().copied().filter(|&s| s >= r).min();
                let got = t.route(r);
                prop_assert_eq!(got.map(|(s, _)| *s), expected);
                if let Some((&s, &payload)) = got {
                    // The first payload added for that rounded size is kept.
                    let first = sizes.iter().copied().find(|&x| rounded_bin_size(x).unwrap() == s);
                    prop_assert_eq!(Some(payload), first);
                }
            }
        }
    }
}
