//! Loading PTX into the current context and launching its kernels, through rmm-sys's own entry
//! points (integer results, like every other wrapper here): what the workspace's benchmarks and
//! tests need to run a kernel of their own without cudarc's `CUresult` enum (see the
//! [crate documentation](crate)).

use std::ffi::{c_void, CStr};

use crate::context::context_api;
use crate::error::{check, CudaResult};
use crate::raw;
use crate::DevicePtr;

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

/// Hand-written PTX (no NVRTC; PTX ISA 7.0, JIT-compiled by the driver for any GPU from sm_52
/// on) of one kernel, `add(u32* out, const u32* x, const u32* y, u32 n)`: `out[i] = x[i] + y[i]`
/// for every `i < n`, one thread per word. `out` may be `x` or `y` (each thread reads its words
/// before it writes). [`AddKernel`] loads and launches it; the workspace's GPU tests and
/// examples use it as a kernel of their own between allocations (CUDA graphs, streams).
pub const ADD_PTX: &CStr = c"
.version 7.0
.target sm_52
.address_size 64

.visible .entry add(
	.param .u64 add_out,
	.param .u64 add_x,
	.param .u64 add_y,
	.param .u32 add_n
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<10>;

	ld.param.u64 	%rd1, [add_out];
	ld.param.u64 	%rd2, [add_x];
	ld.param.u64 	%rd3, [add_y];
	ld.param.u32 	%r1, [add_n];
	mov.u32 	%r2, %ctaid.x;
	mov.u32 	%r3, %ntid.x;
	mov.u32 	%r4, %tid.x;
	mad.lo.s32 	%r5, %r2, %r3, %r4;
	setp.ge.u32 	%p1, %r5, %r1;
	@%p1 bra 	$L__done;
	mul.wide.u32 	%rd4, %r5, 4;
	cvta.to.global.u64 	%rd5, %rd1;
	cvta.to.global.u64 	%rd6, %rd2;
	cvta.to.global.u64 	%rd7, %rd3;
	add.s64 	%rd5, %rd5, %rd4;
	add.s64 	%rd6, %rd6, %rd4;
	add.s64 	%rd7, %rd7, %rd4;
	ld.global.u32 	%r6, [%rd6];
	ld.global.u32 	%r7, [%rd7];
	add.u32 	%r6, %r6, %r7;
	st.global.u32 	[%rd5], %r6;
$L__done:
	ret;
}
";

/// The [`ADD_PTX`] kernel loaded into the current context, its module kept loaded while this
/// value lives. Neither `Send` nor `Sync`, as [`Module`].
#[derive(Debug)]
pub struct AddKernel {
    add: Function,
    /// Keeps `add` loaded; unloaded when this value drops.
    _module: Module,
}

impl AddKernel {
    /// Loads [`ADD_PTX`] into the current context (the current device's primary context if
    /// none is current) and finds its kernel.
    pub fn load() -> CudaResult<Self> {
        let module = Module::load_ptx(ADD_PTX)?;
        let add = module.function(c"add")?;
        Ok(Self {
            add,
            _module: module,
        })
    }

    /// Launches `out[i] = x[i] + y[i]` for `i < n` on `stream`, 256 threads a block (nothing
    /// when `n` is 0).
    ///
    /// # Safety
    /// - `out`, `x` and `y` each hold at least `n` 4-byte words that work on `stream` may use
    ///   (`out` may be `x` or `y`; otherwise `out` overlaps neither).
    /// - `stream` is a live stream of the context the kernel was loaded into, and that context
    ///   is current.
    /// - This value is not dropped before the launch has completed.
    pub unsafe fn launch(
        &self,
        out: DevicePtr,
        x: DevicePtr,
        y: DevicePtr,
        n: u32,
        stream: raw::CUstream,
    ) -> CudaResult<()> {
        if n == 0 {
            return Ok(());
        }
        let (mut o, mut a, mut b, mut n) = (out.addr(), x.addr(), y.addr(), n);
        let mut params: [*mut c_void; 4] = [
            (&raw mut o).cast(),
            (&raw mut a).cast(),
            (&raw mut b).cast(),
            (&raw mut n).cast(),
        ];
        // SAFETY: the parameters match `add(u32*, u32*, u32*, u32)`; the buffers, the stream
        // and the module's life are the caller's contract.
        unsafe {
            self.add
                .launch([n.div_ceil(256), 1, 1], [256, 1, 1], 0, stream, &mut params)
        }
    }
}
