//! [`MemoryEvent`] and [`Action`]: one row of the memory-event log.

use std::fmt;

use super::event_time::EventTime;

/// What a memory-event row records (the `Action` column).
#[doc(alias = "rmm::detail::action")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// A successful allocation: `allocate`.
    Allocate,
    /// An allocation whose upstream failed; its pointer is null: `allocate failure`.
    AllocateFailure,
    /// A deallocation, logged before the upstream frees: `free`.
    Free,
}

impl Action {
    /// The text of the `Action` column.
    pub const fn as_str(self) -> &'static str {
        match self {
            Action::Allocate => "allocate",
            Action::AllocateFailure => "allocate failure",
            Action::Free => "free",
        }
    }

    /// The action named by `text`, exactly as RMM writes it (no case folding, no trimming).
    pub fn from_text(text: &str) -> Option<Action> {
        match text {
            "allocate" => Some(Action::Allocate),
            "allocate failure" => Some(Action::AllocateFailure),
            "free" => Some(Action::Free),
            _ => None,
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of the memory-event CSV that RMM's `logging_resource_adaptor` writes and its replay
/// benchmark reads: `Thread,Time,Action,Pointer,Size,Stream`.
///
/// Addresses and stream handles are raw integers so this module stays free of CUDA types:
/// `pointer` is the device address (`0` for a failed allocation), `stream` the `CUstream`
/// handle value (`0` for the legacy default stream, `2` for the per-thread default stream).
#[doc(alias = "rmm::detail::event")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemoryEvent {
    /// Id of the thread that made the call (RMM prints spdlog's `%t`, the kernel thread id on
    /// Linux; any id that tells threads apart replays the same).
    pub thread: u64,
    /// Time of day of the event.
    pub time: EventTime,
    /// What happened.
    pub action: Action,
    /// The device address allocated or freed; `0` (printed `(nil)`) for a failed allocation.
    pub pointer: u64,
    /// The requested size in bytes (unrounded).
    pub size: usize,
    /// The stream handle the call was ordered on.
    pub stream: u64,
}

impl MemoryEvent {
    /// A successful allocation of `size` bytes at `pointer`.
    pub fn allocate(thread: u64, time: EventTime, pointer: u64, size: usize, stream: u64) -> Self {
        MemoryEvent {
            thread,
            time,
            action: Action::Allocate,
            pointer,
            size,
            stream,
        }
    }

    /// A failed allocation of `size` bytes (null pointer).
    pub fn allocate_failure(thread: u64, time: EventTime, size: usize, stream: u64) -> Self {
        MemoryEvent {
            thread,
            time,
            action: Action::AllocateFailure,
            pointer: 0,
            size,
            stream,
        }
    }

    /// A deallocation of `size` bytes at `pointer`.
    pub fn free(thread: u64, time: EventTime, pointer: u64, size: usize, stream: u64) -> Self {
        MemoryEvent {
            thread,
            time,
            action: Action::Free,
            pointer,
            size,
            stream,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn action_text_round_trips() {
        for a in [Action::Allocate, Action::AllocateFailure, Action::Free] {
            assert_eq!(Action::from_text(a.as_str()), Some(a));
            assert_eq!(a.to_string(), a.as_str());
        }
        assert_eq!(Action::from_text("Allocate"), None);
        assert_eq!(Action::from_text("allocate "), None);
        assert_eq!(Action::from_text("deallocate"), None);
    }

    #[test]
    fn constructors_set_action_and_null_pointer() {
        let t = EventTime::MIDNIGHT;
        assert_eq!(
            MemoryEvent::allocate(1, t, 0x100, 8, 0).action,
            Action::Allocate
        );
        let f = MemoryEvent::allocate_failure(1, t, 8, 2);
        assert_eq!(
            (f.action, f.pointer, f.stream),
            (Action::AllocateFailure, 0, 2)
        );
        assert_eq!(MemoryEvent::free(1, t, 0x100, 8, 0).action, Action::Free);
    }
}
