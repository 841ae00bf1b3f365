//! # rmm-sys: the raw layer of rmm-rs
//!
//! **Contract.** This crate is the only one in rmm-rs that declares or calls foreign functions.
//! It talks to the CUDA **driver** API, loading `libcuda` at run time, so it builds without a
//! CUDA toolkit and runs on any machine: without a driver every entry point returns
//! [`CudaError::DriverNotFound`] and nothing panics.
//!
//! - **Results are integers.** rmm-sys looks up each driver entry point it calls itself and
//!   declares it as returning a plain `u32`, not cudarc's `CUresult` enum: a newer driver may
//!   return a code the bindings do not list, which in a Rust enum would be undefined behaviour.
//!   Every code, known or not, becomes a [`CudaError::Call`] carrying the number. cudarc's
//!   [`sys`](cudarc::driver::sys) types serve for handles and plain data.
//!
//! - **Stream ordering** is the caller's: the wrappers here enqueue exactly the driver call they
//!   name on the stream they are given and never synchronize unless their name says so.
//! - **Threads**: every function is safe to call from any thread. A thread with no current
//!   context gets device 0's primary context on its first call, as the CUDA runtime does (the
//!   driver API would fail with `CUDA_ERROR_INVALID_CONTEXT`). [`set_current_device`] retains
//!   a device's primary context and makes it current (`cudaSetDevice`), so rmm-rs shares contexts
//!   with runtime-API code (PyTorch, CuPy, C++ RMM) and with cudarc.
//! - **Driver versions**: CUDA 12.0 drivers and newer. Entry points present in every version
//!   from 12.0 on are looked up by their exported names when the driver is initialized; newer
//!   ones (`cuMemGetDefaultMemPool`, CUDA 13's `cuMemPrefetchAsync`) are resolved with
//!   `cuGetProcAddress` after a version check and fail with
//!   [`CudaError::EntryPointUnavailable`] on an older driver.
//! - **Safety**: functions that free memory, destroy handles, write through addresses or take
//!   a raw handle the caller must keep alive (streams, events, memory pools) are `unsafe fn`s
//!   whose contracts say what the caller vouches for; every `unsafe` block carries a
//!   `// SAFETY:` comment. The virtual memory API ([`vmm`]) comes as owned handles instead,
//!   released on drop in the order the driver needs (unmap, release, free the addresses).

#![doc(html_root_url = "https://docs.rs/rmm-sys/0.1.0")]

/// A fault point at the top of a driver wrapper: with the `testing` feature it asks [`fault`]
/// whether this call fails (then returns the error) or is simulated (then returns the value
/// after `=>`); without the feature it is nothing. The expressions after the name are the
/// call's stream and event handles (fake ones are always simulated).
#[cfg(feature = "testing")]
macro_rules! fault_point {
    ($call:ident, $name:literal $(, $handle:expr)* => $simulated:expr) => {
        match $crate::fault::intercept(
            $crate::fault::DriverCall::$call,
            $name,
            &[$($handle as usize),*],
        ) {
            $crate::fault::Intercept::Fail(e) => return Err(e),
            $crate::fault::Intercept::Simulate => return $simulated,
            $crate::fault::Intercept::Driver => {}
        }
    };
    ($call:ident, $name:literal) => {
        if let $crate::fault::Intercept::Fail(e) =
            $crate::fault::intercept($crate::fault::DriverCall::$call, $name, &[])
        {
            return Err(e);
        }
    };
}

#[cfg(not(feature = "testing"))]
macro_rules! fault_point {
    ($($tokens:tt)*) => {};
}

pub mod align;
mod capabilities;
mod context;
pub mod device;
pub mod driver;
mod entry;
pub mod error;
#[cfg(feature = "testing")]
pub mod fault;
pub mod graph;
pub mod host_mempool;
pub mod ipc;
pub mod kernel;
pub mod memory;
pub mod mempool;
pub mod ptr;
pub mod raw;
pub mod stream;
/// GPU-test support for this workspace's `tests/gpu_*.rs` (feature `testing`): hidden from the
/// docs, not for production, no stability promise.
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;
pub mod version;
pub mod vmm;

pub use align::{
    align_down, align_up, checked_align_up, is_aligned, is_pow2, is_supported_alignment,
    is_supported_base_resource_alignment, ALLOCATION_ALIGNMENT,
};
pub use capabilities::{AllocationHandleType, DeviceCapabilities};
pub use context::{
    ensure_current_context, primary_context, raw_current_context, DeferredPrimaryContext,
    PrimaryContext, PrimaryContextGuard,
};
pub use device::{
    available_device_memory, current_device, device_count, device_name, device_synchronize,
    gpu_unavailable_reason, percent_of_free_device_memory, set_current_device, ComputeCapability,
    DeviceGuard, DeviceId,
};
pub use driver::{driver_version, init, is_driver_present};
pub use error::{CudaError, CudaResult, ResultCode};
pub use graph::{CaptureMode, CaptureStatus, GraphMemAttribute};
pub use host_mempool::HostPoolLocation;
pub use memory::MemLocation;
pub use mempool::{MemPoolAttribute, MemPoolHandle, MemPoolUsage};
pub use ptr::DevicePtr;
pub use stream::{CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};
pub use version::DriverVersion;

#[cfg(test)]
mod send_sync {
    //! Compile-time `Send`/`Sync` assertions for the public types.
    use super::*;

    const fn assert_send_sync<T: Send + Sync>() {}

    const _: () = {
        assert_send_sync::<CudaError>();
        assert_send_sync::<DevicePtr>();
        assert_send_sync::<DeviceId>();
        assert_send_sync::<MemPoolHandle>();
        assert_send_sync::<PrimaryContext>();
        assert_send_sync::<DeviceCapabilities>();
        assert_send_sync::<DriverVersion>();
        assert_send_sync::<vmm::AddressRange>();
        assert_send_sync::<vmm::PhysicalMemory>();
        assert_send_sync::<vmm::Mapping>();
    };
}
