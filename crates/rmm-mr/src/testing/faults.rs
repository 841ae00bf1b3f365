//! The fault-injection harness: [`sweep`] runs a component through seeded workloads with faults
//! injected (the sweeps of the adaptors and sub-allocators are in `faults/tests.rs`, the
//! arena's in `arena/resource/tests.rs`).
//!
//! Each component runs seeded random workloads on the host mock, under rmm-sys's simulated
//! driver (so ordinary streams exist), while about half of the steps get a fault: the
//! upstream's allocation or free fails ([`FaultyResource`], every error kind), a driver call of
//! the simulated driver fails (event create, record and wait, synchronization, stream ids, the
//! current device), a log writer panics; some steps are wrong frees. After every failed call the
//! component's bookkeeping (statistics counters, tracking records, limiting's bytes, free lists,
//! chunks and handed-out records, shifted entries) and the mock's live set must be exactly as
//! before it; after every successful one they must match a model of the live allocations; at
//! the end every allocation is freed and nothing is left in the mock.
//!
//! `cargo test -p rmm-mr --all-features --lib faults:: -- --nocapture` prints, per
//! component, the faults injected and survived (quoted in `docs/reliability.md`).

use std::fmt::Debug;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use rmm_stream::CudaStreamView;
use rmm_sys::fault::{self, DriverCall, Fault, FaultScope};
use rmm_sys::DevicePtr;

use crate::error::{InvalidFree, MrError, MrResult};
use crate::resource::DeviceMemoryResource;
use crate::stream_ordered::core::tests::CoreMemory;
use crate::testing::{FaultKind, FaultyResource, HostMockResource, Rng};

pub(crate) type Faulty = FaultyResource<HostMockResource>;

/// Workloads per component, and steps per workload.
const SEEDS: u64 = 24;
const STEPS: usize = 120;

/// A fault for one step.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Injection {
    /// The upstream fails `times` allocations after letting `skip` through.
    UpstreamAlloc {
        skip: usize,
        times: usize,
        kind: FaultKind,
    },
    /// The upstream fails the next deallocation (the memory stays allocated).
    UpstreamFree(FaultKind),
    /// A driver call fails.
    Driver(Fault),
    /// The log writer panics.
    WriterPanic,
}

/// What a step does.
#[derive(Debug, Clone, Copy)]
enum Op {
    Alloc {
        bytes: usize,
        alignment: usize,
        stream: usize,
    },
    Free {
        index: usize,
        stream: usize,
    },
    /// A free of an address nothing allocated.
    FreeUnknown,
    /// A free of a live allocation with another size.
    FreeWrongSize {
        index: usize,
    },
    /// A second free of an address freed before (and not live again).
    FreeTwice {
        index: usize,
    },
    /// The component's own maintenance (the pool's `release_unused`).
    Maintain,
    /// Frees every live allocation (without faults), so that whole chunks become free.
    FreeAll,
    /// Nothing for a little longer than a stream's owner may take to answer a thief
    /// (`WAIT_TIME`), so that later thieves synchronize the device instead of asking.
    Idle,
}

/// A live allocation of the workload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Live {
    pub(crate) ptr: DevicePtr,
    pub(crate) bytes: usize,
    pub(crate) alignment: usize,
}

/// The streams a workload uses: the legacy and per-thread default streams and two ordinary
/// (simulated) ones.
pub(crate) fn streams() -> [CudaStreamView<'static>; 4] {
    [
        CudaStreamView::legacy(),
        CudaStreamView::per_thread(),
        CudaStreamView::simulated(1),
        CudaStreamView::simulated(2),
    ]
}

/// A check of a component's bookkeeping against the live allocations.
pub(crate) type Check<'a> = Box<dyn Fn(&[Live]) -> Result<(), String> + 'a>;

/// A component under test, as the harness sees it.
pub(crate) struct Subject<'a> {
    pub(crate) name: &'static str,
    pub(crate) mr: &'a dyn DeviceMemoryResource,
    pub(crate) faulty: &'a Faulty,
    pub(crate) mock: &'a HostMockResource,
    /// The component's bookkeeping, compared before and after each failed call.
    pub(crate) state: Box<dyn Fn() -> String + 'a>,
    /// For the stream-ordered sub-allocators: their memory, to tell the one change a failed
    /// allocation may make (giving wholly free chunks back before it fails) from any other.
    pub(crate) memory: Option<Box<dyn Fn() -> CoreMemory + 'a>>,
    /// Checks the bookkeeping against the live allocations after each successful call.
    pub(crate) check: Check<'a>,
    /// The faults that reach this component.
    pub(crate) faults: Vec<Injection>,
    /// Largest request.
    pub(crate) max_bytes: usize,
    /// Alignments to ask for.
    pub(crate) alignments: &'a [usize],
    /// How many of [`streams`] to use (1: the legacy stream only).
    pub(crate) stream_count: usize,
    /// Whether a free with a wrong size still frees (the tracking adaptor frees the allocated
    /// size and reports the mismatch).
    pub(crate) mismatch_frees: bool,
    /// Maintenance, if any.
    pub(crate) maintain: Option<Box<dyn Fn() -> MrResult<()> + 'a>>,
    /// Percent of the steps that are maintenance (a quarter as many more free everything).
    pub(crate) maintenance: usize,
    /// The panicking writer's switch and panic count, for the logging adaptor.
    pub(crate) writer: Option<PanicSwitch>,
}

/// What the runs of one component added up to.
#[derive(Debug, Default, Clone)]
pub(crate) struct Tally {
    steps: usize,
    injected: usize,
    survived: usize,
    failed_calls: usize,
    wrong_frees: usize,
    /// Faults that fired, by what failed.
    by_kind: std::collections::BTreeMap<String, usize>,
}

impl Injection {
    /// What fails, for the tally.
    fn label(self) -> String {
        match self {
            Injection::UpstreamAlloc { .. } => "upstream allocate".into(),
            Injection::UpstreamFree(_) => "upstream free".into(),
            Injection::Driver(f) => format!("{:?}", f.call),
            Injection::WriterPanic => "writer panic".into(),
        }
    }
}

pub(crate) fn upstream_faults(kinds: &[FaultKind]) -> Vec<Injection> {
    let mut all = Vec::new();
    for &kind in kinds {
        for skip in 0..2 {
            for times in [1, 3] {
                all.push(Injection::UpstreamAlloc { skip, times, kind });
            }
        }
        all.push(Injection::UpstreamFree(kind));
    }
    all
}

pub(crate) fn driver_faults(calls: &[DriverCall]) -> Vec<Injection> {
    let mut all = Vec::new();
    for &call in calls {
        for n in 0..3 {
            all.push(Injection::Driver(Fault::nth(call, n)));
        }
    }
    all
}

/// The stream-related calls the stream-ordered resources make.
pub(crate) const STREAM_CALLS: [DriverCall; 5] = [
    DriverCall::EventCreate,
    DriverCall::EventRecord,
    DriverCall::StreamWait,
    DriverCall::Synchronize,
    DriverCall::StreamId,
];

fn injected_so_far(subject: &Subject<'_>) -> usize {
    let driver: u64 = DriverCall::ALL.iter().map(|&c| fault::injected(c)).sum();
    subject.faulty.injected()
        + driver as usize
        + subject
            .writer
            .as_ref()
            .map_or(0, |w| w.panics.load(Ordering::SeqCst))
}

fn arm(subject: &Subject<'_>, injection: Option<Injection>) {
    match injection {
        None => {}
        Some(Injection::UpstreamAlloc { skip, times, kind }) => {
            subject.faulty.fail_allocations(skip, times, kind);
        }
        Some(Injection::UpstreamFree(kind)) => subject.faulty.fail_next_deallocation(kind),
        Some(Injection::Driver(f)) => fault::inject(f),
        Some(Injection::WriterPanic) => {
            if let Some(w) = &subject.writer {
                w.armed.store(true, Ordering::SeqCst);
            }
        }
    }
}

fn disarm(subject: &Subject<'_>) {
    subject.faulty.disarm();
    for call in DriverCall::ALL {
        fault::disarm(call);
    }
    if let Some(w) = &subject.writer {
        w.armed.store(false, Ordering::SeqCst);
    }
}

/// Added to a size to make it wrong: more than any rounding of any component here.
const WRONG: usize = 1 << 16;

/// An address no resource hands out (in the first megabyte, never mapped for user data).
const UNKNOWN: u64 = 0x4_0000;

/// Runs one seeded workload; panics on the first violation.
fn run(subject: &Subject<'_>, seed: u64, tally: &mut Tally) {
    let streams = streams();
    let streams = &streams[..subject.stream_count];
    let mut rng = Rng::new(seed);
    let mut live: Vec<Live> = Vec::new();
    let mut freed: Vec<Live> = Vec::new();
    for step in 0..STEPS {
        let maintenance = if subject.maintain.is_some() {
            subject.maintenance
        } else {
            0
        };
        let roll = rng.below(100);
        let op = match rng.below(100) {
            _ if roll < maintenance => Op::Maintain,
            _ if roll < maintenance + maintenance.div_ceil(4) => Op::FreeAll,
            0..=44 if live.len() < 24 => Op::Alloc {
                bytes: 1 + rng.below(subject.max_bytes),
                alignment: rng.pick(subject.alignments).unwrap_or(256),
                stream: rng.below(streams.len()),
            },
            0..=79 if !live.is_empty() => Op::Free {
                index: rng.below(live.len()),
                stream: rng.below(streams.len()),
            },
            80..=83 => Op::FreeUnknown,
            84..=87 if !live.is_empty() => Op::FreeWrongSize {
                index: rng.below(live.len()),
            },
            88..=91 if !freed.is_empty() => Op::FreeTwice {
                index: rng.below(freed.len()),
            },
            98..=99 if subject.stream_count > 1 => Op::Idle,
            _ => Op::Alloc {
                bytes: 1 + rng.below(subject.max_bytes),
                alignment: rng.pick(subject.alignments).unwrap_or(256),
                stream: rng.below(streams.len()),
            },
        };
        let faultable = !subject.faults.is_empty() && !matches!(op, Op::FreeAll);
        let injection = (faultable && rng.percent(50))
            .then(|| rng.pick(&subject.faults))
            .flatten();
        let where_ = || {
            format!(
                "{} seed {seed} step {step}: {op:?} with {injection:?}",
                subject.name
            )
        };
        let before = ((subject.state)(), subject.mock.live());
        let memory_before = subject.memory.as_ref().map(|m| m());
        let injected_before = injected_so_far(subject);
        arm(subject, injection);
        let result: MrResult<()> = match op {
            Op::Alloc {
                bytes,
                alignment,
                stream,
            } => subject
                .mr
                .allocate(streams[stream], bytes, alignment)
                .map(|ptr| {
                    live.push(Live {
                        ptr,
                        bytes,
                        alignment,
                    })
                }),
            Op::Free { index, stream } => {
                let l = live[index];
                // SAFETY: `l` came from `mr` with these arguments and is live.
                let r = unsafe {
                    subject
                        .mr
                        .deallocate(streams[stream], l.ptr, l.bytes, l.alignment)
                };
                if r.is_ok() {
                    freed.push(live.swap_remove(index));
                }
                r
            }
            Op::FreeUnknown => {
                tally.wrong_frees += 1;
                // SAFETY: a wrong free the component (or the mock) detects without touching
                // memory.
                unsafe {
                    subject
                        .mr
                        .deallocate(streams[0], DevicePtr::from_raw(UNKNOWN), 256, 256)
                }
            }
            Op::FreeWrongSize { index } => {
                tally.wrong_frees += 1;
                let l = live[index];
                // SAFETY: a wrong free (the size) the component detects.
                let r = unsafe {
                    subject
                        .mr
                        .deallocate(streams[0], l.ptr, l.bytes + WRONG, l.alignment)
                };
                if subject.mismatch_frees
                    && matches!(
                        r,
                        Err(MrError::InvalidFree {
                            kind: InvalidFree::SizeMismatch { .. },
                            ..
                        })
                    )
                {
                    // Documented: freed with the allocated size, and reported.
                    live.swap_remove(index);
                    disarm(subject);
                    (subject.check)(&live).unwrap_or_else(|e| panic!("{}: {e}", where_()));
                    continue;
                }
                r
            }
            Op::FreeTwice { index } => {
                let l = freed[index];
                // An address reused since (by a live allocation, by the block an over-aligned
                // one lies in, or by the mock for an upstream's allocation) cannot be told from
                // a right free: no resource can detect that double free.
                let addr = l.ptr.addr();
                let reused = live.iter().any(|x| {
                    let start = x.ptr.addr().saturating_sub(x.alignment as u64);
                    (start..=x.ptr.addr() + x.bytes as u64).contains(&addr)
                }) || subject.mock.live().iter().any(|&(a, _)| a == addr);
                if reused {
                    disarm(subject);
                    continue;
                }
                tally.wrong_frees += 1;
                // SAFETY: a second free of an address no allocation starts at: detected.
                unsafe {
                    subject
                        .mr
                        .deallocate(streams[0], l.ptr, l.bytes, l.alignment)
                }
            }
            Op::Maintain => subject.maintain.as_ref().map_or(Ok(()), |m| m()),
            Op::FreeAll => {
                for l in live.drain(..) {
                    // SAFETY: `l` came from `mr` with these arguments and is live.
                    unsafe {
                        subject
                            .mr
                            .deallocate(streams[0], l.ptr, l.bytes, l.alignment)
                    }
                    .unwrap_or_else(|e| panic!("{}: {e}", where_()));
                    freed.push(l);
                }
                Ok(())
            }
            Op::Idle => {
                let grace = crate::stream_ordered::tuning::WAIT_TIME;
                std::thread::sleep(grace + grace / 4);
                Ok(())
            }
        };
        disarm(subject);
        let fired = injected_so_far(subject) > injected_before;
        tally.steps += 1;
        match result {
            Err(e) if matches!(op, Op::Maintain) => {
                // A batch: the chunks the upstream refused stay, the others are released.
                tally.failed_calls += 1;
                (subject.check)(&live)
                    .unwrap_or_else(|c| panic!("{}: failed with `{e}`: {c}", where_()));
            }
            Err(e) => {
                tally.failed_calls += 1;
                let after = ((subject.state)(), subject.mock.live());
                let released_free_chunks = || {
                    let (Some(b), Some(m)) = (&memory_before, &subject.memory) else {
                        return false;
                    };
                    matches!(op, Op::Alloc { .. })
                        && e.is_out_of_memory()
                        && only_free_chunks_released(b, &m(), &before.1, &after.1)
                };
                if after != before && !released_free_chunks() {
                    assert_eq!(
                        after,
                        before,
                        "{}: failed with `{e}` and changed the bookkeeping",
                        where_()
                    );
                }
            }
            Ok(()) => {
                if matches!(
                    op,
                    Op::FreeUnknown | Op::FreeTwice { .. } | Op::FreeWrongSize { .. }
                ) {
                    panic!("{}: a wrong free succeeded", where_());
                }
                (subject.check)(&live).unwrap_or_else(|e| panic!("{}: {e}", where_()));
            }
        }
        if fired {
            tally.injected += 1;
            tally.survived += 1;
            if let Some(i) = injection {
                *tally.by_kind.entry(i.label()).or_default() += 1;
            }
        }
    }
    // Everything left is freed, without faults; it must all succeed.
    for l in live.drain(..) {
        // SAFETY: `l` came from `mr` with these arguments and is live.
        unsafe {
            subject
                .mr
                .deallocate(streams[0], l.ptr, l.bytes, l.alignment)
        }
        .unwrap_or_else(|e| panic!("{} seed {seed}: final free of {l:?}: {e}", subject.name));
    }
    (subject.check)(&[])
        .unwrap_or_else(|e| panic!("{} seed {seed}: at the end: {e}", subject.name));
}

/// Runs every seed of a component built by `make`, checks that nothing leaked once it is
/// dropped, and prints the tally.
pub(crate) fn sweep<R>(
    name: &'static str,
    make: impl Fn(&Faulty) -> MrResult<R>,
    subject: impl for<'a> Fn(&'a R, &'a Faulty, &'a HostMockResource) -> Subject<'a>,
) -> Tally {
    let _scope = FaultScope::simulated();
    let mut tally = Tally::default();
    let mut seeds = SEEDS;
    let mut seed = 0;
    while seed < seeds {
        let mock = HostMockResource::new();
        let faulty = FaultyResource::new(mock.clone());
        let r = make(&faulty).unwrap_or_else(|e| panic!("{name}: {e}"));
        {
            let s = subject(&r, &faulty, &mock);
            assert_eq!(s.name, name);
            if s.stream_count > 1 || s.maintain.is_some() {
                // Stream-ordered sub-allocators: most steps touch no upstream and no stream
                // call, so more workloads.
                seeds = 4 * SEEDS;
            }
            run(&s, seed, &mut tally);
        }
        drop(r);
        assert_eq!(
            mock.live(),
            Vec::new(),
            "{name} seed {seed}: leaked after drop"
        );
        seed += 1;
    }
    assert!(
        tally.injected > SEEDS as usize,
        "{name}: hardly any fault fired: {tally:?}"
    );
    assert!(tally.failed_calls > 0, "{name}: no call failed: {tally:?}");
    println!(
        "faults: {name}: {} steps, {} faults injected, {} survived, {} failed calls, {} wrong \
         frees; {:?}",
        tally.steps,
        tally.injected,
        tally.survived,
        tally.failed_calls,
        tally.wrong_frees,
        tally.by_kind
    );
    tally
}

fn live_count(mock: &HostMockResource, live: &[Live]) -> Result<(), String> {
    let n = mock.live_allocations();
    if n == live.iter().filter(|l| l.bytes > 0).count() {
        Ok(())
    } else {
        Err(format!("{n} allocations in the mock, {} live", live.len()))
    }
}

pub(crate) fn expect<T: PartialEq + Debug>(what: &str, got: T, want: T) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: {got:?}, expected {want:?}"))
    }
}

/// A log writer that panics while armed.
#[derive(Clone, Default)]
pub(crate) struct PanicSwitch {
    pub(crate) armed: Arc<AtomicBool>,
    pub(crate) panics: Arc<AtomicUsize>,
}

impl Write for PanicSwitch {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.armed.load(Ordering::SeqCst) {
            self.panics.fetch_add(1, Ordering::SeqCst);
            panic!("injected log writer panic");
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The faults of a stream-ordered sub-allocator: its upstream's (which it maps to its own
/// errors whatever their kind, so two kinds do) and the stream calls'.
pub(crate) fn sub_allocator_faults() -> Vec<Injection> {
    let mut faults = upstream_faults(&[FaultKind::OutOfMemory, FaultKind::Cuda]);
    faults.extend(driver_faults(&STREAM_CALLS));
    faults
}

/// Whether `after` is `before` less some chunks that were wholly free in `before` (given back
/// to the upstream, `mock_before` and `mock_after` its live allocations): the one change an
/// allocation of a stream-ordered sub-allocator may make before it fails.
fn only_free_chunks_released(
    before: &CoreMemory,
    after: &CoreMemory,
    mock_before: &[(u64, usize)],
    mock_after: &[(u64, usize)],
) -> bool {
    let released: Vec<(u64, usize)> = before
        .chunks
        .iter()
        .filter(|c| !after.chunks.contains(c))
        .copied()
        .collect();
    let mut free = before.free.clone();
    for &(addr, size) in &released {
        let end = addr + size as u64;
        let Some(i) = free.iter().position(|&(s, e)| s <= addr && end <= e) else {
            return false;
        };
        let (s, e) = free.remove(i);
        let parts = [(s, addr), (end, e)];
        for (j, part) in parts.into_iter().filter(|p| p.0 < p.1).enumerate() {
            free.insert(i + j, part);
        }
    }
    let mock_left: Vec<(u64, usize)> = mock_before
        .iter()
        .filter(|c| !released.contains(c))
        .copied()
        .collect();
    !released.is_empty()
        && after.chunks.iter().all(|c| before.chunks.contains(c))
        && after.free == free
        && after.handed_out == before.handed_out
        && after.pool_size + released.iter().map(|c| c.1).sum::<usize>() == before.pool_size
        && mock_after == mock_left.as_slice()
}

#[cfg(test)]
mod tests;
