//! [`TrackingError`] and [`TrackingErrorRecord`]: wrong allocations and frees the registry saw.

use std::fmt;
use std::thread::ThreadId;

/// An address as C++ `ostream << void*` prints it: `0x…`, or `0` for null.
pub(super) struct Addr(pub(super) u64);

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            f.write_str("0")
        } else {
            write!(f, "{:#x}", self.0)
        }
    }
}

/// A bookkeeping error detected by the [`TrackingRegistry`](super::TrackingRegistry).
///
/// RMM's tracking adaptor throws `logic_error` for the first and only logs the others; the
/// registry returns each as an error **and** keeps a bounded record of them
/// ([`TrackingRegistry::errors`](super::TrackingRegistry::errors)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TrackingError {
    /// An allocation returned an address that is already tracked as live (RMM: "pointer is
    /// already tracked"). The existing entry is kept.
    DuplicateAllocation {
        /// The address.
        addr: u64,
        /// Size of the new allocation.
        size: usize,
        /// Size of the live entry.
        tracked_size: usize,
    },
    /// A free of an address that is not live and was not recently freed.
    UntrackedFree {
        /// The address.
        addr: u64,
        /// Size given to the free.
        size: usize,
    },
    /// A free of an address that is not live but was recently freed: a double free.
    DoubleFree {
        /// The address.
        addr: u64,
        /// Size given to this free.
        size: usize,
        /// Size of the earlier, successful free.
        freed_size: usize,
    },
    /// A free of a live address with a size other than the allocated one. The entry was
    /// removed and the **allocated** size was subtracted (as RMM does); callers forward
    /// `allocated` to the upstream.
    SizeMismatch {
        /// The address.
        addr: u64,
        /// Size it was allocated with.
        allocated: usize,
        /// Size given to the free.
        deallocated: usize,
    },
}

impl TrackingError {
    /// The address the error is about.
    pub fn addr(&self) -> u64 {
        match *self {
            TrackingError::DuplicateAllocation { addr, .. }
            | TrackingError::UntrackedFree { addr, .. }
            | TrackingError::DoubleFree { addr, .. }
            | TrackingError::SizeMismatch { addr, .. } => addr,
        }
    }
}

impl fmt::Display for TrackingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TrackingError::DuplicateAllocation {
                addr,
                size,
                tracked_size,
            } => write!(
                f,
                "pointer is already tracked. Ptr: {} [{size}B], tracked with {tracked_size}B",
                Addr(addr)
            ),
            TrackingError::UntrackedFree { addr, size } => write!(
                f,
                "Deallocating a pointer that was not tracked. Ptr: {} [{size}B]",
                Addr(addr)
            ),
            TrackingError::DoubleFree {
                addr,
                size,
                freed_size,
            } => write!(
                f,
                "Double free of a pointer. Ptr: {} [{size}B], already freed with {freed_size}B",
                Addr(addr)
            ),
            TrackingError::SizeMismatch {
                addr,
                allocated,
                deallocated,
            } => write!(
                f,
                "Alloc bytes ({allocated}) and Dealloc bytes ({deallocated}) do not match. Ptr: {}",
                Addr(addr)
            ),
        }
    }
}

impl std::error::Error for TrackingError {}

/// One entry of the registry's error record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackingErrorRecord {
    /// 0-based position among all errors this registry ever saw (gaps at the front mean older
    /// records were dropped).
    pub sequence: u64,
    /// The thread that made the call.
    pub thread: ThreadId,
    /// What went wrong.
    pub error: TrackingError,
}

impl fmt::Display for TrackingErrorRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{} ({:?}): {}", self.sequence, self.thread, self.error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_follow_rmm_wording() {
        let e = TrackingError::UntrackedFree {
            addr: 0x7f00,
            size: 64,
        };
        assert_eq!(
            e.to_string(),
            "Deallocating a pointer that was not tracked. Ptr: 0x7f00 [64B]"
        );
        let e = TrackingError::SizeMismatch {
            addr: 0x100,
            allocated: 10,
            deallocated: 12,
        };
        assert_eq!(
            e.to_string(),
            "Alloc bytes (10) and Dealloc bytes (12) do not match. Ptr: 0x100"
        );
        let e = TrackingError::DuplicateAllocation {
            addr: 0,
            size: 1,
            tracked_size: 2,
        };
        assert!(e
            .to_string()
            .starts_with("pointer is already tracked. Ptr: 0 [1B]"));
        let e = TrackingError::DoubleFree {
            addr: 0xab,
            size: 3,
            freed_size: 3,
        };
        assert_eq!(e.addr(), 0xab);
        assert!(e.to_string().contains("Double free"));
    }
}
