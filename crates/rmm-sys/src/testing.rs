//! Support for GPU tests: the [libtest-mimic](https://docs.rs/libtest-mimic) trial constructors
//! and small checks that every crate's `tests/gpu_*.rs` shares (feature `testing`; not for
//! production).
//!
//! A GPU trial runs where a GPU is usable and reports itself **ignored**, with the reason,
//! everywhere else, so CI without a GPU shows it as ignored, never as passed
//! (`docs/gpu-testing.md`):
//!
//! ```
//! use rmm_sys::testing::{ensure, gpu, Failed};
//!
//! fn device_count_positive() -> Result<(), Failed> {
//!     ensure(rmm_sys::device_count()? > 0, "no device")
//! }
//!
//! let trials = vec![gpu("device_count_positive", device_count_positive)];
//! # let _ = trials;
//! ```
//!
//! It lives in the lowest layer so that every layer's tests can use it (the layering rule
//! forbids a separate test-support package).

use std::sync::{Mutex, MutexGuard, PoisonError};

pub use libtest_mimic::{Completion, Failed, Trial};

use crate::DeviceCapabilities;

/// What a trial body that decides its own completion returns (it may report itself ignored).
pub type Outcome = Result<Completion, Failed>;

/// Why a GPU trial cannot run here (`needs a CUDA GPU: ...`), or `None` when a GPU is usable.
#[must_use]
pub fn no_gpu() -> Option<String> {
    crate::gpu_unavailable_reason().map(|why| format!("needs a CUDA GPU: {why}"))
}

/// A trial that runs `f` when a GPU is usable and is ignored, with the reason, otherwise.
pub fn gpu(
    name: impl Into<String>,
    f: impl FnOnce() -> Result<(), Failed> + Send + 'static,
) -> Trial {
    gpu_outcome(name, move || f().map(|()| Completion::Completed))
}

/// [`gpu`] for a body that decides its completion itself (it may report itself ignored, for
/// example when a capability it needs is missing).
pub fn gpu_outcome(name: impl Into<String>, f: impl FnOnce() -> Outcome + Send + 'static) -> Trial {
    Trial::ignorable_test(name, move || match no_gpu() {
        Some(why) => ignored(why),
        None => f(),
    })
}

/// A GPU trial that needs more than a GPU: after the GPU check, `unmet` says what is missing
/// here (a capability, a default-stream mode, ...), and the trial is ignored with that reason;
/// `None` runs `f`.
pub fn gpu_if(
    name: impl Into<String>,
    unmet: impl FnOnce() -> Option<String> + Send + 'static,
    f: impl FnOnce() -> Result<(), Failed> + Send + 'static,
) -> Trial {
    gpu_outcome(name, move || match unmet() {
        Some(why) => ignored(why),
        None => f().map(|()| Completion::Completed),
    })
}

/// `Ok(())` when `cond` holds, otherwise a failure with `msg` (say what was expected and what
/// came back).
///
/// # Errors
/// `msg`, when `cond` is false.
pub fn ensure(cond: bool, msg: impl Into<String>) -> Result<(), Failed> {
    if cond {
        Ok(())
    } else {
        Err(msg.into().into())
    }
}

/// A completed trial.
///
/// # Errors
/// Never; the `Result` is the trial body's type.
pub fn done() -> Outcome {
    Ok(Completion::Completed)
}

/// A trial ignored with `why`.
///
/// # Errors
/// Never; the `Result` is the trial body's type.
pub fn ignored(why: impl Into<String>) -> Outcome {
    Ok(Completion::ignored_with(why.into()))
}

/// The capability probes of the current device.
///
/// # Errors
/// The driver's, as a failure.
pub fn caps() -> Result<DeviceCapabilities, Failed> {
    Ok(DeviceCapabilities::probe(crate::current_device()?)?)
}

/// Why stream-ordered memory pools (`cuMemAllocAsync`) cannot be used here, or `None`.
#[must_use]
pub fn no_pools() -> Option<String> {
    match caps() {
        Ok(c) if c.memory_pools_supported => None,
        Ok(_) => Some("the device has no stream-ordered memory pools".into()),
        Err(e) => Some(format!("cannot probe the device: {e:?}")),
    }
}

/// Why CUDA's virtual memory management (`cuMemAddressReserve`, `cuMemMap`, ...) cannot be
/// used here, or `None`.
#[must_use]
pub fn no_vmm() -> Option<String> {
    match crate::current_device().and_then(crate::vmm::vmm_supported) {
        Ok(true) => None,
        Ok(false) => Some("the device lacks virtual memory management".into()),
        Err(e) => Some(format!("cannot probe the device: {e:?}")),
    }
}

/// A process-wide lock for trials that take large shares of the device's memory, so that they
/// run one at a time even when the harness runs trials in parallel (the GPU runner passes
/// `--test-threads=1`; a person running a test binary by hand may not).
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ensure_fails_with_the_message() {
        assert!(ensure(true, "unused").is_ok());
        let e = ensure(false, "expected 1, got 2").unwrap_err();
        assert_eq!(e.message(), Some("expected 1, got 2"));
    }

    #[test]
    fn without_a_gpu_trials_are_ignored_not_passed() {
        if no_gpu().is_none() {
            return; // a GPU machine: the GPU test binaries exercise the other branch.
        }
        // The body would fail; an ignored trial never runs it.
        let trials = vec![
            gpu("a", || Err("ran".into())),
            gpu_if("b", || None, || Err("ran".into())),
        ];
        let args = libtest_mimic::Arguments {
            test_threads: Some(1),
            quiet: true,
            ..libtest_mimic::Arguments::default()
        };
        let conclusion = libtest_mimic::run(&args, trials);
        assert_eq!(
            (
                conclusion.num_ignored,
                conclusion.num_failed,
                conclusion.num_passed
            ),
            (2, 0, 0)
        );
    }
}
