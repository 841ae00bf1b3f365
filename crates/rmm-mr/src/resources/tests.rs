//! A device or driver that lacks a capability, on any machine: rmm-sys's fault hooks pretend
//! the capability probes (and the driver version) answer what a device without memory pools,
//! concurrent managed access or pageable memory access, or an older driver, would answer, and
//! every resource that needs the capability must refuse with [`MrError::Unsupported`], naming
//! what is missing, without touching the driver.

use rmm_sys::fault::{self, FaultScope};
use rmm_sys::{AllocationHandleType, DeviceCapabilities, DriverVersion, MemPoolHandle};

use crate::error::MrError;
use crate::{
    CudaAsyncManagedMemoryResource, CudaAsyncMemoryResource, CudaAsyncOptions,
    CudaAsyncViewMemoryResource, SamHeadroomMemoryResource, SystemMemoryResource,
};

/// A device with every capability these resources ask for.
const FULL: DeviceCapabilities = DeviceCapabilities {
    memory_pools_supported: true,
    supported_handle_types: AllocationHandleType::PosixFileDescriptor as u32,
    concurrent_managed_access: true,
    pageable_memory_access: true,
};

/// A scope in which the current device is device 0 and answers `caps`, under `driver`.
fn device(caps: DeviceCapabilities, driver: DriverVersion) -> FaultScope {
    let scope = FaultScope::simulated();
    fault::pretend_capabilities(Some(caps));
    fault::pretend_driver_version(Some(driver));
    scope
}

/// `r` is `Unsupported` with a message that contains every one of `names`.
fn assert_unsupported<T: std::fmt::Debug>(r: Result<T, MrError>, names: &[&str]) {
    match r {
        Err(MrError::Unsupported(m)) => {
            for name in names {
                assert!(m.contains(name), "{m:?} does not name {name:?}");
            }
        }
        other => panic!("expected MrError::Unsupported naming {names:?}, got {other:?}"),
    }
}

#[test]
fn the_driver_pools_need_memory_pools() {
    let caps = DeviceCapabilities {
        memory_pools_supported: false,
        ..FULL
    };
    let _scope = device(caps, DriverVersion::CUDA_13_0);
    assert_unsupported(CudaAsyncMemoryResource::new(), &["memory pools"]);
    assert_unsupported(
        CudaAsyncViewMemoryResource::default_device_pool(),
        &["memory pools"],
    );
    // SAFETY: refused before the handle is used (no pools on this device).
    let view = unsafe { CudaAsyncViewMemoryResource::new(MemPoolHandle::from_raw(8 as _)) };
    assert_unsupported(view, &["memory pools"]);
}

#[test]
fn the_driver_pool_needs_the_export_handle_type() {
    let _scope = device(FULL, DriverVersion::CUDA_13_0);
    assert_unsupported(
        CudaAsyncMemoryResource::with_options(
            CudaAsyncOptions::new().export_handle_type(AllocationHandleType::Fabric),
        ),
        &["Fabric"],
    );
}

#[test]
fn async_managed_needs_cuda_13_and_concurrent_managed_access() {
    {
        let _scope = device(FULL, DriverVersion(12080));
        assert_unsupported(
            CudaAsyncManagedMemoryResource::new(),
            &["CUDA 13.0", "12.8"],
        );
    }
    let caps = DeviceCapabilities {
        concurrent_managed_access: false,
        ..FULL
    };
    let _scope = device(caps, DriverVersion::CUDA_13_0);
    assert_unsupported(
        CudaAsyncManagedMemoryResource::new(),
        &["concurrent managed access"],
    );
}

#[test]
fn system_memory_needs_pageable_memory_access() {
    let caps = DeviceCapabilities {
        pageable_memory_access: false,
        ..FULL
    };
    let _scope = device(caps, DriverVersion::CUDA_13_0);
    assert_unsupported(SystemMemoryResource::new(), &["pageable memory access"]);
    assert_unsupported(
        SamHeadroomMemoryResource::new(1 << 20),
        &["pageable memory access"],
    );
}

#[test]
fn with_the_capability_the_check_passes() {
    // The same pretended device with the capability: the check is what refused above.
    let _scope = device(FULL, DriverVersion::CUDA_13_0);
    assert!(SystemMemoryResource::new().is_ok());
    assert!(SamHeadroomMemoryResource::new(1 << 20).is_ok());
    assert!(!matches!(
        CudaAsyncManagedMemoryResource::new(),
        Err(MrError::Unsupported(_))
    ));
}
