//! Out-of-memory reports and snapshots of the pool and the VMM pool (the shared shell,
//! [`Pool`]). Everything here runs on cold paths and reads the stream-ordered core through
//! five narrow calls: `free_lists`, `chunk_list`, `handed_blocks`, `in_use`, `device` (plus
//! `pool_size`).

use crate::diagnostics::build::{self, Piece};
use crate::diagnostics::{OomReport, Snapshot};
use crate::error::{MrError, MrResult};
use crate::pool::engine::{Growth, Pool};
use rmm_sys::{checked_align_up, ALLOCATION_ALIGNMENT};

impl<G: Growth> Pool<G> {
    /// `e` with an [`OomReport`] attached when it is out-of-memory (the failure path of
    /// `allocate`).
    #[cold]
    #[inline(never)]
    pub(crate) fn with_oom_report(&self, e: MrError) -> MrError {
        if !e.is_out_of_memory() {
            return e;
        }
        e.with_oom_report(|requested| {
            let mut report = OomReport {
                resource: G::NAME,
                reserved: self.core.pool_size(),
                in_use: self.core.in_use(),
                limit: self.growth.release_limit(),
                ..OomReport::new(requested)
            };
            build::free_lists(&mut report, &build::numbered(self.core.free_lists()));
            let rounded = checked_align_up(requested, ALLOCATION_ALIGNMENT).unwrap_or(usize::MAX);
            let limit_hit = report
                .limit
                .is_some_and(|max| report.reserved.saturating_add(rounded) > max);
            report.classified(limit_hit, !limit_hit)
        })
    }

    /// The chunks with their free and handed-out blocks ([`DeviceMemoryResource::snapshot`]
    /// of both resources: never an error).
    ///
    /// [`DeviceMemoryResource::snapshot`]: crate::DeviceMemoryResource::snapshot
    pub(crate) fn snapshot(&self) -> MrResult<Snapshot> {
        let device = self.core.device().map_or(0, rmm_sys::DeviceId::value);
        let mut pieces: Vec<Piece> = self
            .core
            .handed_blocks()
            .into_iter()
            .map(|(address, size)| Piece::handed(address, size, size))
            .collect();
        pieces.extend(build::free_pieces(build::numbered(self.core.free_lists())));
        let mut chunks = self.core.chunk_list();
        if self.growth.mapped_end().is_some() {
            // Chunks mapped one after the other merge (the VMM pool): one segment per run of
            // contiguous chunks, as PyTorch's expandable segments.
            chunks = merge_contiguous(chunks);
        }
        Ok(Snapshot {
            segments: build::segments(device, &chunks, &mut pieces),
            trace: Vec::new(),
        })
    }
}

/// `chunks` (sorted by address) with each run of contiguous ones made one.
fn merge_contiguous(chunks: Vec<(u64, usize)>) -> Vec<(u64, usize)> {
    let mut out: Vec<(u64, usize)> = Vec::with_capacity(chunks.len());
    for (addr, size) in chunks {
        match out.last_mut() {
            Some(last) if last.0 + last.1 as u64 == addr => last.1 += size,
            _ => out.push((addr, size)),
        }
    }
    out
}
