//! GPU helpers shared by the benchmarks: resources built the way RMM's benchmarks build them,
//! each with a reader of the memory it reserved at its peak and of what growing cost it
//! ([`GrowthMeter`]); one measured cell (warm-up and timed passes on several threads, one
//! stream each); a compute-bound kernel for `multi_stream_allocations`; the line that names the
//! device.

use std::any::Any;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmm_mr::testing::GrowthLockHolds;
use rmm_mr::{
    ArenaMemoryResource, ArenaOptions, BinningMemoryResource, BinningOptions,
    CudaAsyncMemoryResource, CudaMemoryResource, DeviceMemoryResource, FixedSizeMemoryResource,
    FixedSizeOptions, MrError, MrResult, PoolMemoryResource, ResourceProperties, SharedResource,
    StatisticsResourceAdaptor, VmmPoolMemoryResource, VmmPoolOptions,
};
use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

use crate::naive::NaiveBestFit;
use crate::peer::PeerResource;
use crate::{median, replay_threads, Trace};

/// How to build a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spec {
    /// `cuMemAlloc` / `cuMemFree` (RMM's `cuda`).
    Cuda,
    /// The driver's stream-ordered pool with RMM's defaults (RMM's `cuda_async`).
    Async,
    /// A pool over the CUDA resource with this initial size (RMM's `pool`).
    Pool {
        /// Initial size in bytes.
        initial: usize,
    },
    /// An arena of this size over the CUDA resource (RMM's `arena`).
    Arena {
        /// Arena size in bytes.
        bytes: usize,
    },
    /// A VMM pool (no RMM equivalent) mapping `initial` bytes up front and at most `maximum`.
    VmmPool {
        /// Bytes mapped at construction.
        initial: usize,
        /// The maximum pool size (the reserved address range).
        maximum: usize,
        /// `VmmPoolOptions::min_growth_percent` (`None`: the default).
        min_growth_percent: Option<usize>,
    },
    /// Blocks of this size, 128 per chunk, over the CUDA resource (RMM's `fixed_size`).
    FixedSize {
        /// Block size in bytes.
        block: usize,
    },
    /// The naive baseline over one region of this size from `cuMemAlloc`
    /// ([`NaiveBestFit`]; no RMM equivalent).
    Naive {
        /// Region size in bytes.
        bytes: usize,
    },
    /// Fixed-size bins `2^min_exp..=2^max_exp` over a pool of this initial size over the CUDA
    /// resource (RMM's `binning`).
    Binning {
        /// Initial size of the pool under the bins.
        pool_initial: usize,
        /// Smallest bin exponent.
        min_exp: u32,
        /// Largest bin exponent.
        max_exp: u32,
    },
}

impl Spec {
    /// The benchmark name of the resource.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Cuda => "cuda",
            Self::Async => "cuda_async",
            Self::Pool { .. } => "pool",
            Self::Arena { .. } => "arena",
            Self::VmmPool { .. } => "vmm_pool",
            Self::FixedSize { .. } => "fixed_size",
            Self::Naive { .. } => "naive",
            Self::Binning { .. } => "binning",
        }
    }
}

impl Spec {
    /// How the peer comparison's `r` is built for a workload whose largest allocation is
    /// `largest` bytes (a fixed-size resource's block size).
    #[must_use]
    pub fn of_peer(r: PeerResource, largest: usize) -> Self {
        match r {
            PeerResource::Cuda => Self::Cuda,
            PeerResource::FixedSize { .. } => Self::FixedSize { block: largest },
            PeerResource::Naive { bytes } => Self::Naive { bytes },
            PeerResource::Pool { initial } => Self::Pool { initial },
            PeerResource::Arena { bytes } => Self::Arena { bytes },
            PeerResource::Binning { min_exp, max_exp } => Self::Binning {
                pool_initial: 0,
                min_exp,
                max_exp,
            },
            PeerResource::Async => Self::Async,
        }
    }
}

/// A built resource, a reader of the bytes it reserved at its peak so far and one of what its
/// growth cost so far.
pub struct Built {
    /// The resource.
    pub mr: SharedResource,
    peak: Box<dyn Fn() -> Option<u64> + Send + Sync>,
    growth: Box<dyn Fn() -> Option<Growth> + Send + Sync>,
    holds: Holds,
}

/// A reader of a stream-ordered resource's growth-lock holds (`None`: the resource has no
/// such lock).
type Holds = Box<dyn Fn() -> Option<GrowthLockHolds> + Send + Sync>;

impl Built {
    /// Peak bytes reserved so far: what the resource took from the CUDA resource at most (a
    /// statistics adaptor sits between them), the driver pool's `ReservedMemHigh`, the most
    /// the VMM pool mapped, or the naive baseline's region.
    #[must_use]
    pub fn peak_reserved(&self) -> Option<u64> {
        (self.peak)()
    }

    /// What growing cost so far: the sub-allocators' calls to the CUDA resource under them
    /// (a [`GrowthMeter`] sits between them) and the VMM pool's chunk mappings
    /// ([`VmmPoolMemoryResource::growth_statistics`]); `None` for the resources that do not
    /// grow through either (the CUDA resource itself, the driver's pool, the naive baseline).
    #[must_use]
    pub fn growth(&self) -> Option<Growth> {
        (self.growth)()
    }

    /// How long growers held the resource's growth lock so far (rmm-mr's `testing` feature):
    /// the pool's, the fixed-size resource's, the VMM pool's and, for binning, the pool's under
    /// its bins; for the arena, every hold of its global arena's lock; `None` for the others.
    #[must_use]
    pub fn growth_lock_holds(&self) -> Option<GrowthLockHolds> {
        (self.holds)()
    }
}

impl std::fmt::Debug for Built {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Built").finish_non_exhaustive()
    }
}

/// Growth events and the wall time spent in them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Growth {
    /// Upstream allocations that succeeded (the pool's chunks, the arena's superblock region,
    /// ...) or VMM chunks mapped.
    pub events: u64,
    /// Wall time spent growing (failed attempts included), summed over threads.
    pub time: Duration,
    /// Chunks given back (the pool's upstream deallocations, the VMM pool's unmappings: before
    /// an allocation fails, a resource with a maximum gives its wholly free chunks back, after
    /// a device synchronization, and grows again).
    pub releases: u64,
    /// Wall time spent giving them back.
    pub release_time: Duration,
}

impl Growth {
    /// The growth since `before` (an earlier reading of the same resource).
    #[must_use]
    pub fn since(self, before: Self) -> Self {
        Self {
            events: self.events.saturating_sub(before.events),
            time: self.time.saturating_sub(before.time),
            releases: self.releases.saturating_sub(before.releases),
            release_time: self.release_time.saturating_sub(before.release_time),
        }
    }

    /// Both together.
    #[must_use]
    pub fn plus(self, other: Self) -> Self {
        Self {
            events: self.events + other.events,
            time: self.time + other.time,
            releases: self.releases + other.releases,
            release_time: self.release_time + other.release_time,
        }
    }
}

#[derive(Debug, Default)]
struct MeterCounts {
    events: AtomicU64,
    nanos: AtomicU64,
    releases: AtomicU64,
    release_nanos: AtomicU64,
}

fn nanos_since(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// An adaptor that counts its upstream's allocations and deallocations and the time they take:
/// put between a sub-allocator and the resource it grows from, it counts the sub-allocator's
/// growth (the allocations that succeeded; the time of those that failed, such as the pool's
/// halving retries, counts too) and what it gives back. Clones share the counts.
#[derive(Debug, Clone)]
pub struct GrowthMeter<R> {
    upstream: R,
    counts: Arc<MeterCounts>,
}

impl<R: DeviceMemoryResource> GrowthMeter<R> {
    /// A meter over `upstream`, at zero.
    pub fn new(upstream: R) -> Self {
        Self {
            upstream,
            counts: Arc::default(),
        }
    }

    /// The allocations so far and their time.
    #[must_use]
    pub fn growth(&self) -> Growth {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Growth {
            events: load(&self.counts.events),
            time: Duration::from_nanos(load(&self.counts.nanos)),
            releases: load(&self.counts.releases),
            release_time: Duration::from_nanos(load(&self.counts.release_nanos)),
        }
    }
}

// SAFETY: every call goes to `upstream` unchanged, which keeps the contract; the adaptor only
// counts and times the allocations.
unsafe impl<R: DeviceMemoryResource> DeviceMemoryResource for GrowthMeter<R> {
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        let started = Instant::now();
        let r = self.upstream.allocate(stream, bytes, alignment);
        self.counts
            .nanos
            .fetch_add(nanos_since(started), Ordering::Relaxed);
        if r.is_ok() {
            self.counts.events.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()> {
        let started = Instant::now();
        // SAFETY: the caller's contract, passed on.
        let r = unsafe { self.upstream.deallocate(stream, ptr, bytes, alignment) };
        self.counts
            .release_nanos
            .fetch_add(nanos_since(started), Ordering::Relaxed);
        self.counts.releases.fetch_add(1, Ordering::Relaxed);
        r
    }

    fn is_equal(&self, other: &dyn DeviceMemoryResource) -> bool {
        other
            .as_any()
            .downcast_ref::<Self>()
            .is_some_and(|o| self.upstream.is_equal(&o.upstream))
    }

    fn properties(&self) -> ResourceProperties {
        self.upstream.properties()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Builds `spec` on the current device.
pub fn build(spec: Spec) -> MrResult<Built> {
    let stats = StatisticsResourceAdaptor::new(CudaMemoryResource::new());
    let meter = GrowthMeter::new(stats.clone());
    let peak_of = |s: StatisticsResourceAdaptor<CudaMemoryResource>| {
        Box::new(move || u64::try_from(s.bytes_counter().peak).ok())
            as Box<dyn Fn() -> Option<u64> + Send + Sync>
    };
    let metered = || {
        let m = meter.clone();
        Box::new(move || Some(m.growth())) as Box<dyn Fn() -> Option<Growth> + Send + Sync>
    };
    let none = || Box::new(|| None) as Box<dyn Fn() -> Option<Growth> + Send + Sync>;
    let no_lock = || Box::new(|| None) as Holds;
    Ok(match spec {
        Spec::Cuda => Built {
            mr: rmm_mr::shared(stats.clone()),
            peak: peak_of(stats),
            growth: none(),
            holds: no_lock(),
        },
        Spec::Async => {
            let mr = CudaAsyncMemoryResource::new()?;
            let handle = mr.clone();
            Built {
                mr: rmm_mr::shared(mr),
                peak: Box::new(move || handle.statistics().ok().map(|s| s.reserved_high)),
                growth: none(),
                holds: no_lock(),
            }
        }
        Spec::Pool { initial } => {
            let pool = PoolMemoryResource::new(meter.clone(), initial)?;
            let handle = pool.clone();
            Built {
                mr: rmm_mr::shared(pool),
                peak: peak_of(stats),
                growth: metered(),
                holds: Box::new(move || Some(handle.growth_lock_holds())),
            }
        }
        Spec::VmmPool {
            initial,
            maximum,
            min_growth_percent,
        } => {
            let mut options = VmmPoolOptions::new(maximum).initial_pool_size(initial);
            if let Some(percent) = min_growth_percent {
                options = options.min_growth_percent(percent);
            }
            let mr = VmmPoolMemoryResource::with_options(options)?;
            let handle = mr.clone();
            let growth = mr.clone();
            let locked = mr.clone();
            Built {
                holds: Box::new(move || Some(locked.growth_lock_holds())),
                mr: rmm_mr::shared(mr),
                peak: Box::new(move || u64::try_from(handle.growth_statistics().peak_mapped).ok()),
                growth: Box::new(move || {
                    let g = growth.growth_statistics();
                    Some(Growth {
                        events: g.mappings,
                        time: g.time_mapping,
                        releases: g.unmappings,
                        release_time: g.time_unmapping,
                    })
                }),
            }
        }
        Spec::Arena { bytes } => {
            let arena = ArenaMemoryResource::with_options(
                meter.clone(),
                ArenaOptions::new().arena_size(bytes),
            )?;
            let handle = arena.clone();
            Built {
                mr: rmm_mr::shared(arena),
                peak: peak_of(stats),
                growth: metered(),
                // Its global arena's lock, which large requests and loans take.
                holds: Box::new(move || Some(handle.global_lock_holds())),
            }
        }
        Spec::FixedSize { block } => {
            let fixed = FixedSizeMemoryResource::with_options(
                meter.clone(),
                FixedSizeOptions::new()
                    .block_size(block)
                    .blocks_to_preallocate(128),
            )?;
            let handle = fixed.clone();
            Built {
                mr: rmm_mr::shared(fixed),
                peak: peak_of(stats),
                growth: metered(),
                holds: Box::new(move || Some(handle.growth_lock_holds())),
            }
        }
        Spec::Naive { bytes } => {
            let mr = NaiveBestFit::new(bytes)?;
            let region = u64::try_from(mr.region_size()).ok();
            Built {
                mr: rmm_mr::shared(mr),
                peak: Box::new(move || region),
                growth: none(),
                holds: no_lock(),
            }
        }
        Spec::Binning {
            pool_initial,
            min_exp,
            max_exp,
        } => {
            let pool = PoolMemoryResource::new(meter.clone(), pool_initial)?;
            let handle = pool.clone();
            Built {
                holds: Box::new(move || Some(handle.growth_lock_holds())),
                mr: rmm_mr::shared(BinningMemoryResource::with_options(
                    pool,
                    BinningOptions::new()
                        .min_size_exponent(min_exp)
                        .max_size_exponent(max_exp),
                )?),
                peak: peak_of(stats),
                growth: metered(),
            }
        }
    })
}

/// The outcome of one cell.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// Nanoseconds per operation of each timed pass.
    pub samples: Vec<f64>,
    /// Their median.
    pub ns_per_op: f64,
    /// Peak bytes reserved over all passes, when known.
    pub peak_reserved: Option<u64>,
}

/// Measures one cell: builds `spec`, creates one non-blocking stream per thread, replays
/// `trace` `warmup` times untimed and `reps` times timed on `threads` threads (each its own
/// copy on its own stream, started together); a pass costs the slowest thread's wall time /
/// (operations x threads). The resource is dropped, then the device synchronized, then the
/// streams destroyed, as `rmm_peer`'s cell does (`benches/peer/rmm_peer.cpp`).
pub fn measure(
    spec: Spec,
    trace: &Trace,
    threads: usize,
    warmup: usize,
    reps: usize,
) -> MrResult<Cell> {
    let streams = crate::streams(threads)?;
    let built = build(spec)?;
    let ops = (trace.ops.len() * threads).max(1) as f64;
    let mut samples = Vec::with_capacity(reps);
    for pass in 0..warmup + reps {
        let wall = replay_threads(&*built.mr, trace, &streams)?;
        if pass >= warmup {
            samples.push(wall.as_nanos() as f64 / ops);
        }
    }
    let peak_reserved = built.peak_reserved();
    drop(built);
    // Untimed, and its result unused, as RMM's side ignores its `cudaDeviceSynchronize`'s.
    let _ = rmm_sys::device_synchronize();
    drop(streams);
    let ns_per_op = median(&mut samples.clone());
    Ok(Cell {
        samples,
        ns_per_op,
        peak_reserved,
    })
}

/// The latencies of one cell's calls (`run.sh peer-latency`, [`crate::peer_latency`]): `spec`
/// built as [`measure`] builds it, `trace` replayed `warmup` times untimed on `threads`
/// threads, then once with a clock pair around each call; the allocations' and frees' latencies
/// of every thread together, in ns.
pub fn measure_latency(
    spec: Spec,
    trace: &Trace,
    threads: usize,
    warmup: usize,
) -> MrResult<hdrhistogram::Histogram<u64>> {
    let streams = crate::streams(threads)?;
    let built = build(spec)?;
    for _ in 0..warmup {
        replay_threads(&*built.mr, trace, &streams)?;
    }
    let (_, lat) = crate::latency::replay_threads_latency(&*built.mr, trace, &streams)?;
    drop(built);
    let _ = rmm_sys::device_synchronize();
    drop(streams);
    let mut all = lat.allocate;
    all.add(&lat.deallocate)
        .map_err(|e| MrError::bad_alloc(format!("merging latency histograms: {e:?}")))?;
    Ok(all)
}

/// One line naming the device, its driver and its memory.
pub fn describe_device() -> MrResult<String> {
    let dev = rmm_sys::current_device()?;
    let name = rmm_sys::device_name(dev)?;
    let version = rmm_sys::driver_version()?;
    let mem = crate::sizing::DeviceMemory::query()?;
    Ok(format!(
        "{name}; driver CUDA {version}; memory {} total, {} free",
        crate::sizing::gib(mem.total as u64),
        crate::sizing::gib(mem.free as u64)
    ))
}

/// Hand-written PTX (no NVRTC): `spin(u64* out, u64 cycles)` spins one thread for `cycles`
/// clock cycles (`%clock64`) and writes the cycles it spun to `out`. RMM's
/// `multi_stream_allocations` kernel does the same in CUDA C++.
pub const SPIN_PTX: &str = r#"
.version 7.0
.target sm_52
.address_size 64

.visible .entry spin(
	.param .u64 spin_param_out,
	.param .u64 spin_param_cycles
)
{
	.reg .pred 	%p<2>;
	.reg .b64 	%rd<8>;

	ld.param.u64 	%rd1, [spin_param_out];
	ld.param.u64 	%rd2, [spin_param_cycles];
	mov.u64 	%rd3, %clock64;
$L__spin:
	mov.u64 	%rd4, %clock64;
	sub.s64 	%rd5, %rd4, %rd3;
	setp.lt.u64 	%p1, %rd5, %rd2;
	@%p1 bra 	$L__spin;
	cvta.to.global.u64 	%rd6, %rd1;
	st.global.u64 	[%rd6], %rd5;
	ret;
}
"#;

/// The [`SPIN_PTX`] kernel, loaded (JIT-compiled by the driver) into the current context
/// through rmm-sys's driver calls (integer results).
#[derive(Debug)]
pub struct SpinKernel {
    /// The `spin` kernel of the module.
    func: rmm_sys::kernel::Function,
    /// Keeps the kernel loaded; unloaded when this value drops.
    _module: rmm_sys::kernel::Module,
}

impl SpinKernel {
    /// Loads the kernel into the current device's primary context.
    pub fn load() -> MrResult<Self> {
        rmm_sys::ensure_current_context()?;
        let image = CString::new(SPIN_PTX).map_err(|e| MrError::bad_alloc(e.to_string()))?;
        let module = rmm_sys::kernel::Module::load_ptx(&image)
            .map_err(|e| MrError::bad_alloc(format!("loading the spin kernel: {e}")))?;
        let func = module
            .function(c"spin")
            .map_err(|e| MrError::bad_alloc(format!("finding the spin kernel: {e}")))?;
        Ok(Self {
            func,
            _module: module,
        })
    }

    /// Launches one thread spinning `cycles` cycles on `stream`, writing 8 bytes at `out`.
    ///
    /// # Safety
    /// `out` is 8 bytes of device memory the caller may write on `stream`, a live stream of
    /// the context the kernel was loaded into, which is current; the kernel is not dropped
    /// before the launch has completed.
    pub unsafe fn launch(
        &self,
        stream: rmm_sys::raw::CUstream,
        out: DevicePtr,
        cycles: u64,
    ) -> MrResult<()> {
        let mut out_addr: u64 = out.addr();
        let mut cycles = cycles;
        let mut params: [*mut c_void; 2] = [
            (&mut out_addr as *mut u64).cast(),
            (&mut cycles as *mut u64).cast(),
        ];
        // SAFETY: the parameters match `spin(u64*, u64)` and outlive the call (the driver
        // copies them at launch); the module is loaded (held by `self`); the caller's contract covers `out`,
        // `stream`, the context and the module's life until the launch completes.
        unsafe {
            self.func
                .launch([1, 1, 1], [1, 1, 1], 0, stream, &mut params)
        }
        .map_err(|e| MrError::bad_alloc(format!("launching the spin kernel: {e}")))
    }
}
