//! The snapshot data model: segments, blocks and a trace of events.
//!
//! Every type derives `Default`: outside this crate build values with struct update syntax
//! (`..Default::default()`), as fields may be added.

/// One frame of a call stack, as PyTorch's snapshots name them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Frame {
    /// The function.
    pub name: String,
    /// The source file, or the module where no file is known.
    pub filename: String,
    /// The line, 0 where unknown.
    pub line: u32,
}

/// One block of a [`Segment`]: a piece handed out (`allocated`) or free.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlockRecord {
    /// The block's address.
    pub address: u64,
    /// The block's size, as the resource carved it (rounded).
    pub size: usize,
    /// The bytes the caller asked for, where known (else `size`); 0 for free blocks.
    pub requested: usize,
    /// Handed out and not yet freed.
    pub allocated: bool,
    /// The stream the block belongs to (a free block's list, an allocation's stream), as the
    /// raw stream handle; 0 for the default stream.
    pub stream: u64,
    /// Where it was allocated, where a history recorded it; empty otherwise.
    pub frames: Vec<Frame>,
}

/// One piece of memory a resource holds from its upstream (a pool's chunk, an arena's
/// superblock), with the blocks it is cut into.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Segment {
    /// The device (ordinal).
    pub device: i32,
    /// The segment's address.
    pub address: u64,
    /// The segment's size in bytes.
    pub size: usize,
    /// The stream the segment was taken for (0: the default stream, or none in particular).
    pub stream: u64,
    /// The blocks, in address order. They need not cover the segment: the writers fill gaps
    /// with free blocks.
    pub blocks: Vec<BlockRecord>,
}

impl Segment {
    /// The bytes of the segment's allocated blocks.
    #[must_use]
    pub fn allocated_bytes(&self) -> usize {
        self.blocks
            .iter()
            .filter(|b| b.allocated)
            .map(|b| b.size)
            .sum()
    }
}

/// What a [`TraceEvent`] records; the names are PyTorch's trace actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TraceAction {
    /// An allocation succeeded (`alloc`).
    #[default]
    Alloc,
    /// The caller freed a block (`free_requested`).
    FreeRequested,
    /// The block is reusable (`free_completed`); immediately after `FreeRequested` for
    /// stream-ordered resources.
    FreeCompleted,
    /// The resource took a segment from its upstream (`segment_alloc`).
    SegmentAlloc,
    /// The resource gave a segment back (`segment_free`).
    SegmentFree,
    /// A request failed with out-of-memory (`oom`).
    Oom,
}

impl TraceAction {
    /// PyTorch's name of the action (`alloc`, `free_requested`, `free_completed`,
    /// `segment_alloc`, `segment_free`, `oom`).
    #[must_use]
    pub fn torch_name(self) -> &'static str {
        match self {
            Self::Alloc => "alloc",
            Self::FreeRequested => "free_requested",
            Self::FreeCompleted => "free_completed",
            Self::SegmentAlloc => "segment_alloc",
            Self::SegmentFree => "segment_free",
            Self::Oom => "oom",
        }
    }

    /// The action of PyTorch's `name`, or `None` for one this model does not have.
    #[must_use]
    pub fn from_torch_name(name: &str) -> Option<Self> {
        Some(match name {
            "alloc" => Self::Alloc,
            "free_requested" => Self::FreeRequested,
            "free_completed" => Self::FreeCompleted,
            "segment_alloc" => Self::SegmentAlloc,
            "segment_free" => Self::SegmentFree,
            "oom" => Self::Oom,
            _ => return None,
        })
    }
}

/// One event of a snapshot's trace.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TraceEvent {
    /// What happened.
    pub action: TraceAction,
    /// The block's (or segment's) address; 0 for [`TraceAction::Oom`].
    pub address: u64,
    /// The bytes (requested for `Alloc` and `Oom`; the block's size for frees).
    pub size: usize,
    /// The stream, as the raw stream handle; 0 for the default stream.
    pub stream: u64,
    /// Microseconds since the Unix epoch.
    pub time_us: u64,
    /// The call stack, innermost first, where recorded; empty otherwise.
    pub frames: Vec<Frame>,
    /// The device (ordinal).
    pub device: i32,
    /// For [`TraceAction::Oom`]: the free bytes the refusing resource reported (PyTorch's
    /// `device_free`); 0 otherwise.
    pub device_free: usize,
}

/// A resource's state: its segments with their blocks, and a trace of recent events
/// (empty unless a history recorded one). See [`crate::DeviceMemoryResource::snapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// The segments (upstream chunks), in address order.
    pub segments: Vec<Segment>,
    /// The events, oldest first.
    pub trace: Vec<TraceEvent>,
}

impl Snapshot {
    /// The bytes of all segments (PyTorch's "reserved").
    #[must_use]
    pub fn reserved_bytes(&self) -> usize {
        self.segments.iter().map(|s| s.size).sum()
    }

    /// The bytes of all allocated blocks.
    #[must_use]
    pub fn allocated_bytes(&self) -> usize {
        self.segments.iter().map(Segment::allocated_bytes).sum()
    }

    /// The number of allocated blocks.
    #[must_use]
    pub fn allocated_blocks(&self) -> usize {
        self.segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.allocated)
            .count()
    }
}
