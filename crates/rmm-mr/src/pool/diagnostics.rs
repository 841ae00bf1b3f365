//! Out-of-memory reports and snapshots of the pool and the VMM pool (the shared shell,
//! [`Pool`]). Everything here runs on cold paths and reads the stream-ordered core through
//! five narrow calls: `free_lists`, `chunk_list`, `handed_blocks`, `in_use`, `device` (plus
//! `pool_size`).

use crate::diagnostics::build::{self, Piece};
use crate::diagnostics::{OomReport, Snapshot};
use crate::error::{MrError, MrResult};
use crate::pool::engine::{ChunkLayout, Growth, Pool};
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
        if !<G::Layout as ChunkLayout>::HEADS {
            // Chunks mapped one after the other merge (the VMM pool): one segment per run of
            // contiguous chunks (sorted by address), as PyTorch's expandable segments.
            chunks.dedup_by(|next, run| {
                let contiguous = run.0 + run.1 as u64 == next.0;
                if contiguous {
                    run.1 += next.1;
                }
                contiguous
            });
        }
        Ok(Snapshot {
            segments: build::segments(device, &chunks, &mut pieces),
            trace: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use rmm_stream::CudaStreamView;

    use crate::resource::DeviceMemoryResource;
    use crate::testing::HostMockResource;
    use crate::{PoolMemoryResource, VmmPoolMemoryResource, VmmPoolOptions};

    const MIB: usize = 1 << 20;

    /// Three allocations that each need a new chunk, the middle one freed: the pool size and
    /// the sizes of the snapshot's segments.
    fn grown(mr: &dyn DeviceMemoryResource, pool_size: impl Fn() -> usize) -> (usize, Vec<usize>) {
        let s = CudaStreamView::legacy();
        let ptrs: Vec<_> = (0..3)
            .map(|_| mr.allocate(s, 2 * MIB, 256).unwrap())
            .collect();
        // SAFETY: allocated above on `s` with this size, never used.
        unsafe { mr.deallocate(s, ptrs[1], 2 * MIB, 256) }.unwrap();
        let snapshot = mr.snapshot().unwrap();
        let sizes = snapshot.segments.iter().map(|g| g.size).collect();
        assert_eq!(snapshot.reserved_bytes(), pool_size());
        for p in [ptrs[0], ptrs[2]] {
            // SAFETY: as above.
            unsafe { mr.deallocate(s, p, 2 * MIB, 256) }.unwrap();
        }
        (pool_size(), sizes)
    }

    /// The VMM pool's chunks lie one after the other: one segment for all of them. The
    /// pool's are separate upstream chunks, one segment each, even where the upstream
    /// happened to place them end to end.
    #[test]
    fn contiguous_chunks_are_one_segment_and_separate_ones_are_not() {
        let vmm =
            VmmPoolMemoryResource::simulated(VmmPoolOptions::new(64 * MIB).min_growth_percent(0))
                .unwrap();
        let (size, segments) = grown(&vmm, || vmm.pool_size());
        assert!(vmm.chunk_count() >= 2, "{} chunks", vmm.chunk_count());
        assert_eq!(segments, [size]);
        let pool = PoolMemoryResource::new(HostMockResource::new(), 0).unwrap();
        let (size, segments) = grown(&pool, || pool.pool_size());
        assert!(segments.len() >= 2, "{segments:?}");
        assert_eq!(segments.iter().sum::<usize>(), size);
    }
}
