//! Library-internal debug logging (RMM's `rmm::default_logger()`).
//!
//! rmm-rs logs through the [`log`] facade: pool growth and cross-stream steals at `debug`,
//! per-call traces at `trace`, wrong frees seen by the tracking adaptor at `error`, and so on.
//! Any `log` backend the application installs receives these records (targets start with
//! `rmm`). [`init_debug_logging`] installs RMM's own setup for applications without one:
//!
//! * sink: the file named by `RMM_DEBUG_LOG_FILE` (truncated) if set, else standard error;
//! * records from the rmm-rs crates only, at `info` and above by
//!   default (RMM's default `RMM_LOGGING_LEVEL`), changeable at run time with
//!   [`set_debug_log_level`] (RMM's `default_logger().set_level`);
//! * RMM's pattern `[%6t][%H:%M:%S:%f][%-6l] %v`, e.g.
//!   `[     3][14:03:27:512345][debug ] [A][Stream 0x0][Upstream 1048576B]`, where the thread
//!   is [`current_thread_number`](crate::adaptors::logging::current_thread_number()) and the time is UTC
//!   (RMM prints the kernel thread id and local time).

use std::ffi::OsStr;
use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use log::{Level, LevelFilter, Log, Metadata, Record};

use crate::adaptors::logging::{current_thread_number, EventTime};

/// The environment variable naming the debug log file (RMM's `RMM_DEBUG_LOG_FILE`).
pub const DEBUG_LOG_FILE_ENV: &str = "RMM_DEBUG_LOG_FILE";

/// The crates whose records the debug logger writes.
const RMM_TARGETS: [&str; 5] = ["rmm", "rmm_sys", "rmm_stream", "rmm_mr", "rmm_containers"];

/// The debug logger could not be installed.
#[derive(Debug)]
#[non_exhaustive]
pub enum DebugLogError {
    /// `RMM_DEBUG_LOG_FILE` names a file that cannot be created.
    OpenFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Another `log` backend is already installed; rmm-rs records go to it.
    OtherLoggerInstalled,
}

impl fmt::Display for DebugLogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OpenFile { path, source } => write!(
                f,
                "cannot open the debug log file {} (from {DEBUG_LOG_FILE_ENV}): {source}",
                path.display()
            ),
            Self::OtherLoggerInstalled => f.write_str(
                "another logger is already installed for the `log` facade; rmm-rs logs to it",
            ),
        }
    }
}

impl std::error::Error for DebugLogError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::OpenFile { source, .. } => Some(source),
            Self::OtherLoggerInstalled => None,
        }
    }
}

/// The run-time level (a `LevelFilter` as `usize`), read on every record.
static LEVEL: AtomicUsize = AtomicUsize::new(LevelFilter::Info as usize);

/// Whether our logger is installed; the lock serializes installation.
static INSTALLED: Mutex<bool> = Mutex::new(false);

fn level_from_usize(n: usize) -> LevelFilter {
    LevelFilter::iter().nth(n).unwrap_or(LevelFilter::Trace)
}

/// Installs the debug logger with the default level, `info`.
///
/// rmm-rs logs through the [`log`] facade: pool growth and cross-stream steals at `debug`,
/// per-call traces at `trace`, wrong frees seen by the tracking adaptor at `error`, and so on.
/// Any `log` backend the application installs receives these records (targets start with
/// `rmm`). This function installs RMM's own setup for applications without one:
///
/// * sink: the file named by `RMM_DEBUG_LOG_FILE` (truncated) if set, else standard error;
/// * records from the rmm-rs crates only, at `info` and above by
///   default (RMM's default `RMM_LOGGING_LEVEL`), changeable at run time with
///   [`set_debug_log_level`] (RMM's `default_logger().set_level`);
/// * RMM's pattern `[%6t][%H:%M:%S:%f][%-6l] %v`, e.g.
///   `[     3][14:03:27:512345][debug ] [A][Stream 0x0][Upstream 1048576B]`, where the thread
///   is [`current_thread_number`](crate::adaptors::logging::current_thread_number()) and the time is UTC
///   (RMM prints the kernel thread id and local time).
///
/// Idempotent: once installed, later calls change nothing and return `Ok` (use
/// [`set_debug_log_level`] to change the level).
///
/// # Errors
/// [`DebugLogError::OpenFile`] when `RMM_DEBUG_LOG_FILE` cannot be created (nothing is
/// installed; a later call tries again); [`DebugLogError::OtherLoggerInstalled`] when the
/// application already installed a `log` backend.
#[doc(alias = "rmm::default_logger")]
pub fn init_debug_logging() -> Result<(), DebugLogError> {
    init_debug_logging_with_level(LevelFilter::Info)
}

/// As [`init_debug_logging`], starting at `level` (when this call installs the logger).
///
/// # Errors
/// As [`init_debug_logging`].
pub fn init_debug_logging_with_level(level: LevelFilter) -> Result<(), DebugLogError> {
    let mut installed = INSTALLED.lock().unwrap_or_else(PoisonError::into_inner);
    if *installed {
        return Ok(());
    }
    let path = std::env::var_os(DEBUG_LOG_FILE_ENV);
    let target = open_target(path.as_deref())?;
    let mut builder = env_logger::Builder::new();
    builder
        .filter_level(LevelFilter::Off)
        .write_style(env_logger::WriteStyle::Never)
        .target(target)
        .format(|buf, record| {
            format_record(
                buf,
                current_thread_number(),
                EventTime::now(),
                record.level(),
                record.args(),
            )
        });
    for t in RMM_TARGETS {
        builder.filter_module(t, LevelFilter::Trace);
    }
    let logger: &'static RmmLogger = Box::leak(Box::new(RmmLogger {
        inner: builder.build(),
    }));
    log::set_logger(logger).map_err(|_| DebugLogError::OtherLoggerInstalled)?;
    *installed = true;
    set_debug_log_level(level);
    Ok(())
}

/// Sets the level of the debug logger (RMM's `default_logger().set_level(...)`); also the
/// `log` facade's maximum level, so disabled records cost one comparison.
pub fn set_debug_log_level(level: LevelFilter) {
    LEVEL.store(level as usize, Ordering::Relaxed);
    log::set_max_level(level);
}

/// The level of the debug logger.
#[must_use]
pub fn debug_log_level() -> LevelFilter {
    level_from_usize(LEVEL.load(Ordering::Relaxed))
}

/// Flushes the installed logger (RMM's `flush_logger`).
pub fn flush_debug_log() {
    log::logger().flush();
}

/// The sink: the named file (truncated) or standard error.
fn open_target(path: Option<&OsStr>) -> Result<env_logger::Target, DebugLogError> {
    match path {
        Some(p) if !p.is_empty() => {
            let path = PathBuf::from(p);
            let file = File::create(&path).map_err(|source| DebugLogError::OpenFile {
                path: path.clone(),
                source,
            })?;
            Ok(env_logger::Target::Pipe(Box::new(io::LineWriter::new(
                file,
            ))))
        }
        _ => Ok(env_logger::Target::Stderr),
    }
}

/// spdlog's level names (`%l`).
fn level_name(level: Level) -> &'static str {
    match level {
        Level::Error => "error",
        Level::Warn => "warning",
        Level::Info => "info",
        Level::Debug => "debug",
        Level::Trace => "trace",
    }
}

/// One line in RMM's pattern `[%6t][%H:%M:%S:%f][%-6l] %v`.
fn format_record(
    out: &mut impl Write,
    thread: u64,
    time: EventTime,
    level: Level,
    message: &fmt::Arguments<'_>,
) -> io::Result<()> {
    let mut clock = time.to_bytes();
    clock[8] = b':'; // spdlog's `%S:%f`, not the CSV's `.`
    let clock = std::str::from_utf8(&clock).unwrap_or("00:00:00:000000");
    writeln!(
        out,
        "[{thread:>6}][{clock}][{:<6}] {message}",
        level_name(level)
    )
}

/// env_logger's writer behind a level that can change at run time.
struct RmmLogger {
    inner: env_logger::Logger,
}

impl Log for RmmLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= debug_log_level() && self.inner.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        if self.enabled(record.metadata()) {
            self.inner.log(record);
        }
    }

    fn flush(&self) {
        self.inner.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_follow_rmm_pattern() {
        let mut out = Vec::new();
        let t = EventTime::new(14, 3, 27, 512_345).unwrap();
        format_record(
            &mut out,
            3,
            t,
            Level::Debug,
            &format_args!("grew by {}B", 42),
        )
        .unwrap();
        format_record(&mut out, 1234567, t, Level::Warn, &format_args!("x")).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "[     3][14:03:27:512345][debug ] grew by 42B\n\
             [1234567][14:03:27:512345][warning] x\n"
        );
    }

    #[test]
    fn level_names_are_spdlog_names() {
        let names: Vec<_> = [
            Level::Trace,
            Level::Debug,
            Level::Info,
            Level::Warn,
            Level::Error,
        ]
        .map(level_name)
        .into();
        assert_eq!(names, ["trace", "debug", "info", "warning", "error"]);
    }

    #[test]
    fn level_round_trips() {
        for l in LevelFilter::iter() {
            assert_eq!(level_from_usize(l as usize), l);
        }
    }

    #[test]
    fn target_is_a_truncated_file_or_stderr() {
        assert!(matches!(open_target(None), Ok(env_logger::Target::Stderr)));
        assert!(matches!(
            open_target(Some(OsStr::new(""))),
            Ok(env_logger::Target::Stderr)
        ));
        let path = std::env::temp_dir().join(format!("rmm_debug_log_{}.txt", std::process::id()));
        std::fs::write(&path, "old contents").unwrap();
        let target = open_target(Some(path.as_os_str())).unwrap();
        assert!(matches!(target, env_logger::Target::Pipe(_)));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "", "truncated");
        drop(target);
        let _ = std::fs::remove_file(&path);
        let bad = std::env::temp_dir().join("rmm_no_such_dir_here/x/y.log");
        let e = open_target(Some(bad.as_os_str())).unwrap_err();
        assert!(matches!(e, DebugLogError::OpenFile { .. }), "{e}");
    }

    #[test]
    fn init_is_idempotent_and_level_is_adjustable() {
        init_debug_logging_with_level(LevelFilter::Error).unwrap();
        assert_eq!(debug_log_level(), LevelFilter::Error);
        // A second call installs nothing and keeps the level.
        init_debug_logging().unwrap();
        assert_eq!(debug_log_level(), LevelFilter::Error);
        let meta = |level, target| Metadata::builder().level(level).target(target).build();
        let logger = log::logger();
        assert!(logger.enabled(&meta(Level::Error, "rmm_mr::pool")));
        assert!(!logger.enabled(&meta(Level::Warn, "rmm_mr::pool")));
        assert!(!logger.enabled(&meta(Level::Error, "some_other_crate")));
        set_debug_log_level(LevelFilter::Debug);
        assert!(logger.enabled(&meta(Level::Debug, "rmm_mr::adaptors::tracking")));
        assert_eq!(log::max_level(), LevelFilter::Debug);
        set_debug_log_level(LevelFilter::Error);
        flush_debug_log();
        // The logger stays installed for the rest of the process and writes to standard error
        // directly (the test harness does not capture it): keep the other tests' errors, which
        // the fault sweeps provoke by the thousand, out of the output.
        set_debug_log_level(LevelFilter::Off);
    }
}
