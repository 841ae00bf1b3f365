//! The binning resource (RMM's `binning_memory_resource`).

use std::fmt;
use std::sync::Arc;

use rmm_stream::CudaStreamView;
use rmm_sys::{is_pow2, DevicePtr, ALLOCATION_ALIGNMENT};

use crate::binning::routes::{BinRoutes, InsertError, Version};
use crate::binning::table::{exponent_sizes, rounded_bin_size};
use crate::error::{InvalidFree, MrError, MrResult};
use crate::fixed_size::{FixedSizeMemoryResource, FixedSizeOptions};
use crate::resource::{shared, DeviceMemoryResource, SharedResource};
use crate::util::alignment;

struct Binning<U: DeviceMemoryResource> {
    /// Shared with the fixed-size bins made for it.
    upstream: Arc<U>,
    /// The bins, routed without a lock, and which versions of them handed out memory.
    routes: BinRoutes<Bin<U>>,
}

/// A bin as the routes hold it: a fixed-size bin this resource made, called directly (no
/// dynamic dispatch, no second alignment check) and able to tell whether it owns a block, or a
/// bin the caller gave, through the trait.
enum Bin<U: DeviceMemoryResource> {
    Fixed(FixedSizeMemoryResource<Arc<U>>),
    Other(SharedResource),
}

impl<U: DeviceMemoryResource> Clone for Bin<U> {
    fn clone(&self) -> Self {
        match self {
            Bin::Fixed(f) => Bin::Fixed(f.clone()),
            Bin::Other(r) => Bin::Other(Arc::clone(r)),
        }
    }
}

impl<U: DeviceMemoryResource> fmt::Debug for Bin<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bin::Fixed(r) => write!(f, "fixed-size bin of {} bytes", r.block_size()),
            Bin::Other(r) => write!(f, "{r:?}"),
        }
    }
}

impl<U: DeviceMemoryResource> Bin<U> {
    fn resource(&self) -> &dyn DeviceMemoryResource {
        match self {
            Bin::Fixed(f) => f,
            Bin::Other(r) => &**r,
        }
    }
}

/// The fixed-size bin made here that version `v` routes a request of `bytes` to; `None` for a
/// bin the caller gave or the upstream.
#[inline]
fn fixed_bin<U: DeviceMemoryResource>(
    v: &Version<Bin<U>>,
    bytes: usize,
) -> Option<&FixedSizeMemoryResource<Arc<U>>> {
    match v.route(bytes) {
        Some((_, Bin::Fixed(bin))) => Some(bin),
        _ => None,
    }
}

impl<U: DeviceMemoryResource> Binning<U> {
    /// The resource a request of `bytes` with this (normalized) `alignment` goes to under
    /// version `v`: the upstream for alignments above 256, else the bin or the upstream by size.
    #[inline]
    fn route<'a>(
        &'a self,
        v: &'a Version<Bin<U>>,
        bytes: usize,
        alignment: usize,
    ) -> &'a dyn DeviceMemoryResource {
        if alignment > ALLOCATION_ALIGNMENT {
            return &*self.upstream;
        }
        match v.route(bytes) {
            Some((_, bin)) => bin.resource(),
            None => &*self.upstream,
        }
    }

    /// A free once a bin was added after memory was handed out (`v` is not the only version
    /// that allocated): above 256-byte alignment to the upstream, as ever; else the block goes
    /// to the fixed-size bin among its candidates that owns it, else to the one resource among
    /// them that cannot tell (the bin rule of [`add_bin`](BinningMemoryResource::add_bin)
    /// keeps it to one).
    ///
    /// # Safety
    /// As [`DeviceMemoryResource::deallocate`].
    #[cold]
    #[inline(never)]
    unsafe fn deallocate_across_versions(
        &self,
        v: &Version<Bin<U>>,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()> {
        let required = alignment::normalized(alignment).unwrap_or(ALLOCATION_ALIGNMENT);
        if required > ALLOCATION_ALIGNMENT {
            // SAFETY: the caller's contract; such requests always go to the upstream.
            return unsafe { self.upstream.deallocate(stream, ptr, bytes, alignment) };
        }
        let mut other: Option<&dyn DeviceMemoryResource> = None;
        for candidate in self.routes.candidates(v, bytes) {
            match candidate {
                Some(Bin::Fixed(bin)) => {
                    if bin.owns(ptr) {
                        // SAFETY: the caller's contract; the bin owns the block.
                        return unsafe { bin.deallocate_block(stream, ptr, bytes) };
                    }
                }
                Some(Bin::Other(r)) => other = other.or(Some(&**r)),
                None => other = other.or(Some(&*self.upstream)),
            }
        }
        match other {
            // SAFETY: the caller's contract; no fixed-size bin owns the block, and every other
            // candidate is equal to this one.
            Some(mr) => unsafe { mr.deallocate(stream, ptr, bytes, alignment) },
            None => Err(MrError::InvalidFree {
                ptr,
                bytes,
                kind: InvalidFree::UnknownPointer,
            }),
        }
    }
}

/// The error of an `add_bin` past [`BinningMemoryResource::MAX_BINS`].
fn full() -> MrError {
    MrError::invalid_argument(format!(
        "binning_memory_resource: at most {} bins",
        BinRoutes::<()>::MAX_BINS
    ))
}

/// How to build a [`BinningMemoryResource`] (RMM's constructor parameters).
///
/// Built with [`new`](Self::new) or `default()` (RMM's defaults: no bins) and the chained
/// setters; the fields are public to read. `#[non_exhaustive]`: later options do not break
/// callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct BinningOptions {
    /// The exponent of the smallest bin (`1 << min_size_exponent` bytes). Bins are made only
    /// when both exponents are set (RMM's two constructors).
    pub min_size_exponent: Option<u32>,
    /// The exponent of the largest bin (`1 << max_size_exponent` bytes).
    pub max_size_exponent: Option<u32>,
}

impl BinningOptions {
    /// RMM's defaults: no bins.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the field `min_size_exponent` to `Some(exponent)`.
    #[must_use]
    pub fn min_size_exponent(mut self, exponent: u32) -> Self {
        self.min_size_exponent = Some(exponent);
        self
    }

    /// Sets the field `max_size_exponent` to `Some(exponent)`.
    #[must_use]
    pub fn max_size_exponent(mut self, exponent: u32) -> Self {
        self.max_size_exponent = Some(exponent);
        self
    }
}

/// Routes each request to the smallest bin whose size is at least the request, and larger
/// requests to the upstream (RMM's `binning_memory_resource`).
///
/// - Bins are resources keyed by a size rounded up to 256. [`add_bin`](Self::add_bin) without
///   a resource makes a [`FixedSizeMemoryResource`] of that block size over this resource's
///   upstream (128 blocks preallocated) unless a bin of that size exists; with a resource, it
///   inserts it unless a bin of that size exists (the existing one is kept).
/// - Deallocation routes by `bytes` exactly as allocation did, so `bytes` must be the
///   allocation's. A request of 0 bytes goes to the smallest bin (which returns
///   [`DevicePtr::NULL`]), or to the upstream when there is none. The alignment is forwarded.
/// - Beyond RMM: an alignment that is not a power of two (or 0, the default) is
///   [`MrError::BadAlloc`]; a request with an alignment above 256 goes to the upstream whatever
///   its size (fixed-size bins hand out 256-aligned blocks only), which honours or refuses it,
///   and so does its deallocation. A pointer that is not aligned as asked is given back to the
///   resource it came from and refused.
/// - Beyond RMM: [`add_bin`](Self::add_bin) is thread-safe and allowed at any time. Adding a
///   bin takes a lock and publishes a new immutable version of the routes; allocation and
///   deallocation read the current version without any lock. In RMM, a bin added after memory
///   of its size range was handed out receives the frees of blocks another bin allocated (and
///   a resource that does not check its frees releases memory still in use). Here each version
///   records the size classes it handed out, and a free whose size an earlier such version
///   routed elsewhere goes to the fixed-size bin among those routes that owns the block, else
///   to the one resource among them that cannot tell. To keep that one, `add_bin` with a
///   resource is refused ([`MrError::InvalidArgument`]) when its size range was already served
///   by the upstream or another bin given as a resource (one it is not
///   [`is_equal`](DeviceMemoryResource::is_equal) to); fixed-size bins (`add_bin(size, None)`)
///   are never refused. The record costs every allocate/free pair about 55 host instructions;
///   after a late bin, frees of the sizes it changed also search the bins' chunk maps: design
///   and figures in `docs/internals/binning.md`.
/// - At most [`MAX_BINS`](Self::MAX_BINS) bins (RMM has no limit).
/// - Copies share the bins and are equal; two resources are unequal.
/// - A block freed on another thread's per-thread default stream than the one it was
///   allocated on is ordered as its bin orders it: the fixed-size and pool resources put it on
///   the legacy stream's list (see [`PoolMemoryResource`](crate::PoolMemoryResource)); the
///   upstream, for requests above every bin, decides for itself (a driver pool does not order
///   it, see [`CudaAsyncMemoryResource`](crate::CudaAsyncMemoryResource)).
#[doc(alias = "rmm::mr::binning_memory_resource")]
pub struct BinningMemoryResource<U: DeviceMemoryResource = SharedResource> {
    inner: Arc<Binning<U>>,
}

impl<U: DeviceMemoryResource> Clone for BinningMemoryResource<U> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<U: DeviceMemoryResource> BinningMemoryResource<U> {
    /// A binning resource without bins: everything goes to `upstream` until bins are added.
    pub fn new(upstream: U) -> Self {
        Self {
            inner: Arc::new(Binning {
                upstream: Arc::new(upstream),
                routes: BinRoutes::new(),
            }),
        }
    }

    /// A binning resource built with `options`: with both exponents set, a fixed-size bin of
    /// `1 << i` bytes for every `i` in `min_size_exponent..=max_size_exponent` (each rounded up
    /// to 256; none when `min > max`, as in RMM).
    ///
    /// # Errors
    ///
    /// [`MrError::InvalidArgument`] when only one exponent is set or `1 << max_size_exponent`
    /// does not fit in `usize`; the upstream's error when it refuses a bin's first chunk.
    pub fn with_options(upstream: U, options: BinningOptions) -> MrResult<Self> {
        let this = Self::new(upstream);
        let (min_size_exponent, max_size_exponent) =
            match (options.min_size_exponent, options.max_size_exponent) {
                (None, None) => return Ok(this),
                (Some(min), Some(max)) => (min, max),
                _ => {
                    return Err(MrError::invalid_argument(
                        "binning_memory_resource needs both size exponents or neither",
                    ))
                }
            };
        if min_size_exponent > max_size_exponent {
            return Ok(this);
        }
        let sizes = exponent_sizes(min_size_exponent, max_size_exponent)
            .map_err(|e| MrError::invalid_argument(e.to_string()))?;
        for size in sizes {
            this.add_bin(size, None)?;
        }
        Ok(this)
    }

    /// Adds a bin for requests up to `allocation_size` bytes (rounded up to 256), served by
    /// `bin_resource`, or by a new [`FixedSizeMemoryResource`] over the upstream when `None`.
    /// Where a bin of that size exists it is kept and nothing is created. Thread-safe, and
    /// allowed at any time: frees of blocks handed out before still reach the resource that
    /// allocated them (see the type's documentation for the one case refused).
    ///
    /// # Errors
    ///
    /// [`MrError::InvalidArgument`] when the size cannot be rounded (or is 0 without a
    /// resource), when the resource already has [`MAX_BINS`](Self::MAX_BINS) bins, or when
    /// `bin_resource` would take over sizes that the upstream or another caller-given bin has
    /// handed out memory for (unless it [`is_equal`](DeviceMemoryResource::is_equal) to them);
    /// the upstream's error when it refuses a new bin's first chunk.
    #[doc(alias = "rmm::mr::binning_memory_resource::add_bin")]
    pub fn add_bin(
        &self,
        allocation_size: usize,
        bin_resource: Option<SharedResource>,
    ) -> MrResult<()> {
        let size = rounded_bin_size(allocation_size)
            .map_err(|e| MrError::invalid_argument(e.to_string()))?;
        let routes = &self.inner.routes;
        if routes.bins().any(|(s, _)| s == size) {
            return Ok(());
        }
        if routes.len() >= Self::MAX_BINS {
            return Err(full());
        }
        let bin = match bin_resource {
            Some(resource) => Bin::Other(resource),
            // Made before the routes' lock is taken (its first chunk is an upstream call); a
            // racing `add_bin` of the same size keeps its own and this one is dropped.
            None => Bin::Fixed(FixedSizeMemoryResource::with_options(
                Arc::clone(&self.inner.upstream),
                FixedSizeOptions::new().block_size(size),
            )?),
        };
        let upstream = &*self.inner.upstream;
        let admitted = routes.insert(size, bin, |new, served| match new {
            // A bin made here tells its own blocks from others' on a free.
            Bin::Fixed(_) => Ok(()),
            Bin::Other(new) => {
                for old in served {
                    match old {
                        Some(Bin::Fixed(_)) => {}
                        Some(Bin::Other(old)) if old.is_equal(&**new) => {}
                        None if upstream.is_equal(&**new) => {}
                        Some(Bin::Other(_)) => return Err("another bin given to add_bin"),
                        None => return Err("the upstream"),
                    }
                }
                Ok(())
            }
        });
        match admitted {
            Ok(_) => Ok(()),
            Err(InsertError::Full(_)) => Err(full()),
            Err(InsertError::Refused(_, holder)) => Err(MrError::invalid_argument(format!(
                "binning_memory_resource: a bin of {size} bytes would receive frees of blocks \
                 that {holder} handed out; add bins given as resources before memory of their \
                 sizes is allocated, or add a fixed-size bin (add_bin(size, None))"
            ))),
        }
    }

    /// The most bins a binning resource holds.
    pub const MAX_BINS: usize = BinRoutes::<()>::MAX_BINS;

    /// The upstream resource (RMM's `get_upstream_resource()`).
    #[must_use]
    pub fn upstream(&self) -> &U {
        &self.inner.upstream
    }

    /// The bin sizes, increasing.
    #[must_use]
    pub fn bin_sizes(&self) -> Vec<usize> {
        self.inner.routes.bins().map(|(s, _)| s).collect()
    }

    /// The bin a request of `bytes` goes to now, or `None` for the upstream.
    #[must_use]
    pub fn bin_for(&self, bytes: usize) -> Option<SharedResource> {
        let (_, bin) = self.inner.routes.current().route(bytes)?;
        Some(match bin {
            Bin::Fixed(f) => shared(f.clone()),
            Bin::Other(r) => Arc::clone(r),
        })
    }
}

impl<U: DeviceMemoryResource> fmt::Debug for BinningMemoryResource<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BinningMemoryResource")
            .field("bins", &self.bin_sizes())
            .field("upstream", &self.inner.upstream)
            .finish()
    }
}

// SAFETY: every pointer comes from one of the bins or the fallback upstream (each bound by
// this trait's contract) and goes back to the one that handed it out: a free routes by the
// version of the bins that allocated it (the only one while no bin was added after memory was
// handed out, else the candidates of every version that allocated its size, see
// `deallocate_across_versions`).
unsafe impl<U: DeviceMemoryResource> DeviceMemoryResource for BinningMemoryResource<U> {
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        if let Some(routed) = crate::graph::route_allocate(stream, bytes, alignment) {
            return routed;
        }
        let inner = &*self.inner;
        let v = inner.routes.for_allocation(bytes);
        if alignment::is_default(alignment) {
            if let Some(bin) = fixed_bin(v, bytes) {
                // Its blocks are 256-aligned: as aligned as asked.
                return bin.allocate_block(stream, bytes);
            }
        }
        let required = alignment::check_valid(alignment)?;
        let mr = inner.route(v, bytes, required);
        let ptr = mr
            .allocate(stream, bytes, alignment)
            .map_err(|e| self.with_oom_report(e))?;
        if ptr.is_aligned(required) {
            return Ok(ptr);
        }
        // SAFETY: `ptr` was just allocated from `mr` with these arguments, never handed out.
        if let Err(e) = unsafe { mr.deallocate(stream, ptr, bytes, alignment) } {
            log::error!("rmm: binning_memory_resource could not give {ptr} back: {e}");
        }
        Err(alignment::misaligned_upstream(
            ptr,
            required,
            "binning_memory_resource",
        ))
    }

    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()> {
        // SAFETY: the trait's contract.
        let routed = unsafe { crate::graph::route_deallocate(stream, ptr, bytes, alignment) };
        if let Some(routed) = routed {
            return routed;
        }
        let inner = &*self.inner;
        let v = inner.routes.current();
        // A null pointer is no block: the current route answers it as ever.
        if !v.is_only_era() && !ptr.is_null() {
            // SAFETY: the caller's contract.
            return unsafe { inner.deallocate_across_versions(v, stream, ptr, bytes, alignment) };
        }
        // An alignment no allocation could have had routes by size, as a default one.
        if alignment <= ALLOCATION_ALIGNMENT || !is_pow2(alignment) {
            if let Some(bin) = fixed_bin(v, bytes) {
                // SAFETY: the trait's contract; every block was allocated under `v` (no earlier
                // version handed out memory), which routes `bytes` to this bin.
                return unsafe { bin.deallocate_block(stream, ptr, bytes) };
            }
        }
        let required = alignment::normalized(alignment).unwrap_or(ALLOCATION_ALIGNMENT);
        // SAFETY: the trait's contract; `bytes` and `alignment` route, under the only version
        // that allocated, to the resource that allocated.
        unsafe {
            inner
                .route(v, bytes, required)
                .deallocate(stream, ptr, bytes, alignment)
        }
    }

    fn snapshot(&self) -> MrResult<crate::Snapshot> {
        let mut snapshot = crate::Snapshot::default();
        for (_, bin) in self.inner.routes.bins() {
            let part = match bin {
                Bin::Fixed(fixed) => fixed.diagnostics_snapshot(),
                Bin::Other(other) => match other.snapshot() {
                    Ok(s) => s,
                    Err(MrError::Unsupported(_)) => continue,
                    Err(e) => return Err(e),
                },
            };
            snapshot.segments.extend(part.segments);
            snapshot.trace.extend(part.trace);
        }
        snapshot.segments.sort_by_key(|s| (s.device, s.address));
        Ok(snapshot)
    }

    crate::resource::resource_tail! {
        is_equal: shared(inner),
        properties: forward(inner.upstream),
    }
}

impl<U: DeviceMemoryResource> BinningMemoryResource<U> {
    /// `e` with a report attached when it is out-of-memory from a route that attached none
    /// (an upstream or a caller's bin without reports): the bins' memory, and the verdict that
    /// the resource behind the route refused.
    #[cold]
    #[inline(never)]
    fn with_oom_report(&self, e: MrError) -> MrError {
        if !e.is_out_of_memory() {
            return e;
        }
        e.with_oom_report(|requested| {
            let snapshot = crate::DeviceMemoryResource::snapshot(self).unwrap_or_default();
            let reserved = snapshot.reserved_bytes();
            let in_use = snapshot.allocated_bytes();
            let largest = snapshot
                .segments
                .iter()
                .flat_map(|s| &s.blocks)
                .filter(|b| !b.allocated)
                .map(|b| b.size)
                .max()
                .unwrap_or(0);
            crate::OomReport {
                resource: "binning_memory_resource",
                reserved,
                in_use,
                free: reserved.saturating_sub(in_use),
                largest_free_block: largest,
                // The bins' free blocks cannot serve a request routed past them.
                verdict: crate::Verdict::UpstreamRefused,
                ..crate::OomReport::new(requested)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::InvalidFree;
    use crate::resource::resource_cast;
    use crate::testing::HostMockResource;

    fn s() -> CudaStreamView<'static> {
        CudaStreamView::legacy()
    }

    type Bin = FixedSizeMemoryResource<Arc<HostMockResource>>;

    fn outstanding_in(r: &BinningMemoryResource<HostMockResource>, bytes: usize) -> usize {
        let bin = r.bin_for(bytes).unwrap();
        resource_cast::<Bin>(&*bin)
            .unwrap()
            .outstanding_allocations()
    }

    #[test]
    fn exponents_make_fixed_size_bins() {
        let mock = HostMockResource::new();
        let r = BinningMemoryResource::with_options(
            mock.clone(),
            BinningOptions::new()
                .min_size_exponent(10)
                .max_size_exponent(12),
        )
        .unwrap();
        assert_eq!(r.bin_sizes(), [1024, 2048, 4096]);
        assert_eq!(mock.allocation_calls(), 3);
        assert_eq!(mock.live_bytes(), (1024 + 2048 + 4096) * 128);
        let small = BinningMemoryResource::with_options(
            HostMockResource::new(),
            BinningOptions::new()
                .min_size_exponent(3)
                .max_size_exponent(9),
        )
        .unwrap();
        assert_eq!(
            small.bin_sizes(),
            [256, 512],
            "exponents below 8 share the 256-byte bin"
        );
        let none = BinningMemoryResource::with_options(
            HostMockResource::new(),
            BinningOptions::new()
                .min_size_exponent(9)
                .max_size_exponent(3),
        )
        .unwrap();
        assert!(none.bin_sizes().is_empty());
        assert!(matches!(
            BinningMemoryResource::with_options(
                HostMockResource::new(),
                BinningOptions::new()
                    .min_size_exponent(0)
                    .max_size_exponent(64)
            ),
            Err(MrError::InvalidArgument(_))
        ));
        drop(r);
        assert_eq!(mock.live_allocations(), 0);
    }

    #[test]
    fn options_need_both_exponents_or_neither() {
        let mock = HostMockResource::new();
        let plain = BinningMemoryResource::with_options(mock.clone(), BinningOptions::new());
        assert!(plain.unwrap().bin_sizes().is_empty());
        for half in [
            BinningOptions::new().min_size_exponent(10),
            BinningOptions::new().max_size_exponent(12),
        ] {
            let e = BinningMemoryResource::with_options(mock.clone(), half).unwrap_err();
            assert!(matches!(e, MrError::InvalidArgument(_)), "{e}");
        }
        assert_eq!(mock.allocation_calls(), 0);
    }

    #[test]
    fn requests_go_to_the_smallest_fitting_bin_or_upstream() {
        let mock = HostMockResource::new();
        let r = BinningMemoryResource::with_options(
            mock.clone(),
            BinningOptions::new()
                .min_size_exponent(10)
                .max_size_exponent(12),
        )
        .unwrap();
        let calls = mock.allocation_calls();
        let a = r.allocate(s(), 1, 256).unwrap();
        let b = r.allocate(s(), 1025, 256).unwrap();
        let c = r.allocate(s(), 4096, 256).unwrap();
        assert_eq!(
            (
                outstanding_in(&r, 1),
                outstanding_in(&r, 2048),
                outstanding_in(&r, 4096)
            ),
            (1, 1, 1)
        );
        assert_eq!(
            mock.allocation_calls(),
            calls,
            "a bin request reached the upstream"
        );
        let big = r.allocate(s(), 5000, 128).unwrap();
        assert_eq!(mock.allocation_calls(), calls + 1);
        assert_eq!(mock.last_alignment(), 128, "alignment not forwarded");
        assert!(r.bin_for(5000).is_none());
        // Zero bytes: the smallest bin, which answers NULL.
        assert_eq!(r.allocate(s(), 0, 256).unwrap(), DevicePtr::NULL);
        // SAFETY: each came from `r` with these sizes.
        unsafe {
            r.deallocate(s(), a, 1, 256).unwrap();
            r.deallocate(s(), b, 1025, 256).unwrap();
            r.deallocate(s(), c, 4096, 256).unwrap();
            r.deallocate(s(), big, 5000, 128).unwrap();
        }
        assert_eq!(outstanding_in(&r, 1) + outstanding_in(&r, 2048), 0);
        assert_eq!(mock.live_allocations(), 3);
    }

    #[test]
    fn without_bins_everything_goes_upstream() {
        let mock = HostMockResource::new();
        let r = BinningMemoryResource::new(mock.clone());
        assert_eq!(r.allocate(s(), 0, 256).unwrap(), DevicePtr::NULL);
        let p = r.allocate(s(), 300, 64).unwrap();
        assert_eq!((mock.live_bytes(), mock.last_alignment()), (300, 64));
        // SAFETY: `p` came from `r` with 300 bytes.
        unsafe { r.deallocate(s(), p, 300, 64).unwrap() };
        assert_eq!(mock.live_allocations(), 0);
        assert!(r.upstream().is_equal(&mock));
    }

    #[test]
    fn add_bin_with_a_resource_keeps_existing_bins() {
        let mock = HostMockResource::new();
        let r = BinningMemoryResource::new(mock.clone());
        let first = HostMockResource::new();
        let second = HostMockResource::new();
        r.add_bin(300, Some(shared(first.clone()))).unwrap();
        r.add_bin(500, Some(shared(second.clone()))).unwrap();
        assert_eq!(r.bin_sizes(), [512]);
        let p = r.allocate(s(), 400, 256).unwrap();
        assert_eq!(
            (first.allocation_calls(), second.allocation_calls()),
            (1, 0)
        );
        assert_eq!(mock.allocation_calls(), 0);
        // Deallocation routes by size: a wrong size reaches a resource that rejects it.
        // SAFETY: the first call is a wrong free the mock detects; the second is correct.
        unsafe {
            assert!(matches!(
                r.deallocate(s(), p, 1000, 256),
                Err(MrError::InvalidFree {
                    kind: InvalidFree::UnknownPointer,
                    ..
                })
            ));
            r.deallocate(s(), p, 400, 256).unwrap();
        }
        assert_eq!(first.live_allocations(), 0);
        // Bad sizes.
        assert!(matches!(
            r.add_bin(0, None),
            Err(MrError::InvalidArgument(_))
        ));
        assert!(matches!(
            r.add_bin(usize::MAX, None),
            Err(MrError::InvalidArgument(_))
        ));
        // An upstream failure while creating a fixed-size bin adds no bin.
        mock.fail_next_allocations(1);
        assert!(r.add_bin(4096, None).unwrap_err().is_out_of_memory());
        assert_eq!(r.bin_sizes(), [512]);
    }

    #[test]
    fn more_bins_than_the_lock_free_routes_hold_still_route() {
        let mock = HostMockResource::new();
        let r = BinningMemoryResource::new(mock.clone());
        let bins: Vec<HostMockResource> = (0..80).map(|_| HostMockResource::new()).collect();
        // Added out of order, so the routes and the table must agree on order too.
        for i in (0..80).rev() {
            r.add_bin(256 * (i + 1), Some(shared(bins[i].clone())))
                .unwrap();
        }
        assert_eq!(r.bin_sizes().len(), 80);
        for i in [0usize, 10, 63, 64, 79] {
            let bytes = 256 * i + 1;
            let p = r.allocate(s(), bytes, 256).unwrap();
            let serving = if bytes <= 256 { 0 } else { (bytes - 1) / 256 };
            assert_eq!(bins[serving].live_allocations(), 1, "{bytes} bytes");
            // SAFETY: `p` came from `r` with `bytes`.
            unsafe { r.deallocate(s(), p, bytes, 256).unwrap() };
            assert_eq!(bins[serving].live_allocations(), 0);
        }
        let big = r.allocate(s(), 80 * 256 + 1, 256).unwrap();
        assert_eq!(mock.live_allocations(), 1);
        // SAFETY: `big` came from `r`.
        unsafe { r.deallocate(s(), big, 80 * 256 + 1, 256).unwrap() };
    }

    #[test]
    fn adding_bins_while_allocating_is_safe() {
        let mock = HostMockResource::new();
        let r = BinningMemoryResource::with_options(
            mock.clone(),
            BinningOptions::new()
                .min_size_exponent(10)
                .max_size_exponent(10),
        )
        .unwrap();
        std::thread::scope(|sc| {
            for _ in 0..3 {
                let r = r.clone();
                sc.spawn(move || {
                    for i in 0..3000usize {
                        let bytes = 1 + i % 1024;
                        let p = r.allocate(s(), bytes, 256).unwrap();
                        // SAFETY: from `r` with `bytes`.
                        unsafe { r.deallocate(s(), p, bytes, 256).unwrap() };
                    }
                });
            }
            let r = r.clone();
            sc.spawn(move || {
                for i in 12..20 {
                    r.add_bin(1 << i, Some(shared(HostMockResource::new())))
                        .unwrap();
                }
            });
        });
        assert_eq!(r.bin_sizes().len(), 9);
        assert_eq!(outstanding_in(&r, 1024), 0);
        assert!(r.is_equal(&r.clone()));
        assert!(!r.is_equal(&BinningMemoryResource::new(HostMockResource::new())));
        assert!(format!("{r:?}").contains("1024"));
        drop(r);
        assert_eq!(mock.live_allocations(), 0);
    }

    /// Issue 27's sequence: a 600-byte block from the 1 KiB fixed-size bin, then a 768-byte bin
    /// given as a resource. Its free must reach the 1 KiB bin, never the new resource.
    #[test]
    fn a_late_bin_never_receives_a_block_another_bin_allocated() {
        let mock = HostMockResource::new();
        let r = BinningMemoryResource::with_options(
            mock.clone(),
            BinningOptions::new()
                .min_size_exponent(8)
                .max_size_exponent(10),
        )
        .unwrap();
        let p = r.allocate(s(), 600, 256).unwrap();
        let small = r.allocate(s(), 100, 256).unwrap();
        assert_eq!(outstanding_in(&r, 600), 1);
        let late = HostMockResource::new();
        r.add_bin(768, Some(shared(late.clone()))).unwrap();
        assert_eq!(r.bin_sizes(), [256, 512, 768, 1024]);
        // New requests of 600 bytes go to the new bin.
        let q = r.allocate(s(), 600, 256).unwrap();
        assert_eq!(late.live_allocations(), 1);
        // SAFETY: each block came from `r` with these sizes, freed once.
        unsafe {
            r.deallocate(s(), p, 600, 256).unwrap();
            r.deallocate(s(), q, 600, 256).unwrap();
            r.deallocate(s(), small, 100, 256).unwrap();
        }
        assert_eq!(late.live_allocations(), 0);
        assert_eq!(
            late.allocation_calls(),
            1,
            "the late bin saw only its own block"
        );
        assert_eq!(
            outstanding_in(&r, 1000),
            0,
            "the 1 KiB bin got its block back"
        );
        // A second free of the old block is still a wrong free, reported, not absorbed.
        // SAFETY: a double free the 1 KiB bin detects.
        let again = unsafe { r.deallocate(s(), p, 600, 256) };
        assert!(
            matches!(again, Err(MrError::InvalidFree { .. })),
            "{again:?}"
        );
        drop(r);
        assert_eq!(mock.live_allocations(), 0);
    }

    #[test]
    fn a_late_fixed_bin_over_the_upstream_range_sends_old_blocks_upstream() {
        let mock = HostMockResource::new();
        let r = BinningMemoryResource::new(mock.clone());
        let p = r.allocate(s(), 5000, 256).unwrap();
        assert_eq!(mock.live_allocations(), 1);
        r.add_bin(8192, None).unwrap();
        let q = r.allocate(s(), 5000, 256).unwrap();
        assert_eq!(outstanding_in(&r, 5000), 1);
        // SAFETY: both from `r` with 5000 bytes, freed once.
        unsafe {
            r.deallocate(s(), p, 5000, 256).unwrap();
            r.deallocate(s(), q, 5000, 256).unwrap();
        }
        assert_eq!(outstanding_in(&r, 5000), 0);
        assert_eq!(mock.live_allocations(), 1, "only the bin's chunk is left");
    }

    #[test]
    fn a_resource_bin_over_memory_another_resource_handed_out_is_refused() {
        let mock = HostMockResource::new();
        let r = BinningMemoryResource::new(mock.clone());
        let p = r.allocate(s(), 5000, 256).unwrap();
        let other = HostMockResource::new();
        let e = r.add_bin(8192, Some(shared(other.clone()))).unwrap_err();
        assert!(matches!(e, MrError::InvalidArgument(_)), "{e}");
        assert!(e.to_string().contains("the upstream"), "{e}");
        assert!(r.bin_sizes().is_empty());
        // A resource equal to the upstream, or a range no request reached yet, is accepted.
        r.add_bin(8192, Some(shared(mock.clone()))).unwrap();
        r.add_bin(1 << 20, Some(shared(other.clone()))).unwrap();
        assert_eq!(r.bin_sizes(), [8192, 1 << 20]);
        // A bin given as a resource, used, then a smaller one given over part of its range.
        let big = r.allocate(s(), 100_000, 256).unwrap();
        assert_eq!(other.live_allocations(), 1);
        let e = r
            .add_bin(1 << 17, Some(shared(HostMockResource::new())))
            .unwrap_err();
        assert!(e.to_string().contains("another bin"), "{e}");
        // SAFETY: from `r` with these sizes, freed once.
        unsafe {
            r.deallocate(s(), p, 5000, 256).unwrap();
            r.deallocate(s(), big, 100_000, 256).unwrap();
        }
        assert_eq!((mock.live_allocations(), other.live_allocations()), (0, 0));
    }

    #[test]
    fn more_than_the_most_bins_is_an_error() {
        let r = BinningMemoryResource::new(HostMockResource::new());
        for i in 0..BinningMemoryResource::<HostMockResource>::MAX_BINS {
            r.add_bin(256 * (i + 1), Some(shared(HostMockResource::new())))
                .unwrap();
        }
        let e = r.add_bin(256 * 300, None).unwrap_err();
        assert!(matches!(e, MrError::InvalidArgument(_)), "{e}");
        assert_eq!(r.bin_sizes().len(), 255);
    }

    /// Bins past 64, fixed-size and given, added from one thread while three others allocate
    /// and free every size: every free succeeds (a mock rejects what it did not hand out), and
    /// nothing is left.
    #[test]
    fn bins_added_at_any_time_from_any_thread_keep_every_free_right() {
        let mock = HostMockResource::new();
        let r = BinningMemoryResource::with_options(
            mock.clone(),
            BinningOptions::new()
                .min_size_exponent(12)
                .max_size_exponent(12),
        )
        .unwrap();
        let given: Vec<HostMockResource> = (0..40).map(|_| HostMockResource::new()).collect();
        std::thread::scope(|sc| {
            for t in 0..3usize {
                let r = r.clone();
                sc.spawn(move || {
                    let mut live = Vec::new();
                    let mut rng = crate::testing::Rng::new(0x9e37_79b9_7f4a_7c15u64 ^ t as u64);
                    for i in 0..4000usize {
                        let x = rng.next_u64();
                        let bytes = 1 + (x % 40_000) as usize;
                        live.push((r.allocate(s(), bytes, 256).unwrap(), bytes));
                        if i % 3 != 0 {
                            let (p, b) = live.swap_remove((x >> 20) as usize % live.len());
                            // SAFETY: from `r` with `b`, freed once.
                            unsafe { r.deallocate(s(), p, b, 256).unwrap() };
                        }
                    }
                    for (p, b) in live {
                        // SAFETY: from `r` with `b`, freed once.
                        unsafe { r.deallocate(s(), p, b, 256).unwrap() };
                    }
                });
            }
            let r = r.clone();
            let given = &given;
            sc.spawn(move || {
                for i in 0..120usize {
                    let size = 256 * (i * 7 % 160 + 1);
                    if i % 3 == 0 {
                        let _ = r.add_bin(size, Some(shared(given[i / 3].clone())));
                    } else {
                        r.add_bin(size, None).unwrap();
                    }
                }
            });
        });
        assert!(r.bin_sizes().len() > 64, "{}", r.bin_sizes().len());
        for g in &given {
            assert_eq!(g.live_allocations(), 0);
        }
        drop(r);
        assert_eq!(mock.live_allocations(), 0);
    }
}
