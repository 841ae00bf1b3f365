//! What "the default stream" means: the legacy default stream or the per-thread default stream.
//!
//! RMM decides this at compile time (`CUDA_API_PER_THREAD_DEFAULT_STREAM`) and builds every test
//! twice. rmm-rs decides it once per process at run time, so one binary can be tested in both
//! modes: the environment variable `RMM_DEFAULT_STREAM` (`legacy`, the default, or
//! `per-thread`) is read the first time the mode is needed, unless the program called
//! [`set_default_stream_mode`] before that.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::error::StreamError;

/// The meaning of [`CudaStreamView::default`](crate::CudaStreamView::default) (handle 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DefaultStreamMode {
    /// Handle 0 is the legacy default stream, which synchronizes with all blocking streams
    /// (RMM built without per-thread default stream).
    Legacy,
    /// Handle 0 is the calling thread's per-thread default stream (RMM built with
    /// `CUDA_API_PER_THREAD_DEFAULT_STREAM`).
    PerThread,
}

impl DefaultStreamMode {
    /// Parses the values `RMM_DEFAULT_STREAM` accepts: `legacy` or `per-thread` (also
    /// `per_thread`, `ptds`), case-insensitive.
    pub fn parse(s: &str) -> Result<Self, StreamError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "legacy" => Ok(Self::Legacy),
            "per-thread" | "per_thread" | "perthread" | "ptds" => Ok(Self::PerThread),
            other => Err(StreamError::InvalidArgument(format!(
                "RMM_DEFAULT_STREAM must be `legacy` or `per-thread`, not `{other}`"
            ))),
        }
    }
}

/// The environment variable read for the mode.
pub const DEFAULT_STREAM_ENV: &str = "RMM_DEFAULT_STREAM";

const UNSET: u8 = 0;
const LEGACY: u8 = 1;
const PER_THREAD: u8 = 2;

static MODE: AtomicU8 = AtomicU8::new(UNSET);

fn encode(mode: DefaultStreamMode) -> u8 {
    match mode {
        DefaultStreamMode::Legacy => LEGACY,
        DefaultStreamMode::PerThread => PER_THREAD,
    }
}

/// The process's default-stream mode, fixed on first call (from `RMM_DEFAULT_STREAM`; an
/// unparsable value logs an error and means `legacy`).
#[inline]
pub fn default_stream_mode() -> DefaultStreamMode {
    match MODE.load(Ordering::Acquire) {
        LEGACY => DefaultStreamMode::Legacy,
        PER_THREAD => DefaultStreamMode::PerThread,
        _ => init_from_env(),
    }
}

#[cold]
fn init_from_env() -> DefaultStreamMode {
    let mode = match std::env::var(DEFAULT_STREAM_ENV) {
        Ok(v) => DefaultStreamMode::parse(&v).unwrap_or_else(|e| {
            log::error!("rmm: {e}; using the legacy default stream");
            DefaultStreamMode::Legacy
        }),
        Err(_) => DefaultStreamMode::Legacy,
    };
    match MODE.compare_exchange(UNSET, encode(mode), Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => mode,
        Err(LEGACY) => DefaultStreamMode::Legacy,
        Err(_) => DefaultStreamMode::PerThread,
    }
}

/// Fixes the process's default-stream mode. Succeeds if the mode was not fixed yet or already
/// equals `mode`; fails once it was fixed (by an earlier call or first use) to the other mode,
/// since resources may already have keyed state by it.
pub fn set_default_stream_mode(mode: DefaultStreamMode) -> Result<(), StreamError> {
    match MODE.compare_exchange(UNSET, encode(mode), Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Ok(()),
        Err(current) if current == encode(mode) => Ok(()),
        Err(_) => Err(StreamError::InvalidArgument(
            "the default-stream mode was already fixed to the other mode".to_owned(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_env_values() {
        assert_eq!(
            DefaultStreamMode::parse("legacy").unwrap(),
            DefaultStreamMode::Legacy
        );
        assert_eq!(
            DefaultStreamMode::parse("").unwrap(),
            DefaultStreamMode::Legacy
        );
        assert_eq!(
            DefaultStreamMode::parse("Per-Thread").unwrap(),
            DefaultStreamMode::PerThread
        );
        assert_eq!(
            DefaultStreamMode::parse("ptds").unwrap(),
            DefaultStreamMode::PerThread
        );
        assert!(DefaultStreamMode::parse("both").is_err());
    }

    #[test]
    fn mode_is_fixed_once() {
        let first = default_stream_mode();
        assert!(set_default_stream_mode(first).is_ok());
        let other = match first {
            DefaultStreamMode::Legacy => DefaultStreamMode::PerThread,
            DefaultStreamMode::PerThread => DefaultStreamMode::Legacy,
        };
        assert!(set_default_stream_mode(other).is_err());
        assert_eq!(default_stream_mode(), first);
    }
}
