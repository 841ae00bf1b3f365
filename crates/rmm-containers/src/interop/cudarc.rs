//! cudarc interop (feature `cudarc`).
//!
//! # Streams
//! - cudarc → rmm-rs: [`cudarc_stream_view`] borrows a cudarc stream as a [`CudaStreamView`];
//!   `Arc<cudarc::driver::CudaStream>` converts into a [`BufferStream`] that shares ownership,
//!   so a container can live on a cudarc stream (and keeps it alive).
//! - rmm-rs → cudarc: cudarc's `CudaStream` cannot borrow, so [`wrap_stream_for_cudarc`] is
//!   `unsafe` (the caller keeps the stream alive); [`static_stream_for_cudarc`] is safe for the
//!   special streams.
//!
//! Both sides use the device's **primary** context (cudarc's `CudaContext::new` retains it, as
//! rmm-sys does), so handles are interchangeable; streams of a cudarc non-primary context are
//! not supported. cudarc's null stream is the legacy default stream; it maps to
//! [`CudaStreamView::legacy`] whatever rmm-rs's default-stream mode.
//!
//! # Device memory
//! [`DeviceUvector<T>`] implements cudarc's `DeviceSlice<T>`, `DevicePtr<T>` and
//! `DevicePtrMut<T>` (so cudarc's copies accept it) and `PushKernelArg` for `&v` and `&mut v`
//! (so it can be a kernel argument). Ordering follows the containers' rule: work on the
//! vector's own stream needs nothing; `device_ptr(stream)` / `device_ptr_mut(stream)` with
//! another stream make that stream wait for the vector's stream first (an event, as the
//! containers' own methods do) and synchronize it when the returned guard drops (so later work
//! on the vector's stream, including its free, comes after).
//! Kernel arguments cannot add such waits (cudarc keeps them private): launch on the vector's
//! stream, or order the streams yourself.
//!
//! # cudarc's `CUresult` enum
//!
//! cudarc declares every driver entry point as returning its `CUresult` Rust enum, and a code
//! the enum lacks (from a driver newer than the bindings) would be undefined behaviour
//! (`rmm_sys`'s crate documentation). This module makes its own driver calls through rmm-sys,
//! whose results are integers. Two calls into cudarc that reach the driver remain, because
//! cudarc offers no other way to build what its traits need; the workspace check
//! `cudarc_calls` in xtask lists them, and fails on any other:
//! - [`CudaContext::new`] in [`cudarc_context`], the only constructor of the context every
//!   cudarc stream holds. Each driver call it makes (`cuInit`, `cuDeviceGet`,
//!   `cuDevicePrimaryCtxRetain`, `cuDeviceGetAttribute`, `cuCtxGetCurrent`) is made first
//!   through rmm-sys, with the primary context made current, and cudarc is called only when
//!   all of them succeeded; it then repeats calls whose answer is already known.
//! - The `SyncOnDrop` guard that cudarc's `DevicePtr` and `DevicePtrMut` traits must return:
//!   when it drops, cudarc synchronizes the stream through its own bindings. cudarc's own
//!   operations (copies, launches) take the guard and drop it within the same cudarc call that
//!   has just made its own driver calls through the same enum, so the guard adds no exposure
//!   to a call the user did not already make through cudarc.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use bytemuck::Pod;
use cudarc::driver::{
    CudaContext, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, DriverError, LaunchArgs,
    PushKernelArg, SyncOnDrop,
};
use rmm_mr::{MrError, MrResult};
use rmm_stream::CudaStreamView;
use rmm_sys::{CudaError, DeviceId, PrimaryContextGuard};

use crate::raw::{self, StreamOn};
use crate::stream::{cudarc_stream_view, BufferStream};
use crate::uvector::DeviceUvector;

fn driver_error(e: DriverError) -> MrError {
    MrError::Cuda(CudaError::from_raw_code("cudarc", e.0 as u32))
}

/// cudarc's context for `device`'s primary context (the one rmm-rs uses), created once per
/// device and cached. Checks the driver first, so it returns an error where cudarc would panic
/// (no `libcuda`), and leaves the calling thread's current device as it was.
pub fn cudarc_context(device: DeviceId) -> MrResult<Arc<CudaContext>> {
    static CONTEXTS: OnceLock<Mutex<HashMap<i32, Arc<CudaContext>>>> = OnceLock::new();
    rmm_sys::init()?;
    let count = rmm_sys::device_count()?;
    let ordinal = usize::try_from(device.value())
        .ok()
        .filter(|&d| d < count)
        .ok_or_else(|| {
            MrError::invalid_argument(format!("invalid device ordinal {device} ({count} devices)"))
        })?;
    let mut map = CONTEXTS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(ctx) = map.get(&device.value()) {
        return Ok(Arc::clone(ctx));
    }
    let guard = preflight(device)?;
    // The one call of cudarc's constructor (see the module documentation): every driver call
    // it makes has just succeeded through rmm-sys, with its context current, so it finds the
    // context current and makes no `cuCtxSetCurrent`.
    let ctx = CudaContext::new(ordinal).map_err(driver_error)?;
    // Puts the caller's context back.
    drop(guard);
    map.insert(device.value(), Arc::clone(&ctx));
    Ok(ctx)
}

/// Makes, through rmm-sys's entry points (integer results), every driver call that cudarc's
/// `CudaContext::new` makes for `device`: `cuInit` (by the caller), `cuDeviceGet` and
/// `cuDevicePrimaryCtxRetain` (the primary context), `cuCtxGetCurrent` and `cuCtxSetCurrent`
/// (entering it: the guard returned keeps it current and then puts back the caller's context),
/// and `cuDeviceGetAttribute` (the capabilities, memory pools among them). A failure is a typed
/// error before cudarc is called.
fn preflight(device: DeviceId) -> MrResult<PrimaryContextGuard> {
    let guard = PrimaryContextGuard::enter(device)?;
    device.capabilities()?;
    Ok(guard)
}

/// A cudarc stream for one of the special streams (default, legacy, per-thread), on `device`'s
/// primary context. The default stream is resolved by the process's default-stream mode.
///
/// # Errors
/// [`MrError::InvalidArgument`] for a view that is not a special stream (use
/// [`wrap_stream_for_cudarc`]), and [`cudarc_context`]'s errors.
pub fn static_stream_for_cudarc(
    view: CudaStreamView<'static>,
    device: DeviceId,
) -> MrResult<Arc<CudaStream>> {
    if !(view.is_default() || view.is_per_thread_default()) {
        return Err(MrError::invalid_argument(format!(
            "stream {view} is not a special stream; wrap_stream_for_cudarc wraps others"
        )));
    }
    // SAFETY: special stream handles are valid in every context, forever.
    unsafe { wrap_stream_for_cudarc(view, device) }
}

/// A cudarc stream wrapping `view`'s stream (not owning it) on `device`'s primary context.
///
/// # Safety
/// The stream belongs to `device`'s primary context and stays alive as long as the returned
/// `Arc` (or any clone of it) may be used: cudarc's stream does not borrow.
pub unsafe fn wrap_stream_for_cudarc(
    view: CudaStreamView<'_>,
    device: DeviceId,
) -> MrResult<Arc<CudaStream>> {
    let ctx = cudarc_context(device)?;
    // SAFETY: the caller's contract; `as_raw` resolves the default stream to the handle the
    // driver needs; the cast only renames the pointee type of the same opaque handle.
    Ok(unsafe { ctx.wrap_borrowed_stream(view.as_raw().cast()) })
}

impl From<Arc<CudaStream>> for BufferStream {
    fn from(stream: Arc<CudaStream>) -> Self {
        Self::cudarc(stream)
    }
}

impl From<&Arc<CudaStream>> for BufferStream {
    fn from(stream: &Arc<CudaStream>) -> Self {
        Self::cudarc(Arc::clone(stream))
    }
}

impl<T: Pod> DeviceUvector<T> {
    /// Makes `other` wait for the work queued so far on this vector's stream (the containers'
    /// shared event helper, which falls back to synchronizing this vector's stream on the
    /// host), and returns a guard that synchronizes `other` when it drops, so the vector's later
    /// work and its free come after what cudarc enqueued on `other` meanwhile. Neither happens
    /// when `other` is the vector's own stream. The guard's synchronization is cudarc's own
    /// driver call (see the module documentation).
    fn cudarc_guard<'a>(&self, other: &'a CudaStream) -> SyncOnDrop<'a> {
        let ours = StreamOn::new(self.device(), self.stream());
        let device = i32::try_from(other.context().ordinal()).map_or(self.device(), DeviceId);
        let theirs = StreamOn::new(device, cudarc_stream_view(other));
        if theirs.is_same(&ours) {
            return SyncOnDrop::Sync(None);
        }
        if let Err(e) = raw::order_after(theirs, ours) {
            log::error!("rmm: ordering a cudarc stream after the vector's stream failed: {e}");
        }
        SyncOnDrop::Sync(Some(other))
    }
}

impl<T: Pod> DeviceSlice<T> for DeviceUvector<T> {
    fn len(&self) -> usize {
        DeviceUvector::len(self)
    }

    /// The vector's stream as a cudarc stream: the `Arc` itself for a vector on a cudarc
    /// stream, a wrapper of the stream for a vector on a `'static` one (a special stream, or a
    /// foreign stream whose creator promised never to destroy it). For a vector on an owned
    /// rmm-rs stream, cudarc's stream could be cloned past that stream's life, so this is the
    /// device's legacy default stream instead (cudarc uses it to find the context; ordering is
    /// done by `device_ptr`/`device_ptr_mut`).
    ///
    /// # Panics
    /// If cudarc cannot create its context for the vector's device, which a vector created on
    /// that device rules out in practice (cudarc's trait has no way to return an error).
    fn stream(&self) -> &Arc<CudaStream> {
        if let Some(s) = self.buffer_stream().as_cudarc() {
            return s;
        }
        self.cudarc_stream.get_or_init(|| {
            let made = match self.buffer_stream().as_static() {
                // SAFETY: a `'static` view names a special stream (valid in every context,
                // forever) or a stream that `CudaStreamView::from_raw`'s caller promised stays
                // alive for `'static`; the vector already uses it with its device's primary
                // context current, the context cudarc's wrapper binds.
                Some(view) => unsafe { wrap_stream_for_cudarc(view, self.device()) },
                None => cudarc_context(self.device()).map(|ctx| ctx.default_stream()),
            };
            made.unwrap_or_else(|e| {
                panic!(
                    "rmm: cudarc has no context for device {}: {e}",
                    self.device()
                )
            })
        })
    }
}

impl<T: Pod> DevicePtr<T> for DeviceUvector<T> {
    fn device_ptr<'a>(
        &'a self,
        stream: &'a CudaStream,
    ) -> (cudarc::driver::sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.data().addr(), self.cudarc_guard(stream))
    }
}

impl<T: Pod> DevicePtrMut<T> for DeviceUvector<T> {
    fn device_ptr_mut<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (cudarc::driver::sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.data().addr(), self.cudarc_guard(stream))
    }
}

/// The vector's address field as the `u64` the kernel reads.
fn address_field<T: Pod>(v: &DeviceUvector<T>) -> &u64 {
    v.as_buffer().address_field()
}

// SAFETY: the argument pushed is a reference to the vector's address field (a `u64`,
// `CUdeviceptr`), borrowed for `'b`, which outlives the launch builder `'a`; the driver reads
// 8 bytes from it at launch.
unsafe impl<'a, 'b: 'a, T: Pod> PushKernelArg<&'b DeviceUvector<T>> for LaunchArgs<'a> {
    fn arg(&mut self, arg: &'b DeviceUvector<T>) -> &mut Self {
        self.arg(address_field(arg))
    }
}

// SAFETY: as above; the exclusive borrow keeps the vector from being resized or dropped while
// the builder may launch.
unsafe impl<'a, 'b: 'a, T: Pod> PushKernelArg<&'b mut DeviceUvector<T>> for LaunchArgs<'a> {
    fn arg(&mut self, arg: &'b mut DeviceUvector<T>) -> &mut Self {
        let field: &'b DeviceUvector<T> = arg;
        self.arg(address_field(field))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_special_streams_convert_safely() {
        // SAFETY: the handle is never given to the driver (rejected before any CUDA call).
        let foreign: CudaStreamView<'static> = unsafe { CudaStreamView::from_raw(0x1234 as _) };
        assert!(matches!(
            static_stream_for_cudarc(foreign, DeviceId(0)),
            Err(MrError::InvalidArgument(_))
        ));
    }

    #[test]
    fn without_a_driver_contexts_are_errors_not_panics() {
        if !rmm_sys::is_driver_present() {
            assert!(cudarc_context(DeviceId(0)).unwrap_err().is_no_device());
            assert!(
                static_stream_for_cudarc(CudaStreamView::legacy(), DeviceId(0))
                    .unwrap_err()
                    .is_no_device()
            );
        } else {
            assert!(matches!(
                cudarc_context(DeviceId(-1)),
                Err(MrError::InvalidArgument(_))
            ));
        }
    }
}
