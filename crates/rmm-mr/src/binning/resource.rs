//! The binning resource (RMM's `binning_memory_resource`).

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

use rmm_stream::CudaStreamView;
use rmm_sys::{is_pow2, DevicePtr, ALLOCATION_ALIGNMENT};

use crate::binning::routes::BinRoutes;
use crate::binning::table::{exponent_sizes, rounded_bin_size, BinTable, BinningError};
use crate::error::{MrError, MrResult};
use crate::fixed_size::{FixedSizeMemoryResource, FixedSizeOptions};
use crate::resource::{shared, DeviceMemoryResource, SharedResource};
use crate::util::alignment;

struct Binning<U: DeviceMemoryResource> {
    /// Shared with the fixed-size bins made for it.
    upstream: Arc<U>,
    /// Every bin; written by `add_bin`, read on the slow paths.
    bins: RwLock<BinTable<SharedResource>>,
    /// The same bins, routed without a lock (up to its capacity; closed when a bin did not
    /// fit, and requests then route through `bins`).
    routes: BinRoutes<Bin<U>>,
}

/// A bin as the routes hold it: a fixed-size bin this resource made, called directly (no
/// dynamic dispatch, no second alignment check), or a bin the caller gave, through the trait.
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

/// Where a request goes.
enum Route<'a> {
    Bin(&'a dyn DeviceMemoryResource),
    Owned(SharedResource),
    Upstream,
}

impl<U: DeviceMemoryResource> Binning<U> {
    /// The fixed-size bin made here that a request of `bytes` with an alignment of at most
    /// 256 goes to, found without a lock; `None` for every other case (see [`route`]).
    ///
    /// [`route`]: Self::route
    #[inline]
    fn fixed_bin(&self, bytes: usize) -> Option<&FixedSizeMemoryResource<Arc<U>>> {
        // Closed routes answer `None`.
        match self.routes.route(bytes) {
            Some((_, Bin::Fixed(bin))) => Some(bin),
            _ => None,
        }
    }

    #[inline]
    fn route(&self, bytes: usize) -> Route<'_> {
        match self.routes.route(bytes) {
            Some((_, Bin::Fixed(bin))) => Route::Bin(bin),
            Some((_, Bin::Other(bin))) => Route::Bin(&**bin),
            // `None` from routes still open is the upstream's; closing is for good, so routes
            // that answered while closed are seen closed here.
            None if !self.routes.is_closed() => Route::Upstream,
            None => self.route_locked(bytes),
        }
    }

    #[cold]
    fn route_locked(&self, bytes: usize) -> Route<'_> {
        let bins = self.bins.read().unwrap_or_else(PoisonError::into_inner);
        match bins.route(bytes) {
            Some((_, bin)) => Route::Owned(Arc::clone(bin)),
            None => Route::Upstream,
        }
    }

    /// Calls `f` with the resource a request of `bytes` with this (normalized) `alignment`
    /// goes to: the upstream for alignments above 256, else the bin or the upstream by size.
    #[inline]
    fn on_route<R>(
        &self,
        bytes: usize,
        alignment: usize,
        f: impl FnOnce(&dyn DeviceMemoryResource) -> R,
    ) -> R {
        if alignment > ALLOCATION_ALIGNMENT {
            return f(&*self.upstream);
        }
        match self.route(bytes) {
            Route::Bin(bin) => f(bin),
            Route::Owned(bin) => f(&*bin),
            Route::Upstream => f(&*self.upstream),
        }
    }
}

/// Why a bin could not be added.
enum AddBinError {
    Table(BinningError),
    Resource(MrError),
}

impl From<BinningError> for AddBinError {
    fn from(e: BinningError) -> Self {
        Self::Table(e)
    }
}

impl From<AddBinError> for MrError {
    fn from(e: AddBinError) -> Self {
        match e {
            AddBinError::Table(e) => MrError::invalid_argument(e.to_string()),
            AddBinError::Resource(e) => e,
        }
    }
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
/// - Beyond RMM: [`add_bin`](Self::add_bin) is thread-safe. Adding a bin takes a lock and
///   publishes a new immutable version of the routes; allocation and deallocation read the
///   current version without any lock (beyond 64 bins, through a reader-writer lock). Adding a
///   bin changes where *later* requests in its size range go, deallocations included, so bins
///   for a size range must be added before memory of that range is allocated (RMM's rule too).
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
                bins: RwLock::new(BinTable::new()),
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
    /// Where a bin of that size exists it is kept and nothing is created. Thread-safe.
    ///
    /// # Errors
    ///
    /// [`MrError::InvalidArgument`] when the size cannot be rounded (or is 0 without a
    /// resource); the upstream's error when it refuses a new bin's first chunk.
    #[doc(alias = "rmm::mr::binning_memory_resource::add_bin")]
    pub fn add_bin(
        &self,
        allocation_size: usize,
        bin_resource: Option<SharedResource>,
    ) -> MrResult<()> {
        let mut bins = self
            .inner
            .bins
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let upstream = &self.inner.upstream;
        let mut made = None;
        let inserted = bins.add_bin_with(allocation_size, |size| match bin_resource {
            Some(resource) => Ok::<_, AddBinError>(resource),
            None => {
                let bin = FixedSizeMemoryResource::with_options(
                    Arc::clone(upstream),
                    FixedSizeOptions::new().block_size(size),
                )
                .map_err(AddBinError::Resource)?;
                made = Some(bin.clone());
                Ok(shared(bin))
            }
        })?;
        if inserted {
            // The table accepted the size, so it rounds.
            let size = rounded_bin_size(allocation_size)
                .map_err(|e| MrError::invalid_argument(e.to_string()))?;
            if let Some(bin) = bins.get(size) {
                let route = match made {
                    Some(fixed) => Bin::Fixed(fixed),
                    None => Bin::Other(Arc::clone(bin)),
                };
                // A bin that does not fit closes the routes: requests route through `bins`.
                let _ = self.inner.routes.insert(size, route);
            }
        }
        Ok(())
    }

    /// The upstream resource (RMM's `get_upstream_resource()`).
    #[must_use]
    pub fn upstream(&self) -> &U {
        &self.inner.upstream
    }

    /// The bin sizes, increasing.
    #[must_use]
    pub fn bin_sizes(&self) -> Vec<usize> {
        self.read().bins().map(|(&s, _)| s).collect()
    }

    /// The bin a request of `bytes` goes to, or `None` for the upstream.
    #[must_use]
    pub fn bin_for(&self, bytes: usize) -> Option<SharedResource> {
        self.read().route(bytes).map(|(_, r)| Arc::clone(r))
    }

    fn read(&self) -> RwLockReadGuard<'_, BinTable<SharedResource>> {
        self.inner
            .bins
            .read()
            .unwrap_or_else(PoisonError::into_inner)
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
// this trait's contract) and goes back to the one that handed it out when it is freed here.
unsafe impl<U: DeviceMemoryResource> DeviceMemoryResource for BinningMemoryResource<U> {
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        if alignment::is_default(alignment) {
            if let Some(bin) = self.inner.fixed_bin(bytes) {
                // Its blocks are 256-aligned: as aligned as asked.
                return bin.allocate_block(stream, bytes);
            }
        }
        let required = alignment::check_valid(alignment)?;
        self.inner.on_route(bytes, required, |mr| {
            let ptr = mr.allocate(stream, bytes, alignment)?;
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
        })
    }

    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()> {
        // An alignment no allocation could have had routes by size, as a default one.
        if alignment <= ALLOCATION_ALIGNMENT || !is_pow2(alignment) {
            if let Some(bin) = self.inner.fixed_bin(bytes) {
                // SAFETY: the trait's contract; `bytes` routes to the bin that allocated.
                return unsafe { bin.deallocate_block(stream, ptr, bytes) };
            }
        }
        let required = alignment::normalized(alignment).unwrap_or(ALLOCATION_ALIGNMENT);
        self.inner.on_route(bytes, required, |mr| {
            // SAFETY: the trait's contract; `bytes` and `alignment` route to the resource that
            // allocated.
            unsafe { mr.deallocate(stream, ptr, bytes, alignment) }
        })
    }

    crate::resource::resource_tail! {
        is_equal: shared(inner),
        properties: forward(inner.upstream),
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
}
