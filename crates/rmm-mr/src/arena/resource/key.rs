//! [`ArenaKey`]: which local arena of the resource a stream uses, and the thread serial that
//! names a per-thread arena.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use rmm_stream::CudaStreamView;

use crate::error::MrResult;
use crate::util::cross_thread::Origin;

static NEXT_THREAD_SERIAL: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD_SERIAL: u64 = NEXT_THREAD_SERIAL.fetch_add(1, Ordering::Relaxed);
}

/// A process-unique number for the calling thread (never reused, unlike OS thread ids).
pub(super) fn thread_serial() -> u64 {
    THREAD_SERIAL
        .try_with(|serial| *serial)
        // Thread-local storage is being torn down: a fresh number gives a fresh arena, which
        // defragmentation reclaims.
        .unwrap_or_else(|_| NEXT_THREAD_SERIAL.fetch_add(1, Ordering::Relaxed))
}

/// Which local arena a stream uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum ArenaKey {
    /// The per-thread default stream of the thread with this serial
    /// ([`thread_serial`](thread_serial)).
    Thread(u64),
    /// The legacy default stream (one arena for the whole process).
    Legacy,
    /// Another stream, by its driver id (unique per stream object, never reused).
    Stream(u64),
    /// The superblocks of the arenas of destroyed streams, or of every arena at a
    /// defragmentation, until a reclaim gives them back to the global arena (never in the map,
    /// never allocates: only frees land here).
    Retired,
}

impl ArenaKey {
    /// The key of `stream`. The per-thread default stream and the legacy default stream are
    /// recognised from the view alone, without any CUDA call; only other streams ask the driver
    /// for their id.
    #[inline]
    pub(super) fn of(stream: CudaStreamView<'_>) -> MrResult<Self> {
        if stream.is_per_thread_default() {
            Ok(Self::Thread(thread_serial()))
        } else if stream.is_default() {
            Ok(Self::Legacy)
        } else {
            Ok(Self::Stream(stream.id()?))
        }
    }

    /// The thread whose per-thread default stream this is, if it is one.
    #[inline]
    pub(super) fn thread(self) -> Option<u64> {
        match self {
            Self::Thread(serial) => Some(serial),
            Self::Legacy | Self::Stream(_) | Self::Retired => None,
        }
    }

    /// The [`Origin`] of a block allocated by this key's arena (or by the global arena for
    /// this key's stream).
    #[inline]
    pub(super) fn origin(self) -> Origin {
        match self {
            Self::Thread(serial) => Origin::Thread(serial),
            Self::Legacy | Self::Stream(_) | Self::Retired => Origin::Shared,
        }
    }
}

impl fmt::Display for ArenaKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Thread(serial) => write!(f, "per-thread arena (thread #{serial})"),
            Self::Legacy => f.write_str("legacy default stream arena"),
            Self::Stream(id) => write!(f, "stream arena (stream id {id})"),
            Self::Retired => f.write_str("held superblocks (destroyed streams, defragmentation)"),
        }
    }
}
