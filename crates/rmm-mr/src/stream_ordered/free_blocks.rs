//! What the stream-ordered core asks of a free-list type ([`FreeBlocks`]: the pool's boundary
//! lists, the fixed-size resource's rings) and of its resource's growth ([`Expand`]). The core:
//! `docs/internals/stream-ordered.md`.

use std::fmt;

use crate::error::InvalidFree;
use crate::stream_ordered::pressure::GrowthCause;
use crate::util::cross_thread::Origin;

/// A free-list type the stream-ordered core can drive (RMM's `free_list` / the derived
/// resource's `allocate_from_block` and `free_block`). Implementations are pure bookkeeping.
pub(crate) trait FreeBlocks: Clone + Send + 'static {
    /// What a handed-out block must remember to be freed again (the pool: whether it starts an
    /// upstream chunk).
    type Tag: Copy + Send + Sync + fmt::Debug + 'static;

    /// Removes a block for a request of `size` bytes (a multiple of 256 the resource accepts)
    /// and returns its address; any remainder stays in the list. `None` when nothing fits.
    fn take(&mut self, size: usize) -> Option<(u64, Self::Tag)>;

    /// Whether [`take`](Self::take) would find a block for `size` bytes (the list is left as
    /// it is).
    fn fits(&self, size: usize) -> bool;

    /// Returns a block handed out by [`take`](Self::take) with this `size` and `tag`. On error
    /// the list is unchanged.
    fn put(&mut self, addr: u64, size: usize, tag: Self::Tag) -> Result<(), String>;

    /// [`put`](Self::put) of a block [`take_back`](Self::take_back) has just confirmed and
    /// forgotten: a list may skip checks the record already made (a handed-out block overlaps
    /// no free block). The default is `put`.
    #[inline]
    fn put_released(&mut self, addr: u64, size: usize, tag: Self::Tag) -> Result<(), String> {
        self.put(addr, size, tag)
    }

    /// Adds a whole, fresh upstream chunk. On error the list is unchanged.
    fn add_chunk(&mut self, addr: u64, size: usize) -> Result<(), String>;

    /// Moves every block of `other` into `self`. On error nothing is lost: every block is in
    /// one of the two lists.
    fn absorb(&mut self, other: &mut Self) -> Result<(), String>;

    /// Whether the list holds no block.
    fn is_empty(&self) -> bool;

    /// A thief whose stream has just waited for every block of this list took one for `size`
    /// bytes: moves into `into` (empty) the blocks it may take along for its next requests, so
    /// that a stream whose list ran dry does not steal (and wait) once per allocation. The
    /// default moves nothing: a coalescing list keeps its remainder with its stream.
    fn share_with_thief(&mut self, size: usize, into: &mut Self) {
        let _ = (size, into);
    }

    /// Whether `addr` lies in a free block of this list (to tell a double free from an unknown
    /// pointer).
    fn holds(&self, addr: u64) -> bool;

    /// If the chunk `[addr, addr + size)` is one wholly free block here, removes it.
    fn remove_chunk(&mut self, addr: u64, size: usize) -> bool;

    /// For a free-list type whose chunks coalesce with one another (the VMM pool's, whose
    /// chunks are mapped one after the other into one address range): the bytes of this list's
    /// free block that ends where the resource's memory ends (0 if it holds none), which a chunk
    /// added right after merges with. `None` (the default): chunks never merge, so every new
    /// chunk must serve the request alone.
    fn extendable_tail(&self) -> Option<usize> {
        None
    }

    /// Records in the resource-wide record (shared by every list of the resource) that the
    /// block at `addr`, just taken from one of its lists for a request of `size` bytes, is
    /// handed out, allocated by `origin` (the cross-thread rule, [`crate::util::cross_thread`]).
    /// An error means it already was (an internal inconsistency); the record is then unchanged.
    /// Also puts back what [`take_back`](Self::take_back) removed when the block cannot return
    /// to a list.
    fn hand_out(
        &mut self,
        addr: u64,
        size: usize,
        tag: Self::Tag,
        origin: Origin,
    ) -> Result<(), String>;

    /// Checks in the resource-wide record that the block at `addr` is handed out with `size`
    /// bytes (rounded), forgets it and returns its tag and origin. Of two concurrent calls for
    /// one block, at most one succeeds. On error nothing changes, and the error says why the
    /// free is wrong, or is `None` for "not handed out" (the core then asks the lists whether
    /// `addr` is free: a double free, or else an unknown pointer). A `size` of `usize::MAX`
    /// (never a recorded size) only classifies.
    fn take_back(
        &mut self,
        addr: u64,
        size: usize,
    ) -> Result<(Self::Tag, Origin), Option<InvalidFree>>;

    /// Number of blocks handed out by the resource and the sum of their sizes.
    fn handed_out(&self) -> (usize, usize);

    /// The free blocks of this list, `(address, size)`, in the list's order (tests).
    fn free_blocks(&self) -> Vec<(u64, usize)>;

    /// The blocks handed out by the resource, `(address, rounded size)`, in no order
    /// (snapshots, on their cold path).
    fn handed_blocks(&self) -> Vec<(u64, usize)>;
}

/// What the core asks of its resource's growth (the `expand` closure of
/// [`StreamOrdered::allocate`](crate::stream_ordered::core::StreamOrdered::allocate)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Expand {
    /// Bytes the core holds from its upstream now.
    pub(crate) pool_size: usize,
    /// [`FreeBlocks::extendable_tail`] of the stream's list (0 for chunks that never merge).
    pub(crate) tail: usize,
    /// Why it grows.
    pub(crate) cause: GrowthCause,
}
