//! Test-only fault injection into the driver calls rmm-sys wraps, and a simulated driver for the
//! stream and event calls, so that tests on machines without a GPU can make a CUDA call fail at
//! an exact point and check what the caller left behind (feature `testing`; not for production).
//!
//! Without the feature this module does not exist and the wrappers contain no hook at all.
//!
//! # Faults
//!
//! Every wrapper belongs to one [`DriverCall`] kind (event record, stream wait, copies,
//! allocation, ...). Before anything else, even before it looks for a driver, a wrapper asks this
//! module whether the calling thread armed a [`Fault`] for its kind; if so it returns
//! `Err(CudaError::Call { code, .. })` with the fault's code (named after the real entry point)
//! and makes no driver call. So a fault behaves the same with or without a GPU, and a fault that
//! is not "no device" is not mistaken for a missing driver by the callers that tolerate one.
//!
//! A fault skips `skip` calls of its kind, then fails the next `times`. [`calls`] counts the
//! calls of each kind the thread made, so a test can first run an operation to count its calls
//! and then fail each of them in turn.
//!
//! # The simulated driver
//!
//! With [`simulate`] on, the calls that need no memory (creating, recording, waiting on, querying
//! and synchronizing events and streams, `cuStreamGetId`, `cuCtxSynchronize` and
//! `cuCtxGetDevice`, which answers device 0) succeed without a driver: an event created then is a
//! *fake* handle. A `DeferredPrimaryContext` scope of a fake primary context enters and restores
//! it in a current context the simulation keeps per thread, never the driver's. [`fake_stream`]
//! gives fake stream handles. A fake handle is an address no driver handle can have (its top 16
//! bits are `0xfa17`, outside every user address space); a call given one never reaches the
//! driver, whether simulation is on or not, so a fake event that outlives the simulation is
//! still destroyed safely. Memory calls (allocation, free, copies,
//! prefetch, the virtual memory calls) are never simulated. The simulation orders nothing: never
//! use it with real device work.
//!
//! # A device that lacks a capability
//!
//! [`pretend_capabilities`] makes [`DeviceCapabilities::probe`] answer a chosen set, and
//! [`pretend_driver_version`] makes [`driver_version`](crate::driver_version) answer a chosen
//! version, without asking the driver: a test on any machine can then check what a resource
//! says on a device without memory pools, concurrent managed access or pageable memory access,
//! or under an older driver.
//!
//! # Watching calls
//!
//! [`watch`] runs a closure of the test's at every call of one kind this thread makes, before
//! the call (faulted, simulated or real) goes on: a test watches [`DriverCall::Synchronize`] to
//! check, at the moment the library blocks on the device, that it holds none of its locks.
//!
//! # Scope
//!
//! All state is per thread (tests run in parallel in one process): a fault armed on one thread
//! never fires on another, and a test that spawns threads arms each of them. [`reset`] (or
//! dropping a [`FaultScope`]) clears the thread's faults, counters, watchers and simulation.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::capabilities::DeviceCapabilities;
use crate::error::{CudaError, ResultCode};
use crate::{raw, DriverVersion};

/// A kind of driver call that can be made to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DriverCall {
    /// Memory allocation: `cuMemAlloc`, `cuMemAllocManaged`, `cuMemHostAlloc`,
    /// `cuMemAllocAsync`, `cuMemAllocFromPoolAsync`.
    Allocate,
    /// Freeing memory: `cuMemFree`, `cuMemFreeHost`, `cuMemFreeAsync`.
    Free,
    /// Copies and fills: `cuMemcpyAsync`, `cuMemsetD8Async`, `cuMemsetD32Async`.
    Copy,
    /// `cuMemPrefetchAsync`.
    Prefetch,
    /// `cuEventCreate`.
    EventCreate,
    /// `cuEventRecord`.
    EventRecord,
    /// `cuStreamWaitEvent`.
    StreamWait,
    /// Blocking waits: `cuCtxSynchronize`, `cuStreamSynchronize`, `cuEventSynchronize`.
    Synchronize,
    /// Polls: `cuEventQuery`, `cuStreamQuery`.
    Query,
    /// `cuStreamGetId`.
    StreamId,
    /// `cuCtxGetDevice` (the current device).
    CurrentDevice,
    /// `cuMemAddressReserve`: reserving a virtual address range.
    AddressReserve,
    /// `cuMemCreate`: a physical allocation of the virtual memory API.
    MemCreate,
    /// Mapping physical memory into a reserved range: `cuMemMap`, `cuMemSetAccess`.
    MemMap,
    /// `cuMemUnmap`.
    MemUnmap,
}

const KINDS: usize = 15;

impl DriverCall {
    /// Every kind.
    pub const ALL: [DriverCall; KINDS] = [
        DriverCall::Allocate,
        DriverCall::Free,
        DriverCall::Copy,
        DriverCall::Prefetch,
        DriverCall::EventCreate,
        DriverCall::EventRecord,
        DriverCall::StreamWait,
        DriverCall::Synchronize,
        DriverCall::Query,
        DriverCall::StreamId,
        DriverCall::CurrentDevice,
        DriverCall::AddressReserve,
        DriverCall::MemCreate,
        DriverCall::MemMap,
        DriverCall::MemUnmap,
    ];

    fn index(self) -> usize {
        self as usize
    }

    /// The code a fault of this kind returns unless told otherwise:
    /// `CUDA_ERROR_OUT_OF_MEMORY` for an allocation (of memory or of address space),
    /// `CUDA_ERROR_INVALID_HANDLE` for the rest.
    #[must_use]
    pub fn default_code(self) -> ResultCode {
        match self {
            DriverCall::Allocate | DriverCall::AddressReserve | DriverCall::MemCreate => {
                ResultCode::OUT_OF_MEMORY
            }
            _ => ResultCode::INVALID_HANDLE,
        }
    }

    /// Whether [`simulate`] makes calls of this kind succeed without a driver.
    #[must_use]
    pub fn is_simulated(self) -> bool {
        !matches!(
            self,
            DriverCall::Allocate
                | DriverCall::Free
                | DriverCall::Copy
                | DriverCall::Prefetch
                | DriverCall::AddressReserve
                | DriverCall::MemCreate
                | DriverCall::MemMap
                | DriverCall::MemUnmap
        )
    }
}

/// A planned failure: of the calls of kind `call` this thread makes from now on, skip `skip`,
/// then fail `times`, each with `code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// Which calls.
    pub call: DriverCall,
    /// How many calls of that kind succeed (or go to the driver) first.
    pub skip: usize,
    /// How many calls then fail.
    pub times: usize,
    /// The `CUresult` they fail with.
    pub code: ResultCode,
}

impl Fault {
    /// Fails the next call of kind `call` with its [default code](DriverCall::default_code).
    #[must_use]
    pub fn next(call: DriverCall) -> Self {
        Self {
            call,
            skip: 0,
            times: 1,
            code: call.default_code(),
        }
    }

    /// Fails call number `n` (0 is the next one) of kind `call`, once.
    #[must_use]
    pub fn nth(call: DriverCall, n: usize) -> Self {
        Self {
            skip: n,
            ..Self::next(call)
        }
    }

    /// The same fault failing `times` calls in a row.
    #[must_use]
    pub fn times(self, times: usize) -> Self {
        Self { times, ..self }
    }

    /// The same fault with another code.
    #[must_use]
    pub fn with_code(self, code: ResultCode) -> Self {
        Self { code, ..self }
    }
}

#[derive(Debug, Clone, Copy)]
struct Plan {
    skip: usize,
    times: usize,
    code: ResultCode,
}

const NO_PLAN: Plan = Plan {
    skip: 0,
    times: 0,
    code: ResultCode::SUCCESS,
};

#[derive(Debug)]
struct State {
    plans: [Plan; KINDS],
    calls: [u64; KINDS],
    injected: [u64; KINDS],
    simulate: bool,
    capabilities: Option<DeviceCapabilities>,
    driver_version: Option<DriverVersion>,
}

const FRESH: State = State {
    plans: [NO_PLAN; KINDS],
    calls: [0; KINDS],
    injected: [0; KINDS],
    simulate: false,
    capabilities: None,
    driver_version: None,
};

thread_local! {
    static STATE: RefCell<State> = const { RefCell::new(FRESH) };
    /// [`watch`]'s closures, by kind.
    static WATCHERS: RefCell<[Option<Watcher>; KINDS]> = const { RefCell::new([const { None }; KINDS]) };
}

/// A closure [`watch`] runs at a call.
type Watcher = Box<dyn FnMut(&'static str)>;

fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> Option<R> {
    STATE
        .try_with(|s| s.try_borrow_mut().ok().map(|mut s| f(&mut s)))
        .ok()
        .flatten()
}

/// Arms `fault` on this thread, replacing the plan of its kind.
pub fn inject(fault: Fault) {
    with_state(|s| {
        s.plans[fault.call.index()] = Plan {
            skip: fault.skip,
            times: fault.times,
            code: fault.code,
        };
    });
}

/// Fails the next `times` calls of kind `call` on this thread with the kind's default code.
pub fn fail_next(call: DriverCall, times: usize) {
    inject(Fault::next(call).times(times));
}

/// Disarms the fault of kind `call` on this thread (its counters stay).
pub fn disarm(call: DriverCall) {
    with_state(|s| s.plans[call.index()] = NO_PLAN);
}

/// How many failures of kind `call` are still armed on this thread.
#[must_use]
pub fn armed(call: DriverCall) -> usize {
    with_state(|s| s.plans[call.index()].times).unwrap_or(0)
}

/// How many calls of kind `call` this thread made since the last [`reset`] (failed ones
/// included).
#[must_use]
pub fn calls(call: DriverCall) -> u64 {
    with_state(|s| s.calls[call.index()]).unwrap_or(0)
}

/// How many calls of kind `call` failed by injection on this thread since the last [`reset`].
#[must_use]
pub fn injected(call: DriverCall) -> u64 {
    with_state(|s| s.injected[call.index()]).unwrap_or(0)
}

/// Turns the simulated driver on or off for this thread (see the [module docs](self)).
pub fn simulate(on: bool) {
    with_state(|s| s.simulate = on);
}

/// Whether this thread simulates the driver.
#[must_use]
pub fn is_simulating() -> bool {
    with_state(|s| s.simulate).unwrap_or(false)
}

/// Makes [`DeviceCapabilities::probe`] answer `caps` for every device on this thread, without a
/// driver (`None`: ask the driver again). Cleared by [`reset`].
pub fn pretend_capabilities(caps: Option<DeviceCapabilities>) {
    with_state(|s| s.capabilities = caps);
}

/// What [`pretend_capabilities`] set on this thread.
pub(crate) fn pretended_capabilities() -> Option<DeviceCapabilities> {
    with_state(|s| s.capabilities).flatten()
}

/// Makes [`driver_version`](crate::driver_version) answer `version` on this thread, without a
/// driver (`None`: ask the driver again). Cleared by [`reset`].
pub fn pretend_driver_version(version: Option<DriverVersion>) {
    with_state(|s| s.driver_version = version);
}

/// What [`pretend_driver_version`] set on this thread.
pub(crate) fn pretended_driver_version() -> Option<DriverVersion> {
    with_state(|s| s.driver_version).flatten()
}

/// Clears this thread's faults, counters, watchers, simulation and pretended capabilities.
pub fn reset() {
    with_state(|s| *s = FRESH);
    let _ = WATCHERS.try_with(|w| {
        if let Ok(mut w) = w.try_borrow_mut() {
            *w = [const { None }; KINDS];
        }
    });
}

/// Runs `watcher` at every call of kind `call` this thread makes from now on (with the entry
/// point's name), before the call goes on, until [`unwatch`] or [`reset`]; replaces the kind's
/// earlier watcher. A call the watcher makes itself is not watched again (no recursion).
pub fn watch(call: DriverCall, watcher: impl FnMut(&'static str) + 'static) {
    let _ = WATCHERS.try_with(|w| {
        if let Ok(mut w) = w.try_borrow_mut() {
            w[call.index()] = Some(Box::new(watcher));
        }
    });
}

/// Removes the watcher of kind `call` on this thread.
pub fn unwatch(call: DriverCall) {
    let _ = WATCHERS.try_with(|w| {
        if let Ok(mut w) = w.try_borrow_mut() {
            w[call.index()] = None;
        }
    });
}

/// Runs the watcher of `call`, if any (taken out while it runs, so that it may make calls; it
/// goes back unless it set another watcher for its kind).
fn run_watcher(call: DriverCall, name: &'static str) {
    let taken = WATCHERS
        .try_with(|w| {
            w.try_borrow_mut()
                .ok()
                .and_then(|mut w| w[call.index()].take())
        })
        .ok()
        .flatten();
    if let Some(mut watcher) = taken {
        watcher(name);
        let _ = WATCHERS.try_with(|w| {
            if let Ok(mut w) = w.try_borrow_mut() {
                // Unless the watcher replaced or removed itself.
                if w[call.index()].is_none() {
                    w[call.index()] = Some(watcher);
                }
            }
        });
    }
}

/// Resets this thread's fault state when made and again when dropped (also when a test
/// panics), so one test's faults never leak into the next one run on the same thread.
#[derive(Debug)]
#[must_use = "the faults are cleared when the scope drops"]
pub struct FaultScope {
    /// Per thread: the scope must be dropped where it was made.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl FaultScope {
    /// A clean scope, the real driver (if any) behind it.
    pub fn new() -> Self {
        reset();
        Self {
            _not_send: std::marker::PhantomData,
        }
    }

    /// A clean scope with the simulated driver on.
    pub fn simulated() -> Self {
        let scope = Self::new();
        simulate(true);
        scope
    }
}

impl Default for FaultScope {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for FaultScope {
    fn drop(&mut self) {
        reset();
    }
}

/// The top 16 bits of every fake handle (no user-space address has them set).
const FAKE_TAG: usize = 0xfa17 << 48;
const FAKE_MASK: usize = 0xffff << 48;
/// Fake streams and fake events live in different ranges below the tag.
const FAKE_STREAM: usize = 1 << 40;
const FAKE_EVENT: usize = 2 << 40;
const FAKE_CONTEXT: usize = 3 << 40;

static NEXT_FAKE_EVENT: AtomicUsize = AtomicUsize::new(1);

/// Whether `handle` (a stream or event handle as an address) is a fake one.
#[must_use]
pub fn is_fake(handle: usize) -> bool {
    handle & FAKE_MASK == FAKE_TAG
}

/// Fake stream number `n`: a handle every wrapper accepts without a driver (its
/// `cuStreamGetId` is a number no real stream has, the same for the same `n`).
#[must_use]
pub fn fake_stream(n: u32) -> raw::CUstream {
    (FAKE_TAG | FAKE_STREAM | n as usize) as raw::CUstream
}

/// The fake context of `PrimaryContext::fake`.
pub(crate) fn fake_context() -> usize {
    fake_context_number(0)
}

/// Fake primary context number `n` (`PrimaryContext::fake` is number 0).
pub(crate) fn fake_context_number(n: u32) -> usize {
    FAKE_TAG | FAKE_CONTEXT | n as usize
}

thread_local! {
    /// The fake context current on this thread in the simulated driver (0: none), which a
    /// `DeferredPrimaryContext` scope of a fake context enters and restores instead of the
    /// driver's.
    static FAKE_CURRENT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The fake context current on this thread (0: none).
pub(crate) fn fake_current_context() -> usize {
    FAKE_CURRENT.try_with(std::cell::Cell::get).unwrap_or(0)
}

/// Makes `context` the fake context current on this thread.
pub(crate) fn set_fake_current_context(context: usize) {
    let _ = FAKE_CURRENT.try_with(|c| c.set(context));
}

pub(crate) fn fake_event() -> raw::CUevent {
    (FAKE_TAG | FAKE_EVENT | NEXT_FAKE_EVENT.fetch_add(1, Ordering::Relaxed)) as raw::CUevent
}

/// The stream id the simulation reports for a fake stream.
pub(crate) fn fake_stream_id(handle: usize) -> u64 {
    (handle & !FAKE_MASK) as u64
}

/// The error of a memory call given a fake stream: the simulation has no memory to hand out.
pub(crate) fn unsimulated(name: &'static str) -> CudaError {
    CudaError::from_raw_code(name, ResultCode::INVALID_HANDLE.0)
}

/// What a wrapper does with a call.
#[derive(Debug)]
pub(crate) enum Intercept {
    /// Fail with this error, without calling the driver.
    Fail(CudaError),
    /// Succeed without calling the driver.
    Simulate,
    /// Call the driver.
    Driver,
}

/// Counts a call of kind `call` (the entry point `name`) made with `handles` on this thread and
/// says what to do with it.
pub(crate) fn intercept(call: DriverCall, name: &'static str, handles: &[usize]) -> Intercept {
    run_watcher(call, name);
    let fake = handles.iter().any(|&h| is_fake(h));
    let verdict = with_state(|s| {
        let i = call.index();
        s.calls[i] = s.calls[i].wrapping_add(1);
        let plan = &mut s.plans[i];
        if plan.times > 0 {
            if plan.skip > 0 {
                plan.skip -= 1;
            } else {
                plan.times -= 1;
                s.injected[i] = s.injected[i].wrapping_add(1);
                return Some(plan.code);
            }
        }
        None
    })
    .flatten();
    if let Some(code) = verdict {
        return Intercept::Fail(CudaError::from_raw_code(name, code.0));
    }
    if fake || (call.is_simulated() && is_simulating()) {
        Intercept::Simulate
    } else {
        Intercept::Driver
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{memory, stream};

    #[test]
    fn pretended_capabilities_answer_until_reset() {
        let caps = DeviceCapabilities {
            memory_pools_supported: false,
            supported_handle_types: 0,
            concurrent_managed_access: false,
            pageable_memory_access: true,
        };
        {
            let _scope = FaultScope::new();
            pretend_capabilities(Some(caps));
            pretend_driver_version(Some(DriverVersion(12040)));
            assert_eq!(DeviceCapabilities::probe(crate::DeviceId(3)), Ok(caps));
            assert_eq!(crate::driver_version(), Ok(DriverVersion(12040)));
        }
        // Dropping the scope resets: the driver is asked again.
        assert_eq!(pretended_capabilities(), None);
        assert_eq!(pretended_driver_version(), None);
    }

    #[test]
    fn a_fault_skips_then_fails_then_passes() {
        let _scope = FaultScope::simulated();
        inject(Fault::nth(DriverCall::Synchronize, 1).times(2));
        assert_eq!(armed(DriverCall::Synchronize), 2);
        assert_eq!(crate::device_synchronize(), Ok(()));
        for _ in 0..2 {
            let e = crate::device_synchronize().unwrap_err();
            assert_eq!(e.code(), Some(ResultCode::INVALID_HANDLE));
            assert!(e.to_string().contains("cuCtxSynchronize"), "{e}");
            assert!(!e.is_no_device() && !e.is_out_of_memory());
        }
        assert_eq!(crate::device_synchronize(), Ok(()));
        assert_eq!(calls(DriverCall::Synchronize), 4);
        assert_eq!(injected(DriverCall::Synchronize), 2);
        assert_eq!(armed(DriverCall::Synchronize), 0);
        assert_eq!(calls(DriverCall::EventRecord), 0);
    }

    #[test]
    fn faults_fire_before_the_driver_is_looked_for() {
        let _scope = FaultScope::new();
        inject(Fault::next(DriverCall::Allocate));
        let e = memory::mem_alloc(1 << 20).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        assert!(e.to_string().contains("cuMemAlloc"), "{e}");
        inject(Fault::next(DriverCall::Copy).with_code(ResultCode::INVALID_VALUE));
        // SAFETY: the fault fires before anything is copied.
        let e = unsafe {
            memory::memcpy_async(
                crate::DevicePtr::from_raw(0x1000),
                crate::DevicePtr::from_raw(0x2000),
                16,
                fake_stream(1),
            )
        }
        .unwrap_err();
        assert_eq!(e.code(), Some(ResultCode::INVALID_VALUE));
        assert_eq!(injected(DriverCall::Allocate), 1);
        assert_eq!(injected(DriverCall::Copy), 1);
    }

    #[test]
    fn the_simulation_answers_stream_and_event_calls() {
        let _scope = FaultScope::simulated();
        assert_eq!(crate::current_device(), Ok(crate::DeviceId(0)));
        let ev = stream::event_create(stream::CU_EVENT_DISABLE_TIMING).unwrap();
        assert!(is_fake(ev as usize));
        let s = fake_stream(7);
        // SAFETY: fake handles never reach the driver.
        unsafe {
            assert_eq!(
                stream::stream_get_id(s),
                stream::stream_get_id(fake_stream(7))
            );
            assert_ne!(
                stream::stream_get_id(s).unwrap(),
                stream::stream_get_id(fake_stream(8)).unwrap()
            );
            stream::event_record(ev, s).unwrap();
            stream::event_record(ev, crate::CU_STREAM_LEGACY).unwrap();
            stream::stream_wait_event(crate::CU_STREAM_PER_THREAD, ev).unwrap();
            assert_eq!(stream::event_query(ev), Ok(true));
            stream::event_synchronize(ev).unwrap();
            stream::stream_synchronize(s).unwrap();
            assert_eq!(stream::stream_query(s), Ok(true));
        }
        inject(Fault::next(DriverCall::EventRecord));
        // SAFETY: as above.
        let e = unsafe { stream::event_record(ev, s) }.unwrap_err();
        assert_eq!(e.code(), Some(ResultCode::INVALID_HANDLE));
        simulate(false);
        // Outside the simulation a fake handle still never reaches the driver.
        // SAFETY: as above.
        unsafe {
            stream::event_record(ev, s).unwrap();
            stream::event_destroy(ev).unwrap();
        }
        assert_eq!(calls(DriverCall::EventRecord), 4);
        if !crate::is_driver_present() {
            assert_eq!(
                stream::event_create(0).unwrap_err(),
                CudaError::DriverNotFound
            );
            assert_eq!(crate::device_synchronize(), Err(CudaError::DriverNotFound));
        }
    }

    #[test]
    fn memory_calls_are_never_simulated() {
        let _scope = FaultScope::simulated();
        // The call reaches the driver (or finds none) either way: simulation never fakes memory.
        let result = memory::mem_alloc(256);
        if !crate::is_driver_present() {
            assert_eq!(result.unwrap_err(), CudaError::DriverNotFound);
        } else if let Ok(ptr) = result {
            // SAFETY: a real allocation just made, freed once; no work uses it.
            unsafe { memory::mem_free(ptr) }.unwrap();
        }
        assert_eq!(calls(DriverCall::Allocate), 1);
    }

    #[test]
    fn state_is_per_thread_and_scoped() {
        {
            let _scope = FaultScope::simulated();
            fail_next(DriverCall::StreamWait, 3);
            let other = std::thread::spawn(|| (armed(DriverCall::StreamWait), is_simulating()))
                .join()
                .unwrap();
            assert_eq!(other, (0, false));
            assert_eq!(armed(DriverCall::StreamWait), 3);
            disarm(DriverCall::StreamWait);
            assert_eq!(armed(DriverCall::StreamWait), 0);
            fail_next(DriverCall::StreamWait, 1);
        }
        assert_eq!(armed(DriverCall::StreamWait), 0);
        assert!(!is_simulating());
    }

    #[test]
    fn a_watcher_sees_every_call_of_its_kind_until_removed() {
        use std::cell::RefCell;
        use std::rc::Rc;
        let _scope = FaultScope::simulated();
        let seen: Rc<RefCell<Vec<&'static str>>> = Rc::default();
        let log = Rc::clone(&seen);
        watch(DriverCall::Synchronize, move |name| {
            log.borrow_mut().push(name);
            // A call made by the watcher is not watched again.
            let _ = crate::device_synchronize();
        });
        crate::device_synchronize().unwrap();
        assert_eq!(calls(DriverCall::Synchronize), 2, "the watcher's own call");
        // SAFETY: fake handles never reach the driver.
        unsafe { stream::stream_synchronize(fake_stream(2)).unwrap() };
        let ev = stream::event_create(0).unwrap();
        // SAFETY: as above.
        unsafe { stream::event_synchronize(ev).unwrap() };
        // Other kinds are not watched.
        // SAFETY: as above.
        unsafe { stream::event_record(ev, fake_stream(2)).unwrap() };
        assert_eq!(
            *seen.borrow(),
            [
                "cuCtxSynchronize",
                "cuStreamSynchronize",
                "cuEventSynchronize"
            ]
        );
        unwatch(DriverCall::Synchronize);
        crate::device_synchronize().unwrap();
        assert_eq!(seen.borrow().len(), 3);
        // A scope's end removes the watcher too.
        let log = Rc::clone(&seen);
        watch(DriverCall::Synchronize, move |name| {
            log.borrow_mut().push(name)
        });
        reset();
        simulate(true);
        crate::device_synchronize().unwrap();
        assert_eq!(seen.borrow().len(), 3);
    }

    #[test]
    fn fake_handles_are_no_addresses() {
        assert!(is_fake(fake_stream(0) as usize));
        assert!(is_fake(fake_stream(u32::MAX) as usize));
        for real in [0usize, 1, 2, 0x7fff_ffff_f000, usize::MAX >> 16] {
            assert!(!is_fake(real), "{real:#x}");
        }
        assert_ne!(fake_event(), fake_event());
        assert!(DriverCall::ALL
            .iter()
            .enumerate()
            .all(|(i, c)| c.index() == i));
    }
}
