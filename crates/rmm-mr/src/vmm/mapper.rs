//! The VMM pool's source of memory, the "upstream" of its stream-ordered core: a reserved range
//! of device addresses into which it maps physical chunks (`cuMemCreate`, `cuMemMap`,
//! `cuMemSetAccess`) and from which it unmaps them (`cuMemUnmap`, `cuMemRelease`), keeping the
//! pure [`MappedRange`] in step. Over simulated memory the range is fake addresses and mapping
//! is only bookkeeping.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rmm_stream::CudaStreamView;
use rmm_sys::vmm::{AddressRange, Mapping, PhysicalMemory};
use rmm_sys::{align_up, AllocationHandleType, DeviceId, DevicePtr, ALLOCATION_ALIGNMENT};

use crate::error::{InvalidFree, MrError, MrResult};
use crate::resource::{DeviceMemoryResource, ResourceProperties};
use crate::stream_ordered::core::GrowthCause;
use crate::util::format::format_bytes;
use crate::vmm::range::{MappedRange, Placement, RangeError};

/// The name in messages.
pub(crate) const NAME: &str = "vmm_pool_memory_resource";

/// Where simulated ranges are carved from: `[3 * 2^61, 2^63)`, addresses no real allocation
/// can have (see `SimulatedMemoryResource`), disjoint from every simulated range before.
const SIMULATED_BASE: u64 = 3 << 61;
const SIMULATED_END: u64 = 1 << 63;
/// Simulated ranges start at multiples of this.
const SIMULATED_ALIGNMENT: u64 = 1 << 21;
static NEXT_SIMULATED: AtomicU64 = AtomicU64::new(SIMULATED_BASE);

/// Growth and release counts and the time spent in the driver for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VmmGrowthStatistics {
    /// Chunks mapped (each one `cuMemCreate`, `cuMemMap` and `cuMemSetAccess`).
    pub mappings: u64,
    /// Chunks unmapped and released by [`release_unused`](crate::VmmPoolMemoryResource::release_unused)
    /// (each one `cuMemUnmap` and `cuMemRelease`).
    pub unmappings: u64,
    /// Wall time spent mapping.
    pub time_mapping: Duration,
    /// Wall time spent unmapping and releasing.
    pub time_unmapping: Duration,
    /// The most bytes mapped at once (the pool's peak reserved memory).
    pub peak_mapped: usize,
}

/// Where the memory comes from.
enum Backend {
    /// Device memory through CUDA's virtual memory API.
    Device {
        device: DeviceId,
        handle_type: AllocationHandleType,
        /// The device itself first, then its peers.
        access: Vec<DeviceId>,
        range: Arc<AddressRange>,
    },
    /// Fake addresses: nothing is mapped, nothing may be touched.
    Simulated,
}

/// The mapped chunks: the pure map and, per chunk offset, what owns the mapping (`None` when
/// simulated).
struct State {
    range: MappedRange,
    mappings: HashMap<usize, Option<Mapping>>,
}

/// Maps and unmaps the chunks of one reserved range. See the [module documentation](self).
pub(crate) struct Mapper {
    /// Dropped first: every mapping unmaps before the range is freed (the mappings also hold
    /// the range).
    state: Mutex<State>,
    backend: Backend,
    base: u64,
    granularity: usize,
    /// `base` + the end of the mapped memory, shared with the free lists.
    end: Arc<AtomicU64>,
    mappings: AtomicU64,
    unmappings: AtomicU64,
    nanos_mapping: AtomicU64,
    nanos_unmapping: AtomicU64,
    peak_mapped: AtomicUsize,
    /// Failures to inject into simulated mappings (tests).
    #[cfg(test)]
    pub(crate) fail_maps: AtomicUsize,
}

impl Mapper {
    /// A mapper of device memory on `device` over a fresh reservation of `capacity` bytes.
    pub(crate) fn device(
        device: DeviceId,
        handle_type: AllocationHandleType,
        access: Vec<DeviceId>,
        capacity: usize,
        granularity: usize,
        alignment: usize,
    ) -> MrResult<Self> {
        let range = AddressRange::reserve(capacity, alignment)
            .map_err(|e| MrError::from_allocation(e, capacity))?;
        let base = range.base().addr();
        Self::new(
            Backend::Device {
                device,
                handle_type,
                access,
                range: Arc::new(range),
            },
            base,
            capacity,
            granularity,
        )
    }

    /// A mapper of simulated memory of `capacity` bytes (no CUDA call).
    pub(crate) fn simulated(capacity: usize, granularity: usize) -> MrResult<Self> {
        let span = (capacity as u64).div_ceil(SIMULATED_ALIGNMENT) * SIMULATED_ALIGNMENT;
        let base = NEXT_SIMULATED
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
                next.checked_add(span).filter(|&end| end <= SIMULATED_END)
            })
            .map_err(|_| {
                MrError::invalid_argument(format!(
                    "no simulated address space is left for {}",
                    format_bytes(capacity)
                ))
            })?;
        Self::new(Backend::Simulated, base, capacity, granularity)
    }

    fn new(backend: Backend, base: u64, capacity: usize, granularity: usize) -> MrResult<Self> {
        let range = MappedRange::new(capacity, granularity)
            .map_err(|e| MrError::invalid_argument(e.to_string()))?;
        Ok(Self {
            state: Mutex::new(State {
                range,
                mappings: HashMap::new(),
            }),
            backend,
            base,
            granularity,
            end: Arc::new(AtomicU64::new(base)),
            mappings: AtomicU64::new(0),
            unmappings: AtomicU64::new(0),
            nanos_mapping: AtomicU64::new(0),
            nanos_unmapping: AtomicU64::new(0),
            peak_mapped: AtomicUsize::new(0),
            #[cfg(test)]
            fail_maps: AtomicUsize::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while the lock is held; a poisoned map is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// See [`MappedRange::set_min_growth_percent`].
    pub(crate) fn set_min_growth_percent(&self, percent: usize) {
        self.lock().range.set_min_growth_percent(percent);
    }

    /// The end of the mapped memory, shared with the free lists.
    pub(crate) fn end(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.end)
    }

    /// The first address of the range.
    pub(crate) fn base(&self) -> DevicePtr {
        DevicePtr::from_raw(self.base)
    }

    /// The chunk granularity.
    pub(crate) fn granularity(&self) -> usize {
        self.granularity
    }

    /// The size of the range (the most the pool maps).
    pub(crate) fn capacity(&self) -> usize {
        self.lock().range.capacity()
    }

    /// Number of chunks mapped.
    pub(crate) fn chunk_count(&self) -> usize {
        self.lock().range.chunk_count()
    }

    /// The chunks, `(offset, size)`, by offset (tests).
    #[cfg(test)]
    pub(crate) fn chunks_for_tests(&self) -> Vec<(usize, usize)> {
        self.lock().range.chunks().collect()
    }

    /// The device, unless simulated.
    pub(crate) fn device_id(&self) -> Option<DeviceId> {
        match &self.backend {
            Backend::Device { device, .. } => Some(*device),
            Backend::Simulated => None,
        }
    }

    /// Growth counts and times.
    pub(crate) fn statistics(&self) -> VmmGrowthStatistics {
        VmmGrowthStatistics {
            mappings: self.mappings.load(Ordering::Relaxed),
            unmappings: self.unmappings.load(Ordering::Relaxed),
            time_mapping: Duration::from_nanos(self.nanos_mapping.load(Ordering::Relaxed)),
            time_unmapping: Duration::from_nanos(self.nanos_unmapping.load(Ordering::Relaxed)),
            peak_mapped: self.peak_mapped.load(Ordering::Relaxed),
        }
    }

    /// Maps a chunk for a request of `request` bytes (a multiple of 256) when the free block at
    /// the end of the mapped memory has `tail` bytes, and returns it with its size (see
    /// [`MappedRange::place`]; under [`GrowthCause::Pressure`], [`MappedRange::place_exact`]:
    /// no minimum growth). `bytes` is the caller's request, for the error. When the device
    /// refuses a chunk that the minimum growth made larger than the request needs, the chunk
    /// is halved down to what the request lacks (RMM's `try_to_expand`).
    ///
    /// # Errors
    /// Out-of-memory when no chunk can be placed (the maximum is reached) or the device has no
    /// memory left even for what the request lacks; the driver's error otherwise. Nothing is
    /// mapped then.
    pub(crate) fn grow(
        &self,
        bytes: usize,
        request: usize,
        tail: usize,
        cause: GrowthCause,
    ) -> MrResult<(DevicePtr, usize)> {
        let mut st = self.lock();
        let placed = match cause {
            GrowthCause::Ordinary => st.range.place(request, tail),
            GrowthCause::Pressure => st.range.place_exact(request, tail),
        };
        let p = placed.map_err(|e| {
            MrError::out_of_memory(
                bytes,
                format!(
                    "Maximum pool size exceeded (failed to allocate {}): {e}",
                    format_bytes(bytes)
                ),
            )
        })?;
        let exact = st.range.place_exact(request, tail).ok();
        let started = Instant::now();
        let (p, mapping) = self.map_or_less(p, exact).map_err(|e| {
            log::error!("rmm: {NAME} could not map {}: {e}", format_bytes(p.size));
            e
        })?;
        add_nanos(&self.nanos_mapping, started);
        if let Err(e) = st.range.insert(p) {
            // `place` only returns free, aligned chunks inside the range: never reached.
            return Err(MrError::bad_alloc(format!("{NAME}: {e}")));
        }
        st.mappings.insert(p.offset, mapping);
        self.mappings.fetch_add(1, Ordering::Relaxed);
        self.peak_mapped
            .fetch_max(st.range.mapped(), Ordering::Relaxed);
        self.end
            .store(self.base + st.range.end() as u64, Ordering::Release);
        Ok((DevicePtr::from_raw(self.base + p.offset as u64), p.size))
    }

    /// Maps `p`, or, when the device is out of memory and `p` is more than the request lacks
    /// (`exact`, a chunk at the same offset: the minimum growth made it larger), the halves of
    /// `p` down to `exact`, as RMM's pool halves a refused growth down to the request
    /// (`try_to_expand`). Returns what was mapped.
    fn map_or_less(
        &self,
        p: Placement,
        exact: Option<Placement>,
    ) -> MrResult<(Placement, Option<Mapping>)> {
        let mut p = p;
        loop {
            match self.map(p) {
                Ok(mapping) => return Ok((p, mapping)),
                Err(e) => {
                    let smaller = exact.filter(|x| {
                        e.is_out_of_memory() && x.offset == p.offset && x.size < p.size
                    });
                    let Some(x) = smaller else { return Err(e) };
                    let half = p.size / 2 / self.granularity * self.granularity;
                    p.size = half.max(x.size);
                }
            }
        }
    }

    /// Creates and maps the physical memory of `p` (nothing when simulated).
    fn map(&self, p: Placement) -> MrResult<Option<Mapping>> {
        match &self.backend {
            Backend::Simulated => {
                #[cfg(test)]
                if self
                    .fail_maps
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
                {
                    return Err(MrError::out_of_memory(p.size, "injected mapping failure"));
                }
                Ok(None)
            }
            Backend::Device {
                device,
                handle_type,
                access,
                range,
            } => {
                let memory = PhysicalMemory::create(*device, p.size, *handle_type)
                    .map_err(|e| MrError::from_allocation(e, p.size))?;
                let mapping = Mapping::new(range, p.offset, memory, access)
                    .map_err(|e| MrError::from_allocation(e, p.size))?;
                Ok(Some(mapping))
            }
        }
    }

    /// Unmaps and releases the chunk at `ptr` of `size` bytes.
    ///
    /// # Errors
    /// [`MrError::InvalidFree`] when no chunk of that size is mapped there; the driver's error
    /// of `cuMemUnmap` (the chunk then stays mapped and recorded).
    ///
    /// # Safety
    /// No pending work on any stream uses the chunk, and no block of it is handed out.
    unsafe fn unmap(&self, ptr: DevicePtr, size: usize) -> MrResult<()> {
        let unknown = || MrError::InvalidFree {
            ptr,
            bytes: size,
            kind: InvalidFree::UnknownPointer,
        };
        let offset = ptr
            .addr()
            .checked_sub(self.base)
            .and_then(|o| usize::try_from(o).ok())
            .ok_or_else(unknown)?;
        let p = Placement { offset, size };
        let mut st = self.lock();
        if !st.range.chunks().any(|c| c == (offset, size)) {
            return Err(unknown());
        }
        let started = Instant::now();
        if let Some(Some(mapping)) = st.mappings.remove(&offset) {
            match mapping.unmap() {
                // Released here (`cuMemRelease`; a failure is logged by the drop).
                Ok(memory) => drop(memory),
                Err((mapping, e)) => {
                    st.mappings.insert(offset, Some(mapping));
                    return Err(e.into());
                }
            }
        }
        add_nanos(&self.nanos_unmapping, started);
        st.range
            .remove(p)
            .map_err(|e: RangeError| MrError::invalid_argument(format!("{NAME}: {e}")))?;
        self.unmappings.fetch_add(1, Ordering::Relaxed);
        self.end
            .store(self.base + st.range.end() as u64, Ordering::Release);
        Ok(())
    }

    /// Exports every chunk's physical memory as a POSIX file descriptor, by offset.
    #[cfg(unix)]
    pub(crate) fn export_chunks(&self) -> MrResult<Vec<crate::vmm::ExportedChunk>> {
        let st = self.lock();
        let mut chunks = Vec::with_capacity(st.range.chunk_count());
        for (offset, size) in st.range.chunks() {
            let memory = st
                .mappings
                .get(&offset)
                .and_then(|m| m.as_ref())
                .and_then(Mapping::memory)
                .ok_or_else(|| {
                    MrError::invalid_argument(format!(
                        "{NAME}: simulated memory cannot be exported"
                    ))
                })?;
            chunks.push(crate::vmm::ExportedChunk {
                offset,
                size,
                fd: memory.export_posix_fd()?,
            });
        }
        Ok(chunks)
    }

    /// `f(offset, size, memory)` for every chunk that overlaps `[start, end)` (offsets from
    /// the base), in address order, under the lock (for `export`'s IPC exports).
    #[cfg(unix)]
    pub(crate) fn chunks_in<R>(
        &self,
        start: usize,
        end: usize,
        f: &mut dyn FnMut(usize, usize, &PhysicalMemory) -> MrResult<R>,
    ) -> MrResult<Vec<R>> {
        let st = self.lock();
        let mut out = Vec::new();
        for (offset, size) in st.range.chunks().filter(|&(o, s)| o < end && o + s > start) {
            let memory = st
                .mappings
                .get(&offset)
                .and_then(|m| m.as_ref())
                .and_then(Mapping::memory)
                .ok_or_else(|| {
                    MrError::invalid_argument(format!(
                        "{NAME}: simulated memory cannot be exported"
                    ))
                })?;
            out.push(f(offset, size, memory)?);
        }
        Ok(out)
    }
}

fn add_nanos(total: &AtomicU64, since: Instant) {
    let nanos = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
    total.fetch_add(nanos, Ordering::Relaxed);
}

impl fmt::Debug for Mapper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mapper")
            .field("base", &format_args!("{:#x}", self.base))
            .field("granularity", &self.granularity)
            .field("mapped", &self.lock().range.mapped())
            .field("simulated", &matches!(self.backend, Backend::Simulated))
            .finish_non_exhaustive()
    }
}

// SAFETY: a chunk handed out is a fresh mapping of physical memory (or of simulated addresses
// nothing touches) at a granularity-aligned offset of a range this mapper reserved, disjoint
// from every other chunk, and stays mapped until it is deallocated. It is the private upstream
// of the VMM pool's core, which unmaps a chunk only when no block of it is handed out and the
// device was synchronized.
unsafe impl DeviceMemoryResource for Mapper {
    /// Maps a new chunk of `bytes` rounded up to the granularity (synchronously: usable on any
    /// stream at once).
    fn allocate(
        &self,
        _stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        crate::resource::check_base_alignment(alignment)?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        if bytes > self.capacity() {
            return Err(MrError::out_of_memory(
                bytes,
                format!("{NAME}: {} exceed the range", format_bytes(bytes)),
            ));
        }
        self.grow(
            bytes,
            align_up(bytes, ALLOCATION_ALIGNMENT),
            0,
            GrowthCause::Ordinary,
        )
        .map(|(ptr, _)| ptr)
    }

    /// Unmaps the chunk at `ptr` (`bytes` rounded up to the granularity) at once.
    unsafe fn deallocate(
        &self,
        _stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
    ) -> MrResult<()> {
        if ptr.is_null() || bytes == 0 {
            return Ok(());
        }
        let size = rmm_sys::checked_align_up(bytes, self.granularity).unwrap_or(usize::MAX);
        // SAFETY: the caller's contract (the trait's, and this type's: no pending use).
        unsafe { self.unmap(ptr, size) }
    }

    /// As [`deallocate`](Self::deallocate): unmapping waits for nothing.
    unsafe fn deallocate_sync(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()> {
        // SAFETY: the caller's contract.
        unsafe { self.deallocate(CudaStreamView::default(), ptr, bytes, alignment) }
    }

    fn properties(&self) -> ResourceProperties {
        match self.backend {
            Backend::Device { .. } => ResourceProperties::DEVICE,
            Backend::Simulated => ResourceProperties {
                device_accessible: false,
                host_accessible: false,
            },
        }
    }

    crate::resource::resource_tail! {
        is_equal: identity,
    }
}
