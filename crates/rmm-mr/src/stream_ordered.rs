//! The stream-ordered core shared by the pool and the fixed-size resource (RMM's
//! `stream_ordered_memory_resource`): per-stream free lists, the event rule, the record of
//! handed-out blocks and the registry of which key owns which slot of the lists' storage.

pub(crate) mod core;
pub(crate) mod event_policy;
pub(crate) mod free_blocks;
pub(crate) mod patience;
pub(crate) mod pressure;
pub(crate) mod slot_table;
pub(crate) mod stream_lists;
pub(crate) mod tuning;

use rmm_stream::CudaStreamView;
use rmm_sys::{DevicePtr, ALLOCATION_ALIGNMENT};

use crate::error::MrResult;
use crate::resource::DeviceMemoryResource;
use crate::util::alignment;

/// [`check_chunk`](alignment::check_chunk) for a chunk `upstream` just allocated on `stream`
/// with `size` bytes and alignment 256; a refused chunk goes back to `upstream` at once, so
/// nothing leaks.
///
/// # Safety
/// `chunk` was just returned by `upstream.allocate(stream, size, 256)` and not handed out.
pub(crate) unsafe fn accept_chunk<U: DeviceMemoryResource + ?Sized>(
    upstream: &U,
    stream: CudaStreamView<'_>,
    chunk: DevicePtr,
    size: usize,
    who: &str,
) -> MrResult<DevicePtr> {
    let Err(refused) = alignment::check_chunk(chunk, who) else {
        return Ok(chunk);
    };
    // SAFETY: the caller's contract: the chunk is the upstream's, unused, with these arguments.
    if let Err(e) = unsafe { upstream.deallocate(stream, chunk, size, ALLOCATION_ALIGNMENT) } {
        log::error!("rmm: {who} could not give a refused upstream chunk back: {e}");
    }
    Err(refused)
}
