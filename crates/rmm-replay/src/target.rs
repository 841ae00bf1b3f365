//! The resource a log is replayed against, built as RMM's replay benchmark builds it, on the
//! GPU or over simulated memory, with a probe of the bytes it has reserved.

use std::fmt;

use rmm::mr::{
    shared, ArenaMemoryResource, ArenaOptions, BinningMemoryResource, BinningOptions,
    CudaAsyncMemoryResource, CudaMemoryResource, FixedSizeMemoryResource, FixedSizeOptions,
    ManagedMemoryResource, MrError, PoolMemoryResource, PoolOptions, SharedResource,
    SimulatedMemoryResource, StatisticsResourceAdaptor, VmmPoolMemoryResource, VmmPoolOptions,
};
use rmm::stream::{CudaStream, CudaStreamView};
use rmm::sys::{align_up, CudaError, ALLOCATION_ALIGNMENT};

use crate::plan::Workload;
use crate::summary::format_bytes;

/// The resources a log can be replayed against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum ResourceKind {
    /// `PoolMemoryResource`, initial size 0 and no maximum: it grows until its upstream (the
    /// GPU, or the simulated device) refuses.
    Pool,
    /// `ArenaMemoryResource` of half the free memory (of the GPU, or of the simulated device).
    Arena,
    /// `BinningMemoryResource` with fixed-size bins of 256 KiB..4 MiB (2^18..2^22) over a pool
    /// as above (RMM's benchmark configuration).
    Binning,
    /// `FixedSizeMemoryResource` whose block is the log's largest request.
    Fixed,
    /// `VmmPoolMemoryResource`: one reserved address range, physical memory mapped as it grows;
    /// its maximum is the free memory (of the GPU, or the simulated device's size).
    Vmm,
    /// `CudaAsyncMemoryResource`: the driver's stream-ordered pool (GPU only).
    Async,
    /// `CudaMemoryResource`: `cuMemAlloc` for every request (GPU only).
    Cuda,
    /// `ManagedMemoryResource`: `cuMemAllocManaged` for every request (GPU only).
    Managed,
}

impl ResourceKind {
    /// Every kind, in the order of the command line's help.
    pub const ALL: [ResourceKind; 8] = [
        ResourceKind::Pool,
        ResourceKind::Arena,
        ResourceKind::Binning,
        ResourceKind::Fixed,
        ResourceKind::Vmm,
        ResourceKind::Async,
        ResourceKind::Cuda,
        ResourceKind::Managed,
    ];

    /// The name on the command line.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            ResourceKind::Pool => "pool",
            ResourceKind::Arena => "arena",
            ResourceKind::Binning => "binning",
            ResourceKind::Fixed => "fixed",
            ResourceKind::Vmm => "vmm",
            ResourceKind::Async => "async",
            ResourceKind::Cuda => "cuda",
            ResourceKind::Managed => "managed",
        }
    }

    /// Whether it can be built over simulated memory (the sub-allocators can; the driver's
    /// own allocators cannot).
    #[must_use]
    pub const fn can_simulate(self) -> bool {
        matches!(
            self,
            ResourceKind::Pool
                | ResourceKind::Arena
                | ResourceKind::Binning
                | ResourceKind::Fixed
                | ResourceKind::Vmm
        )
    }
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the memory comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// The current CUDA device.
    Device,
    /// A [`SimulatedMemoryResource`] of this many bytes: no GPU needed.
    Simulated(usize),
}

/// The smallest bin of the binning resource: 2^18 = 256 KiB (RMM's benchmark).
pub const BINNING_MIN_EXPONENT: u32 = 18;
/// The largest bin of the binning resource: 2^22 = 4 MiB (RMM's benchmark).
pub const BINNING_MAX_EXPONENT: u32 = 22;
/// The fixed-size resource takes chunks of at most this many bytes (or one block, when a
/// block is larger), and at most 128 blocks (RMM's default).
pub const FIXED_CHUNK_BYTES: usize = 256 << 20;

/// How the bytes a resource holds are read.
enum Reserved {
    /// A probe (an atomic load, or a driver query for `async`).
    Probe(Box<dyn Fn() -> u64 + Send + Sync>),
    /// Nothing beyond the bytes in use: a resource that asks the driver for every request.
    InUse,
}

/// A resource ready for a replay, with how to read what it holds.
pub struct Target {
    /// The resource.
    pub resource: SharedResource,
    /// What it is, in words (for the summary).
    pub description: String,
    /// The simulated memory's size, when it is simulated.
    pub capacity: Option<u64>,
    reserved: Reserved,
    reserved_high: Option<Box<dyn Fn() -> Option<u64> + Send + Sync>>,
    growths: Option<Box<dyn Fn() -> u64 + Send + Sync>>,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("description", &self.description)
            .field("capacity", &self.capacity)
            .field("resource", &self.resource)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// Bytes the resource holds now: what it took from its upstream (the simulated memory's
    /// bytes handed out, a pool's chunks, the arena), or the driver pool's reserved memory for
    /// `async`; 0 for `cuda` and `managed` (see [`reserved_is_in_use`](Self::reserved_is_in_use)).
    #[must_use]
    pub fn reserved(&self) -> u64 {
        match &self.reserved {
            Reserved::Probe(probe) => probe(),
            Reserved::InUse => 0,
        }
    }

    /// Whether the resource reserves nothing beyond the bytes in use (it asks the driver for
    /// every request: `cuda`, `managed`), so that bytes in use stand for bytes reserved.
    #[must_use]
    pub fn reserved_is_in_use(&self) -> bool {
        matches!(self.reserved, Reserved::InUse)
    }

    /// The largest request worth probing the resource with after a replay
    /// ([`largest_allocation`](crate::summary::largest_allocation)): the simulated size, or on
    /// a GPU the device's free memory plus what the resource holds; `None` for `cuda` and
    /// `managed`, which ask the driver for every request (and managed memory must never be
    /// asked for beyond what the device has free).
    #[must_use]
    pub fn probe_limit(&self) -> Option<u64> {
        if self.reserved_is_in_use() {
            return None;
        }
        match self.capacity {
            Some(capacity) => Some(capacity),
            None => rmm::sys::available_device_memory()
                .ok()
                .map(|(free, _)| free as u64 + self.reserved()),
        }
    }

    /// The high watermark of reserved bytes, where the resource keeps one (the driver pool of
    /// `async`, which may have reserved more between two probes; the VMM pool's most mapped).
    #[must_use]
    pub fn reserved_high(&self) -> Option<u64> {
        self.reserved_high.as_ref().and_then(|high| high())
    }

    /// How many times the resource grew so far: the chunks a pool (or the binning resource's
    /// pool) took from its upstream, the chunks the VMM pool mapped. On a GPU each is a driver
    /// allocation (`cuMemAlloc`, or `cuMemCreate` + `cuMemMap` + `cuMemSetAccess`) of tens of
    /// microseconds. `None` for the other resources.
    #[must_use]
    pub fn growths(&self) -> Option<u64> {
        self.growths.as_ref().map(|count| count())
    }
}

/// What a replay may tune in the resource beyond its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildOptions {
    /// The VMM pool's [`VmmPoolOptions::min_growth_percent`]: each growth maps at least this
    /// share of what is mapped already (default: the VMM pool's own, 100, doubling).
    pub vmm_min_growth_percent: usize,
}

impl Default for BuildOptions {
    fn default() -> Self {
        Self {
            vmm_min_growth_percent: VmmPoolOptions::new(0).min_growth_percent,
        }
    }
}

/// Why a resource could not be built.
#[derive(Debug)]
pub enum BuildError {
    /// The kind has no simulated form.
    CannotSimulate(ResourceKind),
    /// The resource's constructor failed (no GPU, out of memory, a bad size).
    Resource {
        /// The kind.
        kind: ResourceKind,
        /// Its error.
        error: MrError,
    },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::CannotSimulate(kind) => write!(
                f,
                "--resource {kind} cannot run over simulated memory (it is the driver's own \
                 allocator); --simulate works with pool, arena, binning, fixed and vmm"
            ),
            BuildError::Resource { kind, error } => {
                write!(f, "cannot build the {kind} resource: {error}")
            }
        }
    }
}

impl std::error::Error for BuildError {}

/// Builds the resource of `kind` over `memory`, sized for `workload` where the kind needs it
/// (the fixed-size resource's block).
///
/// # Errors
///
/// [`BuildError`]: `async`, `cuda` or `managed` over simulated memory, or a failed
/// constructor (no GPU for [`Memory::Device`], too little simulated memory for the arena or
/// the binning resource's bins).
pub fn build(
    kind: ResourceKind,
    memory: Memory,
    workload: &Workload,
) -> Result<Target, BuildError> {
    build_with(kind, memory, workload, BuildOptions::default())
}

/// [`build`] with `options`.
///
/// Over simulated memory every resource is built exactly as on the GPU, the simulated device
/// standing for the GPU's free memory: the pool (and the binning resource's pool) has no
/// maximum, so it grows until the simulated device refuses, halving a refused chunk down to
/// the request as on a full GPU; the VMM pool's maximum is the simulated size; the arena takes
/// half of it. So the bytes reserved over simulated memory predict the GPU's (on one stream:
/// see [`simulated_streams`]).
///
/// # Errors
///
/// As [`build`].
pub fn build_with(
    kind: ResourceKind,
    memory: Memory,
    workload: &Workload,
    options: BuildOptions,
) -> Result<Target, BuildError> {
    let failed = |error| BuildError::Resource { kind, error };
    let (upstream, simulated, base): (SharedResource, Option<SimulatedMemoryResource>, String) =
        match memory {
            Memory::Simulated(size) => {
                if !kind.can_simulate() {
                    return Err(BuildError::CannotSimulate(kind));
                }
                let sim = SimulatedMemoryResource::new(size).map_err(failed)?;
                let base = format!("{} of simulated memory", format_bytes(sim.size() as u64));
                (shared(sim.clone()), Some(sim), base)
            }
            Memory::Device => (shared(CudaMemoryResource::new()), None, device_words()),
        };
    let capacity = simulated.as_ref().map(|s| s.size() as u64);
    // The simulated device stands for the GPU's free memory.
    let simulated_free = simulated.as_ref().map(SimulatedMemoryResource::size);
    // Over simulated memory, what the resource took from it is exactly what it reserved.
    let probe_simulated = |sim: &SimulatedMemoryResource| {
        let sim = sim.clone();
        Reserved::Probe(Box::new(move || sim.used() as u64))
    };

    // Every chunk a pool takes passes through this: its allocation count is the growths.
    let counted = |upstream| {
        let counted = StatisticsResourceAdaptor::new(upstream);
        let count = counted.clone();
        let growths: Box<dyn Fn() -> u64 + Send + Sync> =
            Box::new(move || u64::try_from(count.allocations_counter().total).unwrap_or(0));
        (counted, growths)
    };
    let mut reserved_high = None;
    let mut growths = None;
    let (resource, reserved, description): (SharedResource, Reserved, String) = match kind {
        ResourceKind::Pool => {
            let (upstream, count) = counted(upstream);
            growths = Some(count);
            let pool =
                PoolMemoryResource::with_options(upstream, pool_options()).map_err(failed)?;
            let reserved = match &simulated {
                Some(sim) => probe_simulated(sim),
                None => {
                    let p = pool.clone();
                    Reserved::Probe(Box::new(move || p.pool_size() as u64))
                }
            };
            let words = format!("pool (initial size 0, no maximum) over {base}");
            (shared(pool), reserved, words)
        }
        ResourceKind::Arena => {
            let mut options = ArenaOptions::new();
            // On a GPU (`None`) half of the free memory.
            options.arena_size = simulated_free.map(|free| free / 2);
            let arena = ArenaMemoryResource::with_options(upstream, options).map_err(failed)?;
            let size = arena.arena_size() as u64;
            let reserved = match &simulated {
                Some(sim) => probe_simulated(sim),
                None => Reserved::Probe(Box::new(move || size)),
            };
            let words = format!("arena of {} over {base}", format_bytes(size));
            (shared(arena), reserved, words)
        }
        ResourceKind::Binning => {
            let (upstream, count) = counted(upstream);
            growths = Some(count);
            let pool =
                PoolMemoryResource::with_options(upstream, pool_options()).map_err(failed)?;
            let binning = BinningMemoryResource::with_options(
                pool.clone(),
                BinningOptions::new()
                    .min_size_exponent(BINNING_MIN_EXPONENT)
                    .max_size_exponent(BINNING_MAX_EXPONENT),
            )
            .map_err(failed)?;
            let reserved = match &simulated {
                Some(sim) => probe_simulated(sim),
                None => Reserved::Probe(Box::new(move || pool.pool_size() as u64)),
            };
            let words = format!(
                "binning (fixed-size bins of {}..{}) over a pool (initial size 0, no maximum) \
                 over {base}",
                format_bytes(1 << BINNING_MIN_EXPONENT),
                format_bytes(1 << BINNING_MAX_EXPONENT)
            );
            (shared(binning), reserved, words)
        }
        ResourceKind::Fixed => {
            let (block, per_chunk) = fixed_geometry(workload.largest_request());
            let fixed = FixedSizeMemoryResource::with_options(
                upstream,
                FixedSizeOptions::new()
                    .block_size(block)
                    .blocks_to_preallocate(per_chunk),
            )
            .map_err(failed)?;
            let reserved = match &simulated {
                Some(sim) => probe_simulated(sim),
                None => {
                    let f = fixed.clone();
                    Reserved::Probe(Box::new(move || f.pool_size() as u64))
                }
            };
            let words = format!(
                "fixed-size (blocks of {}, the largest request; {per_chunk} per chunk) over {base}",
                format_bytes(block as u64)
            );
            (shared(fixed), reserved, words)
        }
        ResourceKind::Vmm => {
            let vmm_options =
                |free| VmmPoolOptions::new(free).min_growth_percent(options.vmm_min_growth_percent);
            let vmm = match simulated_free {
                Some(free) => VmmPoolMemoryResource::simulated(vmm_options(free)),
                None => rmm::sys::available_device_memory()
                    .map_err(MrError::from)
                    .and_then(|(free, _)| VmmPoolMemoryResource::with_options(vmm_options(free))),
            }
            .map_err(failed)?;
            let count = vmm.clone();
            growths = Some(Box::new(move || count.growth_statistics().mappings)
                as Box<dyn Fn() -> u64 + Send + Sync>);
            let (probe, high) = (vmm.clone(), vmm.clone());
            reserved_high =
                Some(
                    Box::new(move || u64::try_from(high.growth_statistics().peak_mapped).ok())
                        as Box<dyn Fn() -> Option<u64> + Send + Sync>,
                );
            let reserved = Reserved::Probe(Box::new(move || probe.pool_size() as u64));
            let words = format!(
                "vmm pool (maximum {}, chunks of {}, growth by at least {}% of what is mapped) \
                 on {base}",
                format_bytes(vmm.maximum_pool_size() as u64),
                format_bytes(vmm.granularity() as u64),
                options.vmm_min_growth_percent.min(100)
            );
            (shared(vmm), reserved, words)
        }
        ResourceKind::Async => {
            let mr = CudaAsyncMemoryResource::new().map_err(failed)?;
            let probe = mr.clone();
            let high = mr.clone();
            reserved_high = Some(
                Box::new(move || high.statistics().ok().map(|s| s.reserved_high))
                    as Box<dyn Fn() -> Option<u64> + Send + Sync>,
            );
            let reserved = Reserved::Probe(Box::new(move || {
                probe.statistics().map_or(0, |s| s.reserved_current)
            }));
            let words = format!("async (the driver's stream-ordered pool) on {base}");
            (shared(mr), reserved, words)
        }
        ResourceKind::Cuda => (
            upstream,
            Reserved::InUse,
            format!("cuda (cuMemAlloc for every request) on {base}"),
        ),
        ResourceKind::Managed => (
            shared(ManagedMemoryResource::new()),
            Reserved::InUse,
            format!("managed (cuMemAllocManaged for every request) on {base}"),
        ),
    };
    Ok(Target {
        resource,
        description,
        capacity,
        reserved,
        reserved_high,
        growths,
    })
}

/// The fixed-size resource's block (the largest request rounded up to 256, at least 256) and
/// blocks per chunk (as many as fit in [`FIXED_CHUNK_BYTES`], between 1 and 128).
#[must_use]
pub fn fixed_geometry(largest_request: usize) -> (usize, usize) {
    let block = align_up(largest_request.max(1), ALLOCATION_ALIGNMENT);
    (block, (FIXED_CHUNK_BYTES / block).clamp(1, 128))
}

/// "GPU 0 (NVIDIA H100 80GB HBM3)", or "the GPU" when it cannot be named.
fn device_words() -> String {
    match rmm::sys::current_device() {
        Ok(device) => match rmm::sys::device_name(device) {
            Ok(name) => format!("GPU {device} ({name})"),
            Err(_) => format!("GPU {device}"),
        },
        Err(_) => "the GPU".to_owned(),
    }
}

/// The streams of a replay on the GPU: each stream of the log mapped to a real one. The default
/// stream (`0`) stays the default stream, `0x1` the legacy and `0x2` the per-thread default
/// stream; every other handle of the log gets a stream of its own, created here.
#[derive(Debug)]
pub struct DeviceStreams {
    /// For each stream of the workload: a special stream, or an index into `owned`.
    map: Vec<Result<CudaStreamView<'static>, usize>>,
    owned: Vec<CudaStream>,
}

impl DeviceStreams {
    /// Streams for the workload's streams (`workload.streams`).
    ///
    /// # Errors
    ///
    /// The driver's error when a stream cannot be created.
    pub fn new(workload: &Workload) -> Result<DeviceStreams, CudaError> {
        let mut owned = Vec::new();
        let mut map = Vec::with_capacity(workload.streams.len());
        for &handle in &workload.streams {
            map.push(match handle {
                0 => Ok(CudaStreamView::default_stream()),
                1 => Ok(CudaStreamView::legacy()),
                2 => Ok(CudaStreamView::per_thread()),
                _ => {
                    owned.push(CudaStream::with_default_flags()?);
                    Err(owned.len() - 1)
                }
            });
        }
        Ok(DeviceStreams { map, owned })
    }

    /// One view per stream of the workload, in its order.
    #[must_use]
    pub fn views(&self) -> Vec<CudaStreamView<'_>> {
        self.map
            .iter()
            .map(|m| match *m {
                Ok(special) => special,
                Err(i) => self.owned[i].view(),
            })
            .collect()
    }

    /// Number of streams created for the replay.
    #[must_use]
    pub fn created(&self) -> usize {
        self.owned.len()
    }
}

/// The streams of a replay over simulated memory: the legacy default stream for every stream
/// of the log (creating a stream needs a GPU, and the legacy stream needs no CUDA call in any
/// resource). A simulated replay therefore models one stream: free blocks are not split
/// between per-stream lists as they would be on a GPU.
#[must_use]
pub fn simulated_streams(workload: &Workload) -> Vec<CudaStreamView<'static>> {
    vec![CudaStreamView::legacy(); workload.streams.len()]
}

/// A pool that starts empty and has no maximum, as on the GPU and as RMM's replay benchmark
/// builds it: over simulated memory the simulated device bounds it, as device memory does.
fn pool_options() -> PoolOptions {
    PoolOptions::new(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmm::mr::DeviceMemoryResource;

    const MIB: usize = 1 << 20;

    #[test]
    fn fixed_blocks_fit_the_largest_request() {
        assert_eq!(fixed_geometry(0), (256, 128));
        assert_eq!(fixed_geometry(1000), (1024, 128));
        assert_eq!(fixed_geometry(4 * MIB), (4 * MIB, 64));
        assert_eq!(fixed_geometry(100 * MIB + 1), (100 * MIB + 256, 2));
        assert_eq!(fixed_geometry(300 * MIB), (300 * MIB, 1));
    }

    #[test]
    fn simulated_targets_need_no_gpu_and_probe_what_they_took() {
        let w = Workload::default();
        for kind in [
            ResourceKind::Pool,
            ResourceKind::Arena,
            ResourceKind::Binning,
            ResourceKind::Fixed,
        ] {
            let t = build(kind, Memory::Simulated(2048 * MIB), &w).unwrap();
            assert!(!t.reserved_is_in_use());
            assert_eq!(t.capacity, Some(2048 << 20));
            assert!(
                t.description.contains("2.00 GiB of simulated memory"),
                "{}",
                t.description
            );
            let props = t.resource.properties();
            assert!(!props.device_accessible && !props.host_accessible, "{kind}");
            let expected = match kind {
                ResourceKind::Pool => 0,
                // Half of the simulated device, as on a GPU half of its free memory.
                ResourceKind::Arena => 1024 * MIB,
                // The bins' first chunks (128 blocks of 256 KiB, 512 KiB, 1, 2 and 4 MiB:
                // 992 MiB), one growth of the pool each (no maximum, as on a GPU).
                ResourceKind::Binning => 992 * MIB,
                ResourceKind::Fixed => 128 * 256,
                _ => unreachable!(),
            };
            assert_eq!(t.reserved() as usize, expected, "{kind}");
            let growths = match kind {
                ResourceKind::Pool => Some(0),
                ResourceKind::Binning => Some(5),
                _ => None,
            };
            assert_eq!(t.growths(), growths, "{kind}");
        }
    }

    /// Over simulated memory the pool is built as on a GPU, without a maximum: it grows by
    /// RMM's rule for a pool without one (the request, then at least doubling), whatever the
    /// simulated size, and when the simulated device refuses a growth it halves the chunk down
    /// to the request, as on a full GPU. (With the simulated size as its maximum, its first
    /// growth took half of it.)
    #[test]
    fn the_simulated_pool_grows_as_on_a_gpu() {
        // Nothing is freed here: dropping a resource returns its chunks.
        let w = Workload::default();
        let s = CudaStreamView::legacy();
        for size in [80usize << 30, 141 << 30] {
            let t = build(ResourceKind::Pool, Memory::Simulated(size), &w).unwrap();
            assert!(t.description.contains("no maximum"), "{}", t.description);
            t.resource.allocate(s, 3 * MIB, 256).unwrap();
            assert_eq!(t.reserved() as usize, 3 * MIB, "{size}: the request alone");
            t.resource.allocate(s, MIB, 256).unwrap();
            assert_eq!(t.reserved() as usize, 6 * MIB, "{size}: doubled");
            assert_eq!(t.growths(), Some(2));
        }
        // 100 MiB of simulated memory, 64 MiB held: a 30 MiB request asks for 64 MiB (refused,
        // 36 are left), then 32 (granted), as RMM's try_to_expand halves; then 8 MiB finds
        // 96, 48, 24, 12 and 8 refused (4 are left) and is out of memory.
        let t = build(ResourceKind::Pool, Memory::Simulated(100 * MIB), &w).unwrap();
        t.resource.allocate(s, 64 * MIB, 256).unwrap();
        t.resource.allocate(s, 30 * MIB, 256).unwrap();
        assert_eq!(
            t.reserved() as usize,
            96 * MIB,
            "64 refused, then 32 granted"
        );
        let e = t.resource.allocate(s, 8 * MIB, 256).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        assert_eq!(t.growths(), Some(2));
    }

    /// The VMM pool's maximum is the simulated device's size, as on a GPU its free memory;
    /// its growth step is the options'.
    #[test]
    fn the_simulated_vmm_pool_spans_the_device_and_takes_the_growth_step() {
        let w = Workload::default();
        let s = CudaStreamView::legacy();
        for (percent, reserved) in [(100, 8 * MIB), (0, 6 * MIB)] {
            let options = BuildOptions {
                vmm_min_growth_percent: percent,
            };
            let t =
                build_with(ResourceKind::Vmm, Memory::Simulated(80 << 30), &w, options).unwrap();
            assert!(
                t.description.contains("maximum 80.00 GiB"),
                "{}",
                t.description
            );
            assert!(
                t.description.contains(&format!("at least {percent}%")),
                "{}",
                t.description
            );
            t.resource.allocate(s, 4 * MIB, 256).unwrap();
            t.resource.allocate(s, 2 * MIB, 256).unwrap();
            assert_eq!(t.reserved() as usize, reserved, "{percent}%");
            assert_eq!(t.growths(), Some(2), "{percent}%");
        }
        assert_eq!(BuildOptions::default().vmm_min_growth_percent, 100);
    }

    #[test]
    fn the_drivers_allocators_cannot_be_simulated() {
        for kind in [
            ResourceKind::Async,
            ResourceKind::Cuda,
            ResourceKind::Managed,
        ] {
            let e = build(kind, Memory::Simulated(MIB), &Workload::default()).unwrap_err();
            assert!(matches!(e, BuildError::CannotSimulate(k) if k == kind));
            assert!(e.to_string().contains("--simulate works with"), "{e}");
        }
    }

    #[test]
    fn too_little_simulated_memory_for_the_bins_is_out_of_memory() {
        let e = build(
            ResourceKind::Binning,
            Memory::Simulated(64 * MIB),
            &Workload::default(),
        )
        .unwrap_err();
        match e {
            BuildError::Resource { kind, error } => {
                assert_eq!(kind, ResourceKind::Binning);
                assert!(error.is_out_of_memory(), "{error}");
            }
            other => panic!("{other}"),
        }
    }
}
