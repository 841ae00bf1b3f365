//! The driver entry points rmm-sys calls, loaded from `libcuda` by rmm-sys itself and declared
//! with **integer** results.
//!
//! cudarc's bindings declare every entry point as returning its `CUresult` Rust enum. A driver
//! newer than the bindings may return a code the enum does not list, and a Rust enum holding an
//! undeclared value is undefined behaviour the moment the call returns. So rmm-sys does not call
//! cudarc's functions: it opens the library once, looks up each symbol it uses and calls it
//! through a function pointer whose result is a `u32`, which [`crate::error::check`] turns into a
//! [`CudaError`](crate::CudaError) carrying the number, known or not. Out-parameters of enum type
//! (`cuGetProcAddress`'s query status) are likewise read as integers. cudarc's `sys` types are
//! still used for enum *inputs* (rmm-sys only passes enumerators it names itself); handles are
//! rmm-sys's own ([`crate::raw`]), ABI-identical to the driver's.
//!
//! Each symbol is the one cudarc binds for the same function (the exported, explicitly
//! versioned name, e.g. `cuMemAlloc_v2`), with the signature of `cuda.h` for that symbol; every
//! one of them is exported by every driver from CUDA 12.0 on. Entry points newer than 12.0, or
//! whose signature changed in a later version, are resolved per call site with
//! `cuGetProcAddress` instead ([`crate::driver::resolve`]).

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::OnceLock;

use cudarc::driver::sys::{
    CUdevice_attribute, CUhostFn, CUmemPool_attribute, CUmem_range_attribute, CUpointer_attribute,
};
use libloading::Library;

use crate::raw::{
    CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction, CUmemoryPool, CUmodule, CUstream,
};

/// A `CUresult` as the driver returns it: a plain integer, so that a code newer than our
/// bindings is a value, not undefined behaviour.
pub(crate) type RawResult = u32;

/// The file names `libcuda` is looked up by, in order.
#[cfg(windows)]
const LIBRARY_NAMES: &[&str] = &["nvcuda.dll"];
/// The file names `libcuda` is looked up by, in order (the driver's soname first).
#[cfg(not(windows))]
const LIBRARY_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];

/// Declares a table of entry points: one field per symbol, named as the symbol, holding an
/// `unsafe extern "C" fn(...) -> RawResult`, and a loader that looks every one of them up.
macro_rules! entry_points {
    ($(#[$meta:meta])* $table:ident { $( $name:ident ( $($arg:ty),* $(,)? ); )* }) => {
        $(#[$meta])*
        #[allow(non_snake_case)]
        pub(crate) struct $table {
            $(
                #[doc = concat!("`", stringify!($name), "`.")]
                pub(crate) $name: unsafe extern "C" fn($($arg),*) -> RawResult,
            )*
        }

        impl $table {
            /// Looks up every symbol of the table; the name of the first missing one on failure.
            ///
            /// # Safety
            /// `lib` is the CUDA driver library, and it stays loaded as long as the table is used
            /// (each symbol's declared signature is the driver's, as written above).
            unsafe fn load(lib: &Library) -> Result<Self, &'static str> {
                Ok(Self {
                    $(
                        // SAFETY: the caller's contract: the symbol has this signature in every
                        // driver from CUDA 12.0 on.
                        $name: unsafe {
                            symbol::<unsafe extern "C" fn($($arg),*) -> RawResult>(
                                lib,
                                concat!(stringify!($name), "\0"),
                            )
                        }
                        .ok_or(stringify!($name))?,
                    )*
                })
            }
        }
    };
}

/// Copies a function pointer out of the library.
///
/// # Safety
/// `F` is the function-pointer type of `name` in `lib`.
unsafe fn symbol<F: Copy>(lib: &Library, name: &str) -> Option<F> {
    // SAFETY: the caller's contract on `F`; the pointer is copied out and stays valid while the
    // library is loaded (the caller's contract on `load`).
    unsafe { lib.get::<F>(name) }.ok().map(|s| *s)
}

entry_points! {
    /// The entry points needed before the driver is known to be recent enough: initializing it,
    /// its version, and the names of error codes.
    Boot {
        cuInit(c_uint);
        cuDriverGetVersion(*mut c_int);
        cuGetErrorName(RawResult, *mut *const c_char);
        cuGetErrorString(RawResult, *mut *const c_char);
    }
}

entry_points! {
    /// Every other entry point rmm-sys calls directly (those of CUDA 12.0).
    Api {
        cuGetProcAddress_v2(*const c_char, *mut *mut c_void, c_int, u64, *mut u32);
        cuCtxGetCurrent(*mut CUcontext);
        cuCtxSetCurrent(CUcontext);
        cuCtxGetDevice(*mut CUdevice);
        cuCtxSynchronize();
        cuDeviceGet(*mut CUdevice, c_int);
        cuDeviceGetCount(*mut c_int);
        cuDeviceGetName(*mut c_char, c_int, CUdevice);
        cuDeviceGetAttribute(*mut c_int, CUdevice_attribute, CUdevice);
        cuDevicePrimaryCtxRetain(*mut CUcontext, CUdevice);
        cuMemGetInfo_v2(*mut usize, *mut usize);
        cuMemAlloc_v2(*mut CUdeviceptr, usize);
        cuMemFree_v2(CUdeviceptr);
        cuMemAllocManaged(*mut CUdeviceptr, usize, c_uint);
        cuMemHostAlloc(*mut *mut c_void, usize, c_uint);
        cuMemFreeHost(*mut c_void);
        cuMemsetD32Async(CUdeviceptr, c_uint, usize, CUstream);
        cuMemsetD8Async(CUdeviceptr, u8, usize, CUstream);
        cuMemcpyAsync(CUdeviceptr, CUdeviceptr, usize, CUstream);
        cuPointerGetAttribute(*mut c_void, CUpointer_attribute, CUdeviceptr);
        cuMemRangeGetAttribute(*mut c_void, usize, CUmem_range_attribute, CUdeviceptr, usize);
        cuModuleLoadData(*mut CUmodule, *const c_void);
        cuModuleGetFunction(*mut CUfunction, CUmodule, *const c_char);
        cuModuleUnload(CUmodule);
        cuLaunchKernel(
            CUfunction,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            CUstream,
            *mut *mut c_void,
            *mut *mut c_void,
        );
        cuMemPoolCreate(*mut CUmemoryPool, *const RawPoolProps);
        cuMemPoolDestroy(CUmemoryPool);
        cuMemPoolGetAttribute(CUmemoryPool, CUmemPool_attribute, *mut c_void);
        cuMemPoolSetAttribute(CUmemoryPool, CUmemPool_attribute, *mut c_void);
        cuMemPoolTrimTo(CUmemoryPool, usize);
        cuMemAllocFromPoolAsync(*mut CUdeviceptr, usize, CUmemoryPool, CUstream);
        cuMemAllocAsync(*mut CUdeviceptr, usize, CUstream);
        cuMemFreeAsync(CUdeviceptr, CUstream);
        cuDeviceGetDefaultMemPool(*mut CUmemoryPool, CUdevice);
        cuDeviceGetMemPool(*mut CUmemoryPool, CUdevice);
        cuStreamCreate(*mut CUstream, c_uint);
        cuStreamDestroy_v2(CUstream);
        cuStreamSynchronize(CUstream);
        cuStreamQuery(CUstream);
        cuStreamGetId(CUstream, *mut c_ulonglong);
        cuStreamWaitEvent(CUstream, CUevent, c_uint);
        cuLaunchHostFunc(CUstream, CUhostFn, *mut c_void);
        cuEventCreate(*mut CUevent, c_uint);
        cuEventDestroy_v2(CUevent);
        cuEventRecord(CUevent, CUstream);
        cuEventSynchronize(CUevent);
        cuEventQuery(CUevent);
        cuMemAddressReserve(*mut CUdeviceptr, usize, usize, CUdeviceptr, c_ulonglong);
        cuMemAddressFree(CUdeviceptr, usize);
        cuMemCreate(*mut RawMemHandle, usize, *const RawAllocationProp, c_ulonglong);
        cuMemRelease(RawMemHandle);
        cuMemMap(CUdeviceptr, usize, usize, RawMemHandle, c_ulonglong);
        cuMemUnmap(CUdeviceptr, usize);
        cuMemSetAccess(CUdeviceptr, usize, *const RawAccessDesc, usize);
        cuMemGetAllocationGranularity(*mut usize, *const RawAllocationProp, c_uint);
        cuMemExportToShareableHandle(*mut c_void, RawMemHandle, c_uint, c_ulonglong);
        cuMemImportFromShareableHandle(*mut RawMemHandle, *mut c_void, c_uint);
    }
}

/// The opened driver library and its bootstrap entry points.
pub(crate) struct Driver {
    /// Keeps the library loaded; it lives in a `static` and is never dropped, so the function
    /// pointers of every table stay valid for the process.
    lib: Library,
    /// `cuInit`, `cuDriverGetVersion` and the error-name functions.
    pub(crate) boot: Boot,
}

impl Driver {
    /// Looks up the full table of entry points (after the version check).
    pub(crate) fn load_api(&'static self) -> Result<Api, &'static str> {
        // SAFETY: `self.lib` is the driver library and lives in a static for the process.
        unsafe { Api::load(&self.lib) }
    }
}

static DRIVER: OnceLock<Option<Driver>> = OnceLock::new();

/// The driver library, opened on first use: `None` when no `libcuda` can be loaded here (or the
/// one found lacks `cuInit`), which the gate reports as `DriverNotFound`.
pub(crate) fn driver() -> Option<&'static Driver> {
    DRIVER.get_or_init(open).as_ref()
}

/// The driver library if it was already opened (never opens it).
pub(crate) fn loaded() -> Option<&'static Driver> {
    DRIVER.get().and_then(Option::as_ref)
}

fn open() -> Option<Driver> {
    // Miri cannot call into a shared library: under it this is a machine without a driver, so
    // that every test that needs none runs there (`cargo xtask miri`).
    if cfg!(miri) {
        return None;
    }
    LIBRARY_NAMES.iter().find_map(|name| {
        // SAFETY: loading the CUDA driver runs its initializers, which have no preconditions;
        // this is what every CUDA program (and cudarc) does.
        let lib = unsafe { Library::new(*name) }.ok()?;
        // SAFETY: `lib` is the driver library; the table is kept beside it in the static.
        let boot = unsafe { Boot::load(&lib) }.ok()?;
        Some(Driver { lib, boot })
    })
}

/// `CUmemLocation`, whose layout (two 32-bit fields) every CUDA version since 11.2 shares.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawMemLocation {
    pub(crate) kind: u32,
    pub(crate) id: i32,
}

/// `CUmemPoolProps`: 88 bytes in every CUDA version since 11.2 (later fields took reserved
/// bytes), so one definition serves every binding cudarc may have picked.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RawPoolProps {
    pub(crate) alloc_type: u32,
    pub(crate) handle_types: u32,
    pub(crate) location: RawMemLocation,
    pub(crate) win32_security_attributes: *mut c_void,
    pub(crate) max_size: usize,
    pub(crate) usage: u16,
    pub(crate) reserved: [u8; 54],
}

const _: () = assert!(std::mem::size_of::<RawPoolProps>() == 88);

/// `CUmemGenericAllocationHandle`: a physical allocation of the virtual memory API.
pub(crate) type RawMemHandle = c_ulonglong;

/// `CUmemAllocationProp`: 32 bytes in every CUDA version since 10.2 (`allocFlags` took
/// reserved bytes; CUDA 13.2's `CUmemLocation` union keeps its 8 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RawAllocationProp {
    pub(crate) alloc_type: u32,
    pub(crate) requested_handle_types: u32,
    pub(crate) location: RawMemLocation,
    pub(crate) win32_handle_metadata: *mut c_void,
    /// `compressionType`, `gpuDirectRDMACapable`, `usage` and reserved bytes: all 0.
    pub(crate) alloc_flags: [u8; 8],
}

const _: () = assert!(std::mem::size_of::<RawAllocationProp>() == 32);

/// `CUmemAccessDesc`: a location and its access flags.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawAccessDesc {
    pub(crate) location: RawMemLocation,
    pub(crate) flags: u32,
}

const _: () = assert!(std::mem::size_of::<RawAccessDesc>() == 12);
