//! GPU tests of peer access: `DeviceBuffer::copy_to_device` between two devices (both ways, and
//! to the same device), a driver pool whose memory a second device reads after
//! `set_peer_access`, and a VMM pool built with `peer_access`. Trials that need two devices
//! with peer access are ignored with the reason on one.

use libtest_mimic::{Arguments, Failed};
use rmm_containers::DeviceBuffer;
use rmm_mr::{
    CudaAsyncMemoryResource, DeviceMemoryResource, MrError, VmmPoolMemoryResource, VmmPoolOptions,
};
use rmm_stream::{CudaStream, CudaStreamView};
use rmm_sys::testing::{ensure, gpu, gpu_if};
use rmm_sys::{memory, DeviceGuard, DeviceId, DevicePtr};

const MIB: usize = 1 << 20;

fn fail(e: impl std::fmt::Display) -> Failed {
    e.to_string().into()
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn no_peer() -> Option<String> {
    match rmm_sys::device_count() {
        Ok(n) if n >= 2 => {
            let both = rmm_sys::ipc::can_access_peer(DeviceId(0), DeviceId(1)).and_then(|a| {
                rmm_sys::ipc::can_access_peer(DeviceId(1), DeviceId(0)).map(|b| a && b)
            });
            match both {
                Ok(true) => None,
                Ok(false) => Some("devices 0 and 1 have no peer access".into()),
                Err(e) => Some(e.to_string()),
            }
        }
        Ok(n) => Some(format!("needs two devices, found {n}")),
        Err(e) => Some(e.to_string()),
    }
}

/// 0 -> 1 -> 0 through `copy_to_device`, each on the destination device's own stream.
fn buffer_round_trip_across_devices() -> Result<(), Failed> {
    let data = pattern(3 * MIB + 5, 1);
    let on_0 = {
        let _g = DeviceGuard::new(DeviceId(0)).map_err(fail)?;
        DeviceBuffer::from_host(&data, CudaStreamView::default(), None).map_err(fail)?
    };
    let s1 = {
        let _g = DeviceGuard::new(DeviceId(1)).map_err(fail)?;
        std::sync::Arc::new(CudaStream::non_blocking().map_err(fail)?)
    };
    let on_1 = on_0.copy_to_device(DeviceId(1), &s1, None).map_err(fail)?;
    ensure(
        on_1.device() == DeviceId(1),
        format!("on device {}", on_1.device()),
    )?;
    ensure(on_1.size() == data.len(), "the copy's size")?;
    let back = on_1
        .copy_to_device(DeviceId(0), CudaStreamView::default(), None)
        .map_err(fail)?;
    drop(on_0);
    ensure(back.device() == DeviceId(0), "back on device 0")?;
    let got = back.to_vec(CudaStreamView::default()).map_err(fail)?;
    ensure(got == data, "the bytes survived 0 -> 1 -> 0")?;
    let got1 = on_1.to_vec(s1.view()).map_err(fail)?;
    ensure(got1 == data, "device 1 holds the bytes")
}

/// To the buffer's own device it is an ordinary copy; an empty buffer copies nothing.
fn copy_to_the_same_device() -> Result<(), Failed> {
    let data = pattern(MIB, 9);
    let a = DeviceBuffer::from_host(&data, CudaStreamView::default(), None).map_err(fail)?;
    let b = a
        .copy_to_device(a.device(), CudaStreamView::default(), None)
        .map_err(fail)?;
    ensure(b.data() != a.data(), "a new allocation")?;
    ensure(
        b.to_vec(CudaStreamView::default()).map_err(fail)? == data,
        "same bytes",
    )?;
    let empty = DeviceBuffer::new(0, CudaStreamView::default()).map_err(fail)?;
    let c = empty
        .copy_to_device(empty.device(), CudaStreamView::default(), None)
        .map_err(fail)?;
    ensure(c.is_empty(), "empty stays empty")
}

/// A kernel-free check that device 1 can use device-0 memory directly: a `cuMemcpyAsync` on a
/// stream of device 1 from `src` (device 0) into memory of device 1.
fn read_from_device_1(src: DevicePtr, bytes: usize) -> Result<Vec<u8>, Failed> {
    let _g = DeviceGuard::new(DeviceId(1)).map_err(fail)?;
    let dst = DeviceBuffer::new(bytes, CudaStreamView::default()).map_err(fail)?;
    let s = CudaStreamView::default();
    // SAFETY: both hold `bytes` bytes for the call, which synchronizes before `dst` drops.
    unsafe { memory::memcpy_async(dst.data(), src, bytes, s.as_raw()) }.map_err(fail)?;
    s.synchronize().map_err(fail)?;
    dst.to_vec(s).map_err(fail)
}

fn write_on_device_0(ptr: DevicePtr, data: &[u8]) -> Result<(), Failed> {
    let _g = DeviceGuard::new(DeviceId(0)).map_err(fail)?;
    // SAFETY: `ptr` holds `data.len()` bytes owned by the caller; the call waits.
    unsafe { memory::copy_to_device_sync(ptr, data, CudaStreamView::default().as_raw()) }
        .map_err(fail)
}

fn driver_pool_with_peer_access() -> Result<(), Failed> {
    let _g = DeviceGuard::new(DeviceId(0)).map_err(fail)?;
    let pool = CudaAsyncMemoryResource::new().map_err(fail)?;
    // The pool's own device needs no grant: skipped, not an error.
    pool.set_peer_access(&[DeviceId(0), DeviceId(1), DeviceId(1)])
        .map_err(fail)?;
    let s = CudaStreamView::default();
    let p = pool.allocate(s, 2 * MIB, 256).map_err(fail)?;
    let data = pattern(2 * MIB, 3);
    write_on_device_0(p, &data)?;
    let got = read_from_device_1(p, data.len())?;
    // SAFETY: allocated above with this size on `s`; the reads were synchronized.
    unsafe { pool.deallocate(s, p, 2 * MIB, 256) }.map_err(fail)?;
    ensure(got == data, "device 1 read the pool's bytes")
}

/// A device that does not exist cannot be granted access: an error, not a panic.
fn driver_pool_refuses_a_missing_peer() -> Result<(), Failed> {
    let pool = match CudaAsyncMemoryResource::new() {
        Ok(p) => p,
        Err(MrError::Unsupported(_)) => return Ok(()),
        Err(e) => return Err(fail(e)),
    };
    let n = rmm_sys::device_count().map_err(fail)? as i32;
    ensure(
        pool.set_peer_access(&[DeviceId(n + 7)]).is_err(),
        "an unknown device is refused",
    )
}

fn vmm_pool_with_peer_access() -> Result<(), Failed> {
    let _g = DeviceGuard::new(DeviceId(0)).map_err(fail)?;
    let pool = VmmPoolMemoryResource::with_options(
        VmmPoolOptions::new(64 * MIB).peer_access([DeviceId(1)]),
    )
    .map_err(fail)?;
    let s = CudaStreamView::default();
    let p = pool.allocate(s, 3 * MIB, 256).map_err(fail)?;
    let data = pattern(3 * MIB, 5);
    write_on_device_0(p, &data)?;
    let got = read_from_device_1(p, data.len())?;
    // SAFETY: allocated above with this size on `s`; the reads were synchronized.
    unsafe { pool.deallocate(s, p, 3 * MIB, 256) }.map_err(fail)?;
    ensure(got == data, "device 1 read the VMM pool's bytes")
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        gpu_if(
            "peer/buffer_round_trip_across_devices",
            no_peer,
            buffer_round_trip_across_devices,
        ),
        gpu("peer/copy_to_the_same_device", copy_to_the_same_device),
        gpu_if(
            "peer/driver_pool_with_peer_access",
            || rmm_sys::testing::no_pools().or_else(no_peer),
            driver_pool_with_peer_access,
        ),
        gpu(
            "peer/driver_pool_refuses_a_missing_peer",
            driver_pool_refuses_a_missing_peer,
        ),
        gpu_if(
            "peer/vmm_pool_with_peer_access",
            || rmm_sys::testing::no_vmm().or_else(no_peer),
            vmm_pool_with_peer_access,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
