//! Operation sequences over the sub-allocators (pool, arena, fixed-size, binning) on the host
//! mock, checked against a model of the live blocks.
//!
//! An input is two setup bytes (the resource's sizes, [`Setup::decode`]) followed by operations
//! ([`decode_ops`]): allocations of many sizes (zero, small, around the arena's 1 MiB
//! superblock, several MiB, absurd) on the legacy or the per-thread default stream, frees of
//! live blocks on either stream, wrong frees (double free, wrong size, unknown pointer), null
//! frees, injected upstream failures, for the pool `release_unused` and, for binning, bins added
//! at any point (any number of them, past the 64 the lock-free routes hold: [`Op::AddBin`]).
//! [`check`] builds the resource over a fresh [`HostMockResource`], applies the operations and
//! checks, after each:
//!
//! - a successful allocation is non-null, aligned to 256 bytes (and to the alignment asked,
//!   at most 256) and overlaps no live block; `allocate(0)` is the null pointer;
//! - an allocation fails only with [`MrError::OutOfMemory`], and only where the resource may run
//!   out (a bounded pool, the arena, a fixed-size request above the block size, an absurd size,
//!   an injected upstream failure), or, without a GPU, with the "no device" error of a step
//!   that needs the driver (a pool stealing across streams); a failure changes no count;
//! - every free of a live block succeeds, and the block's memory still holds what was written
//!   into it when it was allocated (so no other block was placed over it), bins added since
//!   its allocation included: the free reaches the resource that allocated the block (every
//!   resource here checks its frees, so a free routed elsewhere is an `InvalidFree`);
//! - a bin added without a resource is accepted; one with a resource is accepted or refused
//!   with [`MrError::InvalidArgument`];
//! - every wrong free is [`MrError::InvalidFree`] naming the pointer and size given, and changes
//!   no count; a free of the null pointer succeeds and changes nothing;
//! - the resource's count of outstanding allocations (pool, fixed-size) matches the model;
//! - `release_unused` (pool) releases exactly the bytes it reports and no live block;
//! - at the end every live block is freed (a pool used on the legacy stream alone must then
//!   release every chunk with `release_unused`: a free block lost from its list would keep its
//!   chunk), the resource is dropped, and the mock has nothing live.
//!
//! The memory is the mock's host memory: the checker writes a few bytes at both ends of every
//! block, so under AddressSanitizer (the fuzz targets' default) a block that strays outside the
//! upstream's memory is caught as well.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use rmm_mr::__internals::arena::align_to_size_class;
use rmm_mr::testing::HostMockResource;
use rmm_mr::ArenaOptions;
use rmm_mr::{
    shared, ArenaMemoryResource, BinningMemoryResource, BinningOptions, DeviceMemoryResource,
    FixedSizeMemoryResource, FixedSizeOptions, MrError, MrResult, PoolMemoryResource, PoolOptions,
};
use rmm_stream::CudaStreamView;
use rmm_sys::{checked_align_up, DevicePtr, ALLOCATION_ALIGNMENT};

use crate::input::Bytes;

/// At most this many operations are decoded from one input.
pub const MAX_OPS: usize = 512;

/// Allocations are skipped (not applied) while the mock holds more than this many bytes, so an
/// unbounded pool or a binning resource's upstream cannot grow past what a fuzzer allows.
pub const LIVE_BYTES_CAP: usize = 32 << 20;

/// Bins are added (not skipped) while the chunks they took from the mock at their creation
/// total at most this many bytes (a fixed-size bin preallocates 128 blocks).
pub const BIN_BYTES_CAP: usize = 256 << 20;

/// The largest size [`Op::AddBin`] adds a bin for.
pub const MAX_ADDED_BIN: usize = 32 * KIB;

/// The smallest size the checker calls absurd: no allocator can serve it (the host mock cannot
/// even describe it as a `Layout`), so it must fail with out-of-memory.
pub const ABSURD_BYTES: usize = isize::MAX as usize + 1;

/// How many freed blocks are remembered as double-free candidates.
const FREED_HISTORY: usize = 64;

/// An address above the x86-64 and AArch64 user address spaces (48 bits), which no
/// allocator hands out.
const FAR_AWAY: u64 = 0x8000_0000_0000;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// The resource under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// [`PoolMemoryResource`].
    Pool,
    /// [`ArenaMemoryResource`].
    Arena,
    /// [`FixedSizeMemoryResource`].
    FixedSize,
    /// [`BinningMemoryResource`] with fixed-size bins.
    Binning,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 4] = [Kind::Pool, Kind::Arena, Kind::FixedSize, Kind::Binning];

    /// The name of its fuzz target (and corpus folder).
    #[must_use]
    pub const fn target(self) -> &'static str {
        match self {
            Kind::Pool => "pool_ops",
            Kind::Arena => "arena_ops",
            Kind::FixedSize => "fixed_size_ops",
            Kind::Binning => "binning_ops",
        }
    }
}

/// The stream an operation is ordered on (both need no CUDA call to name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    /// The legacy default stream.
    Legacy,
    /// The calling thread's per-thread default stream.
    PerThread,
}

impl Stream {
    /// The stream's view.
    #[must_use]
    pub const fn view(self) -> CudaStreamView<'static> {
        match self {
            Stream::Legacy => CudaStreamView::legacy(),
            Stream::PerThread => CudaStreamView::per_thread(),
        }
    }
}

/// A deallocation the resource must reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WrongFree {
    /// Frees again one of the recently freed blocks (`pick` modulo their number), unless a live
    /// block now starts at its address.
    DoubleFree {
        /// Which freed block.
        pick: u16,
    },
    /// Frees a live block (`pick` modulo their number) with a size the resource must reject
    /// (`how` picks among several; sizes the resource would accept are passed over).
    WrongSize {
        /// Which live block.
        pick: u16,
        /// Which wrong size.
        how: u8,
    },
    /// Frees an address no live block starts at: inside a live block, just past one, just
    /// before one, or far away (`how` picks), with that block's size.
    UnknownPointer {
        /// Which live block the address is derived from.
        pick: u16,
        /// How it is derived.
        how: u8,
    },
}

/// One step of a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `allocate(stream, bytes, alignment)`.
    Allocate {
        /// The size asked for.
        bytes: usize,
        /// The alignment asked for: a power of two from 2 to 256.
        alignment: usize,
        /// The stream.
        stream: Stream,
    },
    /// Frees a live block (`pick` modulo their number) with its size, on `stream`.
    Free {
        /// Which live block.
        pick: u16,
        /// The stream (not necessarily the one it was allocated on).
        stream: Stream,
    },
    /// A wrong free, on `stream`.
    WrongFree {
        /// What is wrong with it.
        kind: WrongFree,
        /// The stream.
        stream: Stream,
    },
    /// `deallocate` of the null pointer: succeeds and changes nothing.
    FreeNull {
        /// The stream.
        stream: Stream,
    },
    /// The mock's next `count` (1 to 8) allocations fail with out-of-memory (disarmed after the
    /// next allocation operation).
    FailUpstream {
        /// How many.
        count: u8,
    },
    /// The pool's `release_unused` (nothing for the other resources).
    Maintain,
    /// `add_bin(size, ..)` on a binning resource (skipped for the others), between any two
    /// operations.
    AddBin {
        /// The bin's size (1 to [`MAX_ADDED_BIN`]; the resource rounds it up to 256).
        size: usize,
        /// What serves it.
        resource: BinResource,
    },
}

/// The resource of an added bin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinResource {
    /// None: the binning resource makes a fixed-size resource over its upstream.
    Fixed,
    /// The host mock itself (the binning resource's upstream).
    Upstream,
    /// A fixed-size resource of that block size over the mock, 2 blocks per chunk.
    FixedSize,
}

impl Op {
    /// The stream the operation is ordered on, if it names one.
    #[must_use]
    pub const fn stream(&self) -> Option<Stream> {
        match *self {
            Op::Allocate { stream, .. }
            | Op::Free { stream, .. }
            | Op::WrongFree { stream, .. }
            | Op::FreeNull { stream } => Some(stream),
            Op::FailUpstream { .. } | Op::Maintain | Op::AddBin { .. } => None,
        }
    }
}

/// How the resource under test is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// `PoolMemoryResource::with_options(mock, PoolOptions { initial, maximum })`.
    Pool {
        /// Initial pool size (a multiple of 64 KiB below 4 MiB).
        initial: usize,
        /// Maximum pool size, if any (at most 32 MiB above the initial size).
        maximum: Option<usize>,
    },
    /// `ArenaMemoryResource::with_options(mock, ..)`.
    Arena {
        /// Arena size: 1 to 16 MiB plus up to 25,500 bytes (aligned down by the arena).
        size: usize,
        /// RMM's size classes.
        size_classes: bool,
    },
    /// `FixedSizeMemoryResource::with_options(mock, FixedSizeOptions::new().block_size(block_size).blocks_to_preallocate(blocks))`.
    FixedSize {
        /// Block size (rounded up to 256 by the resource).
        block_size: usize,
        /// Blocks per upstream chunk (1 to 8).
        blocks: usize,
    },
    /// `BinningMemoryResource::with_options(mock, BinningOptions::new().min_size_exponent(min).max_size_exponent(max))`, plus an optional bin of its own
    /// fixed-size resource (2 blocks per chunk).
    Binning {
        /// Smallest bin: `1 << min_exponent` bytes (8 to 11).
        min_exponent: u32,
        /// Largest exponent bin: `1 << max_exponent` bytes (up to 16).
        max_exponent: u32,
        /// An extra bin's size.
        extra_bin: Option<usize>,
    },
}

impl Setup {
    /// The setup of a `kind` resource from two bytes of `b`.
    pub fn decode(kind: Kind, b: &mut Bytes<'_>) -> Setup {
        let (x, y) = (usize::from(b.u8()), usize::from(b.u8()));
        match kind {
            Kind::Pool => {
                let initial = (x % 64) * 64 * KIB;
                let maximum = (y & 1 == 1).then(|| initial + (y >> 1) * 256 * KIB);
                Setup::Pool { initial, maximum }
            }
            Kind::Arena => Setup::Arena {
                size: (1 + x % 16) * MIB + y * 100,
                size_classes: x & 0x80 != 0,
            },
            Kind::FixedSize => {
                const BLOCK_SIZES: [usize; 8] =
                    [1, 256, 300, 1000, 4 * KIB, 64 * KIB, MIB, 3 * MIB];
                Setup::FixedSize {
                    block_size: BLOCK_SIZES[x % 8],
                    blocks: 1 + y % 8,
                }
            }
            Kind::Binning => {
                const EXTRA: [Option<usize>; 4] = [None, Some(3000), Some(200_000), Some(MIB)];
                let min_exponent = 8 + (x % 4) as u32;
                Setup::Binning {
                    min_exponent,
                    max_exponent: min_exponent + ((x >> 2) % 6) as u32,
                    extra_bin: EXTRA[y % 4],
                }
            }
        }
    }

    /// Builds the resource over `mock`.
    ///
    /// # Errors
    ///
    /// The constructor's error (none is expected: every decoded setup is valid).
    pub fn build(&self, mock: HostMockResource) -> MrResult<Box<dyn Subject>> {
        Ok(match *self {
            Setup::Pool { initial, maximum } => {
                let mut options = PoolOptions::new(initial);
                options.maximum_pool_size = maximum;
                Box::new(PoolSubject {
                    pool: PoolMemoryResource::with_options(mock, options)?,
                })
            }
            Setup::Arena { size, size_classes } => Box::new(ArenaSubject {
                arena: ArenaMemoryResource::with_options(
                    mock,
                    ArenaOptions::new()
                        .arena_size(size)
                        .dump_log_on_failure(false)
                        .use_size_classes(size_classes),
                )?,
                size_classes,
            }),
            Setup::FixedSize { block_size, blocks } => Box::new(FixedSizeSubject {
                fixed: FixedSizeMemoryResource::with_options(
                    mock,
                    FixedSizeOptions::new()
                        .block_size(block_size)
                        .blocks_to_preallocate(blocks),
                )?,
            }),
            Setup::Binning {
                min_exponent,
                max_exponent,
                extra_bin,
            } => {
                let mock_of_bins = mock.clone();
                let binning = BinningMemoryResource::with_options(
                    mock.clone(),
                    BinningOptions::new()
                        .min_size_exponent(min_exponent)
                        .max_size_exponent(max_exponent),
                )?;
                if let Some(size) = extra_bin {
                    let bin = FixedSizeMemoryResource::with_options(
                        mock,
                        FixedSizeOptions::new()
                            .block_size(size)
                            .blocks_to_preallocate(2),
                    )?;
                    binning.add_bin(size, Some(shared(bin)))?;
                }
                Box::new(BinningSubject {
                    binning,
                    mock: mock_of_bins,
                })
            }
        })
    }
}

/// Reads operations from `b` until it is exhausted or [`MAX_OPS`] were read.
///
/// Each operation starts with a byte: bits 0-3 the operation, bits 4-6 a parameter (the
/// alignment's exponent minus one for an allocation, the count minus one for an upstream
/// failure, the resource of an added bin), bit 7 the stream (set: per-thread). [`encode_ops`]
/// is the inverse.
pub fn decode_ops(b: &mut Bytes<'_>) -> Vec<Op> {
    let mut ops = Vec::new();
    while !b.is_empty() && ops.len() < MAX_OPS {
        let tag = b.u8();
        let stream = if tag & 0x80 != 0 {
            Stream::PerThread
        } else {
            Stream::Legacy
        };
        let param = (tag >> 4) & 7;
        let op = match tag & 0x0f {
            0..=5 => Op::Allocate {
                bytes: decode_size(b),
                alignment: 2 << param,
                stream,
            },
            6..=8 => Op::Free {
                pick: b.u16(),
                stream,
            },
            9 => Op::AddBin {
                size: 1 + usize::from(b.u16()) % MAX_ADDED_BIN,
                resource: match param % 4 {
                    1 => BinResource::Upstream,
                    2 => BinResource::FixedSize,
                    _ => BinResource::Fixed,
                },
            },
            10 => Op::WrongFree {
                kind: WrongFree::DoubleFree { pick: b.u16() },
                stream,
            },
            11 => Op::WrongFree {
                kind: WrongFree::WrongSize {
                    pick: b.u16(),
                    how: b.u8(),
                },
                stream,
            },
            12 => Op::WrongFree {
                kind: WrongFree::UnknownPointer {
                    pick: b.u16(),
                    how: b.u8(),
                },
                stream,
            },
            13 => Op::FreeNull { stream },
            14 => Op::FailUpstream { count: param + 1 },
            _ => Op::Maintain,
        };
        ops.push(op);
    }
    ops
}

/// A size from a class byte and a 32-bit value (see [`encode_size`] for the classes).
fn decode_size(b: &mut Bytes<'_>) -> usize {
    let class = b.u8();
    let v = b.u32() as usize;
    match class {
        0..=99 => 1 + v % KIB,
        100..=159 => 1 + v % (64 * KIB),
        160..=199 => 1 + v % (MIB + 4 * KIB),
        200..=231 => 1 + v % (4 * MIB),
        232..=243 => 256 * (1 + v % 64),
        244..=249 => 0,
        _ if v & 1 == 1 => usize::MAX - (v >> 1) % 4096,
        _ => ABSURD_BYTES + (v >> 1) % 4096,
    }
}

/// The class byte and value that [`decode_size`] turns into `bytes`, if there are any.
fn encode_size(bytes: usize) -> Option<(u8, u32)> {
    let v = |x: usize| u32::try_from(x).ok();
    match bytes {
        0 => Some((244, 0)),
        1..=KIB => Some((0, v(bytes - 1)?)),
        _ if bytes <= 64 * KIB => Some((100, v(bytes - 1)?)),
        _ if bytes <= MIB + 4 * KIB => Some((160, v(bytes - 1)?)),
        _ if bytes <= 4 * MIB => Some((200, v(bytes - 1)?)),
        _ if bytes >= usize::MAX - 4095 => Some((250, v((usize::MAX - bytes) << 1 | 1)?)),
        _ if (ABSURD_BYTES..ABSURD_BYTES + 4096).contains(&bytes) => {
            Some((250, v((bytes - ABSURD_BYTES) << 1)?))
        }
        _ => None,
    }
}

/// The bytes [`decode_ops`] reads back as `ops`.
///
/// # Errors
///
/// The first operation that cannot be encoded (an allocation size outside the decoder's
/// classes, an alignment that is not a power of two from 2 to 256, a failure count outside 1
/// to 8, a bin size outside 1 to [`MAX_ADDED_BIN`]).
pub fn encode_ops(ops: &[Op]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let stream_bit = |s: Stream| if s == Stream::PerThread { 0x80u8 } else { 0 };
    for op in ops {
        match *op {
            Op::Allocate {
                bytes,
                alignment,
                stream,
            } => {
                let (class, value) =
                    encode_size(bytes).ok_or_else(|| format!("cannot encode {op:?}"))?;
                if !alignment.is_power_of_two() || !(2..=256).contains(&alignment) {
                    return Err(format!("cannot encode {op:?}"));
                }
                let param = (alignment.trailing_zeros() - 1) as u8;
                out.push(stream_bit(stream) | param << 4);
                out.push(class);
                out.extend_from_slice(&value.to_le_bytes());
            }
            Op::Free { pick, stream } => {
                out.push(stream_bit(stream) | 6);
                out.extend_from_slice(&pick.to_le_bytes());
            }
            Op::WrongFree { kind, stream } => match kind {
                WrongFree::DoubleFree { pick } => {
                    out.push(stream_bit(stream) | 10);
                    out.extend_from_slice(&pick.to_le_bytes());
                }
                WrongFree::WrongSize { pick, how } => {
                    out.push(stream_bit(stream) | 11);
                    out.extend_from_slice(&pick.to_le_bytes());
                    out.push(how);
                }
                WrongFree::UnknownPointer { pick, how } => {
                    out.push(stream_bit(stream) | 12);
                    out.extend_from_slice(&pick.to_le_bytes());
                    out.push(how);
                }
            },
            Op::FreeNull { stream } => out.push(stream_bit(stream) | 13),
            Op::FailUpstream { count } => {
                if !(1..=8).contains(&count) {
                    return Err(format!("cannot encode {op:?}"));
                }
                out.push((count - 1) << 4 | 14);
            }
            Op::Maintain => out.push(15),
            Op::AddBin { size, resource } => {
                if !(1..=MAX_ADDED_BIN).contains(&size) {
                    return Err(format!("cannot encode {op:?}"));
                }
                let param: u8 = match resource {
                    BinResource::Fixed => 0,
                    BinResource::Upstream => 1,
                    BinResource::FixedSize => 2,
                };
                out.push(param << 4 | 9);
                out.extend_from_slice(&((size - 1) as u16).to_le_bytes());
            }
        }
    }
    Ok(out)
}

/// A resource under test, with what the checker needs to know of its rules.
pub trait Subject {
    /// The resource.
    fn resource(&self) -> &dyn DeviceMemoryResource;

    /// Whether the resource accepts a free of a block allocated with `allocated` bytes given
    /// `freed` bytes (the same rounded size, or the same route).
    fn same_size(&self, allocated: usize, freed: usize) -> bool;

    /// Whether an allocation of `bytes` may fail with out-of-memory (with the mock's memory
    /// below [`LIVE_BYTES_CAP`] and no injected failure).
    fn may_run_out(&self, bytes: usize) -> bool;

    /// The number of blocks handed out and not freed, where the resource counts them.
    fn outstanding(&self) -> Option<usize> {
        None
    }

    /// The bytes held from the upstream, where the resource says.
    fn pool_size(&self) -> Option<usize> {
        None
    }

    /// Whether an allocation of `bytes` that fails with out-of-memory may first give wholly
    /// free chunks back to the upstream (a pool with a maximum, for a request of at most its
    /// maximum): then the pool size and the mock's bytes may drop together, by whole chunks.
    fn may_give_back_before_failing(&self, _bytes: usize) -> bool {
        false
    }

    /// Whether a free of `bytes` goes straight to the host mock (a binning resource's
    /// requests above its largest bin). The mock knows only the addresses it handed out, so a
    /// wrong free that reaches it is safe only where no upstream allocation can start at the
    /// address (an address the allocator reused after a free, a chunk of a bin); the checker
    /// tries only those there.
    fn to_upstream(&self, _bytes: usize) -> bool {
        false
    }

    /// Once every block is freed, where every operation used the legacy stream: gives back
    /// what the resource can (the pool's `release_unused`, after which it must hold nothing:
    /// a free block lost from the list would keep its chunk). Not asked after several streams
    /// were used: the pool releases only chunks wholly free in one stream's list, and frees on
    /// two streams split a chunk between two lists.
    ///
    /// # Errors
    ///
    /// A description of what is left.
    fn drain(&self) -> Result<(), String> {
        Ok(())
    }

    /// Adds a bin (binning only: `None` elsewhere, and the operation is skipped).
    fn add_bin(&self, _size: usize, _resource: BinResource) -> Option<MrResult<()>> {
        None
    }

    /// Housekeeping that must leave every live block alone (the pool's `release_unused`).
    ///
    /// # Errors
    ///
    /// A description of what went wrong.
    fn maintain(&self) -> Result<(), String> {
        Ok(())
    }
}

/// The same size after rounding up to 256 bytes.
fn same_rounded(allocated: usize, freed: usize) -> bool {
    let round = |b| checked_align_up(b, ALLOCATION_ALIGNMENT);
    round(allocated).is_some() && round(allocated) == round(freed)
}

struct PoolSubject {
    pool: PoolMemoryResource<HostMockResource>,
}

impl Subject for PoolSubject {
    fn resource(&self) -> &dyn DeviceMemoryResource {
        &self.pool
    }
    fn same_size(&self, allocated: usize, freed: usize) -> bool {
        same_rounded(allocated, freed)
    }
    fn may_run_out(&self, _bytes: usize) -> bool {
        self.pool.maximum_pool_size().is_some()
    }
    fn may_give_back_before_failing(&self, bytes: usize) -> bool {
        self.pool.maximum_pool_size().is_some_and(|m| bytes <= m)
    }
    fn outstanding(&self) -> Option<usize> {
        Some(self.pool.outstanding_allocations())
    }
    fn pool_size(&self) -> Option<usize> {
        Some(self.pool.pool_size())
    }
    fn drain(&self) -> Result<(), String> {
        self.maintain()?;
        match self.pool.pool_size() {
            0 => Ok(()),
            left => Err(format!(
                "{left} bytes of chunks left after freeing every block and releasing unused \
                 memory"
            )),
        }
    }
    fn maintain(&self) -> Result<(), String> {
        let before = self.pool.pool_size();
        let released = self
            .pool
            .release_unused()
            .map_err(|e| format!("release_unused failed: {e}"))?;
        let after = self.pool.pool_size();
        if before.checked_sub(released) != Some(after) {
            return Err(format!(
                "release_unused released {released} bytes but the pool went from {before} to \
                 {after} bytes"
            ));
        }
        Ok(())
    }
}

struct ArenaSubject {
    arena: ArenaMemoryResource<HostMockResource>,
    size_classes: bool,
}

impl Subject for ArenaSubject {
    fn resource(&self) -> &dyn DeviceMemoryResource {
        &self.arena
    }
    fn same_size(&self, allocated: usize, freed: usize) -> bool {
        if self.size_classes {
            let a = align_to_size_class(allocated);
            a.is_some() && a == align_to_size_class(freed)
        } else {
            same_rounded(allocated, freed)
        }
    }
    fn may_run_out(&self, _bytes: usize) -> bool {
        true
    }
}

struct FixedSizeSubject {
    fixed: FixedSizeMemoryResource<HostMockResource>,
}

impl Subject for FixedSizeSubject {
    fn resource(&self) -> &dyn DeviceMemoryResource {
        &self.fixed
    }
    fn same_size(&self, allocated: usize, freed: usize) -> bool {
        same_rounded(allocated, freed)
    }
    fn may_run_out(&self, bytes: usize) -> bool {
        bytes > self.fixed.block_size()
    }
    fn outstanding(&self) -> Option<usize> {
        Some(self.fixed.outstanding_allocations())
    }
    fn pool_size(&self) -> Option<usize> {
        Some(self.fixed.pool_size())
    }
}

struct BinningSubject {
    binning: BinningMemoryResource<HostMockResource>,
    /// The upstream, which a bin may be too.
    mock: HostMockResource,
}

impl Subject for BinningSubject {
    fn resource(&self) -> &dyn DeviceMemoryResource {
        &self.binning
    }
    fn same_size(&self, allocated: usize, freed: usize) -> bool {
        match (self.binning.bin_for(allocated), self.binning.bin_for(freed)) {
            // Bins are fixed-size resources: the same bin and the same rounded size.
            (Some(a), Some(b)) => a.is_equal(&*b) && same_rounded(allocated, freed),
            // The upstream is the mock, which wants the exact size.
            (None, None) => allocated == freed,
            _ => false,
        }
    }
    fn may_run_out(&self, _bytes: usize) -> bool {
        false
    }
    fn to_upstream(&self, bytes: usize) -> bool {
        // A bin that is the mock itself is the upstream too.
        self.binning
            .bin_for(bytes)
            .is_none_or(|bin| bin.is_equal(&self.mock))
    }
    fn add_bin(&self, size: usize, resource: BinResource) -> Option<MrResult<()>> {
        let resource = match resource {
            BinResource::Fixed => None,
            BinResource::Upstream => Some(shared(self.mock.clone())),
            BinResource::FixedSize => {
                match FixedSizeMemoryResource::with_options(
                    self.mock.clone(),
                    FixedSizeOptions::new()
                        .block_size(size)
                        .blocks_to_preallocate(2),
                ) {
                    Ok(bin) => Some(shared(bin)),
                    Err(e) => return Some(Err(e)),
                }
            }
        };
        Some(self.binning.add_bin(size, resource))
    }
}

/// What a checked sequence did (to tell a vacuous run from a real one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Operations applied (not skipped).
    pub applied: usize,
    /// Operations skipped: nothing to free, no wrong size or address to try, or the mock above
    /// [`LIVE_BYTES_CAP`].
    pub skipped: usize,
    /// Successful non-empty allocations.
    pub allocations: usize,
    /// Frees of live blocks, the final ones included.
    pub frees: usize,
    /// Wrong frees tried (each rejected).
    pub wrong_frees: usize,
    /// Allocations that failed with out-of-memory.
    pub out_of_memory: usize,
    /// Allocations that failed for want of a GPU (a pool stealing across streams).
    pub no_device: usize,
    /// The most blocks live at once.
    pub max_live: usize,
    /// Bins added by [`Op::AddBin`] (accepted; a size that had a bin counts too).
    pub bins_added: usize,
    /// Bins with a resource that the binning resource refused.
    pub bins_refused: usize,
}

/// A live block of the model.
#[derive(Debug, Clone, Copy)]
struct Block {
    addr: u64,
    bytes: usize,
    alignment: usize,
    tag: u64,
    /// How many bins had been added ([`Checker::bins`]) when it was allocated.
    bins: usize,
    /// Whether it came straight from the mock (the upstream, or a bin that is the mock).
    direct: bool,
}

/// A freed block, remembered for double frees.
#[derive(Debug, Clone, Copy)]
struct Freed {
    addr: u64,
    bytes: usize,
    bins: usize,
    direct: bool,
}

/// The counts a failed call must leave as they were.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Snapshot {
    outstanding: Option<usize>,
    pool_size: Option<usize>,
    mock_live: usize,
    mock_bytes: usize,
}

/// The byte at `offset` of a block tagged `tag`.
fn tag_byte(tag: u64, offset: usize) -> u8 {
    (tag.rotate_left((offset % 64) as u32) as u8) ^ (offset as u8)
}

/// The offsets the checker writes in a block of `bytes`: up to 8 at each end.
fn tag_offsets(bytes: usize) -> impl Iterator<Item = usize> {
    (0..bytes.min(8)).chain(bytes.saturating_sub(8).max(8)..bytes)
}

struct Checker<'a> {
    subject: &'a dyn Subject,
    mock: &'a HostMockResource,
    live: Vec<Block>,
    /// Start address -> size of every live block.
    starts: BTreeMap<u64, usize>,
    freed: VecDeque<Freed>,
    armed: bool,
    /// Bins added so far (accepted or refused: a refusal may have changed nothing, but the
    /// rules below only need to know when the routes may have changed).
    bins: usize,
    /// The mock's bytes taken by added bins at their creation.
    bin_bytes: usize,
    next_tag: u64,
    no_gpu: bool,
    stats: Stats,
}

impl Checker<'_> {
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            outstanding: self.subject.outstanding(),
            pool_size: self.subject.pool_size(),
            mock_live: self.mock.live_allocations(),
            mock_bytes: self.mock.live_bytes(),
        }
    }

    fn apply(&mut self, op: Op) -> Result<(), String> {
        match op {
            Op::Allocate {
                bytes,
                alignment,
                stream,
            } => self.allocate(bytes, alignment, stream),
            Op::Free { pick, stream } => {
                if self.live.is_empty() {
                    self.stats.skipped += 1;
                    return Ok(());
                }
                let i = usize::from(pick) % self.live.len();
                self.free(i, stream)
            }
            Op::WrongFree { kind, stream } => self.wrong_free(kind, stream),
            Op::FreeNull { stream } => {
                let before = self.snapshot();
                // SAFETY: freeing the null pointer is a no-op for every resource.
                let r = unsafe {
                    self.subject
                        .resource()
                        .deallocate(stream.view(), DevicePtr::NULL, 256, 256)
                };
                r.map_err(|e| format!("freeing the null pointer failed: {e}"))?;
                self.unchanged(before, "freeing the null pointer")
            }
            Op::FailUpstream { count } => {
                self.mock.fail_next_allocations(usize::from(count));
                self.armed = true;
                Ok(())
            }
            Op::Maintain => {
                let outstanding = self.subject.outstanding();
                self.subject.maintain()?;
                if self.subject.outstanding() != outstanding {
                    return Err("housekeeping changed the outstanding allocations".into());
                }
                Ok(())
            }
            Op::AddBin { size, resource } => self.add_bin(size, resource),
        }
    }

    fn add_bin(&mut self, size: usize, resource: BinResource) -> Result<(), String> {
        if self.bin_bytes > BIN_BYTES_CAP {
            self.stats.skipped += 1;
            return Ok(());
        }
        let before = self.mock.live_bytes();
        let Some(result) = self.subject.add_bin(size, resource) else {
            self.stats.skipped += 1;
            return Ok(());
        };
        let armed = std::mem::take(&mut self.armed);
        self.mock.fail_next_allocations(0);
        self.bin_bytes += self.mock.live_bytes().saturating_sub(before);
        self.bins += 1;
        let what = format!("add_bin({size}, {resource:?})");
        match result {
            Ok(()) => self.stats.bins_added += 1,
            Err(MrError::InvalidArgument(_)) if resource != BinResource::Fixed => {
                self.stats.bins_refused += 1;
            }
            // A new bin's first chunk may meet an injected upstream failure.
            Err(e) if armed && e.is_out_of_memory() => self.stats.out_of_memory += 1,
            Err(e) => return Err(format!("{what} failed: {e:?}")),
        }
        Ok(())
    }

    /// As [`unchanged`](Self::unchanged), except that the pool may have given chunks back to
    /// the mock: the outstanding blocks stay, and the pool size and the mock's bytes drop
    /// together, with fewer mock allocations.
    fn unchanged_or_given_back(&self, before: Snapshot, what: &str) -> Result<(), String> {
        let after = self.snapshot();
        let given_back = before.mock_bytes.checked_sub(after.mock_bytes);
        let pool_drop = before
            .pool_size
            .zip(after.pool_size)
            .and_then(|(b, a)| b.checked_sub(a));
        if after == before
            || (after.outstanding == before.outstanding
                && after.mock_live < before.mock_live
                && given_back.is_some()
                && given_back == pool_drop)
        {
            Ok(())
        } else {
            Err(format!(
                "{what} changed the counts other than by giving chunks back: {before:?} -> \
                 {after:?}"
            ))
        }
    }

    fn unchanged(&self, before: Snapshot, what: &str) -> Result<(), String> {
        let after = self.snapshot();
        if after == before {
            Ok(())
        } else {
            Err(format!(
                "{what} changed the counts: {before:?} -> {after:?}"
            ))
        }
    }

    fn allocate(&mut self, bytes: usize, alignment: usize, stream: Stream) -> Result<(), String> {
        if bytes != 0
            && bytes < ABSURD_BYTES
            && self.mock.live_bytes().saturating_sub(self.bin_bytes) > LIVE_BYTES_CAP
        {
            self.stats.skipped += 1;
            return Ok(());
        }
        let before = self.snapshot();
        let direct = self.subject.to_upstream(bytes);
        let result = self
            .subject
            .resource()
            .allocate(stream.view(), bytes, alignment);
        let armed = std::mem::take(&mut self.armed);
        self.mock.fail_next_allocations(0);
        let what = format!("allocate({bytes}, alignment {alignment}) on {stream:?}");
        match result {
            Ok(ptr) if bytes == 0 => {
                if !ptr.is_null() {
                    return Err(format!("{what} gave {ptr}, not the null pointer"));
                }
                self.unchanged(before, &what)
            }
            Ok(ptr) => {
                if bytes >= ABSURD_BYTES {
                    return Err(format!("{what} succeeded ({ptr})"));
                }
                if ptr.is_null() {
                    return Err(format!("{what} gave the null pointer"));
                }
                if !ptr.is_aligned(ALLOCATION_ALIGNMENT.max(alignment)) {
                    return Err(format!("{what} gave the misaligned {ptr}"));
                }
                let addr = ptr.addr();
                let end = addr
                    .checked_add(bytes as u64)
                    .ok_or_else(|| format!("{what} gave {ptr}, whose end overflows"))?;
                if let Some((&a, &n)) = self.starts.range(..=addr).next_back() {
                    if a + n as u64 > addr {
                        return Err(format!(
                            "{what} gave {ptr}, overlapping the live block {a:#x} ({n} bytes)"
                        ));
                    }
                }
                if let Some((&a, &n)) = self.starts.range(addr..).next() {
                    if a < end {
                        return Err(format!(
                            "{what} gave {ptr}, overlapping the live block {a:#x} ({n} bytes)"
                        ));
                    }
                }
                if let Some(n) = before.outstanding {
                    let now = self.subject.outstanding();
                    if now != Some(n + 1) {
                        return Err(format!(
                            "{what}: outstanding allocations went from {n} to {now:?}"
                        ));
                    }
                }
                let tag = self.next_tag;
                self.next_tag += 1;
                let p = ptr.as_host_ptr::<u8>();
                for offset in tag_offsets(bytes) {
                    // SAFETY: `[ptr, ptr + bytes)` is host memory (the resource sub-allocates
                    // the mock's host allocations) handed out just now and overlapping no other
                    // live block (checked above).
                    unsafe { p.add(offset).write(tag_byte(tag, offset)) };
                }
                self.live.push(Block {
                    addr,
                    bytes,
                    alignment,
                    tag,
                    bins: self.bins,
                    direct,
                });
                self.starts.insert(addr, bytes);
                self.stats.allocations += 1;
                self.stats.max_live = self.stats.max_live.max(self.live.len());
                Ok(())
            }
            Err(e) if e.is_out_of_memory() => {
                if !(armed || bytes >= ABSURD_BYTES || self.subject.may_run_out(bytes)) {
                    return Err(format!("{what} ran out of memory where it cannot: {e}"));
                }
                self.stats.out_of_memory += 1;
                if self.subject.may_give_back_before_failing(bytes) {
                    self.unchanged_or_given_back(before, &what)
                } else {
                    self.unchanged(before, &what)
                }
            }
            Err(e) if self.no_gpu && e.is_no_device() => {
                self.stats.no_device += 1;
                self.unchanged(before, &what)
            }
            Err(e) => Err(format!("{what} failed, not with out-of-memory: {e:?}")),
        }
    }

    /// Frees `live[i]` with its size on `stream`.
    fn free(&mut self, i: usize, stream: Stream) -> Result<(), String> {
        let block = self.live.swap_remove(i);
        self.starts.remove(&block.addr);
        let ptr = DevicePtr::from_raw(block.addr);
        let p = ptr.as_host_ptr::<u8>();
        for offset in tag_offsets(block.bytes) {
            // SAFETY: the block is live host memory of `block.bytes` bytes (written at
            // allocation).
            let got = unsafe { p.add(offset).read() };
            if got != tag_byte(block.tag, offset) {
                return Err(format!(
                    "the live block {ptr} ({} bytes) was overwritten at offset {offset}",
                    block.bytes
                ));
            }
        }
        let before = self.subject.outstanding();
        // SAFETY: the block was allocated by this resource with this size and alignment and is
        // freed once (it just left the model's live set).
        let r = unsafe {
            self.subject
                .resource()
                .deallocate(stream.view(), ptr, block.bytes, block.alignment)
        };
        r.map_err(|e| {
            format!(
                "freeing the live block {ptr} ({} bytes) on {stream:?} failed: {e}",
                block.bytes
            )
        })?;
        if let Some(n) = before {
            let now = self.subject.outstanding();
            if Some(n) != now.map(|m| m + 1) {
                return Err(format!(
                    "freeing {ptr}: outstanding allocations went from {n} to {now:?}"
                ));
            }
        }
        if self.freed.len() == FREED_HISTORY {
            self.freed.pop_front();
        }
        self.freed.push_back(Freed {
            addr: block.addr,
            bytes: block.bytes,
            bins: block.bins,
            direct: block.direct,
        });
        self.stats.frees += 1;
        Ok(())
    }

    /// The pointer, size and alignment of a wrong free, or `None` when there is none to try.
    fn wrong_free_args(&self, kind: WrongFree) -> Option<(DevicePtr, usize, usize)> {
        let pick = |n: u16, len: usize| (len > 0).then(|| usize::from(n) % len);
        match kind {
            WrongFree::DoubleFree { pick: n } => {
                let f = self.freed[pick(n, self.freed.len())?];
                // Bins added since the block's allocation: only where it came from a bin and
                // its size routes to one (either rejects it, whoever owns the address).
                (!self.starts.contains_key(&f.addr)
                    && !self.subject.to_upstream(f.bytes)
                    && (f.bins == self.bins || !f.direct))
                    .then(|| (DevicePtr::from_raw(f.addr), f.bytes, 256))
            }
            WrongFree::WrongSize { pick: n, how } => {
                let b = self.live[pick(n, self.live.len())?];
                let k = usize::from(how >> 3) + 1;
                let candidates = [
                    b.bytes.checked_add(256 * k),
                    b.bytes.checked_sub(256 * k),
                    b.bytes.checked_mul(2).map(|x| x + 1),
                    Some(b.bytes / 2),
                    Some(usize::MAX),
                    Some(1),
                    b.bytes.checked_add(k),
                ];
                let start = usize::from(how) % candidates.len();
                // Bins added since the block's allocation may have moved its size's route: then
                // only a size that its own bin rejects too (another rounded size), routed to a
                // bin, whatever the resource does with routes that moved.
                let moved = b.bins != self.bins;
                (0..candidates.len())
                    .filter_map(|i| candidates[(start + i) % candidates.len()])
                    .find(|&c| {
                        c != 0
                            && !self.subject.same_size(b.bytes, c)
                            // A block of a bin may start a chunk of the mock's.
                            && (!self.subject.to_upstream(c)
                                || (!moved && self.subject.to_upstream(b.bytes)))
                            && (!moved || (!b.direct && !same_rounded(b.bytes, c)))
                    })
                    .map(|c| (DevicePtr::from_raw(b.addr), c, b.alignment))
            }
            WrongFree::UnknownPointer { pick: n, how } => {
                let (base, bytes) = match pick(n, self.live.len()) {
                    Some(i) => (self.live[i].addr, self.live[i].bytes),
                    None => (FAR_AWAY, 256),
                };
                let k = u64::from(how >> 2);
                // Where the free goes to the mock, only addresses no upstream allocation can
                // start at: inside a block (which is then one of the mock's), or far away.
                let near = !self.subject.to_upstream(bytes);
                let addr = match how & 3 {
                    // Inside the block: 256-aligned where it is long enough, else misaligned.
                    0 if bytes > 256 => base + 256 * (1 + k % ((bytes as u64 - 1) / 256)),
                    0 => base + 1 + k % 255,
                    // Just past its (rounded) end.
                    1 if near => base.checked_add(checked_align_up(bytes, 256)? as u64)?,
                    // Before it.
                    2 if near => base.checked_sub(256 * (1 + k))?,
                    // Far away.
                    _ => FAR_AWAY + 256 * k,
                };
                (addr != 0 && !self.starts.contains_key(&addr))
                    .then(|| (DevicePtr::from_raw(addr), bytes, 256))
            }
        }
    }

    fn wrong_free(&mut self, kind: WrongFree, stream: Stream) -> Result<(), String> {
        let Some((ptr, bytes, alignment)) = self.wrong_free_args(kind) else {
            self.stats.skipped += 1;
            return Ok(());
        };
        let before = self.snapshot();
        // SAFETY: outside the trait's contract on purpose: a wrong free (no live block starts
        // at `ptr`, or it is live with another size), which every resource under test
        // documents as detected without touching memory and reported as `InvalidFree`. The
        // memory involved is the mock's host memory, so even a resource that broke that
        // promise would not reach a device.
        let r = unsafe {
            self.subject
                .resource()
                .deallocate(stream.view(), ptr, bytes, alignment)
        };
        let what = format!("the wrong free {kind:?} free({ptr}, {bytes}) on {stream:?}");
        match r {
            Err(MrError::InvalidFree {
                ptr: p, bytes: b, ..
            }) if p == ptr && b == bytes => {}
            other => return Err(format!("{what} gave {other:?}, not an invalid free")),
        }
        self.stats.wrong_frees += 1;
        self.unchanged(before, &what)
    }
}

/// Applies `ops` to `subject` (built over `mock`), checking every invariant of the
/// [module documentation](self), then frees every live block. The caller drops the subject and
/// checks the mock.
///
/// # Errors
///
/// The first broken invariant, with the operation that broke it.
pub fn run(subject: &dyn Subject, mock: &HostMockResource, ops: &[Op]) -> Result<Stats, String> {
    let mut checker = Checker {
        subject,
        mock,
        live: Vec::new(),
        starts: BTreeMap::new(),
        freed: VecDeque::new(),
        armed: false,
        bins: 0,
        bin_bytes: 0,
        next_tag: 0x5eed_0000_0000_0001,
        no_gpu: rmm_sys::gpu_unavailable_reason().is_some(),
        stats: Stats::default(),
    };
    for (i, &op) in ops.iter().enumerate() {
        let skipped = checker.stats.skipped;
        checker
            .apply(op)
            .map_err(|e| format!("operation {i} ({op:?}): {e}"))?;
        if checker.stats.skipped == skipped {
            checker.stats.applied += 1;
        }
        if let Some(n) = subject.outstanding() {
            if n != checker.live.len() {
                return Err(format!(
                    "after operation {i} ({op:?}): {n} outstanding allocations, {} live blocks",
                    checker.live.len()
                ));
            }
        }
    }
    while !checker.live.is_empty() {
        let last = checker.live.len() - 1;
        checker
            .free(last, Stream::Legacy)
            .map_err(|e| format!("freeing everything at the end: {e}"))?;
    }
    if let Some(n) = subject.outstanding().filter(|&n| n != 0) {
        return Err(format!(
            "{n} allocations outstanding after freeing everything"
        ));
    }
    if ops.iter().all(|op| op.stream() != Some(Stream::PerThread)) {
        subject
            .drain()
            .map_err(|e| format!("after freeing everything: {e}"))?;
    }
    Ok(checker.stats)
}

/// Decodes `data` (setup and operations) for a `kind` resource, builds it over a fresh host
/// mock, [`run`]s the operations, drops the resource and checks that the mock has nothing
/// live.
///
/// # Errors
///
/// The first broken invariant.
pub fn check(kind: Kind, data: &[u8]) -> Result<Stats, String> {
    let mut b = Bytes::new(data);
    let setup = Setup::decode(kind, &mut b);
    let ops = decode_ops(&mut b);
    check_ops(setup, &ops)
}

/// [`check`] for an already decoded setup and operations.
///
/// # Errors
///
/// The first broken invariant.
pub fn check_ops(setup: Setup, ops: &[Op]) -> Result<Stats, String> {
    let mock = HostMockResource::new();
    let subject = setup
        .build(mock.clone())
        .map_err(|e| format!("{setup:?}: the constructor failed: {e}"))?;
    let stats = run(&*subject, &mock, ops).map_err(|e| format!("{setup:?}: {e}"))?;
    drop(subject);
    if mock.live_allocations() != 0 {
        return Err(format!(
            "{setup:?}: {} upstream allocations ({} bytes) live after the resource was dropped",
            mock.live_allocations(),
            mock.live_bytes()
        ));
    }
    Ok(stats)
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} applied, {} skipped; {} allocations, {} frees, {} wrong frees, {} out of \
             memory, {} without a device, at most {} live, {} bins added, {} refused",
            self.applied,
            self.skipped,
            self.allocations,
            self.frees,
            self.wrong_frees,
            self.out_of_memory,
            self.no_device,
            self.max_live,
            self.bins_added,
            self.bins_refused
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::any::Any;
    use std::sync::Mutex;

    /// What a deliberately broken resource gets wrong.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Fault {
        /// Hands out the first block again for every request of at most 256 bytes.
        Overlap,
        /// Answers every wrong free with `Ok`.
        SwallowWrongFrees,
        /// Reports wrong frees as invalid arguments.
        UntypedWrongFrees,
        /// Fails every allocation of 1000 bytes or more with out-of-memory.
        RunsOut,
        /// Fails every allocation of 1000 bytes or more with a bad argument.
        UntypedFailures,
        /// Forgets to free blocks of 512 bytes upstream.
        Leaks,
    }

    /// The host mock with one fault.
    #[derive(Debug)]
    struct Broken {
        mock: HostMockResource,
        fault: Fault,
        first: Mutex<Option<DevicePtr>>,
    }

    // SAFETY: only ever used by these tests, through the checker, on host memory of the mock.
    unsafe impl DeviceMemoryResource for Broken {
        fn allocate(
            &self,
            stream: CudaStreamView<'_>,
            bytes: usize,
            alignment: usize,
        ) -> MrResult<DevicePtr> {
            let mut first = self.first.lock().unwrap();
            match self.fault {
                Fault::Overlap if bytes <= 256 && first.is_some() => return Ok(first.unwrap()),
                Fault::RunsOut if bytes >= 1000 => return Err(MrError::out_of_memory(bytes, "")),
                Fault::UntypedFailures if bytes >= 1000 => {
                    return Err(MrError::invalid_argument("no"))
                }
                _ => {}
            }
            let p = self.mock.allocate(stream, bytes, alignment)?;
            first.get_or_insert(p);
            Ok(p)
        }

        unsafe fn deallocate(
            &self,
            stream: CudaStreamView<'_>,
            ptr: DevicePtr,
            bytes: usize,
            alignment: usize,
        ) -> MrResult<()> {
            if self.fault == Fault::Leaks && bytes == 512 {
                return Ok(());
            }
            // SAFETY: the caller's contract (the mock checks every free).
            match unsafe { self.mock.deallocate(stream, ptr, bytes, alignment) } {
                Err(MrError::InvalidFree { .. }) if self.fault == Fault::SwallowWrongFrees => {
                    Ok(())
                }
                Err(MrError::InvalidFree { .. }) if self.fault == Fault::UntypedWrongFrees => {
                    Err(MrError::invalid_argument("wrong"))
                }
                other => other,
            }
        }

        fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
            std::ptr::addr_eq(self, other)
        }

        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    struct BrokenSubject(Broken);

    impl Subject for BrokenSubject {
        fn resource(&self) -> &dyn DeviceMemoryResource {
            &self.0
        }
        fn same_size(&self, allocated: usize, freed: usize) -> bool {
            allocated == freed
        }
        fn may_run_out(&self, _bytes: usize) -> bool {
            false
        }
    }

    fn run_broken(fault: Fault, ops: &[Op]) -> Result<Stats, String> {
        let mock = HostMockResource::new();
        let subject = BrokenSubject(Broken {
            mock: mock.clone(),
            fault,
            first: Mutex::new(None),
        });
        let stats = run(&subject, &mock, ops)?;
        if mock.live_allocations() != 0 {
            return Err(format!("{} live", mock.live_allocations()));
        }
        Ok(stats)
    }

    fn alloc(bytes: usize) -> Op {
        Op::Allocate {
            bytes,
            alignment: 256,
            stream: Stream::Legacy,
        }
    }

    fn wrong(kind: WrongFree) -> Op {
        Op::WrongFree {
            kind,
            stream: Stream::Legacy,
        }
    }

    fn free(pick: u16) -> Op {
        Op::Free {
            pick,
            stream: Stream::Legacy,
        }
    }

    #[test]
    fn the_checker_passes_the_honest_mock() {
        let ops = [
            alloc(100),
            alloc(5000),
            wrong(WrongFree::WrongSize { pick: 0, how: 0 }),
            wrong(WrongFree::UnknownPointer { pick: 1, how: 0 }),
            free(0),
            wrong(WrongFree::DoubleFree { pick: 0 }),
            Op::FreeNull {
                stream: Stream::PerThread,
            },
        ];
        let stats = run_broken(Fault::Leaks, &ops).unwrap();
        assert_eq!(
            (stats.allocations, stats.frees, stats.wrong_frees),
            (2, 2, 3)
        );
    }

    #[test]
    fn the_checker_catches_overlapping_blocks() {
        let e = run_broken(Fault::Overlap, &[alloc(100), alloc(200)]).unwrap_err();
        assert!(e.contains("overlapping the live block"), "{e}");
    }

    #[test]
    fn the_checker_catches_accepted_wrong_frees() {
        for kind in [
            WrongFree::WrongSize { pick: 0, how: 0 },
            WrongFree::UnknownPointer { pick: 0, how: 3 },
        ] {
            let e = run_broken(Fault::SwallowWrongFrees, &[alloc(300), wrong(kind)]).unwrap_err();
            assert!(e.contains("not an invalid free"), "{e}");
        }
        let e = run_broken(
            Fault::SwallowWrongFrees,
            &[
                alloc(300),
                free(0),
                wrong(WrongFree::DoubleFree { pick: 0 }),
            ],
        )
        .unwrap_err();
        assert!(e.contains("not an invalid free"), "{e}");
    }

    #[test]
    fn the_checker_catches_untyped_wrong_frees() {
        let ops = [alloc(300), wrong(WrongFree::WrongSize { pick: 0, how: 0 })];
        let e = run_broken(Fault::UntypedWrongFrees, &ops).unwrap_err();
        assert!(e.contains("InvalidArgument"), "{e}");
    }

    #[test]
    fn the_checker_catches_out_of_memory_where_it_cannot_happen() {
        let e = run_broken(Fault::RunsOut, &[alloc(2000)]).unwrap_err();
        assert!(e.contains("ran out of memory where it cannot"), "{e}");
        // After an injected upstream failure it may.
        run_broken(
            Fault::RunsOut,
            &[Op::FailUpstream { count: 1 }, alloc(2000)],
        )
        .unwrap();
        let e = run_broken(Fault::UntypedFailures, &[alloc(2000)]).unwrap_err();
        assert!(e.contains("not with out-of-memory"), "{e}");
    }

    #[test]
    fn the_checker_catches_failed_frees_of_live_blocks() {
        // The broken resource drops 512-byte frees; the mock then still holds the block.
        let e = run_broken(Fault::Leaks, &[alloc(512)]).unwrap_err();
        assert_eq!(e, "1 live");
    }

    #[test]
    fn absurd_sizes_round_trip_through_the_encoding() {
        for bytes in [
            0,
            1,
            1024,
            1025,
            65_536,
            1 << 20,
            4 << 20,
            usize::MAX,
            ABSURD_BYTES,
        ] {
            let op = Op::Allocate {
                bytes,
                alignment: 2,
                stream: Stream::PerThread,
            };
            let data = encode_ops(&[op]).unwrap();
            assert_eq!(decode_ops(&mut Bytes::new(&data)), [op]);
        }
        assert!(encode_ops(&[alloc(5 << 20)]).is_err());
    }

    /// A binning resource as issue 27 asks for, built around the real one for these tests: a
    /// free goes to the resource that allocated the block (recorded by address), and only a
    /// free of an address it does not know is routed by size. With it, the late-bin checks
    /// must pass: they demand nothing a correct resource cannot give.
    struct OwnerRouted {
        inner: BinningSubject,
        /// Address -> the bin that allocated it (`None`: the upstream).
        owners: Mutex<std::collections::HashMap<u64, Option<rmm_mr::SharedResource>>>,
    }

    impl std::fmt::Debug for OwnerRouted {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("OwnerRouted")
        }
    }

    // SAFETY: every block it hands out is one of the binning resource's; a free reaches the
    // resource that allocated the block, or the binning resource, which checks it.
    unsafe impl DeviceMemoryResource for OwnerRouted {
        fn allocate(
            &self,
            stream: CudaStreamView<'_>,
            bytes: usize,
            alignment: usize,
        ) -> MrResult<DevicePtr> {
            let owner = self.inner.binning.bin_for(bytes);
            let p = self.inner.binning.allocate(stream, bytes, alignment)?;
            if !p.is_null() {
                self.owners.lock().unwrap().insert(p.addr(), owner);
            }
            Ok(p)
        }

        unsafe fn deallocate(
            &self,
            stream: CudaStreamView<'_>,
            ptr: DevicePtr,
            bytes: usize,
            alignment: usize,
        ) -> MrResult<()> {
            let owner = self.owners.lock().unwrap().get(&ptr.addr()).cloned();
            // SAFETY: the caller's contract; the owner checks the size.
            let r = unsafe {
                match &owner {
                    Some(Some(bin)) => bin.deallocate(stream, ptr, bytes, alignment),
                    Some(None) => self
                        .inner
                        .binning
                        .upstream()
                        .deallocate(stream, ptr, bytes, alignment),
                    None => self.inner.binning.deallocate(stream, ptr, bytes, alignment),
                }
            };
            if r.is_ok() && owner.is_some() {
                self.owners.lock().unwrap().remove(&ptr.addr());
            }
            r
        }

        fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
            std::ptr::addr_eq(self, other)
        }

        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    impl Subject for OwnerRouted {
        fn resource(&self) -> &dyn DeviceMemoryResource {
            self
        }
        fn same_size(&self, allocated: usize, freed: usize) -> bool {
            self.inner.same_size(allocated, freed)
        }
        fn may_run_out(&self, bytes: usize) -> bool {
            self.inner.may_run_out(bytes)
        }
        fn to_upstream(&self, bytes: usize) -> bool {
            self.inner.to_upstream(bytes)
        }
        fn add_bin(&self, size: usize, resource: BinResource) -> Option<MrResult<()>> {
            self.inner.add_bin(size, resource)
        }
    }

    /// [`check`] of binning input `data` on [`OwnerRouted`].
    fn check_owner_routed(data: &[u8]) -> Result<Stats, String> {
        let mut b = Bytes::new(data);
        let setup = Setup::decode(Kind::Binning, &mut b);
        let ops = decode_ops(&mut b);
        let mock = HostMockResource::new();
        let built = setup.build(mock.clone()).unwrap();
        let Some(inner) = built_binning(&*built) else {
            unreachable!()
        };
        let subject = OwnerRouted {
            inner: BinningSubject {
                binning: inner,
                mock: mock.clone(),
            },
            owners: Mutex::default(),
        };
        drop(built);
        let stats = run(&subject, &mock, &ops).map_err(|e| format!("{setup:?}: {e}"))?;
        drop(subject);
        if mock.live_allocations() != 0 {
            return Err(format!("{} live", mock.live_allocations()));
        }
        Ok(stats)
    }

    /// The binning resource a binning setup built (sharing its bins).
    fn built_binning(subject: &dyn Subject) -> Option<BinningMemoryResource<HostMockResource>> {
        subject
            .resource()
            .as_any()
            .downcast_ref::<BinningMemoryResource<HostMockResource>>()
            .cloned()
    }

    fn run_owner_routed(setup_byte: u8, ops: &[Op]) -> Result<Stats, String> {
        let mut data = vec![setup_byte, 0];
        data.extend(encode_ops(ops)?);
        check_owner_routed(&data)
    }

    /// The committed binning seeds (the late-bin one included) pass on it.
    #[test]
    fn the_binning_seeds_pass_on_a_resource_that_frees_to_the_owner() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/binning_ops");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            check_owner_routed(&data).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
        assert!(n >= 5, "{n} seeds");
    }

    #[test]
    fn late_bins_pass_on_a_resource_that_frees_to_the_owner() {
        // The scenario of issue 27, with every kind of bin.
        for resource in [
            BinResource::Fixed,
            BinResource::Upstream,
            BinResource::FixedSize,
        ] {
            let ops = [
                alloc(600),
                Op::AddBin {
                    size: 768,
                    resource,
                },
                free(0),
            ];
            run_owner_routed(0, &ops).unwrap();
        }
        // Random sequences, about a third of them bins added.
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut most, mut wrong) = (0, 0);
        for case in 0..24 {
            let mut data = Vec::new();
            for _ in 0..300 {
                let r = next();
                match r % 8 {
                    0..=2 => data.extend(
                        encode_ops(&[Op::AddBin {
                            size: 1 + (r >> 8) as usize % MAX_ADDED_BIN,
                            resource: [
                                BinResource::Fixed,
                                BinResource::Upstream,
                                BinResource::FixedSize,
                            ][(r >> 40) as usize % 3],
                        }])
                        .unwrap(),
                    ),
                    3 | 4 => data.extend(
                        encode_ops(&[Op::Allocate {
                            bytes: 1 + (r >> 8) as usize % (40 * KIB),
                            alignment: 256,
                            stream: Stream::Legacy,
                        }])
                        .unwrap(),
                    ),
                    _ => data.extend((r >> 8).to_le_bytes().iter().take(4)),
                }
            }
            let ops = decode_ops(&mut Bytes::new(&data));
            let stats = run_owner_routed(case as u8, &ops).unwrap_or_else(|e| panic!("{e}"));
            most = most.max(stats.bins_added);
            wrong += stats.wrong_frees;
        }
        assert!(most > 64, "at most {most} bins added");
        assert!(wrong > 100, "{wrong} wrong frees tried");
    }

    #[test]
    fn every_kind_builds_from_any_setup_bytes() {
        for kind in Kind::ALL {
            for x in (0..=255u8).step_by(17) {
                for y in [0u8, 1, 2, 3, 255] {
                    let setup = Setup::decode(kind, &mut Bytes::new(&[x, y]));
                    check_ops(setup, &[alloc(100), free(0)]).unwrap();
                }
            }
        }
    }
}
