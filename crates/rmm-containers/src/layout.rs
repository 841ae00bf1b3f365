//! Argument checks that need no device: alignments, element counts and indices. Every container
//! runs these before its first CUDA call, so bad input is reported the same way on machines
//! with and without a GPU.

use rmm_mr::{MrError, MrResult};
use rmm_sys::is_supported_alignment;

/// RMM's message for an element index past the end (`rmm::out_of_range`).
pub(crate) const OUT_OF_BOUNDS: &str = "Attempt to access out of bounds element.";

/// A buffer alignment must be a power of two (RMM's `device_buffer` throws
/// `rmm::invalid_argument` otherwise). Whether the resource can honour it is the resource's
/// call (base resources refuse more than 256 bytes with `BadAlloc`).
pub(crate) fn check_alignment(alignment: usize) -> MrResult<()> {
    if is_supported_alignment(alignment) {
        Ok(())
    } else {
        Err(MrError::invalid_argument(format!(
            "Invalid alignment {alignment}: a device_buffer alignment must be a power of two."
        )))
    }
}

/// The byte size of `count` elements of `T`, or `InvalidArgument` when it overflows `usize`
/// (RMM #2451).
pub(crate) fn bytes_for<T>(count: usize) -> MrResult<usize> {
    count.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
        MrError::invalid_argument(format!(
            "Requested number of elements ({count}) of {} bytes each overflows the byte size.",
            std::mem::size_of::<T>()
        ))
    })
}

/// `index` must name an element of a sequence of `len` elements.
pub(crate) fn check_index(index: usize, len: usize) -> MrResult<()> {
    if index < len {
        Ok(())
    } else {
        Err(MrError::OutOfRange(OUT_OF_BOUNDS.to_owned()))
    }
}

/// A host slice of `len` bytes must fit in a buffer of `size` bytes.
pub(crate) fn check_fits(len: usize, size: usize, what: &str) -> MrResult<()> {
    if len <= size {
        Ok(())
    } else {
        Err(MrError::OutOfRange(format!(
            "{what} of {len} bytes does not fit in a buffer of {size} bytes."
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignments_must_be_powers_of_two() {
        for a in [0usize, 3, 6, 255, 257, usize::MAX] {
            assert!(
                matches!(check_alignment(a), Err(MrError::InvalidArgument(_))),
                "{a}"
            );
        }
        for shift in 0..usize::BITS {
            assert!(check_alignment(1usize << shift).is_ok());
        }
    }

    #[test]
    fn byte_sizes_overflow_into_invalid_argument() {
        assert_eq!(bytes_for::<u64>(3).unwrap(), 24);
        assert_eq!(bytes_for::<u8>(usize::MAX).unwrap(), usize::MAX);
        assert!(matches!(
            bytes_for::<u16>(usize::MAX / 2 + 1),
            Err(MrError::InvalidArgument(_))
        ));
        assert_eq!(bytes_for::<u16>(usize::MAX / 2).unwrap(), usize::MAX - 1);
        assert!(matches!(
            bytes_for::<[u8; 3]>(usize::MAX / 3 + 1),
            Err(MrError::InvalidArgument(_))
        ));
    }

    #[test]
    fn indices_are_checked_with_rmm_message() {
        assert!(check_index(0, 1).is_ok());
        assert_eq!(
            check_index(1, 1),
            Err(MrError::OutOfRange(OUT_OF_BOUNDS.to_owned()))
        );
        assert!(check_index(0, 0).is_err());
        assert!(check_fits(4, 4, "x").is_ok());
        assert!(matches!(check_fits(5, 4, "x"), Err(MrError::OutOfRange(_))));
    }
}
