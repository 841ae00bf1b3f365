//! Primary contexts: one per device, retained once per process and never released, as the CUDA
//! runtime does. Sharing the primary context is what lets rmm-rs memory interoperate with
//! runtime-API users (PyTorch, CuPy, C++ RMM) and with cudarc on the same device.
//!
//! Every wrapper that needs a context calls [`ensure_current_context`] (or takes the entry
//! points through [`context_api`]) before its first driver call, so that a thread with no
//! current context gets device 0's primary context, as the CUDA runtime does, instead of
//! failing with `CUDA_ERROR_INVALID_CONTEXT`.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::OnceLock;

use crate::raw;

use crate::driver::api;
use crate::entry::Api;
use crate::error::{check, CudaError, CudaResult, ResultCode};

/// A retained primary context (the raw handle, kept as an address so it is `Send + Sync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PrimaryContext(usize);

impl PrimaryContext {
    /// The raw `CUcontext`.
    #[must_use]
    pub fn as_raw(self) -> raw::CUcontext {
        self.0 as raw::CUcontext
    }
}

static CONTEXTS: OnceLock<Vec<OnceLock<CudaResult<PrimaryContext>>>> = OnceLock::new();

thread_local! {
    /// Whether this thread is known to have a current context (false inside a
    /// [`DeferredPrimaryContext`] scope until its context was entered, so that the first call
    /// needing a context takes the slow path, which enters it).
    static HAS_CONTEXT: Cell<bool> = const { Cell::new(false) };
    /// The innermost [`DeferredPrimaryContext`] scope of this thread.
    static DEFERRED: Cell<Deferred> = const { Cell::new(Deferred::NONE) };
}

/// A deferred primary context scope's state (addresses, so that the cell is `Copy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Deferred {
    /// The primary context to make current before the scope's first call that needs a
    /// context; 0: no scope.
    context: usize,
    /// Whether it was made current (or found current) in this scope.
    entered: bool,
    /// The context it replaced, to put back when the scope ends (0: none to restore).
    previous: usize,
}

impl Deferred {
    const NONE: Deferred = Deferred {
        context: 0,
        entered: false,
        previous: 0,
    };
}

/// The primary context of `device`, retained on first use and kept for the process.
pub fn primary_context(device: i32) -> CudaResult<PrimaryContext> {
    crate::driver::init()?;
    let slots = match CONTEXTS.get() {
        Some(s) => s,
        None => {
            let n = raw_device_count()?;
            CONTEXTS.get_or_init(|| (0..n).map(|_| OnceLock::new()).collect())
        }
    };
    let slot = usize::try_from(device)
        .ok()
        .and_then(|d| slots.get(d))
        .ok_or_else(|| invalid_device(device))?;
    slot.get_or_init(|| retain(device)).clone()
}

fn retain(device: i32) -> CudaResult<PrimaryContext> {
    let api = api()?;
    let mut dev: raw::CUdevice = 0;
    // SAFETY: the driver is initialized; writes one device handle.
    check("cuDeviceGet", unsafe {
        (api.cuDeviceGet)(&mut dev, device)
    })?;
    let mut ctx: raw::CUcontext = std::ptr::null_mut();
    // SAFETY: `dev` is a valid device; writes one context handle. The retain is never released:
    // the context lives as long as the process, like the runtime's.
    check("cuDevicePrimaryCtxRetain", unsafe {
        (api.cuDevicePrimaryCtxRetain)(&mut ctx, dev)
    })?;
    Ok(PrimaryContext(ctx as usize))
}

pub(crate) fn raw_device_count() -> CudaResult<i32> {
    let api = api()?;
    let mut n = 0;
    // SAFETY: the driver is initialized; writes one int.
    check("cuDeviceGetCount", unsafe {
        (api.cuDeviceGetCount)(&mut n)
    })?;
    Ok(n)
}

pub(crate) fn invalid_device(device: i32) -> CudaError {
    CudaError::Call {
        call: "cuDeviceGet",
        code: ResultCode::INVALID_DEVICE,
        name: "CUDA_ERROR_INVALID_DEVICE".into(),
        description: format!("device ordinal {device} is out of range"),
    }
}

/// Makes the primary context of the device with ordinal `device` current on the calling thread
/// (`cudaSetDevice`).
pub(crate) fn make_current(device: i32) -> CudaResult<()> {
    let ctx = primary_context(device)?;
    let api = api()?;
    // SAFETY: `ctx` is a retained primary context that lives for the process.
    check("cuCtxSetCurrent", unsafe {
        (api.cuCtxSetCurrent)(ctx.as_raw())
    })?;
    mark_context_current();
    Ok(())
}

/// The driver's entry points, with a context current on the calling thread
/// ([`ensure_current_context`]).
#[inline]
pub(crate) fn context_api() -> CudaResult<&'static Api> {
    ensure_current_context()?;
    api()
}

/// Makes sure the calling thread has a current context.
///
/// A thread that has none gets device 0's primary context (retained once per process and made
/// current), which is what the CUDA runtime does implicitly. Cheap after the first call on a
/// thread: one thread-local read.
#[inline]
pub fn ensure_current_context() -> CudaResult<()> {
    if HAS_CONTEXT.with(Cell::get) {
        return Ok(());
    }
    ensure_current_context_slow()
}

#[cold]
fn ensure_current_context_slow() -> CudaResult<()> {
    let deferred = DEFERRED.with(Cell::get);
    if deferred.context != 0 && !deferred.entered {
        return enter_deferred(deferred);
    }
    let api = api()?;
    let mut ctx: raw::CUcontext = std::ptr::null_mut();
    // SAFETY: the driver is initialized; the call writes one handle.
    check("cuCtxGetCurrent", unsafe {
        (api.cuCtxGetCurrent)(&mut ctx)
    })?;
    if ctx.is_null() {
        let primary = primary_context(0)?;
        // SAFETY: `primary` is a retained primary context of device 0, kept alive for the
        // process by `primary_context`.
        check("cuCtxSetCurrent", unsafe {
            (api.cuCtxSetCurrent)(primary.as_raw())
        })?;
    }
    mark_context_current();
    Ok(())
}

/// The calling thread's current context as the driver reports it (`cuCtxGetCurrent`): null
/// when the thread has none. Unlike every other call of this crate it does not give a thread
/// without a context device 0's primary context, so it shows what a foreign caller arrived with.
pub fn raw_current_context() -> CudaResult<raw::CUcontext> {
    let api = api()?;
    let mut ctx: raw::CUcontext = std::ptr::null_mut();
    // SAFETY: the driver is initialized; the call writes one handle.
    check("cuCtxGetCurrent", unsafe {
        (api.cuCtxGetCurrent)(&mut ctx)
    })?;
    Ok(ctx)
}

/// Makes a device's primary context current on the calling thread for a scope: what an entry
/// point called from foreign code (a C API, a PyTorch allocator hook) does before it touches
/// the device, since such a thread may arrive with no current context, with the device's
/// primary context, or with another device's.
///
/// [`enter`](Self::enter) costs one `cuCtxGetCurrent` when the primary context is already
/// current and changes nothing then. A thread that had **no** context keeps the primary
/// context after the guard drops (what the CUDA runtime does on a thread's first call, and what
/// makes its next call the cheap case); a thread that had **another** context gets it back on
/// drop. Unlike [`DeviceGuard`](crate::DeviceGuard), which compares device ordinals, the guard
/// compares contexts, so a thread with a context of its own on the same device is switched to
/// the primary one too. The guard is not `Send`: it restores the thread that made it.
#[derive(Debug)]
#[must_use = "the previous context is restored when the guard drops"]
pub struct PrimaryContextGuard {
    /// The context to put back on drop (an address, null for none to restore).
    previous: usize,
    _not_send: PhantomData<*const ()>,
}

impl PrimaryContextGuard {
    /// Makes the primary context of `device` current until the guard drops.
    ///
    /// # Errors
    /// No driver or an invalid device (nothing changed), or a failed `cuCtxSetCurrent`.
    pub fn enter(device: crate::DeviceId) -> CudaResult<Self> {
        let primary = primary_context(device.0)?.as_raw();
        let current = raw_current_context()?;
        if current == primary {
            mark_context_current();
            return Ok(Self {
                previous: 0,
                _not_send: PhantomData,
            });
        }
        let api = api()?;
        // SAFETY: `primary` is a retained primary context that lives for the process.
        check("cuCtxSetCurrent", unsafe { (api.cuCtxSetCurrent)(primary) })?;
        mark_context_current();
        Ok(Self {
            previous: current as usize,
            _not_send: PhantomData,
        })
    }
}

impl Drop for PrimaryContextGuard {
    fn drop(&mut self) {
        if self.previous != 0 {
            restore_context(self.previous);
        }
    }
}

/// Makes a deferred scope's context current (the first call of the scope that needs one).
fn enter_deferred(mut deferred: Deferred) -> CudaResult<()> {
    let current = raw_current_context()?;
    if current as usize != deferred.context {
        let api = api()?;
        // SAFETY: the scope's context is a retained primary context that lives for the
        // process (`DeferredPrimaryContext::enter` takes only those).
        check("cuCtxSetCurrent", unsafe {
            (api.cuCtxSetCurrent)(deferred.context as raw::CUcontext)
        })?;
        deferred.previous = current as usize;
    }
    deferred.entered = true;
    DEFERRED.with(|d| d.set(deferred));
    mark_context_current();
    Ok(())
}

/// A scope in which the primary context of a device is made current **only if a driver call
/// needs a context**: what an entry point called from foreign code does when its work usually
/// needs no driver call at all (a pool allocation served from the pool's free memory), so that
/// the common case costs no `cuCtxGetCurrent`.
///
/// Inside the scope, the first rmm-sys call of the calling thread that needs a current context
/// (every wrapper but the simulated ones and those that name a device) first does what
/// [`PrimaryContextGuard::enter`] does: it makes `context` current unless it already is. When
/// the scope ends, a context it replaced is made current again, and a thread that had none
/// keeps the primary context, as with the guard. A scope in which no call needed a context
/// changes nothing and makes no driver call. Calls that name their stream or event run in
/// `context` like every other, so the special stream handles (`CU_STREAM_LEGACY`,
/// `CU_STREAM_PER_THREAD`) name the device's streams.
///
/// Scopes nest (the inner one applies until it ends). Not `Send`: it restores the thread that
/// made it.
#[derive(Debug)]
#[must_use = "the deferred context applies until the scope drops"]
pub struct DeferredPrimaryContext {
    /// The enclosing scope's state, put back on drop.
    outer: Deferred,
    /// Whether the thread was known to have a current context before the scope.
    had_context: bool,
    _not_send: PhantomData<*const ()>,
}

impl DeferredPrimaryContext {
    /// Starts a scope for `context` (see the type's documentation). Makes no driver call.
    #[inline]
    pub fn enter(context: PrimaryContext) -> Self {
        let outer = DEFERRED.with(|d| {
            d.replace(Deferred {
                context: context.0,
                entered: false,
                previous: 0,
            })
        });
        let had_context = HAS_CONTEXT.with(|c| c.replace(false));
        Self {
            outer,
            had_context,
            _not_send: PhantomData,
        }
    }

    /// Whether a call of this scope needed a context, so that the scope's context was entered.
    #[must_use]
    pub fn entered(&self) -> bool {
        DEFERRED.with(Cell::get).entered
    }
}

impl Drop for DeferredPrimaryContext {
    #[inline]
    fn drop(&mut self) {
        let scope = DEFERRED.with(|d| d.replace(self.outer));
        if scope.entered && scope.previous != 0 {
            restore_context(scope.previous);
        }
        // Known to have a context: had one, or the scope left its own (a restored context is
        // one too). An enclosing scope not yet entered must still enter its own context.
        let known =
            (self.had_context || scope.entered) && (self.outer.context == 0 || self.outer.entered);
        HAS_CONTEXT.with(|c| c.set(known));
    }
}

/// Makes `previous` (a context that was current on this thread) current again; a failure is
/// logged, as drops cannot return it.
#[cold]
fn restore_context(previous: usize) {
    let restore = || -> CudaResult<()> {
        let api = api()?;
        // SAFETY: the handle was this thread's current context when the scope entered its
        // own; a context destroyed since is reported by the driver as an error code.
        check("cuCtxSetCurrent", unsafe {
            (api.cuCtxSetCurrent)(previous as raw::CUcontext)
        })
    };
    if let Err(e) = restore() {
        log::error!("rmm: could not restore the previous context: {e}");
    }
}

/// Records that the calling thread now has a current context (after `cuCtxSetCurrent`).
fn mark_context_current() {
    HAS_CONTEXT.with(|c| c.set(true));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_needs_a_driver_and_a_valid_device() {
        if crate::gpu_unavailable_reason().is_some() {
            let e = PrimaryContextGuard::enter(crate::DeviceId(0)).unwrap_err();
            assert!(e.is_no_device(), "{e}");
            assert!(raw_current_context().unwrap_err().is_no_device());
        } else {
            let e = PrimaryContextGuard::enter(crate::DeviceId(i32::MAX)).unwrap_err();
            assert!(e.to_string().contains("out of range"), "{e}");
        }
    }

    /// What a scope leaves on the thread: (known to have a context, the scope state).
    fn thread_state() -> (bool, Deferred) {
        (HAS_CONTEXT.with(Cell::get), DEFERRED.with(Cell::get))
    }

    #[test]
    fn a_deferred_scope_defers_until_a_call_needs_a_context() {
        if crate::driver::is_driver_present() {
            // A fake context must not reach a real driver; the GPU test
            // `deferred_primary_context` covers this machine.
            return;
        }
        std::thread::spawn(|| {
            let fake = PrimaryContext(0xdead_0000);
            // A thread known to have a context (as after an earlier call).
            mark_context_current();
            {
                let scope = DeferredPrimaryContext::enter(fake);
                assert_eq!(
                    thread_state(),
                    (
                        false,
                        Deferred {
                            context: 0xdead_0000,
                            entered: false,
                            previous: 0
                        }
                    ),
                    "the next call needing a context does not take the fast path"
                );
                // A call the simulation answers needs no context: nothing is entered.
                #[cfg(feature = "testing")]
                {
                    crate::fault::simulate(true);
                    // SAFETY: a fake stream handle never reaches a driver.
                    let id = unsafe { crate::stream::stream_get_id(crate::fault::fake_stream(3)) };
                    assert!(id.is_ok(), "{id:?}");
                    crate::fault::simulate(false);
                    assert!(!scope.entered());
                }
                // A call that needs one tries to enter the scope's context (here: no driver).
                assert_eq!(ensure_current_context(), Err(CudaError::DriverNotFound));
                assert!(!scope.entered(), "entered without a driver");
                {
                    let inner = DeferredPrimaryContext::enter(PrimaryContext(0xbeef_0000));
                    assert_eq!(thread_state().1.context, 0xbeef_0000);
                    drop(inner);
                }
                assert_eq!(
                    thread_state(),
                    (
                        false,
                        Deferred {
                            context: 0xdead_0000,
                            entered: false,
                            previous: 0
                        }
                    ),
                    "the inner scope did not give the outer one back"
                );
            }
            assert_eq!(
                thread_state(),
                (true, Deferred::NONE),
                "the scope left state behind"
            );
        })
        .join()
        .unwrap();
    }
}
