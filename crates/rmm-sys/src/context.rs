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

    /// A fake primary context for benchmarks and tests without a GPU (feature `testing`; never
    /// for real device work): a [`DeferredPrimaryContext`] scope of it "enters" it without a
    /// driver, and no rmm-sys call passes it to one.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    #[must_use]
    pub fn fake() -> Self {
        PrimaryContext(crate::fault::fake_context())
    }
}

static CONTEXTS: OnceLock<Vec<OnceLock<CudaResult<PrimaryContext>>>> = OnceLock::new();

thread_local! {
    /// What this thread knows of its context: one cell, so that a library loaded with
    /// `dlopen` (where each thread-local access is a `__tls_get_addr` call) reaches it once per
    /// access site.
    static THREAD: Cell<ThreadContext> = const { Cell::new(ThreadContext::NONE) };
}

/// A thread's context state (flat, so that saving and restoring it is three words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ThreadContext {
    /// The innermost [`DeferredPrimaryContext`] scope's primary context, to make current
    /// before the scope's first call that needs a context; 0: no scope.
    context: usize,
    /// The context the scope's entry replaced, to put back when the scope ends (0: none).
    previous: usize,
    /// Whether this thread is known to have a current context (false inside a scope until its
    /// context was entered, so that the first call needing a context takes the slow path,
    /// which enters it).
    known: bool,
    /// Whether the scope's context was made (or found) current.
    entered: bool,
}

impl ThreadContext {
    const NONE: ThreadContext = ThreadContext {
        context: 0,
        previous: 0,
        known: false,
        entered: false,
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
    if THREAD.with(|t| t.get().known) {
        return Ok(());
    }
    ensure_current_context_slow()
}

#[cold]
fn ensure_current_context_slow() -> CudaResult<()> {
    let state = THREAD.with(Cell::get);
    if state.context != 0 && !state.entered {
        return enter_deferred(state);
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
fn enter_deferred(mut state: ThreadContext) -> CudaResult<()> {
    // A fake context (feature `testing`) is entered without a driver, as the simulated driver
    // answers fake handles.
    #[cfg(feature = "testing")]
    let fake = crate::fault::is_fake(state.context);
    #[cfg(not(feature = "testing"))]
    let fake = false;
    if !fake {
        let current = raw_current_context()?;
        if current as usize != state.context {
            let api = api()?;
            // SAFETY: the scope's context is a retained primary context that lives for the
            // process (`DeferredPrimaryContext::enter` takes only those).
            check("cuCtxSetCurrent", unsafe {
                (api.cuCtxSetCurrent)(state.context as raw::CUcontext)
            })?;
            state.previous = current as usize;
        }
    }
    state.entered = true;
    state.known = true;
    THREAD.with(|t| t.set(state));
    Ok(())
}

/// A scope in which the primary context of a device is made current **only if a driver call
/// needs a context**: what an entry point called from foreign code does when its work usually
/// needs no driver call at all (a pool allocation served from the pool's free memory), so that
/// the common case costs no `cuCtxGetCurrent`.
///
/// Inside the scope, the first rmm-sys call of the calling thread that needs a current context
/// (every wrapper but the simulated ones, those that name a device, and `cuStreamGetId` of an
/// ordinary stream, which names its own context) first does what
/// [`PrimaryContextGuard::enter`] does: it makes `context` current unless it already is. When
/// the scope ends, a context it replaced is made current again, and a thread that had none
/// keeps the primary context, as with the guard. A scope in which no call needed a context
/// changes nothing and makes no driver call. Calls that take a stream or an event run with
/// `context` current like every other, so the special stream handles (`CU_STREAM_LEGACY`,
/// `CU_STREAM_PER_THREAD`) name the device's streams. A call that makes a context current
/// itself before the scope's context was entered ([`PrimaryContextGuard`],
/// [`set_current_device`](crate::set_current_device)) ends the deferral: from then on the
/// scope's calls run in whatever context is current, as outside a scope.
/// ([`DeviceGuard`](crate::DeviceGuard) asks for the current device first, which enters the
/// scope's context.)
///
/// Scopes nest (the inner one applies until it ends). Not `Send`: it restores the thread that
/// made it.
#[derive(Debug)]
#[must_use = "the deferred context applies until the scope drops"]
pub struct DeferredPrimaryContext {
    /// The thread's state before the scope (the enclosing scope's), put back on drop.
    outer: ThreadContext,
    _not_send: PhantomData<*const ()>,
}

impl DeferredPrimaryContext {
    /// Starts a scope for `context` (see the type's documentation). Makes no driver call.
    #[inline]
    pub fn enter(context: PrimaryContext) -> Self {
        let outer = THREAD.with(|t| {
            t.replace(ThreadContext {
                context: context.0,
                ..ThreadContext::NONE
            })
        });
        Self {
            outer,
            _not_send: PhantomData,
        }
    }

    /// Whether a call of this scope needed a context, so that the scope's context was entered.
    #[must_use]
    pub fn entered(&self) -> bool {
        THREAD.with(|t| t.get().entered)
    }
}

impl Drop for DeferredPrimaryContext {
    #[inline]
    fn drop(&mut self) {
        let mut outer = self.outer;
        let scope = THREAD.with(|t| {
            let scope = t.get();
            // A thread without a scope around this one keeps the scope's context (or gets its
            // own back): it is known to have one. An enclosing scope is put back as it was
            // (not yet entered: still to enter its own context).
            if scope.entered && outer.context == 0 {
                outer.known = true;
            }
            t.set(outer);
            scope
        });
        if scope.entered && scope.previous != 0 {
            restore_context(scope.previous);
        }
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
    THREAD.with(|t| {
        let mut state = t.get();
        state.known = true;
        t.set(state);
    });
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
    fn thread_state() -> (bool, ThreadContext) {
        let t = THREAD.with(Cell::get);
        (t.known, t)
    }

    fn pending(context: usize) -> (bool, ThreadContext) {
        (
            false,
            ThreadContext {
                context,
                ..ThreadContext::NONE
            },
        )
    }

    #[cfg(feature = "testing")]
    #[test]
    fn a_deferred_scope_enters_at_the_first_call_that_needs_a_context() {
        std::thread::spawn(|| {
            let fake = PrimaryContext::fake();
            assert_eq!(thread_state(), (false, ThreadContext::NONE));
            {
                let scope = DeferredPrimaryContext::enter(fake);
                assert_eq!(thread_state(), pending(fake.0));
                // A call the simulation answers needs no context: nothing is entered.
                crate::fault::simulate(true);
                // SAFETY: a fake stream handle never reaches a driver.
                let id = unsafe { crate::stream::stream_get_id(crate::fault::fake_stream(3)) };
                crate::fault::simulate(false);
                assert!(id.is_ok(), "{id:?}");
                assert!(!scope.entered());
                // One that needs a context enters the scope's, once.
                assert_eq!(ensure_current_context(), Ok(()));
                assert!(scope.entered());
                assert!(
                    thread_state().0,
                    "entered, yet calls still take the slow path"
                );
                {
                    // A nested scope defers again, and gives the outer one back.
                    let inner = DeferredPrimaryContext::enter(fake);
                    assert_eq!(thread_state(), pending(fake.0));
                    drop(inner);
                }
                assert!(scope.entered());
                assert!(thread_state().0);
            }
            // The thread had no context and keeps the scope's (as with the guard).
            assert_eq!(
                thread_state(),
                (
                    true,
                    ThreadContext {
                        known: true,
                        ..ThreadContext::NONE
                    }
                )
            );
            {
                // An enclosing scope not yet entered is armed again after an inner one.
                let outer = DeferredPrimaryContext::enter(fake);
                {
                    let _inner = DeferredPrimaryContext::enter(fake);
                    assert_eq!(ensure_current_context(), Ok(()));
                }
                assert_eq!(
                    thread_state(),
                    pending(fake.0),
                    "the outer scope was disarmed"
                );
                assert!(!outer.entered());
            }
            assert_eq!(
                thread_state(),
                (
                    true,
                    ThreadContext {
                        known: true,
                        ..ThreadContext::NONE
                    }
                )
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    fn without_a_driver_a_deferred_scope_fails_where_a_context_is_needed() {
        if crate::driver::is_driver_present() {
            // A made-up context must not reach a real driver; the GPU test
            // `deferred_primary_context` covers this machine.
            return;
        }
        std::thread::spawn(|| {
            // A thread known to have a context (as after an earlier call).
            mark_context_current();
            {
                let scope = DeferredPrimaryContext::enter(PrimaryContext(0xdead_0000));
                assert_eq!(thread_state(), pending(0xdead_0000));
                assert_eq!(ensure_current_context(), Err(CudaError::DriverNotFound));
                assert!(!scope.entered(), "entered without a driver");
                assert_eq!(
                    thread_state(),
                    pending(0xdead_0000),
                    "the scope was disarmed"
                );
            }
            assert_eq!(
                thread_state(),
                (
                    true,
                    ThreadContext {
                        known: true,
                        ..ThreadContext::NONE
                    }
                ),
                "the scope left state behind"
            );
        })
        .join()
        .unwrap();
    }
}
