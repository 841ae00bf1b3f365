//! Size rounding: plain 256-byte alignment (RMM's default) and RMM's optional jemalloc-like size
//! classes (`RMM_ARENA_USE_SIZE_CLASSES`).

/// Every arena size and address is a multiple of this (RMM's `CUDA_ALLOCATION_ALIGNMENT`).
pub(crate) const ALLOCATION_ALIGNMENT: usize = 256;

/// The largest size class; bigger requests have no class (RMM maps them to `SIZE_MAX`, which no
/// arena can serve).
pub(crate) const MAX_SIZE_CLASS: u64 = 256 << 30;

/// Round `size` up to a multiple of `ALLOCATION_ALIGNMENT` (256 bytes); `None` when that overflows.
///
/// `align_up(0) == Some(0)`: a zero-byte request never reaches the arena core (the resource
/// returns null for it first), and the core treats size 0 as "nothing to allocate".
pub fn align_up(size: usize) -> Option<usize> {
    Some(size.checked_add(ALLOCATION_ALIGNMENT - 1)? & !(ALLOCATION_ALIGNMENT - 1))
}

/// Round `size` down to a multiple of [`ALLOCATION_ALIGNMENT`] (used for the arena size).
pub(crate) fn align_down(size: usize) -> usize {
    size & !(ALLOCATION_ALIGNMENT - 1)
}

/// Round `size` up to its jemalloc-like size class (RMM's `align_to_size_class`).
///
/// Classes: 256-byte steps up to 2 KiB, then four evenly spaced classes per power of two
/// (2.5, 3, 3.5, 4 KiB; 5, 6, 7, 8 KiB; ...) up to 256 GiB. Sizes above 256 GiB have no class:
/// `None` (RMM returns `SIZE_MAX`, an allocation that then fails). Size 0 maps to the first
/// class, 256, as in RMM.
///
/// Every class is a multiple of 256, so the core's own 256-byte rounding leaves it unchanged.
///
/// One deliberate difference: RMM's table lists 54 KiB between 48 KiB and 64 KiB, a typo for
/// jemalloc's 56 KiB (the other classes of that group are 8 KiB apart); this function gives
/// 56 KiB.
#[doc(alias = "rmm::mr::detail::arena::align_to_size_class")]
pub fn align_to_size_class(size: usize) -> Option<usize> {
    const SMALL_LIMIT: usize = 2048;
    if size <= SMALL_LIMIT {
        return align_up(size.max(1));
    }
    if size as u64 > MAX_SIZE_CLASS {
        return None;
    }
    // The group of `size` is (p, 2p] where p is the largest power of two below `size`; its four
    // classes are p/4 apart.
    let group_base = 1usize << (usize::BITS - 1 - (size - 1).leading_zeros());
    let spacing = group_base / 4;
    size.checked_add(spacing - 1).map(|s| s & !(spacing - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: usize = 1 << 10;
    const MIB: usize = 1 << 20;
    const GIB: usize = 1 << 30;

    #[test]
    fn align_up_and_down() {
        assert_eq!(align_up(0), Some(0));
        assert_eq!(align_up(1), Some(256));
        assert_eq!(align_up(256), Some(256));
        assert_eq!(align_up(257), Some(512));
        assert_eq!(align_up(usize::MAX), None);
        assert_eq!(align_up(usize::MAX - 255), Some(usize::MAX - 255));
        assert_eq!(align_down(511), 256);
        assert_eq!(align_down(255), 0);
    }

    /// RMM `ArenaTest.AlignToSizeClass`.
    #[test]
    fn rmm_align_to_size_class_cases() {
        assert_eq!(align_to_size_class(8), Some(256));
        assert_eq!(align_to_size_class(256), Some(256));
        assert_eq!(align_to_size_class(264), Some(512));
        assert_eq!(align_to_size_class(512), Some(512));
        assert_eq!(align_to_size_class(17 * KIB), Some(20 * KIB));
        assert_eq!(align_to_size_class(13 * MIB), Some(14 * MIB));
        assert_eq!(align_to_size_class(2500 * MIB), Some(2560 * MIB));
        assert_eq!(align_to_size_class(128 * GIB), Some(128 * GIB));
        assert_eq!(align_to_size_class(1 << 50), None);
    }

    #[test]
    fn size_class_table_matches_the_jemalloc_layout() {
        // Enumerate every class by feeding each class + 1 back in, as RMM's 117-entry table.
        let mut classes = vec![];
        let mut next = 1usize;
        while let Some(class) = align_to_size_class(next) {
            classes.push(class);
            next = class + 1;
        }
        assert_eq!(classes.len(), 116, "116 classes + RMM's SIZE_MAX catch-all");
        assert_eq!(
            &classes[..9],
            &[256, 512, 768, 1024, 1280, 1536, 1792, 2048, 2560]
        );
        assert!(classes.contains(&(56 * KIB)));
        assert!(!classes.contains(&(54 * KIB)));
        assert_eq!(*classes.last().unwrap_or(&0), 256 * GIB);
        for pair in classes.windows(2) {
            assert!(pair[0] < pair[1]);
            assert_eq!(pair[1] % ALLOCATION_ALIGNMENT, 0);
        }
        // Every size maps to the smallest class that holds it.
        for size in [
            1,
            2047,
            2049,
            4095,
            4097,
            49 * KIB,
            1536 * KIB + 1,
            3 * GIB - 1,
        ] {
            let class = align_to_size_class(size).unwrap_or(0);
            let pos = classes.iter().position(|c| *c == class).unwrap_or(0);
            assert!(class >= size);
            assert!(pos == 0 || classes[pos - 1] < size, "{size} -> {class}");
        }
    }
}
