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

/// How deep [`DeferredPrimaryContext`] scopes nest on one thread; a scope opened deeper is
/// inert (see the type's documentation).
const MAX_SCOPES: usize = 16;

thread_local! {
    /// What this thread knows of its context: one constant-initialized value without a
    /// destructor, so that it stays readable during thread-local teardown and a library loaded
    /// with `dlopen` (where each thread-local access is a `__tls_get_addr` call) reaches it once
    /// per access site.
    static THREAD: ThreadContext = const { ThreadContext::new() };
}

/// A thread's context state: whether it is known to have a current context, and the stack of
/// its open [`DeferredPrimaryContext`] scopes.
struct ThreadContext {
    /// Whether this thread is known to have a current context (false inside a scope until its
    /// context was entered, so that the first call needing a context takes the slow path,
    /// which enters it).
    known: Cell<bool>,
    /// Open scopes: `scopes[..depth]`, innermost last.
    depth: Cell<usize>,
    /// The id of the last scope opened on this thread (ids are never reused).
    last_id: Cell<u64>,
    scopes: [Cell<Scope>; MAX_SCOPES],
}

/// One open scope, as the thread keeps it (the scope's value holds only its id and place, so
/// that a scope dropped out of order or leaked leaves no stale copy behind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Scope {
    id: u64,
    /// The primary context to make current before the scope's first call that needs one.
    context: usize,
    /// Whether the scope's context was made (or found) current.
    entered: bool,
    /// Whether entering made another context current in place of `previous`.
    switched: bool,
    /// The context the entry replaced (0: the thread had none, so it keeps the new one).
    previous: usize,
    /// [`ThreadContext::known`] when the scope opened, put back when it ends.
    known_before: bool,
}

impl Scope {
    const NONE: Scope = Scope {
        id: 0,
        context: 0,
        entered: false,
        switched: false,
        previous: 0,
        known_before: false,
    };
}

impl ThreadContext {
    const fn new() -> ThreadContext {
        ThreadContext {
            known: Cell::new(false),
            depth: Cell::new(0),
            last_id: Cell::new(0),
            scopes: [const { Cell::new(Scope::NONE) }; MAX_SCOPES],
        }
    }

    /// The innermost open scope and its index.
    fn innermost(&self) -> Option<(usize, Scope)> {
        let depth = self.depth.get();
        let i = depth.checked_sub(1)?;
        Some((i, self.scopes[i].get()))
    }

    /// The index of the open scope `id` expected at `index`, if it is still open.
    fn find(&self, index: usize, id: u64) -> Option<usize> {
        (index < self.depth.get() && self.scopes[index].get().id == id).then_some(index)
    }
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
    if THREAD.with(|t| t.known.get()) {
        return Ok(());
    }
    ensure_current_context_slow()
}

#[cold]
fn ensure_current_context_slow() -> CudaResult<()> {
    if let Some((i, scope)) = THREAD.with(ThreadContext::innermost) {
        if !scope.entered {
            return enter_deferred(i, scope);
        }
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
    /// Makes the primary context of device `ordinal` current until the guard drops
    /// ([`enter`](Self::enter), which takes a [`DeviceId`](crate::DeviceId)).
    pub(crate) fn enter_ordinal(ordinal: i32) -> CudaResult<Self> {
        let primary = primary_context(ordinal)?.as_raw();
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

/// Makes a deferred scope's context current (the first call of the scope that needs one):
/// `scope`, open at index `i` of the thread's stack.
fn enter_deferred(i: usize, mut scope: Scope) -> CudaResult<()> {
    let current = current_context_for(scope.context)?;
    if current != scope.context {
        set_current_context(scope.context)?;
        scope.switched = true;
        scope.previous = current;
    }
    scope.entered = true;
    THREAD.with(|t| {
        t.scopes[i].set(scope);
        t.known.set(true);
    });
    Ok(())
}

/// The calling thread's current context, to be replaced by `context`: for a fake context
/// (feature `testing`), the simulated driver's, as the simulation answers fake handles.
fn current_context_for(context: usize) -> CudaResult<usize> {
    #[cfg(feature = "testing")]
    if crate::fault::is_fake(context) {
        return Ok(crate::fault::fake_current_context());
    }
    let _ = context;
    Ok(raw_current_context()? as usize)
}

/// Makes `context` (a retained primary context, or a context that was current on this thread)
/// current: a fake one (feature `testing`) in the simulated driver only.
fn set_current_context(context: usize) -> CudaResult<()> {
    #[cfg(feature = "testing")]
    if crate::fault::is_fake(context) {
        crate::fault::set_fake_current_context(context);
        return Ok(());
    }
    let api = api()?;
    // SAFETY: the callers pass a retained primary context, which lives for the process, or the
    // context that was current on this thread when a scope replaced it; a context destroyed
    // since is reported by the driver as an error code.
    check("cuCtxSetCurrent", unsafe {
        (api.cuCtxSetCurrent)(context as raw::CUcontext)
    })
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
/// Scopes nest: the innermost open one applies. The thread keeps its open scopes on a stack,
/// and a scope's value holds only its place there and an id, so that scopes which do not end
/// in nesting order leave nothing stale behind:
/// - **Ending a scope ends every scope opened after it that is still open** (they lie inside
///   it), and the thread gets back the state it had when the scope opened: the context current
///   before the first of them made another one current is made current again (unless that was
///   none), and the enclosing scope, if any, applies again as it was. A scope dropped after
///   one that encloses it has already ended changes nothing.
/// - So a scope leaked with [`mem::forget`](std::mem::forget) inside another ends with it; one
///   leaked outside every scope stays open on its thread, as a leaked guard stays in force.
/// - Scopes nest up to 16 deep; a scope opened inside 16 open ones is inert: it defers nothing
///   (calls run as in the enclosing scope) and its end changes nothing.
///
/// Not `Send`: it belongs to the thread that opened it.
#[derive(Debug)]
#[must_use = "the deferred context applies until the scope drops"]
pub struct DeferredPrimaryContext {
    /// This scope's id on its thread (0: inert).
    id: u64,
    /// Its index in the thread's stack of scopes.
    index: usize,
    _not_send: PhantomData<*const ()>,
}

impl DeferredPrimaryContext {
    /// Starts a scope for `context` (see the type's documentation). Makes no driver call.
    #[inline]
    pub fn enter(context: PrimaryContext) -> Self {
        let (id, index) = THREAD
            .try_with(|t| {
                let index = t.depth.get();
                if index >= MAX_SCOPES {
                    return (0, index);
                }
                let id = t.last_id.get() + 1;
                t.last_id.set(id);
                t.scopes[index].set(Scope {
                    id,
                    context: context.0,
                    known_before: t.known.get(),
                    ..Scope::NONE
                });
                t.depth.set(index + 1);
                t.known.set(false);
                (id, index)
            })
            .unwrap_or((0, 0));
        Self {
            id,
            index,
            _not_send: PhantomData,
        }
    }

    /// Whether a call of this scope needed a context, so that the scope's context was entered
    /// (false once the scope has ended, and for an inert scope).
    #[must_use]
    pub fn entered(&self) -> bool {
        THREAD.with(|t| {
            t.find(self.index, self.id)
                .is_some_and(|i| t.scopes[i].get().entered)
        })
    }
}

impl Drop for DeferredPrimaryContext {
    #[inline]
    fn drop(&mut self) {
        if self.id == 0 {
            return;
        }
        let restore = THREAD
            .try_with(|t| {
                let i = t.find(self.index, self.id)?;
                let depth = t.depth.get();
                // This scope and every scope opened after it end together.
                let mut restore = None;
                let mut entered = false;
                for cell in &t.scopes[i..depth] {
                    let scope = cell.get();
                    entered |= scope.entered;
                    if scope.switched && restore.is_none() {
                        restore = Some(scope.previous);
                    }
                }
                // A thread outside every scope that entered one keeps its context (or gets
                // its own back): it is known to have one. An enclosing scope applies again as
                // it was when this one opened.
                let known_before = t.scopes[i].get().known_before;
                t.known.set(known_before || (entered && i == 0));
                t.depth.set(i);
                restore
            })
            .ok()
            .flatten();
        if let Some(previous) = restore.filter(|&p| p != 0) {
            restore_context(previous);
        }
    }
}

/// Makes `previous` (a context that was current on this thread) current again; a failure is
/// logged, as drops cannot return it.
#[cold]
fn restore_context(previous: usize) {
    if let Err(e) = set_current_context(previous) {
        log::error!("rmm: could not restore the previous context: {e}");
    }
}

/// Records that the calling thread now has a current context (after `cuCtxSetCurrent`).
fn mark_context_current() {
    let _ = THREAD.try_with(|t| t.known.set(true));
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

    /// What the thread knows: (known to have a context, open scopes, the innermost one's
    /// context and whether it was entered).
    fn thread_state() -> (bool, usize, Option<(usize, bool)>) {
        THREAD.with(|t| {
            (
                t.known.get(),
                t.depth.get(),
                t.innermost().map(|(_, s)| (s.context, s.entered)),
            )
        })
    }

    /// Inside one scope of `context`, not entered yet.
    fn pending(context: usize) -> (bool, usize, Option<(usize, bool)>) {
        (false, 1, Some((context, false)))
    }

    /// Outside every scope, with a context.
    const KNOWN: (bool, usize, Option<(usize, bool)>) = (true, 0, None);

    /// Fake primary context `n`, which scopes enter in the simulated driver's thread state.
    #[cfg(feature = "testing")]
    fn fake(n: u32) -> PrimaryContext {
        PrimaryContext(crate::fault::fake_context_number(n))
    }

    /// The simulated driver's current context on this thread.
    #[cfg(feature = "testing")]
    fn current() -> usize {
        crate::fault::fake_current_context()
    }

    /// Runs `f` on a fresh thread whose current context (in the simulated driver) is fake
    /// context 9, known to the thread (as after an earlier call).
    #[cfg(feature = "testing")]
    fn on_a_thread_in_context_9(f: impl FnOnce() + Send + 'static) {
        std::thread::spawn(move || {
            crate::fault::set_fake_current_context(fake(9).0);
            mark_context_current();
            f();
        })
        .join()
        .unwrap();
    }

    #[cfg(feature = "testing")]
    #[test]
    fn a_deferred_scope_enters_at_the_first_call_that_needs_a_context() {
        std::thread::spawn(|| {
            let fake = PrimaryContext::fake();
            assert_eq!(thread_state(), (false, 0, None));
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
                assert_eq!(current(), 0);
                // One that needs a context enters the scope's, once.
                assert_eq!(ensure_current_context(), Ok(()));
                assert!(scope.entered());
                assert_eq!(current(), fake.0);
                assert!(
                    thread_state().0,
                    "entered, yet calls still take the slow path"
                );
                {
                    // A nested scope defers again, and gives the outer one back.
                    let inner = DeferredPrimaryContext::enter(fake);
                    assert_eq!(thread_state(), (false, 2, Some((fake.0, false))));
                    drop(inner);
                }
                assert!(scope.entered());
                assert!(thread_state().0);
            }
            // The thread had no context and keeps the scope's (as with the guard).
            assert_eq!(thread_state(), KNOWN);
            assert_eq!(current(), fake.0);
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
            assert_eq!(thread_state(), KNOWN);
        })
        .join()
        .unwrap();
    }

    /// Each scope switches the context, then the outer one ends first: the thread gets its own
    /// context back, and the inner scope's later end changes nothing.
    #[cfg(feature = "testing")]
    #[test]
    fn an_out_of_order_drop_restores_the_context_before_the_outer_scope() {
        on_a_thread_in_context_9(|| {
            let outer = DeferredPrimaryContext::enter(fake(1));
            assert_eq!(ensure_current_context(), Ok(()));
            let inner = DeferredPrimaryContext::enter(fake(2));
            assert_eq!(ensure_current_context(), Ok(()));
            assert_eq!(current(), fake(2).0);
            drop(outer);
            assert_eq!(current(), fake(9).0, "the thread's own context is not back");
            assert_eq!(thread_state(), KNOWN, "a scope is still open");
            assert!(!inner.entered(), "the inner scope outlived its encloser");
            drop(inner);
            assert_eq!(
                current(),
                fake(9).0,
                "the late drop restored a stale context"
            );
            assert_eq!(thread_state(), KNOWN);
            // The thread's next scopes work as on a fresh thread.
            let next = DeferredPrimaryContext::enter(fake(3));
            assert_eq!(thread_state(), pending(fake(3).0));
            assert_eq!(ensure_current_context(), Ok(()));
            drop(next);
            assert_eq!(current(), fake(9).0);
        });
    }

    /// A scope opened inside another and leaked ends with it: the thread does not believe the
    /// leaked scope open, and the context current before the outer scope comes back.
    #[cfg(feature = "testing")]
    #[test]
    fn a_scope_leaked_inside_another_ends_with_it() {
        on_a_thread_in_context_9(|| {
            let outer = DeferredPrimaryContext::enter(fake(1));
            assert_eq!(ensure_current_context(), Ok(()));
            let leaked = DeferredPrimaryContext::enter(fake(2));
            assert_eq!(ensure_current_context(), Ok(()));
            std::mem::forget(leaked);
            drop(outer);
            assert_eq!(thread_state(), KNOWN, "the leaked scope is still open");
            assert_eq!(current(), fake(9).0);
            // Leaked before it entered: nothing to restore, and nothing left open.
            let outer = DeferredPrimaryContext::enter(fake(1));
            std::mem::forget(DeferredPrimaryContext::enter(fake(2)));
            assert_eq!(thread_state(), (false, 2, Some((fake(2).0, false))));
            drop(outer);
            assert_eq!(thread_state(), KNOWN);
            assert_eq!(current(), fake(9).0);
        });
    }

    /// A scope dropped after its encloser ended, once a new scope took its place on the stack,
    /// leaves the new scope alone.
    #[cfg(feature = "testing")]
    #[test]
    fn a_late_drop_leaves_a_newer_scope_in_its_place_alone() {
        on_a_thread_in_context_9(|| {
            let outer = DeferredPrimaryContext::enter(fake(1));
            let stale = DeferredPrimaryContext::enter(fake(2));
            drop(outer);
            let first = DeferredPrimaryContext::enter(fake(3));
            let second = DeferredPrimaryContext::enter(fake(4));
            assert_eq!(ensure_current_context(), Ok(()));
            drop(stale);
            assert_eq!(thread_state(), (true, 2, Some((fake(4).0, true))));
            assert_eq!(current(), fake(4).0);
            drop(second);
            assert_eq!(thread_state(), pending(fake(3).0));
            assert_eq!(current(), fake(9).0);
            drop(first);
            assert_eq!(thread_state(), KNOWN);
        });
    }

    /// Past the nesting limit a scope is inert; the scopes below it work as before.
    #[cfg(feature = "testing")]
    #[test]
    fn scopes_past_the_limit_are_inert() {
        on_a_thread_in_context_9(|| {
            let scopes: Vec<DeferredPrimaryContext> = (0..MAX_SCOPES as u32)
                .map(|n| DeferredPrimaryContext::enter(fake(n + 1)))
                .collect();
            let last = fake(MAX_SCOPES as u32).0;
            let deep = DeferredPrimaryContext::enter(fake(99));
            assert_eq!(thread_state(), (false, MAX_SCOPES, Some((last, false))));
            assert_eq!(ensure_current_context(), Ok(()));
            assert_eq!(current(), last, "the inert scope deferred its context");
            assert!(!deep.entered());
            drop(deep);
            assert_eq!(thread_state(), (true, MAX_SCOPES, Some((last, true))));
            drop(scopes);
            assert_eq!(thread_state(), KNOWN);
            assert_eq!(current(), fake(9).0);
        });
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
            assert_eq!(thread_state(), KNOWN, "the scope left state behind");
        })
        .join()
        .unwrap();
    }
}
