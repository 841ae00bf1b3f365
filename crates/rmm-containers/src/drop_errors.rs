//! The process-wide record of frees that failed where no caller could be told: in `Drop`, and
//! when a resize, reserve or shrink frees the allocation it replaced (RMM's deallocation is
//! `noexcept`; there such failures abort or vanish).
//!
//! Every such failure is logged with `log::error!` and kept here, the most recent
//! [`DROP_ERROR_CAPACITY`] of them; older ones are counted in [`drop_errors_discarded`].
//! Programs and tests read them with [`take_drop_errors`].

use std::collections::VecDeque;
use std::sync::Mutex;

use rmm_mr::MrError;

/// How many failed frees the record keeps (the most recent ones).
pub const DROP_ERROR_CAPACITY: usize = 64;

/// A bounded queue of errors that keeps the newest and counts what it discarded.
#[derive(Debug)]
struct ErrorRecord {
    errors: VecDeque<MrError>,
    capacity: usize,
    discarded: u64,
}

impl ErrorRecord {
    const fn new(capacity: usize) -> Self {
        Self {
            errors: VecDeque::new(),
            capacity,
            discarded: 0,
        }
    }

    fn push(&mut self, error: MrError) {
        if self.capacity == 0 {
            self.discarded += 1;
            return;
        }
        if self.errors.len() == self.capacity {
            self.errors.pop_front();
            self.discarded += 1;
        }
        self.errors.push_back(error);
    }

    fn take(&mut self) -> Vec<MrError> {
        self.errors.drain(..).collect()
    }
}

static RECORD: Mutex<ErrorRecord> = Mutex::new(ErrorRecord::new(DROP_ERROR_CAPACITY));

fn record() -> std::sync::MutexGuard<'static, ErrorRecord> {
    RECORD.lock().unwrap_or_else(|e| e.into_inner())
}

/// Logs a failed free and keeps it in the process-wide record.
pub(crate) fn record_drop_error(what: &str, error: MrError) {
    log::error!("rmm: {what} failed: {error}");
    record().push(error);
}

/// Removes and returns the recorded failed frees, oldest first.
pub fn take_drop_errors() -> Vec<MrError> {
    record().take()
}

/// How many failed frees were dropped from the record because it was full (since the process
/// started).
pub fn drop_errors_discarded() -> u64 {
    record().discarded
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(i: usize) -> MrError {
        MrError::invalid_argument(format!("e{i}"))
    }

    #[test]
    fn keeps_the_newest_and_counts_the_rest() {
        let mut r = ErrorRecord::new(3);
        for i in 0..5 {
            r.push(err(i));
        }
        assert_eq!(r.discarded, 2);
        assert_eq!(r.take(), vec![err(2), err(3), err(4)]);
        assert!(r.take().is_empty());
        r.push(err(9));
        assert_eq!(r.take(), vec![err(9)]);
        assert_eq!(r.discarded, 2);
    }

    #[test]
    fn zero_capacity_only_counts() {
        let mut r = ErrorRecord::new(0);
        r.push(err(0));
        assert_eq!(r.discarded, 1);
        assert!(r.take().is_empty());
    }
}
