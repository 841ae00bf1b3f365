//! Running a [`Workload`] against a memory resource, as RMM's replay benchmark does: one thread
//! per thread of the log, each running its own steps, every step waiting until all the steps
//! before it in the log (on any thread) have run, so the resource sees the log's global order
//! from the log's threads.
//!
//! The hand-over is direct: the thread that ran step `i` publishes `i + 1` and unparks the
//! thread that owns step `i + 1` (RMM wakes every thread through one condition variable).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use rmm::mr::{DeviceMemoryResource, MrError};
use rmm::stream::CudaStreamView;
use rmm::sys::DevicePtr;

use crate::plan::{Op, Step, Workload};

/// The alignment every replayed allocation asks for (RMM's replay asks for 256).
pub const ALIGNMENT: usize = 256;

/// How many times a replay thread checks for its turn before it parks, when it spins at all
/// (see `Shared::spin`).
const SPINS: u32 = 256;

/// A step the resource failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepFailure {
    /// The step's index in [`Workload::steps`].
    pub step: usize,
    /// The step itself (its line, thread, stream and operation).
    pub at: Step,
    /// What the resource said.
    pub error: MrError,
}

/// What a replay measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// Bytes the resource had reserved after each step that ran, as the `reserved` probe read
    /// them (as many entries as steps ran).
    pub reserved: Vec<u64>,
    /// From the release of the replay threads until the last of them finished.
    pub wall: Duration,
    /// The step that failed, which stopped the replay; `None` when every step ran.
    pub failure: Option<StepFailure>,
    /// The first error returning what was still allocated after the replay (the log's leaks,
    /// or everything live when a step failed), if any.
    pub cleanup_error: Option<MrError>,
}

impl Replay {
    /// Number of steps that ran.
    #[must_use]
    pub fn steps_run(&self) -> usize {
        self.reserved.len()
    }
}

/// Why a replay could not start.
#[derive(Debug)]
pub enum ReplayError {
    /// There is no stream for one of the workload's streams.
    Streams {
        /// Streams the workload uses.
        needed: usize,
        /// Streams given.
        given: usize,
    },
    /// A replay thread could not be started.
    Spawn(std::io::Error),
}

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplayError::Streams { needed, given } => {
                write!(f, "the log uses {needed} streams, {given} given")
            }
            ReplayError::Spawn(e) => write!(f, "cannot start a replay thread: {e}"),
        }
    }
}

impl std::error::Error for ReplayError {}

/// What the replay threads share.
struct Shared<'a> {
    workload: &'a Workload,
    resource: &'a dyn DeviceMemoryResource,
    streams: &'a [CudaStreamView<'a>],
    reserved: &'a (dyn Fn() -> u64 + Sync),
    progress: &'a AtomicUsize,
    /// Whether waiting threads spin before they park: only when the machine has at least
    /// twice as many cores as there are replay threads (spinning threads that share cores
    /// with the thread whose turn it is slow everything down).
    spin: bool,
    /// The next step to run.
    next: AtomicUsize,
    /// Set when a step failed (or a thread could not start): everyone leaves.
    stop: AtomicBool,
    /// The replay threads, set once all are started.
    threads: OnceLock<Vec<Thread>>,
    /// Each slot's pointer while it is allocated (0 otherwise).
    pointers: Vec<AtomicU64>,
    /// Bytes reserved after each step.
    samples: Vec<AtomicU64>,
    failure: Mutex<Option<StepFailure>>,
}

/// Replays `workload` against `resource`, step `i` on `streams[workload.steps[i].stream]`,
/// reading `reserved()` after every step, and publishing the number of steps done in
/// `progress` (for a progress bar; nothing else reads it). Whatever is still allocated at
/// the end (leaks of the log, or everything live after a failed step) is freed on the stream
/// it was allocated on.
///
/// The resource's out-of-memory (or any other error) on a step stops the replay: the result
/// names the step in [`Replay::failure`].
///
/// # Errors
///
/// [`ReplayError`] when the replay could not start (too few streams, a thread that cannot be
/// spawned); nothing was allocated then, or everything allocated was freed.
pub fn replay(
    workload: &Workload,
    resource: &dyn DeviceMemoryResource,
    streams: &[CudaStreamView<'_>],
    reserved: &(dyn Fn() -> u64 + Sync),
    progress: &AtomicUsize,
) -> Result<Replay, ReplayError> {
    if streams.len() < workload.streams.len() {
        return Err(ReplayError::Streams {
            needed: workload.streams.len(),
            given: streams.len(),
        });
    }
    let shared = Shared {
        workload,
        resource,
        streams,
        reserved,
        progress,
        spin: thread::available_parallelism()
            .is_ok_and(|cores| workload.threads.len().saturating_mul(2) <= cores.get()),
        next: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        threads: OnceLock::new(),
        pointers: (0..workload.slots.len())
            .map(|_| AtomicU64::new(0))
            .collect(),
        samples: (0..workload.steps.len())
            .map(|_| AtomicU64::new(0))
            .collect(),
        failure: Mutex::new(None),
    };

    let started = thread::scope(|scope| {
        let mut handles = Vec::with_capacity(workload.threads.len());
        for (index, logged) in workload.threads.iter().enumerate() {
            let shared = &shared;
            let spawned = thread::Builder::new()
                .name(format!("replay-{logged}"))
                .spawn_scoped(scope, move || shared.run_thread(index));
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    shared.stop.store(true, Ordering::Release);
                    for h in &handles {
                        h.thread().unpark();
                    }
                    return Err(ReplayError::Spawn(e));
                }
            }
        }
        let threads: Vec<Thread> = handles.iter().map(|h| h.thread().clone()).collect();
        let start = Instant::now();
        // Set once, here; the threads wait for it before their first step.
        let _ = shared.threads.set(threads);
        for h in &handles {
            h.thread().unpark();
        }
        let mut panic = None;
        for h in handles {
            if let Err(payload) = h.join() {
                panic.get_or_insert(payload);
            }
        }
        Ok((start.elapsed(), panic))
    });
    let wall = match started {
        Ok((_, Some(payload))) => {
            // A resource panicked on a replay thread (whose guard stopped the others): give
            // back what is live, then pass the panic on.
            let _ = shared.free_everything();
            std::panic::resume_unwind(payload);
        }
        Ok((wall, None)) => wall,
        Err(e) => {
            // Nothing ran: no thread got its step list before the stop.
            shared.free_everything();
            return Err(e);
        }
    };

    let failure = shared
        .failure
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    let ran = shared.next.load(Ordering::Acquire);
    let cleanup_error = shared.free_everything();
    let reserved = shared.samples[..ran]
        .iter()
        .map(|s| s.load(Ordering::Relaxed))
        .collect();
    Ok(Replay {
        reserved,
        wall,
        failure,
        cleanup_error,
    })
}

/// Stops the replay when a replay thread unwinds (a resource panicked), so that no thread
/// waits forever for a step that will never run.
struct StopOnPanic<'a> {
    stop: &'a AtomicBool,
    threads: &'a [Thread],
}

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.stop.store(true, Ordering::Release);
            for t in self.threads {
                t.unpark();
            }
        }
    }
}

impl Shared<'_> {
    /// The body of replay thread `me`.
    fn run_thread(&self, me: usize) {
        let threads = loop {
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            match self.threads.get() {
                Some(threads) => break threads,
                None => thread::park(),
            }
        };
        let _guard = StopOnPanic {
            stop: &self.stop,
            threads,
        };
        for &index in &self.workload.thread_steps[me] {
            let index = index as usize;
            // Wait for the steps before this one, on every thread: where every replay thread
            // has cores to spare, spin a little first (a hand-over between running threads
            // takes well under a microsecond, a wake-up several); then sleep until unparked.
            let mut spins = if self.spin { 0 } else { SPINS };
            loop {
                if self.stop.load(Ordering::Acquire) {
                    return;
                }
                if self.next.load(Ordering::Acquire) == index {
                    break;
                }
                if spins < SPINS {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    thread::park();
                }
            }
            let step = self.workload.steps[index];
            if let Err(error) = self.run_step(step) {
                *self.failure.lock().unwrap_or_else(PoisonError::into_inner) = Some(StepFailure {
                    step: index,
                    at: step,
                    error,
                });
                self.stop.store(true, Ordering::Release);
                for t in threads {
                    t.unpark();
                }
                return;
            }
            self.samples[index].store((self.reserved)(), Ordering::Relaxed);
            self.progress.store(index + 1, Ordering::Relaxed);
            self.next.store(index + 1, Ordering::Release);
            if let Some(following) = self.workload.steps.get(index + 1) {
                if following.thread as usize != me {
                    threads[following.thread as usize].unpark();
                }
            }
        }
    }

    fn run_step(&self, step: Step) -> Result<(), MrError> {
        let stream = self.streams[step.stream as usize];
        match step.op {
            Op::Allocate { slot, size } => {
                let ptr = self.resource.allocate(stream, size, ALIGNMENT)?;
                self.pointers[slot as usize].store(ptr.addr(), Ordering::Relaxed);
            }
            Op::Free { slot, size } => {
                let ptr =
                    DevicePtr::from_raw(self.pointers[slot as usize].swap(0, Ordering::Relaxed));
                // SAFETY: the slot held what this resource's `allocate` returned for `size`
                // bytes (the plan ties each free to its allocation, with the same size), the
                // swap makes this its only free, and the replay queues no work that could use
                // the memory on any stream.
                unsafe { self.resource.deallocate(stream, ptr, size, ALIGNMENT) }?;
            }
        }
        Ok(())
    }

    /// Frees every slot still allocated, each on the stream it was allocated on; returns the
    /// first error.
    fn free_everything(&self) -> Option<MrError> {
        let mut first = None;
        for (slot, pointer) in self.pointers.iter().enumerate() {
            let addr = pointer.swap(0, Ordering::Relaxed);
            if addr == 0 {
                continue;
            }
            let (size, stream) = self.workload.slots[slot];
            // SAFETY: as in `run_step`: allocated here with `size` bytes, freed once (the
            // swap), no work queued on it; the replay threads have all finished.
            let r = unsafe {
                self.resource.deallocate(
                    self.streams[stream as usize],
                    DevicePtr::from_raw(addr),
                    size,
                    ALIGNMENT,
                )
            };
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        }
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmm::mr::{parse_log_lines, parse_log_str, Action, MemoryEvent};
    use rmm::mr::{
        LoggingOptions, LoggingResourceAdaptor, PoolMemoryResource, PoolOptions,
        SimulatedMemoryResource,
    };
    use std::collections::HashMap;
    use std::io::Write;
    use std::sync::Arc;

    fn workload(text: &str) -> Workload {
        Workload::from_events(&parse_log_lines(text.as_bytes()).unwrap()).unwrap()
    }

    fn legacy(n: usize) -> Vec<CudaStreamView<'static>> {
        vec![CudaStreamView::legacy(); n]
    }

    /// A `Write` into a shared buffer, to read what a logging adaptor wrote.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A log of four threads taking turns in an irregular pattern, each size unique, so the
    /// order of the replay can be read back from a log of it.
    fn interleaved_log() -> String {
        let mut text = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
        let pattern = [
            11u64, 11, 42, 7, 42, 42, 99, 7, 11, 99, 7, 7, 42, 11, 99, 99,
        ];
        for (i, thread) in pattern.iter().enumerate() {
            let size = 1000 + i;
            text += &format!(
                "{thread},00:00:00.{i:06},allocate,{:#x},{size},0\n",
                0x1000 * (i + 1)
            );
        }
        // Frees in reverse order, each by the next thread of the pattern (cross-thread frees).
        for (i, _) in pattern.iter().enumerate().rev() {
            let thread = pattern[(i + 1) % pattern.len()];
            let size = 1000 + i;
            text += &format!(
                "{thread},00:00:01.{i:06},free,{:#x},{size},0\n",
                0x1000 * (i + 1)
            );
        }
        text
    }

    #[test]
    fn replays_in_the_global_order_on_one_thread_per_logged_thread() {
        let input = interleaved_log();
        let w = workload(&input);
        assert_eq!(w.threads.len(), 4);
        let out = Buffer::default();
        let simulated = SimulatedMemoryResource::new(1 << 30).unwrap();
        let pool = PoolMemoryResource::with_options(
            simulated.clone(),
            PoolOptions::new(0).maximum_pool_size(1 << 30),
        )
        .unwrap();
        let logged = LoggingResourceAdaptor::with_options(
            pool.clone(),
            LoggingOptions::new().writer(out.clone()),
        )
        .unwrap();
        let progress = AtomicUsize::new(0);
        let r = replay(
            &w,
            &logged,
            &legacy(1),
            &|| pool.pool_size() as u64,
            &progress,
        )
        .unwrap();
        assert_eq!(r.failure, None);
        assert_eq!(r.cleanup_error, None);
        assert_eq!(r.steps_run(), 32);
        assert_eq!(progress.load(Ordering::Relaxed), 32);
        logged.flush().unwrap();

        let replayed = parse_log_str(std::str::from_utf8(&out.0.lock().unwrap()).unwrap()).unwrap();
        let original = parse_log_str(&input).unwrap();
        assert_eq!(replayed.len(), original.len());
        // Same actions and sizes in the same order.
        let shape = |e: &MemoryEvent| (e.action, e.size);
        assert_eq!(
            replayed.iter().map(shape).collect::<Vec<_>>(),
            original.iter().map(shape).collect::<Vec<_>>()
        );
        // One replay thread per logged thread: the thread columns correspond one to one.
        let mut to_replayed: HashMap<u64, u64> = HashMap::new();
        let mut to_original: HashMap<u64, u64> = HashMap::new();
        for (o, r) in original.iter().zip(&replayed) {
            assert_eq!(
                *to_replayed.entry(o.thread).or_insert(r.thread),
                r.thread,
                "{o}"
            );
            assert_eq!(
                *to_original.entry(r.thread).or_insert(o.thread),
                o.thread,
                "{r}"
            );
        }
        assert_eq!(to_replayed.len(), 4);
        assert!(!to_original.contains_key(&rmm::mr::current_thread_number()));
        // Every free gave back the pointer its allocation got.
        let mut live = HashMap::new();
        for e in &replayed {
            match e.action {
                Action::Allocate => assert!(live.insert(e.pointer, e.size).is_none()),
                Action::Free => assert_eq!(live.remove(&e.pointer), Some(e.size)),
                Action::AllocateFailure => panic!("no failure expected: {e}"),
            }
        }
        assert!(live.is_empty());
    }

    #[test]
    fn samples_reserved_after_every_step_and_frees_leaks() {
        let w = workload(
            "Thread,Time,Action,Pointer,Size,Stream\n\
             1,00:00:00.000001,allocate,0x1000,1000,0\n\
             2,00:00:00.000002,allocate,0x2000,3000,0x2\n\
             1,00:00:00.000003,allocate failure,(nil),1099511627776,0\n\
             2,00:00:00.000004,free,0x1000,1000,0x2\n\
             1,00:00:00.000005,allocate,0x1000,521000,0\n",
        );
        let simulated = SimulatedMemoryResource::new(1 << 20).unwrap();
        let pool = PoolMemoryResource::with_options(
            simulated.clone(),
            PoolOptions::new(0).maximum_pool_size(1 << 20),
        )
        .unwrap();
        let progress = AtomicUsize::new(0);
        let r = replay(
            &w,
            &pool,
            &legacy(2),
            &|| simulated.used() as u64,
            &progress,
        )
        .unwrap();
        assert_eq!(r.failure, None);
        // The pool of at most 1 MiB grows by half its headroom (512 KiB), then, when no free
        // block holds 521,000 bytes (521,216 rounded), by the request, which is larger than
        // half of what is left.
        assert_eq!(r.reserved, [524_288, 524_288, 524_288, 524_288 + 521_216]);
        assert_eq!(r.cleanup_error, None);
        assert_eq!(pool.outstanding_allocations(), 0, "the leak was freed");
    }

    #[test]
    fn a_step_that_fails_stops_the_replay_and_is_named() {
        let w = workload(
            "Thread,Time,Action,Pointer,Size,Stream\n\
             1,00:00:00.000001,allocate,0x1000,400000,0\n\
             2,00:00:00.000002,allocate,0x2000,400000,0\n\
             3,00:00:00.000003,allocate,0x3000,400000,0\n\
             1,00:00:00.000004,free,0x1000,400000,0\n",
        );
        let simulated = SimulatedMemoryResource::new(1 << 20).unwrap();
        let pool = PoolMemoryResource::with_options(
            simulated.clone(),
            PoolOptions::new(0).maximum_pool_size(1 << 20),
        )
        .unwrap();
        let progress = AtomicUsize::new(0);
        let r = replay(
            &w,
            &pool,
            &legacy(1),
            &|| simulated.used() as u64,
            &progress,
        )
        .unwrap();
        let failure = r
            .failure
            .clone()
            .expect("the third 400 kB cannot fit in 1 MiB");
        assert_eq!(
            (failure.step, failure.at.line, failure.at.thread),
            (2, 4, 2)
        );
        assert!(failure.error.is_out_of_memory(), "{}", failure.error);
        assert_eq!(r.steps_run(), 2);
        assert_eq!(r.cleanup_error, None);
        assert_eq!(pool.outstanding_allocations(), 0, "what was live was freed");
    }

    #[test]
    fn too_few_streams_is_an_error_before_anything_runs() {
        let w = workload(
            "Thread,Time,Action,Pointer,Size,Stream\n\
             1,00:00:00.000001,allocate,0x1000,10,0\n\
             1,00:00:00.000002,allocate,0x2000,10,0x2\n",
        );
        let simulated = SimulatedMemoryResource::new(1 << 20).unwrap();
        let progress = AtomicUsize::new(0);
        let e = replay(&w, &simulated, &legacy(1), &|| 0, &progress).unwrap_err();
        assert!(
            matches!(
                e,
                ReplayError::Streams {
                    needed: 2,
                    given: 1
                }
            ),
            "{e}"
        );
        assert_eq!(simulated.used(), 0);
    }
}
