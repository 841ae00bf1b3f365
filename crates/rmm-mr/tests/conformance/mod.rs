//! RMM's shared resource-conformance suite (its `mr_ref` tests, section 3.2 of the reference)
//! as one generic suite: any resource can be plugged in through a [`Subject`], and each case
//! becomes a libtest-mimic trial that reports itself ignored, with the reason, where there is
//! no GPU or the resource is unsupported on this machine.
//!
//! Sizes and counts are RMM's; the random sequences use seeds of our own.

#![allow(dead_code, unreachable_pub, missing_docs)]

pub mod alignment;

use std::sync::mpsc;
use std::sync::Arc;

use libtest_mimic::{Failed, Trial};
use rmm_mr::testing::Rng;
use rmm_mr::{
    current_device_resource, reset_current_device_resource, set_current_device_resource,
    CudaMemoryResource, DeviceMemoryResource, MrError, SharedResource,
};
use rmm_stream::{CudaEvent, CudaStream, CudaStreamView};
pub use rmm_sys::testing::ensure;
use rmm_sys::testing::gpu_if;
use rmm_sys::{DeviceGuard, DeviceId, DevicePtr};

pub const KIB: usize = 1 << 10;
pub const MIB: usize = 1 << 20;
pub const GIB: usize = 1 << 30;
pub const PIB: usize = 1 << 50;

/// How a subject is built and which of RMM's suites it runs.
#[derive(Clone)]
pub struct Subject {
    /// The name in trial names (e.g. `cuda_async`).
    pub name: &'static str,
    /// Builds a fresh resource with the current device current.
    pub factory: Arc<dyn Fn() -> Result<SharedResource, MrError> + Send + Sync>,
    /// Why the resource cannot run here (checked after the GPU check), or `None`.
    pub unsupported: Arc<dyn Fn() -> Option<String> + Send + Sync>,
    /// Run the multi-threaded suite (RMM skips it for pinned, system, pinned pool, ...).
    pub multithreaded: bool,
    /// Run the allocation suite (RMM skips it for fixed-size: sizes above its block fail).
    pub allocation: bool,
    /// Check that a 1 PiB request fails with out-of-memory. Off for managed memory: asking the
    /// driver for more managed memory than the device has free can hang the GPU.
    pub oversize: bool,
}

impl Subject {
    /// A subject running every suite.
    pub fn new(
        name: &'static str,
        factory: impl Fn() -> Result<SharedResource, MrError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            name,
            factory: Arc::new(factory),
            unsupported: Arc::new(|| None),
            multithreaded: true,
            allocation: true,
            oversize: true,
        }
    }

    pub fn unsupported_when(
        mut self,
        f: impl Fn() -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.unsupported = Arc::new(f);
        self
    }

    pub fn without_mt(mut self) -> Self {
        self.multithreaded = false;
        self
    }

    pub fn without_allocation_suite(mut self) -> Self {
        self.allocation = false;
        self
    }

    pub fn without_oversize(mut self) -> Self {
        self.oversize = false;
        self
    }

    fn make(&self) -> Result<SharedResource, Failed> {
        (self.factory)().map_err(|e| Failed::from(format!("constructing {}: {e}", self.name)))
    }
}

/// A test body given the subject.
type Body = fn(&Subject) -> Result<(), Failed>;

/// Wraps a body in the GPU and capability checks.
pub fn trial(prefix: &str, subject: &Subject, case: &str, body: Body) -> Trial {
    let s = subject.clone();
    let unsupported = Arc::clone(&s.unsupported);
    gpu_if(
        format!("{prefix}::{}::{case}", subject.name),
        move || unsupported().map(|why| format!("unsupported here: {why}")),
        move || body(&s),
    )
}

/// The alignment rows (the trait's "Alignment" rule), which every subject runs.
const ALIGNMENT_CASES: [(&str, Body); 3] = [
    ("alignment_zero_is_default", alignment_zero_is_default),
    ("alignment_not_pow2_is_error", alignment_not_pow2_is_error),
    (
        "alignment_large_honoured_or_refused",
        alignment_large_honoured_or_refused,
    ),
];

/// Only the alignment rows, for subjects that need no more.
pub fn alignment_trials(subject: &Subject) -> Vec<Trial> {
    ALIGNMENT_CASES
        .into_iter()
        .map(|(case, body)| trial("conformance", subject, case, body))
        .collect()
}

/// Every case of the suites the subject runs (5 basic, 9 allocation, 15 multithreaded) and the
/// 3 alignment rows.
pub fn trials(subject: &Subject) -> Vec<Trial> {
    let mut cases: Vec<(&str, Body)> = vec![
        (
            "SetCurrentDeviceResourceRef",
            set_current_device_resource_ref,
        ),
        ("SelfEquality", self_equality),
        ("AllocationsAreDifferent", allocations_are_different),
        (
            "AsyncAllocationsAreDifferentDefaultStream",
            async_allocations_are_different_default_stream,
        ),
        (
            "AsyncAllocationsAreDifferent",
            async_allocations_are_different,
        ),
    ];
    if subject.allocation {
        cases.extend([
            ("AllocateDefault", allocate_default as Body),
            ("AllocateDefaultStream", allocate_default_stream),
            ("AllocateOnStream", allocate_on_stream),
            ("RandomAllocations", random_allocations),
            (
                "RandomAllocationsDefaultStream",
                random_allocations_default_stream,
            ),
            ("RandomAllocationsStream", random_allocations_stream),
            ("MixedRandomAllocationFree", mixed_random_allocation_free),
            (
                "MixedRandomAllocationFreeDefaultStream",
                mixed_default_stream,
            ),
            ("MixedRandomAllocationFreeStream", mixed_stream),
        ]);
    }
    if subject.multithreaded {
        cases.extend([
            (
                "SetCurrentDeviceResourceRef_mt",
                set_current_device_resource_ref_mt as Body,
            ),
            (
                "SetCurrentDeviceResourceRefPerThread_mt",
                set_current_device_resource_ref_per_thread_mt,
            ),
            ("Allocate_mt", mt_allocate),
            ("AllocateDefaultStream_mt", mt_allocate_default_stream),
            ("AllocateOnStream_mt", mt_allocate_on_stream),
            ("RandomAllocations_mt", mt_random),
            (
                "RandomAllocationsDefaultStream_mt",
                mt_random_default_stream,
            ),
            ("RandomAllocationsStream_mt", mt_random_stream),
            ("MixedRandomAllocationFree_mt", mt_mixed),
            (
                "MixedRandomAllocationFreeDefaultStream_mt",
                mt_mixed_default_stream,
            ),
            ("MixedRandomAllocationFreeStream_mt", mt_mixed_stream),
            (
                "AllocFreeDifferentThreadsDefaultStream",
                alloc_free_threads_default_stream,
            ),
            (
                "AllocFreeDifferentThreadsPerThreadDefaultStream",
                alloc_free_threads_per_thread_stream,
            ),
            (
                "AllocFreeDifferentThreadsSameStream",
                alloc_free_threads_same_stream,
            ),
            (
                "AllocFreeDifferentThreadsDifferentStream",
                alloc_free_threads_different_stream,
            ),
        ]);
    }
    cases.extend(ALIGNMENT_CASES);
    cases
        .into_iter()
        .map(|(case, body)| trial("conformance", subject, case, body))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// Where a routine allocates: the synchronous API, the default stream, or an owned stream.
#[derive(Clone, Copy)]
pub enum Mode<'s> {
    Sync,
    Stream(CudaStreamView<'s>),
}

pub fn alloc(
    mr: &dyn DeviceMemoryResource,
    mode: Mode<'_>,
    bytes: usize,
) -> Result<DevicePtr, MrError> {
    match mode {
        Mode::Sync => mr.allocate_sync(bytes, 256),
        Mode::Stream(s) => {
            let p = mr.allocate(s, bytes, 256)?;
            if !s.is_default() && !s.is_per_thread_default() {
                s.synchronize()?;
            }
            Ok(p)
        }
    }
}

pub fn free(
    mr: &dyn DeviceMemoryResource,
    mode: Mode<'_>,
    p: DevicePtr,
    bytes: usize,
) -> Result<(), Failed> {
    // SAFETY: every caller frees what it allocated from `mr` with the same size.
    let r = unsafe {
        match mode {
            Mode::Sync => mr.deallocate_sync(p, bytes, 256),
            Mode::Stream(s) => mr.deallocate(s, p, bytes, 256),
        }
    };
    r.map_err(|e| Failed::from(format!("deallocate {bytes} B: {e}")))?;
    if let Mode::Stream(s) = mode {
        if !s.is_default() && !s.is_per_thread_default() {
            s.synchronize()?;
        }
    }
    Ok(())
}

fn check_ptr(mr: &dyn DeviceMemoryResource, p: DevicePtr, what: &str) -> Result<(), Failed> {
    ensure(!p.is_null(), format!("{what}: null pointer"))?;
    ensure(p.is_aligned(256), format!("{what}: {p} is not 256-aligned"))?;
    ensure(
        mr.properties().device_accessible,
        format!("{what}: not device accessible"),
    )
}

// ---------------------------------------------------------------------------------------------
// Routines (RMM's mr_ref_test.hpp)

fn current_device_resource_allocates() -> Result<(), Failed> {
    let mr = current_device_resource()?;
    let p = mr.allocate_sync(MIB, 256)?;
    check_ptr(&*mr, p, "current device resource")?;
    // SAFETY: `p` came from `mr` with these arguments.
    unsafe { mr.deallocate_sync(p, MIB, 256)? };
    Ok(())
}

fn various_allocations(
    s: &Subject,
    mr: &dyn DeviceMemoryResource,
    mode: Mode<'_>,
) -> Result<(), Failed> {
    let p = alloc(mr, mode, 0)?;
    free(mr, mode, p, 0)?;
    for (bytes, name) in [(4, "4 B"), (KIB, "1 KiB"), (MIB, "1 MiB"), (GIB, "1 GiB")] {
        match alloc(mr, mode, bytes) {
            Ok(p) => {
                check_ptr(mr, p, name)?;
                free(mr, mode, p, bytes)?;
            }
            Err(e) if e.is_out_of_memory() => {
                ensure(
                    e.to_string().contains("out_of_memory"),
                    format!("{name}: {e}"),
                )?;
            }
            Err(e) => return Err(format!("{name}: {e}").into()),
        }
    }
    if s.oversize {
        match alloc(mr, mode, PIB) {
            Ok(p) => {
                let _ = free(mr, mode, p, PIB);
                return Err("a 1 PiB allocation succeeded".into());
            }
            Err(e) => ensure(
                e.is_out_of_memory(),
                format!("1 PiB failed with the wrong kind: {e}"),
            )?,
        }
    }
    Ok(())
}

fn random_allocations_in(
    mr: &dyn DeviceMemoryResource,
    mode: Mode<'_>,
    seed: u64,
) -> Result<(), Failed> {
    let mut rng = Rng::new(seed);
    let mut live = Vec::with_capacity(100);
    for _ in 0..100 {
        let bytes = rng.range(1, 5 * MIB);
        let p = alloc(mr, mode, bytes)?;
        check_ptr(mr, p, "random allocation")?;
        live.push((p, bytes));
    }
    for (p, b) in live {
        free(mr, mode, p, b)?;
    }
    Ok(())
}

fn mixed_in(mr: &dyn DeviceMemoryResource, mode: Mode<'_>, seed: u64) -> Result<(), Failed> {
    let mut rng = Rng::new(seed);
    let mut live: Vec<(DevicePtr, usize)> = Vec::new();
    let mut allocated = 0;
    for _ in 0..200 {
        let do_alloc = live.is_empty() || (allocated < 100 && rng.range(0, 99) < 53);
        if do_alloc {
            let bytes = rng.range(1, 5 * MIB);
            let p = alloc(mr, mode, bytes)?;
            check_ptr(mr, p, "mixed allocation")?;
            live.push((p, bytes));
            allocated += 1;
        } else {
            let i = rng.range(0, live.len() - 1);
            let (p, b) = live.swap_remove(i);
            free(mr, mode, p, b)?;
        }
    }
    for (p, b) in live {
        free(mr, mode, p, b)?;
    }
    Ok(())
}

fn different_in(mr: &dyn DeviceMemoryResource, mode: Mode<'_>) -> Result<(), Failed> {
    let a = alloc(mr, mode, 8)?;
    let b = alloc(mr, mode, 8)?;
    ensure(a != b, format!("two live allocations share {a}"))?;
    free(mr, mode, a, 8)?;
    free(mr, mode, b, 8)
}

fn on_4_threads(f: impl Fn(u64) -> Result<(), Failed> + Sync) -> Result<(), Failed> {
    let device = rmm_sys::current_device()?;
    std::thread::scope(|scope| {
        let joins: Vec<_> = (0..4u64)
            .map(|i| {
                let f = &f;
                scope.spawn(move || -> Result<(), Failed> {
                    rmm_sys::set_current_device(device)?;
                    f(i)
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| j.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect::<Result<Vec<()>, Failed>>()
    })?;
    Ok(())
}

/// A producer thread allocates 100 blocks on stream A and records an event after each; a
/// consumer thread makes stream B wait on the event and frees on B.
fn producer_consumer(
    mr: &dyn DeviceMemoryResource,
    a: CudaStreamView<'_>,
    b: CudaStreamView<'_>,
) -> Result<(), Failed> {
    let device = rmm_sys::current_device()?;
    let (tx, rx) = mpsc::channel::<(DevicePtr, usize, CudaEvent)>();
    std::thread::scope(|scope| {
        let producer = scope.spawn(move || -> Result<(), Failed> {
            rmm_sys::set_current_device(device)?;
            let mut rng = Rng::new(0x5eed_0001);
            for _ in 0..100 {
                let bytes = rng.range(1, MIB);
                let p = mr.allocate(a, bytes, 256)?;
                check_ptr(mr, p, "producer allocation")?;
                let ev = CudaEvent::new()?;
                ev.record(a)?;
                tx.send((p, bytes, ev))
                    .map_err(|e| Failed::from(e.to_string()))?;
            }
            Ok(())
        });
        let consumer = scope.spawn(move || -> Result<(), Failed> {
            rmm_sys::set_current_device(device)?;
            for (p, bytes, ev) in rx {
                ev.wait(b)?;
                // SAFETY: `p` came from `mr` with `bytes`; `b` waits on the producer's event.
                unsafe { mr.deallocate(b, p, bytes, 256) }
                    .map_err(|e| Failed::from(format!("consumer free: {e}")))?;
            }
            b.synchronize()?;
            Ok(())
        });
        producer
            .join()
            .unwrap_or_else(|_| Err("producer panicked".into()))?;
        consumer
            .join()
            .unwrap_or_else(|_| Err("consumer panicked".into()))
    })
}

// ---------------------------------------------------------------------------------------------
// Basic suite

fn set_current_device_resource_ref(s: &Subject) -> Result<(), Failed> {
    set_current_device_resource(Arc::new(CudaMemoryResource::new()))?;
    let mr = s.make()?;
    let previous = set_current_device_resource(Arc::clone(&mr))?;
    let result = (|| {
        ensure(
            previous.is_equal(&CudaMemoryResource::new()),
            "previous is not the cuda resource",
        )?;
        let p = previous.allocate_sync(MIB, 256)?;
        // SAFETY: `p` came from `previous`.
        unsafe { previous.deallocate_sync(p, MIB, 256)? };
        ensure(
            current_device_resource()?.is_equal(&*mr),
            "current is not the subject",
        )?;
        current_device_resource_allocates()
    })();
    reset_current_device_resource()?;
    result?;
    current_device_resource_allocates()
}

fn self_equality(s: &Subject) -> Result<(), Failed> {
    let mr = s.make()?;
    ensure(mr.is_equal(&*mr), "resource is not equal to itself")?;
    let copy = Arc::clone(&mr);
    ensure(
        copy.is_equal(&*mr) && mr.is_equal(&copy),
        "a copy is not equal",
    )
}

fn allocations_are_different(s: &Subject) -> Result<(), Failed> {
    different_in(&*s.make()?, Mode::Sync)
}

fn async_allocations_are_different_default_stream(s: &Subject) -> Result<(), Failed> {
    different_in(&*s.make()?, Mode::Stream(CudaStreamView::default()))
}

fn async_allocations_are_different(s: &Subject) -> Result<(), Failed> {
    let stream = CudaStream::with_default_flags()?;
    different_in(&*s.make()?, Mode::Stream(stream.view()))
}

// ---------------------------------------------------------------------------------------------
// Allocation suite

fn allocate_default(s: &Subject) -> Result<(), Failed> {
    various_allocations(s, &*s.make()?, Mode::Sync)
}

fn allocate_default_stream(s: &Subject) -> Result<(), Failed> {
    various_allocations(s, &*s.make()?, Mode::Stream(CudaStreamView::default()))
}

fn allocate_on_stream(s: &Subject) -> Result<(), Failed> {
    let stream = CudaStream::with_default_flags()?;
    various_allocations(s, &*s.make()?, Mode::Stream(stream.view()))
}

fn random_allocations(s: &Subject) -> Result<(), Failed> {
    random_allocations_in(&*s.make()?, Mode::Sync, 1)
}

fn random_allocations_default_stream(s: &Subject) -> Result<(), Failed> {
    random_allocations_in(&*s.make()?, Mode::Stream(CudaStreamView::default()), 2)
}

fn random_allocations_stream(s: &Subject) -> Result<(), Failed> {
    let stream = CudaStream::with_default_flags()?;
    random_allocations_in(&*s.make()?, Mode::Stream(stream.view()), 3)
}

fn mixed_random_allocation_free(s: &Subject) -> Result<(), Failed> {
    mixed_in(&*s.make()?, Mode::Sync, 4)
}

fn mixed_default_stream(s: &Subject) -> Result<(), Failed> {
    mixed_in(&*s.make()?, Mode::Stream(CudaStreamView::default()), 5)
}

fn mixed_stream(s: &Subject) -> Result<(), Failed> {
    let stream = CudaStream::with_default_flags()?;
    mixed_in(&*s.make()?, Mode::Stream(stream.view()), 6)
}

// ---------------------------------------------------------------------------------------------
// Multithreaded suite

fn set_current_device_resource_ref_mt(s: &Subject) -> Result<(), Failed> {
    let mr = s.make()?;
    set_current_device_resource(Arc::clone(&mr))?;
    let r = on_4_threads(|_| {
        ensure(
            current_device_resource()?.is_equal(&*mr),
            "thread sees another resource",
        )?;
        current_device_resource_allocates()
    });
    reset_current_device_resource()?;
    r
}

fn set_current_device_resource_ref_per_thread_mt(s: &Subject) -> Result<(), Failed> {
    let n = rmm_sys::device_count()?;
    std::thread::scope(|scope| {
        let joins: Vec<_> = (0..n as i32)
            .map(|d| {
                scope.spawn(move || -> Result<(), Failed> {
                    rmm_sys::set_current_device(DeviceId(d))?;
                    current_device_resource_allocates()?;
                    let mr = s.make()?;
                    set_current_device_resource(Arc::clone(&mr))?;
                    let r = current_device_resource_allocates();
                    reset_current_device_resource()?;
                    r?;
                    current_device_resource_allocates()
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| j.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect::<Result<Vec<()>, Failed>>()
    })?;
    Ok(())
}

fn mt_allocate(s: &Subject) -> Result<(), Failed> {
    let mr = s.make()?;
    on_4_threads(|_| various_allocations(s, &*mr, Mode::Sync))
}

fn mt_allocate_default_stream(s: &Subject) -> Result<(), Failed> {
    let mr = s.make()?;
    on_4_threads(|_| various_allocations(s, &*mr, Mode::Stream(CudaStreamView::default())))
}

fn mt_allocate_on_stream(s: &Subject) -> Result<(), Failed> {
    let mr = s.make()?;
    let stream = CudaStream::with_default_flags()?;
    let v = stream.view();
    on_4_threads(|_| various_allocations(s, &*mr, Mode::Stream(v)))
}

fn mt_random(s: &Subject) -> Result<(), Failed> {
    let mr = s.make()?;
    on_4_threads(|i| random_allocations_in(&*mr, Mode::Sync, 10 + i))
}

fn mt_random_default_stream(s: &Subject) -> Result<(), Failed> {
    let mr = s.make()?;
    on_4_threads(|i| random_allocations_in(&*mr, Mode::Stream(CudaStreamView::default()), 20 + i))
}

fn mt_random_stream(s: &Subject) -> Result<(), Failed> {
    let mr = s.make()?;
    let stream = CudaStream::with_default_flags()?;
    let v = stream.view();
    on_4_threads(|i| random_allocations_in(&*mr, Mode::Stream(v), 30 + i))
}

fn mt_mixed(s: &Subject) -> Result<(), Failed> {
    let mr = s.make()?;
    on_4_threads(|i| mixed_in(&*mr, Mode::Sync, 40 + i))
}

fn mt_mixed_default_stream(s: &Subject) -> Result<(), Failed> {
    let mr = s.make()?;
    on_4_threads(|i| mixed_in(&*mr, Mode::Stream(CudaStreamView::default()), 50 + i))
}

fn mt_mixed_stream(s: &Subject) -> Result<(), Failed> {
    let mr = s.make()?;
    let stream = CudaStream::with_default_flags()?;
    let v = stream.view();
    on_4_threads(|i| mixed_in(&*mr, Mode::Stream(v), 60 + i))
}

fn alloc_free_threads_default_stream(s: &Subject) -> Result<(), Failed> {
    let d = CudaStreamView::default();
    producer_consumer(&*s.make()?, d, d)
}

fn alloc_free_threads_per_thread_stream(s: &Subject) -> Result<(), Failed> {
    let p = CudaStreamView::per_thread();
    producer_consumer(&*s.make()?, p, p)
}

fn alloc_free_threads_same_stream(s: &Subject) -> Result<(), Failed> {
    let stream = CudaStream::with_default_flags()?;
    producer_consumer(&*s.make()?, stream.view(), stream.view())
}

fn alloc_free_threads_different_stream(s: &Subject) -> Result<(), Failed> {
    let a = CudaStream::with_default_flags()?;
    let b = CudaStream::with_default_flags()?;
    producer_consumer(&*s.make()?, a.view(), b.view())
}

// ---------------------------------------------------------------------------------------------
// Alignment rows (the checks live in `alignment`, shared with the CPU test over host memory)

/// Runs `check` with the synchronous API and on an owned stream.
fn on_sync_and_stream(
    s: &Subject,
    check: impl Fn(&dyn DeviceMemoryResource, alignment::How<'_>) -> Result<(), String>,
) -> Result<(), Failed> {
    let mr = s.make()?;
    let stream = CudaStream::with_default_flags()?;
    check(&*mr, alignment::How::Sync).map_err(|e| format!("synchronous API: {e}"))?;
    check(&*mr, alignment::How::Stream(stream.view())).map_err(|e| format!("on a stream: {e}"))?;
    stream.synchronize()?;
    Ok(())
}

fn alignment_zero_is_default(s: &Subject) -> Result<(), Failed> {
    on_sync_and_stream(s, alignment::zero_is_default)
}

fn alignment_not_pow2_is_error(s: &Subject) -> Result<(), Failed> {
    on_sync_and_stream(s, alignment::not_pow2_is_error)
}

fn alignment_large_honoured_or_refused(s: &Subject) -> Result<(), Failed> {
    on_sync_and_stream(s, |mr, how| {
        for bytes in [1000, 300 * KIB] {
            alignment::large_honoured_or_refused(mr, how, bytes)?;
        }
        Ok(())
    })
}

/// Keeps a device current for a scope in helpers that need one.
pub fn on_device(d: DeviceId) -> Result<DeviceGuard, Failed> {
    Ok(DeviceGuard::new(d)?)
}
