//! System-allocated memory (SAM) usable from the GPU, and its headroom variant.

use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use rmm_stream::CudaStreamView;
use rmm_sys::memory::{self, MemLocation, MEM_ADVISE_SET_PREFERRED_LOCATION};
use rmm_sys::{align_down, DeviceCapabilities, DevicePtr, ALLOCATION_ALIGNMENT};

use crate::error::{InvalidFree, MrError, MrResult};
use crate::resource::{check_base_alignment, DeviceMemoryResource};

/// Live system allocations of every instance (all instances are equal, so any may free what
/// another allocated). Freeing through the Rust allocator with a wrong pointer or size would be
/// undefined behaviour, so unlike RMM every free is checked against this set first.
fn live() -> &'static Mutex<HashMap<u64, usize>> {
    static LIVE: OnceLock<Mutex<HashMap<u64, usize>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(HashMap::new()))
}

fn require_pageable_memory_access() -> MrResult<()> {
    let device = rmm_sys::current_device()?;
    let caps = DeviceCapabilities::probe(device)?;
    if caps.pageable_memory_access {
        Ok(())
    } else {
        Err(MrError::Unsupported(format!(
            "system memory allocator is not supported on device {device}: it lacks pageable \
             memory access (HMM or ATS, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS)"
        )))
    }
}

fn system_allocate(bytes: usize, alignment: usize) -> MrResult<DevicePtr> {
    check_base_alignment(alignment)?;
    if bytes == 0 {
        return Ok(DevicePtr::NULL);
    }
    let layout = Layout::from_size_align(bytes, ALLOCATION_ALIGNMENT).map_err(|_| {
        MrError::out_of_memory(
            bytes,
            format!("failed to allocate {bytes} bytes of system memory"),
        )
    })?;
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc(layout) };
    if p.is_null() {
        return Err(MrError::out_of_memory(
            bytes,
            format!("failed to allocate {bytes} bytes of system memory"),
        ));
    }
    let ptr = DevicePtr::from_host_ptr(p);
    live()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(ptr.addr(), bytes);
    Ok(ptr)
}

/// # Safety
/// `stream` is a valid view (its invariant); the memory is not used after the stream's work.
unsafe fn system_deallocate(
    stream: CudaStreamView<'_>,
    ptr: DevicePtr,
    bytes: usize,
) -> MrResult<()> {
    // `free` is immediate, so pending work on the stream must finish first.
    stream.synchronize()?;
    if ptr.is_null() {
        return Ok(());
    }
    {
        let mut map = live().lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&ptr.addr()) {
            None => {
                return Err(MrError::InvalidFree {
                    ptr,
                    bytes,
                    kind: InvalidFree::UnknownPointer,
                })
            }
            Some(&allocated) if allocated != bytes => {
                return Err(MrError::InvalidFree {
                    ptr,
                    bytes,
                    kind: InvalidFree::SizeMismatch { allocated },
                })
            }
            Some(_) => {
                map.remove(&ptr.addr());
            }
        }
    }
    let layout = Layout::from_size_align(bytes, ALLOCATION_ALIGNMENT)
        .map_err(|e| MrError::invalid_argument(e.to_string()))?;
    // SAFETY: `ptr` is a live allocation of exactly this layout (checked against the live set,
    // from which it was just removed, so it cannot be freed twice).
    unsafe { std::alloc::dealloc(ptr.as_host_ptr(), layout) };
    Ok(())
}

/// System-allocated memory (RMM's `system_memory_resource`): ordinary host memory from the
/// global allocator that the GPU can access through HMM or ATS. Construction fails where the
/// device lacks pageable memory access. `deallocate` synchronizes the stream before freeing,
/// because a host free is immediate. All instances are equal.
#[doc(alias = "rmm::mr::system_memory_resource")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SystemMemoryResource {
    _private: (),
}

impl SystemMemoryResource {
    /// Checks the current device's pageable memory access: [`MrError::Unsupported`] without it.
    pub fn new() -> MrResult<Self> {
        require_pageable_memory_access()?;
        Ok(Self { _private: () })
    }
}

// SAFETY: every pointer comes from the host's allocator (aligned allocation of at least the
// bytes asked for, at least 256-byte aligned), device-accessible through the device's
// pageable-memory access, which construction checked; it is freed only here.
unsafe impl DeviceMemoryResource for SystemMemoryResource {
    fn allocate(
        &self,
        _stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        system_allocate(bytes, alignment)
    }

    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
    ) -> MrResult<()> {
        // SAFETY: the trait's contract.
        unsafe { system_deallocate(stream, ptr, bytes) }
    }

    crate::resource::resource_tail! {
        is_equal: same_type,
        properties: HOST_DEVICE,
    }
}

/// System memory whose first part prefers the GPU while at least `headroom` bytes of device
/// memory stay free (RMM's `sam_headroom_memory_resource`): of each allocation, the first
/// `align_down(min(free - headroom, bytes), 256)` bytes get the GPU as preferred location, the
/// rest the CPU. Queries free memory on every allocation. Instances with the same headroom are
/// equal.
#[doc(alias = "rmm::mr::sam_headroom_memory_resource")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SamHeadroomMemoryResource {
    headroom: usize,
}

impl SamHeadroomMemoryResource {
    /// Checks the current device's pageable memory access: [`MrError::Unsupported`] without it.
    pub fn new(headroom: usize) -> MrResult<Self> {
        require_pageable_memory_access()?;
        Ok(Self { headroom })
    }

    /// The headroom in bytes.
    #[must_use]
    pub fn headroom(&self) -> usize {
        self.headroom
    }

    /// How many leading bytes of a `bytes` allocation prefer the GPU when `free` bytes of
    /// device memory are free.
    #[must_use]
    pub fn gpu_portion(&self, free: usize, bytes: usize) -> usize {
        align_down(
            free.saturating_sub(self.headroom).min(bytes),
            ALLOCATION_ALIGNMENT,
        )
    }
}

// SAFETY: every pointer comes from the host's allocator (aligned allocation of at least the
// bytes asked for, at least 256-byte aligned), device-accessible through the device's
// pageable-memory access, which construction checked; it is freed only here.
unsafe impl DeviceMemoryResource for SamHeadroomMemoryResource {
    fn allocate(
        &self,
        _stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        let ptr = system_allocate(bytes, alignment)?;
        if bytes == 0 {
            return Ok(ptr);
        }
        let advise = || -> MrResult<()> {
            let (free, _) = rmm_sys::available_device_memory()?;
            let device = rmm_sys::current_device()?;
            let gpu = self.gpu_portion(free, bytes);
            // SAFETY: `[ptr, ptr + bytes)` is a live system allocation.
            unsafe {
                if gpu > 0 {
                    memory::mem_advise(
                        ptr,
                        gpu,
                        MEM_ADVISE_SET_PREFERRED_LOCATION,
                        MemLocation::Device(device.0),
                    )?;
                }
                if gpu < bytes {
                    let rest = ptr.checked_add(gpu).unwrap_or(ptr);
                    memory::mem_advise(
                        rest,
                        bytes - gpu,
                        MEM_ADVISE_SET_PREFERRED_LOCATION,
                        MemLocation::Host,
                    )?;
                }
            }
            Ok(())
        };
        if let Err(e) = advise() {
            // SAFETY: `ptr` was just allocated and never handed out.
            let _ = unsafe { system_deallocate(CudaStreamView::default(), ptr, bytes) };
            return Err(e);
        }
        Ok(ptr)
    }

    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
    ) -> MrResult<()> {
        // SAFETY: the trait's contract.
        unsafe { system_deallocate(stream, ptr, bytes) }
    }

    crate::resource::resource_tail! {
        is_equal: same(headroom),
        properties: HOST_DEVICE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headroom_split() {
        let r = SamHeadroomMemoryResource { headroom: 1000 };
        assert_eq!(r.gpu_portion(10_000, 4096), 4096);
        assert_eq!(r.gpu_portion(3000, 4096), 1792);
        assert_eq!(r.gpu_portion(500, 4096), 0);
        assert!(r.is_equal(&SamHeadroomMemoryResource { headroom: 1000 }));
        assert!(!r.is_equal(&SamHeadroomMemoryResource { headroom: 1001 }));
    }

    #[test]
    fn construction_needs_a_device() {
        if !rmm_sys::is_driver_present() {
            assert!(SystemMemoryResource::new().unwrap_err().is_no_device());
            assert!(SamHeadroomMemoryResource::new(0)
                .unwrap_err()
                .is_no_device());
        } else {
            assert!(!matches!(SystemMemoryResource::new(), Err(e) if e.is_no_device()));
        }
    }
}
