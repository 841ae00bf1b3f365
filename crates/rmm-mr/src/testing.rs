//! A host-memory resource for tests and benchmarks on machines without a GPU, an upstream
//! that fails on demand ([`FaultyResource`]), the fragmentation workloads the benchmarks
//! and tests share ([`fragmentation`]), the benchmarks' naive baseline ([`naive`]), the
//! allocation traces they replay ([`trace`]), the record of how long growers held a
//! resource's growth lock ([`GrowthLockHolds`]), upstreams that do no work ([`NullResource`],
//! [`PanickingResource`]) and the seeded generator every test and trace draws from ([`Rng`]).

use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

use crate::error::{InvalidFree, MrError, MrResult};
use crate::resource::{DeviceMemoryResource, ResourceProperties};
use crate::util::alignment::{self, MAX_OVER_ALIGNMENT};

#[doc(hidden)]
pub mod coalescing_model;
mod doubles;
#[cfg(test)]
pub(crate) mod faults;
mod faulty;
pub mod fragmentation;
pub(crate) mod growth_lock;
pub mod naive;
mod rng;
pub mod trace;

#[cfg(test)]
pub(crate) use doubles::Hooked;
pub use doubles::{NullResource, PanickingResource};
pub use faulty::{FaultKind, FaultyResource};
pub use growth_lock::GrowthLockHolds;
pub use rng::Rng;

#[derive(Debug, Default)]
struct Mock {
    live: Mutex<HashMap<u64, (usize, usize)>>,
    allocations: AtomicUsize,
    deallocations: AtomicUsize,
    fail_next: AtomicUsize,
    last_alignment: AtomicUsize,
}

/// A resource backed by the host's global allocator, with call counters and injectable
/// out-of-memory failures. It makes no CUDA call, so adaptors and sub-allocators can be tested
/// and benchmarked on a machine without a GPU. The memory is host memory: never hand it to a
/// kernel. Copies share state and are equal.
///
/// Alignments follow the crate's rule: 0 is 256, every power of two up to
/// [`MAX_OVER_ALIGNMENT`] (2 MiB) is honoured, a larger one or one that is not a power of two is
/// [`MrError::BadAlloc`].
///
/// Every free is checked against the live set: unknown pointers, double frees and size
/// mismatches are [`MrError::InvalidFree`].
#[derive(Debug, Clone, Default)]
pub struct HostMockResource {
    inner: Arc<Mock>,
}

impl HostMockResource {
    /// A fresh mock with no allocations.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the next `n` non-empty allocations fail with out-of-memory.
    pub fn fail_next_allocations(&self, n: usize) {
        self.inner.fail_next.store(n, Ordering::SeqCst);
    }

    /// Number of successful non-empty allocations so far.
    #[must_use]
    pub fn allocation_calls(&self) -> usize {
        self.inner.allocations.load(Ordering::SeqCst)
    }

    /// Number of successful non-null deallocations so far.
    #[must_use]
    pub fn deallocation_calls(&self) -> usize {
        self.inner.deallocations.load(Ordering::SeqCst)
    }

    /// Number of allocations not yet freed.
    #[must_use]
    pub fn live_allocations(&self) -> usize {
        self.inner
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Bytes not yet freed (as requested).
    #[must_use]
    pub fn live_bytes(&self) -> usize {
        let live = self.inner.live.lock().unwrap_or_else(|e| e.into_inner());
        live.values().map(|&(b, _)| b).sum()
    }

    /// Every allocation not yet freed, `(address, bytes)`, by address.
    #[must_use]
    pub fn live(&self) -> Vec<(u64, usize)> {
        let live = self.inner.live.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<(u64, usize)> = live.iter().map(|(&a, &(b, _))| (a, b)).collect();
        all.sort_unstable();
        all
    }

    /// The alignment argument of the last allocation.
    #[must_use]
    pub fn last_alignment(&self) -> usize {
        self.inner.last_alignment.load(Ordering::SeqCst)
    }
}

// SAFETY: host memory from the global allocator, at least 256-byte aligned and `bytes` long,
// live until it is freed here or the last clone of the mock is dropped; `properties` says it is
// host memory only, so containers (which need device memory) refuse it.
unsafe impl DeviceMemoryResource for HostMockResource {
    fn allocate(
        &self,
        _stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        self.inner.last_alignment.store(alignment, Ordering::SeqCst);
        let align = alignment::check(alignment, MAX_OVER_ALIGNMENT)?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let fail = self
            .inner
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let oom =
            || MrError::out_of_memory(bytes, format!("host mock failed to allocate {bytes} bytes"));
        if fail {
            return Err(oom());
        }
        let layout = Layout::from_size_align(bytes, align).map_err(|_| oom())?;
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return Err(oom());
        }
        let ptr = DevicePtr::from_host_ptr(p);
        self.inner
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ptr.addr(), (bytes, align));
        self.inner.allocations.fetch_add(1, Ordering::SeqCst);
        Ok(ptr)
    }

    unsafe fn deallocate(
        &self,
        _stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
    ) -> MrResult<()> {
        if ptr.is_null() {
            return Ok(());
        }
        let (size, align) = {
            let mut live = self.inner.live.lock().unwrap_or_else(|e| e.into_inner());
            match live.get(&ptr.addr()).copied() {
                None => {
                    return Err(MrError::InvalidFree {
                        ptr,
                        bytes,
                        kind: InvalidFree::UnknownPointer,
                    })
                }
                Some((size, _)) if size != bytes => {
                    return Err(MrError::InvalidFree {
                        ptr,
                        bytes,
                        kind: InvalidFree::SizeMismatch { allocated: size },
                    })
                }
                Some(v) => {
                    live.remove(&ptr.addr());
                    v
                }
            }
        };
        let layout = Layout::from_size_align(size, align)
            .map_err(|e| MrError::invalid_argument(e.to_string()))?;
        // SAFETY: `ptr` was allocated here with exactly this layout and was just removed from the
        // live set, so it is freed once.
        unsafe { std::alloc::dealloc(ptr.as_host_ptr(), layout) };
        self.inner.deallocations.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn properties(&self) -> ResourceProperties {
        ResourceProperties {
            device_accessible: false,
            host_accessible: true,
        }
    }

    crate::resource::resource_tail! {
        is_equal: shared(inner),
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        let live = self.live.get_mut().unwrap_or_else(|e| e.into_inner());
        for (&addr, &(size, align)) in live.iter() {
            if let Ok(layout) = Layout::from_size_align(size, align) {
                // SAFETY: every entry is a live allocation of this layout, freed once here.
                unsafe { std::alloc::dealloc(addr as usize as *mut u8, layout) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_wrong_frees() {
        let m = HostMockResource::new();
        let s = CudaStreamView::default();
        let p = m.allocate(s, 100, 256).unwrap();
        assert!(p.is_aligned(256));
        // SAFETY: exercising the detection; the mock never touches unknown memory.
        unsafe {
            assert!(matches!(
                m.deallocate(s, p, 99, 256),
                Err(MrError::InvalidFree {
                    kind: InvalidFree::SizeMismatch { allocated: 100 },
                    ..
                })
            ));
            m.deallocate(s, p, 100, 256).unwrap();
            assert!(matches!(
                m.deallocate(s, p, 100, 256),
                Err(MrError::InvalidFree {
                    kind: InvalidFree::UnknownPointer,
                    ..
                })
            ));
        }
        assert_eq!(m.allocation_calls(), 1);
        assert_eq!(m.deallocation_calls(), 1);
        m.fail_next_allocations(1);
        assert!(m.allocate(s, 1, 256).unwrap_err().is_out_of_memory());
        assert!(m.allocate(s, 1, 256).is_ok());
        assert_eq!(m.allocate(s, 0, 256).unwrap(), DevicePtr::NULL);
    }
}
