//! Out-of-memory reports and snapshots of the arena (cold paths only): one segment, the
//! upstream allocation, cut into the global arena's blocks and the blocks of the superblocks
//! its local arenas hold.

use std::sync::Arc;

use super::State;
use crate::arena::resource::{lock, read, ArenaCell};
use crate::diagnostics::{BlockRecord, OomReport, Segment, Snapshot};
use crate::resource::DeviceMemoryResource;

impl<U: DeviceMemoryResource> State<U> {
    fn cells(&self) -> Vec<Arc<ArenaCell>> {
        let mut cells: Vec<Arc<ArenaCell>> = read(&self.arenas).values().cloned().collect();
        cells.extend(lock(&self.holding).iter().cloned());
        cells
    }

    /// What the arena knew when it refused `bytes`.
    #[cold]
    #[inline(never)]
    pub(in crate::arena::resource) fn oom_report(&self, bytes: usize) -> OomReport {
        let (mut free, mut largest) = {
            let global = self.lock_global();
            (global.arena.free_bytes(), global.arena.max_free_size())
        };
        for cell in self.cells() {
            let slot = cell.lock();
            for sb in slot.arena.superblocks() {
                free += sb.total_free_size();
                largest = largest.max(sb.max_free_size());
            }
        }
        OomReport {
            resource: "arena_memory_resource",
            reserved: self.size,
            in_use: self.size.saturating_sub(free),
            free,
            largest_free_block: largest,
            limit: Some(self.size),
            ..OomReport::new(bytes)
        }
        // The arena never grows: a request larger than it is the size it was given.
        .classified(bytes > self.size, false)
    }

    /// The snapshot: one segment with every block the arena knows.
    pub(in crate::arena::resource) fn memory_snapshot(&self) -> Snapshot {
        let mut blocks = Vec::new();
        let record = |b: crate::arena::block::Block, allocated: bool| BlockRecord {
            address: b.addr,
            size: b.size,
            requested: if allocated { b.size } else { 0 },
            allocated,
            stream: 0,
            frames: Vec::new(),
        };
        for cell in self.cells() {
            let slot = cell.lock();
            for sb in slot.arena.superblocks() {
                blocks.extend(sb.blocks().map(|(b, free)| record(b, !free)));
            }
        }
        {
            let global = self.lock_global();
            blocks.extend(global.arena.free_blocks().map(|b| record(b, false)));
            blocks.extend(global.arena.live_blocks().map(|b| record(b, true)));
        }
        blocks.sort_unstable_by_key(|b| b.address);
        let device = rmm_sys::current_device().map_or(0, rmm_sys::DeviceId::value);
        Snapshot {
            segments: vec![Segment {
                device: if self.gpu { device } else { 0 },
                address: self.base.addr(),
                size: self.size,
                stream: 0,
                blocks,
            }],
            trace: Vec::new(),
        }
    }
}
