//! Out-of-memory reports and snapshots of the fixed-size resource (cold paths only).

use crate::diagnostics::build::{self, Piece};
use crate::diagnostics::{OomReport, Snapshot};
use crate::error::MrError;
use crate::fixed_size::resource::FixedSizeMemoryResource;
use crate::resource::DeviceMemoryResource;

impl<U: DeviceMemoryResource> FixedSizeMemoryResource<U> {
    /// `e` with an [`OomReport`] attached when it is out-of-memory and carries none (the
    /// upstream's own report is kept: it refused).
    #[cold]
    #[inline(never)]
    pub(crate) fn with_oom_report(&self, e: MrError) -> MrError {
        if !e.is_out_of_memory() {
            return e;
        }
        let core = &self.inner.core;
        let block_size = self.inner.block_size;
        e.with_oom_report(|requested| {
            let mut report = OomReport {
                resource: "fixed_size_memory_resource",
                reserved: core.pool_size(),
                in_use: core.outstanding().saturating_mul(block_size),
                ..OomReport::new(requested)
            };
            build::free_lists(&mut report, &build::numbered(core.free_lists()));
            if requested > block_size {
                // The block size is the configured maximum of every request.
                report.verdict = crate::diagnostics::Verdict::Limit;
                report
            } else {
                report.classified(false, true)
            }
        })
    }

    /// The chunks with their blocks: handed-out blocks with the bytes requested (rounded to
    /// 256), free blocks with the stream whose list holds them.
    pub(crate) fn diagnostics_snapshot(&self) -> Snapshot {
        let core = &self.inner.core;
        let block_size = self.inner.block_size;
        let mut pieces: Vec<Piece> = core
            .handed_blocks()
            .into_iter()
            .map(|(address, requested)| Piece::handed(address, block_size, requested))
            .collect();
        pieces.extend(build::free_pieces(build::numbered(core.free_lists())));
        let device = core.device().map_or(0, rmm_sys::DeviceId::value);
        Snapshot {
            segments: build::segments(device, &core.chunk_list(), &mut pieces),
            trace: Vec::new(),
        }
    }
}
