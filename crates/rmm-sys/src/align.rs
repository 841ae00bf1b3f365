//! Alignment helpers (RMM's `rmm/aligned.hpp`).
//!
//! Every allocation rmm-rs hands out is at least [`ALLOCATION_ALIGNMENT`]-aligned. The helpers are
//! total: where RMM has a debug assertion (alignment not a power of two) or silently overflows,
//! the checked variants return `None`.

/// The default (and base resource maximum) allocation alignment: 256 bytes, the alignment
/// `cuMemAlloc` guarantees.
#[doc(alias = "rmm::CUDA_ALLOCATION_ALIGNMENT")]
pub const ALLOCATION_ALIGNMENT: usize = 256;

/// `true` when `value` is a non-zero power of two.
#[doc(alias = "rmm::is_pow2")]
#[must_use]
pub const fn is_pow2(value: usize) -> bool {
    value.is_power_of_two()
}

/// Whether `alignment` is a valid alignment at all (a power of two).
#[doc(alias = "rmm::is_supported_alignment")]
#[must_use]
pub const fn is_supported_alignment(alignment: usize) -> bool {
    is_pow2(alignment)
}

/// Whether a base ("leaf") resource can honour `alignment`: a power of two no larger than
/// [`ALLOCATION_ALIGNMENT`]. Larger alignments need an aligned adaptor.
#[doc(alias = "rmm::is_supported_base_resource_alignment")]
#[must_use]
pub const fn is_supported_base_resource_alignment(alignment: usize) -> bool {
    is_pow2(alignment) && alignment <= ALLOCATION_ALIGNMENT
}

/// Rounds `value` up to a multiple of `alignment` (a power of two), or `None` when
/// `alignment` is not a power of two or the result would overflow.
#[must_use]
pub const fn checked_align_up(value: usize, alignment: usize) -> Option<usize> {
    if !is_pow2(alignment) {
        return None;
    }
    match value.checked_add(alignment - 1) {
        Some(v) => Some(v & !(alignment - 1)),
        None => None,
    }
}

/// Rounds `value` up to a multiple of `alignment`.
///
/// `alignment` must be a power of two and the result must fit in `usize`; otherwise the result
/// saturates to the largest multiple of `alignment` (use [`checked_align_up`] to detect that).
#[doc(alias = "rmm::align_up")]
#[must_use]
pub const fn align_up(value: usize, alignment: usize) -> usize {
    match checked_align_up(value, alignment) {
        Some(v) => v,
        None => align_down(usize::MAX, alignment),
    }
}

/// Rounds `value` down to a multiple of `alignment` (a power of two; any other alignment
/// leaves `value` unchanged).
#[doc(alias = "rmm::align_down")]
#[must_use]
pub const fn align_down(value: usize, alignment: usize) -> usize {
    if !is_pow2(alignment) {
        return value;
    }
    value & !(alignment - 1)
}

/// Whether `value` is a multiple of `alignment` (a power of two).
#[doc(alias = "rmm::is_aligned")]
#[must_use]
pub const fn is_aligned(value: usize, alignment: usize) -> bool {
    is_pow2(alignment) && value == align_down(value, alignment)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn powers_of_two() {
        assert!(!is_pow2(0));
        assert!(is_pow2(1));
        assert!(is_pow2(256));
        assert!(!is_pow2(3));
        assert!(!is_pow2(257));
        assert!(is_supported_base_resource_alignment(256));
        assert!(!is_supported_base_resource_alignment(512));
        assert!(!is_supported_base_resource_alignment(0));
        assert!(is_supported_alignment(4096));
    }

    #[test]
    fn rounding() {
        assert_eq!(align_up(0, 256), 0);
        assert_eq!(align_up(1, 256), 256);
        assert_eq!(align_up(256, 256), 256);
        assert_eq!(align_up(257, 256), 512);
        assert_eq!(align_down(511, 256), 256);
        assert!(is_aligned(512, 256));
        assert!(!is_aligned(513, 256));
        assert!(!is_aligned(512, 3));
        assert_eq!(checked_align_up(usize::MAX, 256), None);
        assert_eq!(checked_align_up(10, 3), None);
        assert_eq!(align_up(usize::MAX, 256), usize::MAX - 255);
    }

    proptest! {
        #[test]
        fn align_up_is_smallest_multiple(v in 0usize..(1 << 48), shift in 0u32..20) {
            let a = 1usize << shift;
            let up = align_up(v, a);
            prop_assert!(is_aligned(up, a));
            prop_assert!(up >= v);
            prop_assert!(up - v < a);
            let down = align_down(v, a);
            prop_assert!(is_aligned(down, a));
            prop_assert!(down <= v && v - down < a);
        }
    }
}
