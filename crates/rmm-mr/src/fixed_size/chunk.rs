//! The chunk and error types of the fixed-size bookkeeping: [`Chunk`] (one upstream chunk cut
//! into equally sized blocks), [`FixedSizeError`] and RMM's block-size rule
//! ([`rounded_block_size`]).
//!
//! Which blocks are handed out is recorded by the resource-wide
//! [`BlockLedger`](crate::fixed_size::block_table::BlockLedger); free blocks sit in the plain
//! per-stream FIFOs of the stream-ordered core.
//!
//! Pure bookkeeping: no CUDA calls; addresses are `u64`, sizes `usize`.

use std::fmt;

use rmm_sys::align::{checked_align_up, ALLOCATION_ALIGNMENT};

/// Errors of the fixed-size bookkeeping. The structures are unchanged when one is returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FixedSizeError {
    /// A block size of 0 was requested.
    ZeroBlockSize,
    /// The block size cannot be rounded up to 256 without overflowing.
    BlockSizeOverflow {
        /// The requested block size.
        block_size: usize,
    },
    /// A chunk of zero blocks.
    EmptyChunk {
        /// Its address.
        addr: u64,
    },
    /// `block_size * count` overflows, or the chunk extends past the end of the address space.
    ChunkOverflow {
        /// Chunk address.
        addr: u64,
        /// Block size.
        block_size: usize,
        /// Number of blocks.
        count: usize,
    },
    /// A new chunk overlaps a chunk that is already indexed.
    ChunkOverlap {
        /// The chunk being added.
        chunk: Chunk,
        /// The indexed chunk it overlaps.
        existing: Chunk,
    },
    /// The freed address lies in no known chunk.
    UnknownAddress {
        /// The freed address.
        addr: u64,
    },
    /// The freed address lies inside a chunk but is not the start of one of its blocks.
    Misaligned {
        /// The freed address.
        addr: u64,
        /// The chunk it lies in.
        chunk: Chunk,
    },
    /// The freed address is already free.
    DoubleFree {
        /// The freed address.
        addr: u64,
    },
    /// The block is handed out with another size than the one it is freed with.
    SizeMismatch {
        /// The freed address.
        addr: u64,
        /// The size it was handed out with (rounded up to 256).
        allocated: usize,
        /// The size it is freed with (rounded up to 256).
        freed: usize,
    },
    /// A block already handed out was handed out again (an internal inconsistency).
    HandedOutTwice {
        /// The block's address.
        addr: u64,
    },
}

impl fmt::Display for FixedSizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroBlockSize => f.write_str("fixed-size block size must not be 0"),
            Self::BlockSizeOverflow { block_size } => {
                write!(
                    f,
                    "block size {block_size} cannot be rounded up to 256 bytes"
                )
            }
            Self::EmptyChunk { addr } => write!(f, "chunk at {addr:#x} holds no blocks"),
            Self::ChunkOverflow {
                addr,
                block_size,
                count,
            } => write!(
                f,
                "chunk of {count} blocks of {block_size} bytes at {addr:#x} overflows"
            ),
            Self::ChunkOverlap { chunk, existing } => write!(
                f,
                "chunk [{:#x}, {:#x}) overlaps known chunk [{:#x}, {:#x})",
                chunk.addr,
                chunk.end(),
                existing.addr,
                existing.end()
            ),
            Self::UnknownAddress { addr } => {
                write!(
                    f,
                    "freed address {addr:#x} belongs to no chunk of this resource"
                )
            }
            Self::Misaligned { addr, chunk } => write!(
                f,
                "freed address {addr:#x} is not the start of a {}-byte block of chunk {:#x}",
                chunk.block_size, chunk.addr
            ),
            Self::DoubleFree { addr } => write!(f, "double free of block {addr:#x}"),
            Self::SizeMismatch {
                addr,
                allocated,
                freed,
            } => write!(
                f,
                "block {addr:#x} of {allocated} bytes freed with {freed} bytes"
            ),
            Self::HandedOutTwice { addr } => {
                write!(f, "block {addr:#x} is already handed out")
            }
        }
    }
}

impl std::error::Error for FixedSizeError {}

/// RMM's block size rule: `align_up(block_size, 256)`.
///
/// # Errors
///
/// [`FixedSizeError::ZeroBlockSize`] for 0, [`FixedSizeError::BlockSizeOverflow`] when the
/// rounded size does not fit in `usize`.
pub fn rounded_block_size(block_size: usize) -> Result<usize, FixedSizeError> {
    if block_size == 0 {
        return Err(FixedSizeError::ZeroBlockSize);
    }
    checked_align_up(block_size, ALLOCATION_ALIGNMENT)
        .ok_or(FixedSizeError::BlockSizeOverflow { block_size })
}

/// One upstream chunk cut into `count` blocks of `block_size` bytes starting at `addr`.
///
/// Always valid (non-zero block size and count, no overflow): built only by [`Chunk::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Chunk {
    addr: u64,
    block_size: usize,
    count: usize,
}

impl Chunk {
    /// First address.
    #[must_use]
    pub const fn addr(&self) -> u64 {
        self.addr
    }

    /// Size of every block.
    #[must_use]
    pub const fn block_size(&self) -> usize {
        self.block_size
    }

    /// Number of blocks.
    #[must_use]
    pub const fn count(&self) -> usize {
        self.count
    }

    /// Validates and builds a chunk.
    ///
    /// # Errors
    ///
    /// [`FixedSizeError::ZeroBlockSize`], [`FixedSizeError::EmptyChunk`], or
    /// [`FixedSizeError::ChunkOverflow`] when its size or end overflows.
    pub fn new(addr: u64, block_size: usize, count: usize) -> Result<Self, FixedSizeError> {
        if block_size == 0 {
            return Err(FixedSizeError::ZeroBlockSize);
        }
        if count == 0 {
            return Err(FixedSizeError::EmptyChunk { addr });
        }
        let overflow = FixedSizeError::ChunkOverflow {
            addr,
            block_size,
            count,
        };
        let size = block_size.checked_mul(count).ok_or(overflow)?;
        addr.checked_add(size as u64).ok_or(overflow)?;
        Ok(Self {
            addr,
            block_size,
            count,
        })
    }

    /// Size of the chunk in bytes (`block_size * count`).
    #[must_use]
    pub const fn size(&self) -> usize {
        self.block_size * self.count
    }

    /// One past the last address of the chunk.
    #[must_use]
    pub const fn end(&self) -> u64 {
        self.addr + self.size() as u64
    }

    /// Whether `addr` lies inside the chunk.
    #[must_use]
    pub const fn contains(&self, addr: u64) -> bool {
        self.addr <= addr && addr < self.end()
    }

    /// The index of the block that starts at `addr`, or `None` when `addr` is outside the
    /// chunk or not the start of a block.
    #[must_use]
    pub fn block_index(&self, addr: u64) -> Option<usize> {
        if !self.contains(addr) {
            return None;
        }
        let offset = usize::try_from(addr - self.addr).ok()?;
        (offset % self.block_size == 0).then_some(offset / self.block_size)
    }

    /// The start addresses of the chunk's blocks, in address order.
    pub fn blocks(&self) -> impl ExactSizeIterator<Item = u64> + '_ {
        let step = self.block_size as u64;
        (0..self.count).map(move |i| self.addr + i as u64 * step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_size_rounding() {
        assert_eq!(rounded_block_size(0), Err(FixedSizeError::ZeroBlockSize));
        assert_eq!(rounded_block_size(1), Ok(256));
        assert_eq!(rounded_block_size(256), Ok(256));
        assert_eq!(rounded_block_size(1 << 20), Ok(1 << 20));
        assert_eq!(rounded_block_size(1000), Ok(1024));
        assert_eq!(
            rounded_block_size(usize::MAX),
            Err(FixedSizeError::BlockSizeOverflow {
                block_size: usize::MAX
            })
        );
    }

    #[test]
    fn chunk_validation_and_block_lookup() {
        assert_eq!(Chunk::new(0, 0, 1), Err(FixedSizeError::ZeroBlockSize));
        assert_eq!(
            Chunk::new(8, 256, 0),
            Err(FixedSizeError::EmptyChunk { addr: 8 })
        );
        assert!(matches!(
            Chunk::new(0, usize::MAX, 2),
            Err(FixedSizeError::ChunkOverflow { .. })
        ));
        assert!(matches!(
            Chunk::new(u64::MAX - 100, 256, 1),
            Err(FixedSizeError::ChunkOverflow { .. })
        ));
        let c = Chunk::new(4096, 512, 4).unwrap();
        assert_eq!((c.size(), c.end()), (2048, 6144));
        assert_eq!(c.blocks().collect::<Vec<_>>(), [4096, 4608, 5120, 5632]);
        assert_eq!(c.block_index(5120), Some(2));
        assert_eq!(c.block_index(5121), None);
        assert_eq!(c.block_index(6144), None);
        assert_eq!(c.block_index(4095), None);
    }
}
