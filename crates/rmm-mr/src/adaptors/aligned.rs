//! The aligned adaptor: pointers aligned to more than 256 bytes.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rmm_stream::CudaStreamView;
use rmm_sys::{checked_align_up, is_pow2, DevicePtr, ALLOCATION_ALIGNMENT};

use crate::error::{InvalidFree, MrError, MrResult};
use crate::resource::{DeviceMemoryResource, SharedResource};
use crate::util::alignment::{self, MAX_OVER_ALIGNMENT};

/// The alignment argument given to the upstream: RMM asks for 1 (any), since every resource
/// returns at least 256-byte aligned memory and the adaptor does the rest itself.
const UPSTREAM_ALIGNMENT: usize = 1;

struct Aligned<U> {
    upstream: U,
    alignment: usize,
    threshold: usize,
    /// Aligned address -> the upstream's address, for allocations the adaptor had to shift.
    shifted: Mutex<HashMap<u64, u64>>,
}

impl<U> Aligned<U> {
    fn shifted(&self) -> MutexGuard<'_, HashMap<u64, u64>> {
        // Nothing panics while the lock is held; a poisoned map is still consistent.
        self.shifted.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The largest per-call alignment honoured: the configured one or 2 MiB, the larger.
    fn largest(&self) -> usize {
        self.alignment.max(MAX_OVER_ALIGNMENT)
    }

    /// The alignment a request of `bytes` with the (normalized) per-call `requested` alignment
    /// gets: the larger of the two, the configured one only from the threshold on.
    fn effective(&self, bytes: usize, requested: usize) -> usize {
        if bytes < self.threshold {
            requested
        } else {
            requested.max(self.alignment)
        }
    }

    /// Whether a request of `bytes` aligned to `a` goes to the upstream unchanged.
    fn passes_through(bytes: usize, a: usize) -> bool {
        bytes == 0 || a == ALLOCATION_ALIGNMENT
    }

    /// What the upstream is asked for so that an `a`-aligned block of `bytes` fits:
    /// `align_up(bytes, a) + (a - 256)` (the upstream's pointer is already 256-aligned).
    fn upstream_size(bytes: usize, a: usize) -> Option<usize> {
        checked_align_up(bytes, a)?.checked_add(a - ALLOCATION_ALIGNMENT)
    }
}
/// How to build an [`AlignedResourceAdaptor`] (RMM's constructor parameters).
///
/// Built with [`new`](Self::new) (the required arguments) and the chained setters; the
/// fields are public to read. `#[non_exhaustive]`: later options do not break callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AlignedOptions {
    /// The alignment of every non-empty allocation: a power of two, raised to 256 when smaller
    /// (RMM's default 256).
    pub alignment: usize,
    /// Requests smaller than this many bytes go to the upstream unchanged (default 0: none).
    pub alignment_threshold: usize,
}

impl AlignedOptions {
    /// RMM's defaults for `alignment`: threshold 0.
    #[must_use]
    pub fn new(alignment: usize) -> Self {
        Self {
            alignment,
            alignment_threshold: 0,
        }
    }

    /// Sets the field `alignment`.
    #[must_use]
    pub fn alignment(mut self, alignment: usize) -> Self {
        self.alignment = alignment;
        self
    }

    /// Sets the field `alignment_threshold`.
    #[must_use]
    pub fn alignment_threshold(mut self, bytes: usize) -> Self {
        self.alignment_threshold = bytes;
        self
    }
}

/// Hands out pointers aligned to a configured alignment larger than 256 bytes (RMM's
/// `aligned_resource_adaptor`).
///
/// A request of `bytes` at or above the threshold asks the upstream for
/// `align_up(bytes, A) + (A - 256)` bytes and returns the first `A`-aligned address inside; the
/// aligned address is mapped back to the upstream's on deallocation, which recomputes the
/// upstream size from `bytes`. Requests of 0 bytes, below the threshold, or when `A` is 256 go to
/// the upstream unchanged. As in RMM, the upstream is asked for alignment 1.
///
/// Beyond RMM, which ignores the per-call alignment argument, that argument is honoured too
/// (see the trait's "Alignment"): a request gets the larger of it and `A` (below the threshold,
/// the per-call one alone), and the same arithmetic serves it; `deallocate` must be given the
/// same alignment. A per-call alignment above the larger of `A` and
/// [`MAX_OVER_ALIGNMENT`], or one that is neither 0 nor a power of two, is
/// [`MrError::BadAlloc`]; the upstream must be able to serve the over-allocation (an upstream
/// that cannot, such as a fixed-size resource with smaller blocks, answers out-of-memory). A
/// pointer passed through from the upstream that is not
/// 256-aligned is given back and refused. Freeing a pointer that is not aligned as allocated
/// and was not handed out shifted is reported as [`MrError::InvalidFree`] without calling the
/// upstream. A free the upstream refuses leaves the allocation live and its record in place,
/// so it can be freed again. Copies share state and are equal.
#[doc(alias = "rmm::mr::aligned_resource_adaptor")]
pub struct AlignedResourceAdaptor<U: DeviceMemoryResource = SharedResource> {
    inner: Arc<Aligned<U>>,
}

impl<U: DeviceMemoryResource> Clone for AlignedResourceAdaptor<U> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<U: DeviceMemoryResource> AlignedResourceAdaptor<U> {
    /// Aligns every non-empty allocation to `alignment` (a power of two; values below 256 are
    /// raised to 256), with RMM's default threshold 0.
    ///
    /// # Errors
    /// As [`with_options`](Self::with_options).
    pub fn new(upstream: U, alignment: usize) -> MrResult<Self> {
        Self::with_options(upstream, AlignedOptions::new(alignment))
    }

    /// Built with `options`: requests smaller than
    /// [`alignment_threshold`](AlignedOptions::alignment_threshold) bytes go to the upstream
    /// unchanged.
    ///
    /// # Errors
    /// [`MrError::InvalidArgument`] when the alignment is not a power of two (RMM: "Allocation
    /// alignment is not a power of 2.").
    pub fn with_options(upstream: U, options: AlignedOptions) -> MrResult<Self> {
        let AlignedOptions {
            alignment,
            alignment_threshold,
        } = options;
        if !is_pow2(alignment) {
            return Err(MrError::invalid_argument(format!(
                "Allocation alignment is not a power of 2 ({alignment})."
            )));
        }
        Ok(Self {
            inner: Arc::new(Aligned {
                upstream,
                alignment: alignment.max(ALLOCATION_ALIGNMENT),
                threshold: alignment_threshold,
                shifted: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The upstream resource.
    #[doc(alias = "get_upstream_resource")]
    #[must_use]
    pub fn upstream(&self) -> &U {
        &self.inner.upstream
    }

    /// The alignment of the pointers handed out (at least 256).
    #[doc(alias = "get_alignment")]
    #[must_use]
    pub fn alignment(&self) -> usize {
        self.inner.alignment
    }

    /// Requests smaller than this go to the upstream unchanged.
    #[doc(alias = "get_alignment_threshold")]
    #[must_use]
    pub fn alignment_threshold(&self) -> usize {
        self.inner.threshold
    }
}

impl<U: DeviceMemoryResource> AlignedResourceAdaptor<U> {
    /// Number of live allocations handed out shifted (tests).
    #[cfg(test)]
    pub(crate) fn shifted_count(&self) -> usize {
        self.inner.shifted().len()
    }
}

impl<U: DeviceMemoryResource> fmt::Debug for AlignedResourceAdaptor<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedResourceAdaptor")
            .field("alignment", &self.inner.alignment)
            .field("alignment_threshold", &self.inner.threshold)
            .field("shifted", &self.inner.shifted().len())
            .field("upstream", &self.inner.upstream)
            .finish()
    }
}

// SAFETY: every pointer handed out is the upstream's (bound by this trait's contract), or an
// offset into an over-allocation from it that leaves at least the bytes asked for before its
// end; it goes back to the upstream only when it is freed here.
unsafe impl<U: DeviceMemoryResource> DeviceMemoryResource for AlignedResourceAdaptor<U> {
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        let inner = &*self.inner;
        let a = inner.effective(bytes, alignment::check(alignment, inner.largest())?);
        if Aligned::<U>::passes_through(bytes, a) {
            let pointer = inner.upstream.allocate(stream, bytes, UPSTREAM_ALIGNMENT)?;
            if pointer.is_aligned(ALLOCATION_ALIGNMENT) {
                return Ok(pointer);
            }
            // SAFETY: `pointer` was just allocated from the upstream with these arguments and
            // was never handed out.
            let _ = unsafe {
                inner
                    .upstream
                    .deallocate(stream, pointer, bytes, UPSTREAM_ALIGNMENT)
            };
            return Err(alignment::misaligned_upstream(
                pointer,
                ALLOCATION_ALIGNMENT,
                "aligned_resource_adaptor",
            ));
        }
        let size = Aligned::<U>::upstream_size(bytes, a).ok_or_else(|| {
            MrError::out_of_memory(
                bytes,
                format!(
                    "aligned_resource_adaptor cannot align {bytes} bytes to {a} (size overflow)"
                ),
            )
        })?;
        let pointer = inner.upstream.allocate(stream, size, UPSTREAM_ALIGNMENT)?;
        let slack = (a - ALLOCATION_ALIGNMENT) as u64;
        // The first aligned address, if the aligned block fits in what the upstream gave
        // (always so for the 256-aligned pointers every resource returns).
        let aligned = pointer
            .addr()
            .checked_next_multiple_of(a as u64)
            .filter(|&x| x - pointer.addr() <= slack)
            .filter(|_| !pointer.is_null());
        let failure = match aligned {
            Some(x) if x == pointer.addr() => return Ok(pointer),
            Some(x) => match inner.shifted().entry(x) {
                Entry::Vacant(v) => {
                    v.insert(pointer.addr());
                    return Ok(DevicePtr::from_raw(x));
                }
                // The upstream handed out an address inside a live shifted allocation.
                Entry::Occupied(_) => MrError::bad_alloc(format!(
                    "aligned_resource_adaptor: pointer is already tracked ({})",
                    DevicePtr::from_raw(x)
                )),
            },
            None => MrError::bad_alloc(format!(
                "aligned_resource_adaptor: the upstream returned {pointer}, too misaligned to \
                 hold a {a}-aligned block"
            )),
        };
        // SAFETY: `pointer` was just allocated from the upstream with these arguments and was
        // never handed out.
        let _ = unsafe {
            inner
                .upstream
                .deallocate(stream, pointer, size, UPSTREAM_ALIGNMENT)
        };
        Err(failure)
    }

    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()> {
        let inner = &*self.inner;
        // An alignment no allocation could have had is taken as the default.
        let requested = alignment::normalized(alignment)
            .filter(|&r| r <= inner.largest())
            .unwrap_or(ALLOCATION_ALIGNMENT);
        let a = inner.effective(bytes, requested);
        if Aligned::<U>::passes_through(bytes, a) {
            // SAFETY: forwarded contract; the allocation passed through with the same size.
            return unsafe {
                inner
                    .upstream
                    .deallocate(stream, ptr, bytes, UPSTREAM_ALIGNMENT)
            };
        }
        let unknown = || MrError::InvalidFree {
            ptr,
            bytes,
            kind: InvalidFree::UnknownPointer,
        };
        let size = Aligned::<U>::upstream_size(bytes, a).ok_or_else(unknown)?;
        // Removed before the upstream frees, so a concurrent allocation that gets the same
        // address back cannot collide with this entry.
        let (original, was_shifted) = match inner.shifted().remove(&ptr.addr()) {
            Some(original) => (DevicePtr::from_raw(original), true),
            None if ptr.is_aligned(a) => (ptr, false),
            None => return Err(unknown()),
        };
        // SAFETY: forwarded contract: `original` and `size` are what the upstream handed out for
        // this allocation.
        let freed = unsafe {
            inner
                .upstream
                .deallocate(stream, original, size, UPSTREAM_ALIGNMENT)
        };
        if freed.is_err() && was_shifted {
            // Not freed: the allocation is live, and a retried free must find its entry.
            inner.shifted().insert(ptr.addr(), original.addr());
        }
        freed
    }

    crate::resource::resource_tail! {
        is_equal: shared(inner),
        properties: forward(inner.upstream),
        snapshot: forward(inner.upstream),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::HostMockResource;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn s() -> CudaStreamView<'static> {
        CudaStreamView::default()
    }

    /// An upstream handing out scripted fake addresses (never dereferenced) and recording every
    /// call, for RMM's exact-address cases.
    #[derive(Debug, Default)]
    struct Scripted {
        next: Mutex<Vec<u64>>,
        calls: Mutex<Vec<(&'static str, u64, usize, usize)>>,
        fallback: AtomicU64,
    }

    impl Scripted {
        fn new(addresses: &[u64]) -> Arc<Self> {
            let s = Scripted::default();
            s.next.lock().unwrap().extend(addresses.iter().rev());
            s.fallback.store(1 << 40, Ordering::Relaxed);
            Arc::new(s)
        }

        fn calls(&self) -> Vec<(&'static str, u64, usize, usize)> {
            self.calls.lock().unwrap().clone()
        }
    }

    // SAFETY: a test double handing out scripted fake addresses. That breaks the promise of valid
    // memory, which is sound only because these tests never touch the memory.
    unsafe impl DeviceMemoryResource for Scripted {
        fn allocate(
            &self,
            _stream: CudaStreamView<'_>,
            bytes: usize,
            alignment: usize,
        ) -> MrResult<DevicePtr> {
            if bytes == 0 {
                self.calls
                    .lock()
                    .unwrap()
                    .push(("allocate", 0, 0, alignment));
                return Ok(DevicePtr::NULL);
            }
            let addr = self
                .next
                .lock()
                .unwrap()
                .pop()
                .unwrap_or_else(|| self.fallback.fetch_add(1 << 20, Ordering::Relaxed));
            self.calls
                .lock()
                .unwrap()
                .push(("allocate", addr, bytes, alignment));
            Ok(DevicePtr::from_raw(addr))
        }

        unsafe fn deallocate(
            &self,
            _stream: CudaStreamView<'_>,
            ptr: DevicePtr,
            bytes: usize,
            alignment: usize,
        ) -> MrResult<()> {
            self.calls
                .lock()
                .unwrap()
                .push(("free", ptr.addr(), bytes, alignment));
            Ok(())
        }

        crate::resource::resource_tail! {
            is_equal: identity,
        }
    }

    #[test]
    fn throw_on_invalid_allocation_alignment() {
        for bad in [0, 255, 768, 4095] {
            let e = AlignedResourceAdaptor::new(HostMockResource::new(), bad).unwrap_err();
            assert!(matches!(e, MrError::InvalidArgument(_)), "{bad}: {e}");
        }
        for good in [1, 32, 256, 4096] {
            assert!(AlignedResourceAdaptor::new(HostMockResource::new(), good).is_ok());
        }
    }

    #[test]
    fn mock_case_4096_asks_upstream_for_69376_bytes() {
        let up = HostMockResource::new();
        let mr = AlignedResourceAdaptor::with_options(
            up.clone(),
            AlignedOptions::new(4096).alignment_threshold(65536),
        )
        .unwrap();
        let p = mr.allocate(s(), 65536, 256).unwrap();
        assert!(p.is_aligned(4096), "{p}");
        assert_eq!(up.live_bytes(), 69376);
        assert_eq!(up.last_alignment(), UPSTREAM_ALIGNMENT);
        assert_eq!(up.allocation_calls(), 1);
        // SAFETY: `p` came from `mr` with this size.
        unsafe { mr.deallocate(s(), p, 65536, 256).unwrap() };
        assert_eq!(up.live_allocations(), 0);
        assert_eq!(up.deallocation_calls(), 1);
        assert!(mr.inner.shifted().is_empty());
    }

    #[test]
    fn default_alignment_and_below_threshold_pass_through() {
        let up = HostMockResource::new();
        let mr = AlignedResourceAdaptor::new(up.clone(), 256).unwrap();
        let p = mr.allocate(s(), 1000, 0).unwrap();
        assert_eq!(up.live_bytes(), 1000, "passed through unchanged");
        // SAFETY: `p` came from `mr`.
        unsafe { mr.deallocate(s(), p, 1000, 0).unwrap() };

        let mr = AlignedResourceAdaptor::with_options(
            up.clone(),
            AlignedOptions::new(4096).alignment_threshold(65536),
        )
        .unwrap();
        let p = mr.allocate(s(), 65535, 256).unwrap();
        assert_eq!(up.live_bytes(), 65535);
        // SAFETY: `p` came from `mr`.
        unsafe { mr.deallocate(s(), p, 65535, 256).unwrap() };
        assert_eq!(mr.allocate(s(), 0, 256).unwrap(), DevicePtr::NULL);
        // SAFETY: a 0-byte free of null.
        unsafe { mr.deallocate(s(), DevicePtr::NULL, 0, 256).unwrap() };
        assert_eq!(up.live_allocations(), 0);
    }

    #[test]
    fn per_call_alignment_is_honoured_not_ignored() {
        // RMM ignores it: a 4096-aligned request of a 256-aligned adaptor came back 256-aligned.
        let up = Scripted::new(&[256, 0x10_0100]);
        let mr = AlignedResourceAdaptor::new(Arc::clone(&up), 256).unwrap();
        let p = mr.allocate(s(), 1000, 4096).unwrap();
        assert_eq!(p.addr(), 4096);
        // Below the threshold the per-call alignment still applies.
        let mr2 = AlignedResourceAdaptor::with_options(
            Arc::clone(&up),
            AlignedOptions::new(4096).alignment_threshold(65536),
        )
        .unwrap();
        let q = mr2.allocate(s(), 1000, 8192).unwrap();
        assert_eq!(q.addr(), 0x10_2000);
        // SAFETY: each came from its adaptor with these arguments.
        unsafe {
            mr.deallocate(s(), p, 1000, 4096).unwrap();
            mr2.deallocate(s(), q, 1000, 8192).unwrap();
        }
        assert_eq!(
            up.calls(),
            vec![
                ("allocate", 256, 4096 + 3840, 1),
                ("allocate", 0x10_0100, 8192 + 7936, 1),
                ("free", 256, 4096 + 3840, 1),
                ("free", 0x10_0100, 8192 + 7936, 1),
            ]
        );
        // The larger of the two applies from the threshold on.
        let up = HostMockResource::new();
        let mr = AlignedResourceAdaptor::new(up.clone(), 8192).unwrap();
        for a in [0, 256, 4096, 16384] {
            let p = mr.allocate(s(), 5000, a).unwrap();
            assert!(p.is_aligned(a.max(8192)), "{a}: {p}");
            // SAFETY: `p` came from `mr` with these arguments.
            unsafe { mr.deallocate(s(), p, 5000, a).unwrap() };
        }
        assert_eq!(up.live_allocations(), 0);
        assert!(mr.inner.shifted().is_empty());
    }

    #[test]
    fn bad_and_too_large_per_call_alignments_are_refused_without_upstream_call() {
        let up = HostMockResource::new();
        let mr = AlignedResourceAdaptor::new(up.clone(), 4096).unwrap();
        for bad in [3, 255, 768] {
            let e = mr.allocate(s(), 1000, bad).unwrap_err();
            assert!(matches!(e, MrError::BadAlloc { .. }), "{bad}: {e}");
        }
        let e = mr.allocate(s(), 1000, 1 << 40).unwrap_err();
        assert!(matches!(e, MrError::BadAlloc { .. }), "{e}");
        assert_eq!(
            crate::util::alignment::largest_named(&e),
            Some(MAX_OVER_ALIGNMENT)
        );
        // Built with more than 2 MiB, the configured alignment is the limit.
        let big = AlignedResourceAdaptor::new(up.clone(), 1 << 22).unwrap();
        let e = big.allocate(s(), 1000, 1 << 23).unwrap_err();
        assert_eq!(
            crate::util::alignment::largest_named(&e),
            Some(1 << 22),
            "{e}"
        );
        assert_eq!(up.allocation_calls(), 0);
        let p = big.allocate(s(), 1000, 1 << 22).unwrap();
        assert!(p.is_aligned(1 << 22));
        // SAFETY: `p` came from `big` with these arguments.
        unsafe { big.deallocate(s(), p, 1000, 1 << 22).unwrap() };
        assert_eq!(up.live_allocations(), 0);
    }

    #[test]
    fn misaligned_pass_through_pointer_is_rejected_and_returned() {
        let up = Scripted::new(&[0x1080]);
        let mr = AlignedResourceAdaptor::new(Arc::clone(&up), 256).unwrap();
        let e = mr.allocate(s(), 100, 256).unwrap_err();
        assert!(matches!(e, MrError::BadAlloc { .. }), "{e}");
        assert_eq!(
            up.calls(),
            vec![("allocate", 0x1080, 100, 1), ("free", 0x1080, 100, 1)]
        );
    }

    #[test]
    fn upstream_address_already_aligned_is_returned_unchanged() {
        let up = Scripted::new(&[4096]);
        let mr = AlignedResourceAdaptor::with_options(
            Arc::clone(&up),
            AlignedOptions::new(4096).alignment_threshold(65536),
        )
        .unwrap();
        let p = mr.allocate(s(), 65536, 256).unwrap();
        assert_eq!(p.addr(), 4096);
        assert!(mr.inner.shifted().is_empty());
        // SAFETY: `p` came from `mr`.
        unsafe { mr.deallocate(s(), p, 65536, 256).unwrap() };
        assert_eq!(
            up.calls(),
            vec![("allocate", 4096, 69376, 1), ("free", 4096, 69376, 1)]
        );
    }

    #[test]
    fn align_upstream_address() {
        let up = Scripted::new(&[256]);
        let mr = AlignedResourceAdaptor::with_options(
            Arc::clone(&up),
            AlignedOptions::new(4096).alignment_threshold(65536),
        )
        .unwrap();
        let p = mr.allocate(s(), 65536, 256).unwrap();
        assert_eq!(p.addr(), 4096);
        // SAFETY: `p` came from `mr`.
        unsafe { mr.deallocate(s(), p, 65536, 256).unwrap() };
        assert_eq!(
            up.calls(),
            vec![("allocate", 256, 69376, 1), ("free", 256, 69376, 1)]
        );
    }

    #[test]
    fn align_multiple_interleaved() {
        let up = Scripted::new(&[256, 131584, 263168]);
        let mr = AlignedResourceAdaptor::with_options(
            Arc::clone(&up),
            AlignedOptions::new(4096).alignment_threshold(65536),
        )
        .unwrap();
        let p1 = mr.allocate(s(), 65536, 256).unwrap();
        let p2 = mr.allocate(s(), 73728, 256).unwrap();
        let p3 = mr.allocate(s(), 77800, 256).unwrap();
        assert_eq!((p1.addr(), p2.addr(), p3.addr()), (4096, 135168, 266240));
        // SAFETY: each came from `mr` with these sizes.
        unsafe {
            mr.deallocate(s(), p2, 73728, 256).unwrap();
            mr.deallocate(s(), p1, 65536, 256).unwrap();
            mr.deallocate(s(), p3, 77800, 256).unwrap();
        }
        assert_eq!(
            up.calls(),
            vec![
                ("allocate", 256, 69376, 1),
                ("allocate", 131584, 77568, 1),
                ("allocate", 263168, 81664, 1),
                ("free", 131584, 77568, 1),
                ("free", 256, 69376, 1),
                ("free", 263168, 81664, 1),
            ]
        );
    }

    #[test]
    fn small_alignments_are_bumped_to_256() {
        for a in [32, 64, 128] {
            let up = HostMockResource::new();
            let mr = AlignedResourceAdaptor::new(up.clone(), a).unwrap();
            assert_eq!(mr.alignment(), 256);
            let p = mr.allocate(s(), 1000, a).unwrap();
            assert!(p.is_aligned(256));
            assert_eq!(up.live_bytes(), 1000, "256 passes through");
            // SAFETY: `p` came from `mr`.
            unsafe { mr.deallocate(s(), p, 1000, a).unwrap() };
        }
    }

    #[test]
    fn unknown_misaligned_free_is_detected_without_calling_upstream() {
        let up = Scripted::new(&[]);
        let mr = AlignedResourceAdaptor::new(Arc::clone(&up), 4096).unwrap();
        // SAFETY: the scripted upstream never touches memory; exercising the detection.
        let e = unsafe { mr.deallocate(s(), DevicePtr::from_raw(0x1100), 8192, 256) }.unwrap_err();
        assert!(matches!(
            e,
            MrError::InvalidFree {
                kind: InvalidFree::UnknownPointer,
                ..
            }
        ));
        assert!(up.calls().is_empty());
    }

    #[test]
    fn misaligned_upstream_pointer_is_rejected_and_returned() {
        let up = Scripted::new(&[1]);
        let mr = AlignedResourceAdaptor::new(Arc::clone(&up), 4096).unwrap();
        let e = mr.allocate(s(), 8192, 256).unwrap_err();
        assert!(matches!(e, MrError::BadAlloc { .. }), "{e}");
        assert_eq!(
            up.calls(),
            vec![("allocate", 1, 12032, 1), ("free", 1, 12032, 1)]
        );
    }

    #[test]
    fn duplicate_shifted_address_is_rejected_and_returned() {
        // Two upstream pointers that align up to the same address: a broken upstream.
        let up = Scripted::new(&[256, 512]);
        let mr = AlignedResourceAdaptor::new(Arc::clone(&up), 4096).unwrap();
        let p = mr.allocate(s(), 4096, 256).unwrap();
        assert_eq!(p.addr(), 4096);
        let e = mr.allocate(s(), 4096, 256).unwrap_err();
        assert!(e.to_string().contains("already tracked"), "{e}");
        // The live entry survives and frees the right upstream pointer.
        // SAFETY: `p` came from `mr`.
        unsafe { mr.deallocate(s(), p, 4096, 256).unwrap() };
        assert_eq!(
            up.calls(),
            vec![
                ("allocate", 256, 7936, 1),
                ("allocate", 512, 7936, 1),
                ("free", 512, 7936, 1),
                ("free", 256, 7936, 1),
            ]
        );
    }

    #[test]
    fn overflowing_request_is_out_of_memory_without_upstream_call() {
        let up = HostMockResource::new();
        let mr = AlignedResourceAdaptor::new(up.clone(), 4096).unwrap();
        assert!(mr
            .allocate(s(), usize::MAX - 100, 256)
            .unwrap_err()
            .is_out_of_memory());
        assert_eq!(up.allocation_calls(), 0);
    }

    #[test]
    fn upstream_failure_is_passed_on() {
        let up = HostMockResource::new();
        up.fail_next_allocations(1);
        let mr = AlignedResourceAdaptor::new(up.clone(), 4096).unwrap();
        assert!(mr
            .allocate(s(), 10_000, 256)
            .unwrap_err()
            .is_out_of_memory());
        assert!(mr.inner.shifted().is_empty());
    }

    #[test]
    fn equality_and_shared_ownership() {
        let up = HostMockResource::new();
        let mr = AlignedResourceAdaptor::new(up.clone(), 4096).unwrap();
        let copy = mr.clone();
        assert!(copy.is_equal(&mr) && mr.is_equal(&copy));
        assert!(!mr.is_equal(&AlignedResourceAdaptor::new(up.clone(), 4096).unwrap()));
        assert!(mr.upstream().is_equal(&up));
        let p = copy.allocate(s(), 5000, 256).unwrap();
        drop(copy);
        // SAFETY: `p` came from a copy of `mr`, which shares its state.
        unsafe { mr.deallocate(s(), p, 5000, 256).unwrap() };
        assert_eq!(up.live_allocations(), 0);
    }

    #[test]
    fn a_free_the_upstream_refuses_keeps_the_shifted_entry() {
        use crate::testing::{FaultKind, FaultyResource};
        let up = HostMockResource::new();
        let faulty = FaultyResource::new(up.clone());
        let mr = AlignedResourceAdaptor::new(faulty.clone(), 1 << 16).unwrap();
        let ptrs: Vec<DevicePtr> = (0..16)
            .map(|_| mr.allocate(s(), 5000, 256).unwrap())
            .collect();
        let shifted = mr.inner.shifted().len();
        assert!(shifted > 0, "no allocation was shifted");
        for &p in &ptrs {
            faulty.fail_next_deallocation(FaultKind::Cuda);
            // SAFETY: `p` came from `mr`; the free fails and `p` stays allocated.
            let e = unsafe { mr.deallocate(s(), p, 5000, 256) }.unwrap_err();
            assert!(FaultKind::Cuda.matches(&e), "{e}");
            assert_eq!(mr.inner.shifted().len(), shifted);
        }
        for p in ptrs {
            // SAFETY: every pointer came from `mr` and is still allocated.
            unsafe { mr.deallocate(s(), p, 5000, 256).unwrap() };
        }
        assert_eq!(up.live_allocations(), 0);
        assert!(mr.inner.shifted().is_empty());
    }

    #[test]
    fn concurrent_aligned_allocations() {
        let up = HostMockResource::new();
        let mr = AlignedResourceAdaptor::new(up.clone(), 8192).unwrap();
        std::thread::scope(|sc| {
            for t in 0..2 {
                let mr = &mr;
                sc.spawn(move || {
                    for i in 0..500usize {
                        let bytes = 1 + (i * 97 + t) % 20_000;
                        let p = mr.allocate(s(), bytes, 256).unwrap();
                        assert!(p.is_aligned(8192));
                        // SAFETY: `p` came from `mr` with this size.
                        unsafe { mr.deallocate(s(), p, bytes, 256).unwrap() };
                    }
                });
            }
        });
        assert_eq!(up.live_allocations(), 0);
        assert!(mr.inner.shifted().is_empty());
    }
}
