//! Loading PTX into the current context and launching its kernels, through rmm-sys's own entry
//! points (integer results, like every other wrapper here): what the workspace's benchmarks and
//! tests need to run a kernel of their own without cudarc's `CUresult` enum (see the
//! [crate documentation](crate)).

use std::ffi::{c_void, CStr};

use crate::context::context_api;
use crate::error::{check, CudaResult};
use crate::raw;

/// A module loaded into the context that was current when it was loaded (`cuModuleLoadData`),
/// unloaded from the current context when dropped (`cuModuleUnload`; an error is logged).
/// Neither `Send` nor `Sync`: it belongs to the thread that loaded it, which drops it with the
/// same context current.
#[derive(Debug)]
pub struct Module {
    /// Invariant: loaded, not unloaded.
    handle: raw::CUmodule,
}

impl Module {
    /// Loads (JIT-compiles) the NUL-terminated PTX text `ptx` into the current context (the
    /// current device's primary context if none is current). Malformed PTX, or PTX the device
    /// cannot run, is the driver's error.
    pub fn load_ptx(ptx: &CStr) -> CudaResult<Self> {
        let api = context_api()?;
        let mut handle: raw::CUmodule = std::ptr::null_mut();
        // SAFETY: a context is current; `ptx` is NUL-terminated text that outlives the call;
        // the call writes one handle.
        check("cuModuleLoadData", unsafe {
            (api.cuModuleLoadData)(&mut handle, ptx.as_ptr().cast())
        })?;
        Ok(Self { handle })
    }

    /// The kernel `name` of this module (`cuModuleGetFunction`): `CUDA_ERROR_NOT_FOUND` when
    /// the module has none of that name.
    pub fn function(&self, name: &CStr) -> CudaResult<Function> {
        let api = context_api()?;
        let mut handle: raw::CUfunction = std::ptr::null_mut();
        // SAFETY: the module is loaded (the invariant); `name` is NUL-terminated; the call
        // writes one handle.
        check("cuModuleGetFunction", unsafe {
            (api.cuModuleGetFunction)(&mut handle, self.handle, name.as_ptr())
        })?;
        Ok(Function { handle })
    }

    /// The module's handle, valid while this value lives.
    #[must_use]
    pub fn as_raw(&self) -> raw::CUmodule {
        self.handle
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let Ok(api) = context_api() else {
            return;
        };
        // SAFETY: the module is loaded and unloaded once, here; every launch of its kernels
        // completed before (`Function::launch`'s contract).
        let r = check("cuModuleUnload", unsafe {
            (api.cuModuleUnload)(self.handle)
        });
        if let Err(e) = r {
            log::error!("rmm: unloading a module failed: {e}");
        }
    }
}

/// A kernel of a [`Module`]: a plain handle, launchable while its module is loaded (which
/// [`launch`](Self::launch)'s caller vouches for). Neither `Send` nor `Sync`, as the module.
#[derive(Debug, Clone, Copy)]
pub struct Function {
    handle: raw::CUfunction,
}

impl Function {
    /// Launches the kernel (`cuLaunchKernel`) on `stream` with `grid` blocks of `block`
    /// threads and `shared_bytes` bytes of dynamic shared memory; `params` holds one pointer
    /// per kernel parameter, to its value (the driver copies the values at the call).
    ///
    /// # Safety
    /// - `params` matches the kernel's parameter list in number and types.
    /// - Every address the kernel reads or writes is memory it may use on `stream`.
    /// - `stream` is a live stream of the context the module was loaded into, and that
    ///   context is current.
    /// - The [`Module`] this function came from is loaded (not dropped) and is not dropped
    ///   before the launch has completed.
    pub unsafe fn launch(
        self,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        stream: raw::CUstream,
        params: &mut [*mut c_void],
    ) -> CudaResult<()> {
        let api = context_api()?;
        // SAFETY: the caller's contract (the function's module is loaded).
        check("cuLaunchKernel", unsafe {
            (api.cuLaunchKernel)(
                self.handle,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared_bytes,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    /// The kernel's handle, valid while its module is loaded.
    #[must_use]
    pub fn as_raw(&self) -> raw::CUfunction {
        self.handle
    }
}
