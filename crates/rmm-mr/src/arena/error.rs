//! Typed errors of the arena bookkeeping.

use std::fmt;

/// What went wrong in the arena bookkeeping.
///
/// RMM reports a free of an unknown pointer with `RMM_FAIL("allocation not found")` inside a
/// `noexcept` function, which terminates the process; here every wrong free is a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ArenaError {
    /// The span (after aligning its size down to 256 bytes) is smaller than one superblock
    /// (RMM: `logic_error` "Arena size smaller than minimum superblock size.").
    TooSmall {
        /// The size that was asked for.
        size: usize,
        /// The smallest size accepted ([`SUPERBLOCK_MIN_SIZE`](super::SUPERBLOCK_MIN_SIZE)).
        minimum: usize,
    },
    /// A span whose address or size is not a multiple of 256 bytes, or that wraps around the end
    /// of the address space.
    InvalidSpan {
        /// Start address of the span.
        addr: u64,
        /// Size of the span in bytes.
        size: usize,
    },
    /// No live allocation starts at `addr` (unknown pointer, or a pointer into the middle of an
    /// allocation).
    NotFound {
        /// The address that was freed.
        addr: u64,
        /// The size given with the free.
        size: usize,
    },
    /// The freed range overlaps memory that is already free: the block was freed before.
    DoubleFree {
        /// The address that was freed.
        addr: u64,
        /// The size given with the free.
        size: usize,
    },
    /// A live allocation starts at `addr` but with another (rounded) size. Nothing is freed.
    SizeMismatch {
        /// The address that was freed.
        addr: u64,
        /// The size given with the free.
        size: usize,
        /// The (rounded) size of the allocation at `addr`.
        allocated: usize,
    },
    /// A superblock was handed to an arena that cannot take it: the global arena did not lend
    /// it out (or already got it back), or it overlaps one the local arena already holds.
    ForeignSuperblock {
        /// Start address of the superblock.
        addr: u64,
        /// Size of the superblock.
        size: usize,
    },
}

impl fmt::Display for ArenaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::TooSmall { size, minimum } => write!(
                f,
                "Arena size smaller than minimum superblock size. ({size} B < {minimum} B)"
            ),
            Self::InvalidSpan { addr, size } => write!(
                f,
                "invalid arena span {addr:#x} + {size} B (must be 256-byte aligned and not wrap)"
            ),
            Self::NotFound { addr, size } => {
                write!(f, "allocation not found ({addr:#x}, {size} B)")
            }
            Self::DoubleFree { addr, size } => write!(
                f,
                "double free ({addr:#x}, {size} B overlaps memory that is already free)"
            ),
            Self::SizeMismatch {
                addr,
                size,
                allocated,
            } => write!(
                f,
                "size mismatch freeing {addr:#x}: freed with {size} B, allocated {allocated} B"
            ),
            Self::ForeignSuperblock { addr, size } => write!(
                f,
                "superblock {addr:#x} + {size} B does not belong here (not lent out, \
                 already returned, or overlapping)"
            ),
        }
    }
}

impl std::error::Error for ArenaError {}
