//! # rmm-replay: replay RMM memory-event logs against rmm-rs resources
//!
//! RMM's `logging_resource_adaptor` (and rmm-rs's
//! [`LoggingResourceAdaptor`](rmm::mr::LoggingResourceAdaptor)) write one CSV row per allocation,
//! failed allocation and free. This crate replays such a log against a memory resource, as
//! RMM's replay benchmark does, and reports what the resource made of it: peak bytes in use and
//! reserved, fragmentation at the peak, wall time, and, where the workload does not fit, the
//! row where memory ran out. On a GPU it uses the real resources; over simulated memory
//! ([`SimulatedMemoryResource`](rmm::mr::SimulatedMemoryResource)) it runs on any machine and
//! answers "does this workload fit in 80 GiB with a pool? with an arena?".
//!
//! The command-line tool `rmm-replay` is [`cli::main`]; the pieces are usable on their own:
//!
//! 1. [`read_log`]: the log, parsed by rmm-mr's parser (columns by header name, `(nil)`,
//!    any stream), with each row's line number;
//! 2. [`Workload::from_events`]: the replay plan (global order, one replay thread per logged
//!    thread, frees tied to their allocations, `allocate failure` rows counted);
//! 3. [`target::build`]: the resource, on the GPU or over simulated memory;
//! 4. [`replay::replay`]: the replay itself;
//! 5. [`Summary`] and [`plot::draw`]: the numbers and the picture.
//!
//! [`replay_log`] does 3 to 5 for one log, as the tool does.
//!
//! PyTorch's memory snapshots (the pickle `torch.cuda.memory._dump_snapshot` writes) replay
//! the same way: [`torch::load_snapshot`] reads their `device_traces` (allocations and
//! completed frees, with their streams) into one [`Workload`] per device, in place of steps 1
//! and 2; the tool tells a snapshot from a CSV log by its first bytes.
//!
//! ```
//! use std::sync::atomic::AtomicUsize;
//! use rmm_replay::{read_log_str, replay, target, Summary, Workload};
//!
//! let log = "Thread,Time,Action,Pointer,Size,Stream\n\
//!            1,00:00:00.000001,allocate,0x7f0000000000,1000000,0\n\
//!            2,00:00:00.000002,allocate failure,(nil),1099511627776,0x2\n\
//!            1,00:00:00.000003,free,0x7f0000000000,1000000,0\n";
//! let workload = Workload::from_events(&read_log_str(log)?)?;
//! let t = target::build(target::ResourceKind::Pool, target::Memory::Simulated(1 << 30), &workload)?;
//! let streams = target::simulated_streams(&workload);
//! let r = replay::replay(&workload, &*t.resource, &streams, &|| t.reserved(), &AtomicUsize::new(0))?;
//! let summary = Summary::new("log.csv", &t.description, &workload, &r, &r.reserved, None);
//! assert_eq!((summary.allocations, summary.failures_in_log), (1, 1));
//! assert_eq!(summary.peaks.in_use, 1_000_000);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod cli;
pub mod plan;
pub mod plot;
pub mod replay;
pub mod run;
pub mod summary;
pub mod target;
pub mod torch;

use std::fmt;
use std::io::BufRead;

use rmm::mr::{parse_log_lines, CsvError, MemoryEvent};

pub use plan::{PlanError, Position, Workload};
pub use replay::{replay, Replay, ReplayError};
pub use run::{replay_log, replay_log_with, Report, RunError};
pub use summary::{Peaks, Summary};
pub use target::{BuildOptions, Memory, ResourceKind, Target};

/// A log that cannot be read or makes no sense, with the file it came from.
#[derive(Debug)]
pub enum LogError {
    /// The file cannot be read, or a row is malformed (the error names the line).
    Csv(CsvError),
    /// A row contradicts the rows before it (the error names the line).
    Plan(PlanError),
    /// A PyTorch memory snapshot that cannot be read or replayed.
    Snapshot(torch::SnapshotError),
}

impl fmt::Display for LogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // The header's errors carry no line: it is the first.
            LogError::Csv(
                e @ (CsvError::MissingHeader
                | CsvError::MissingColumn { .. }
                | CsvError::DuplicateColumn { .. }),
            ) => write!(f, "line 1: {e}"),
            LogError::Csv(e) => e.fmt(f),
            LogError::Plan(e) => e.fmt(f),
            LogError::Snapshot(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for LogError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LogError::Csv(e) => Some(e),
            LogError::Plan(e) => Some(e),
            LogError::Snapshot(e) => Some(e),
        }
    }
}

impl From<CsvError> for LogError {
    fn from(e: CsvError) -> Self {
        LogError::Csv(e)
    }
}

impl From<torch::SnapshotError> for LogError {
    fn from(e: torch::SnapshotError) -> Self {
        LogError::Snapshot(e)
    }
}

impl From<PlanError> for LogError {
    fn from(e: PlanError) -> Self {
        LogError::Plan(e)
    }
}

/// Reads a memory-event log: each event with its 1-based line number.
///
/// # Errors
///
/// [`CsvError`] for an unreadable or malformed log; it names the line.
pub fn read_log<R: BufRead>(reader: R) -> Result<Vec<(usize, MemoryEvent)>, CsvError> {
    parse_log_lines(reader)
}

/// [`read_log`] over a string.
///
/// # Errors
///
/// As [`read_log`].
pub fn read_log_str(text: &str) -> Result<Vec<(usize, MemoryEvent)>, CsvError> {
    parse_log_lines(text.as_bytes())
}

/// Reads and plans a log in one go.
///
/// # Errors
///
/// [`LogError`], naming the line.
pub fn load<R: BufRead>(reader: R) -> Result<Workload, LogError> {
    Ok(Workload::from_events(&read_log(reader)?)?)
}
