//! GPU tests of the containers: RMM's `device_buffer`, `device_uvector`, `device_scalar` and
//! container multi-device tests (section 3.3 of the reference), run for several resources,
//! plus the default-resource replacement, the drop-error record, the pool helper, the ordering
//! of methods given another stream than the container's (`cross_stream::*`) and (feature
//! `cudarc`) cudarc interop. Without a GPU every trial reports itself ignored, with the reason;
//! multi-device trials need 2 GPUs. GPU tests change process-wide state (current device,
//! current resource), so the runner uses one test thread.

use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytemuck::Pod;
use libtest_mimic::{Arguments, Completion, Failed, Trial};
use rmm_containers::interop::{configure_device_default_pool, device_pool_state};
use rmm_containers::{take_drop_errors, BufferStream, DeviceBuffer, DeviceScalar, DeviceUvector};
use rmm_mr::{
    reset_current_device_resource, set_current_device_resource, CallbackMemoryResource,
    CudaAsyncMemoryResource, CudaMemoryResource, DeviceMemoryResource, ManagedMemoryResource,
    MrError, MrResult, PoolMemoryResource, PoolOptions, SharedResource,
};
use rmm_stream::{CudaStream, CudaStreamView};
use rmm_sys::testing::{done, ensure, gpu_outcome as gpu, no_pools, Outcome};
use rmm_sys::{DeviceId, DevicePtr};

fn two_gpus(name: impl Into<String>, f: impl FnOnce() -> Outcome + Send + 'static) -> Trial {
    gpu(name, move || {
        if rmm_sys::device_count()? < 2 {
            return Ok(Completion::ignored_with("needs 2 GPUs"));
        }
        f()
    })
}

// --- subjects ------------------------------------------------------------------------------

/// A resource the container suites run on.
#[derive(Clone, Copy)]
struct Subject {
    name: &'static str,
    make: fn() -> MrResult<SharedResource>,
    /// Why it cannot run here (after the GPU check).
    unsupported: fn() -> Option<String>,
}

const SUBJECTS: [Subject; 3] = [
    Subject {
        name: "cuda",
        make: || Ok(Arc::new(CudaMemoryResource::new())),
        unsupported: || None,
    },
    Subject {
        name: "managed",
        make: || Ok(Arc::new(ManagedMemoryResource::new())),
        unsupported: || None,
    },
    Subject {
        name: "cuda_async",
        make: || Ok(Arc::new(CudaAsyncMemoryResource::new()?)),
        unsupported: no_pools,
    },
];

/// A test body given a resource.
type Body = fn(SharedResource) -> Outcome;

fn with_subject(prefix: &str, s: Subject, case: &str, body: Body) -> Trial {
    gpu(format!("{prefix}::{}::{case}", s.name), move || {
        if let Some(why) = (s.unsupported)() {
            return Ok(Completion::ignored_with(format!("unsupported here: {why}")));
        }
        body((s.make)()?)
    })
}

// --- helpers -------------------------------------------------------------------------------

/// Deterministic pseudo-random numbers (RMM draws buffer sizes from [1000, 100000]).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
    fn size(&mut self) -> usize {
        1000 + (self.next() % 99_001) as usize
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn sync() -> Result<(), Failed> {
    CudaStreamView::default().synchronize()?;
    Ok(())
}

/// One call a recording resource saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Event {
    free: bool,
    ptr: u64,
    bytes: usize,
    stream: usize,
    device: i32,
}

type Log = Arc<Mutex<Vec<Event>>>;

/// Wraps `upstream` in a callback resource that records every call, with the device current at
/// the call (RMM's `device_check_resource_adaptor`, but recording).
fn recording(upstream: SharedResource) -> (SharedResource, Log) {
    let log: Log = Arc::default();
    let (la, ld) = (Arc::clone(&log), Arc::clone(&log));
    let (ua, ud) = (Arc::clone(&upstream), upstream);
    let device = || rmm_sys::current_device().map(|d| d.value()).unwrap_or(-99);
    let alloc = move |bytes: usize, stream: rmm_stream::CudaStreamView<'_>| {
        let p = ua.allocate(stream, bytes, 256)?;
        la.lock().unwrap().push(Event {
            free: false,
            ptr: p.addr(),
            bytes,
            stream: stream.value() as usize,
            device: device(),
        });
        Ok(p)
    };
    let free =
        move |ptr: rmm_sys::DevicePtr, bytes: usize, stream: rmm_stream::CudaStreamView<'_>| {
            ld.lock().unwrap().push(Event {
                free: true,
                ptr: ptr.addr(),
                bytes,
                stream: stream.value() as usize,
                device: device(),
            });
            // SAFETY: the containers free what they allocated through this resource.
            unsafe { ud.deallocate(stream, ptr, bytes, 256) }
        };
    // SAFETY: the closures forward to `upstream`, a resource that keeps the contract.
    let mr = unsafe { CallbackMemoryResource::new(alloc, free) };
    (Arc::new(mr), log)
}

fn events(log: &Log) -> Vec<Event> {
    log.lock().unwrap().clone()
}

/// Puts the initial resource back for the current device when dropped.
struct ResetResource;

impl Drop for ResetResource {
    fn drop(&mut self) {
        let _ = reset_current_device_resource();
    }
}

/// Makes device 0 current again when dropped.
struct BackToDevice0;

impl Drop for BackToDevice0 {
    fn drop(&mut self) {
        let _ = rmm_sys::set_current_device(DeviceId(0));
    }
}

// --- device_buffer (device_buffer_tests.cu) ------------------------------------------------

fn buffer_empty(mr: SharedResource) -> Outcome {
    let b = DeviceBuffer::new_in(0, CudaStreamView::default(), Arc::clone(&mr))?;
    ensure(b.data().is_null(), "empty buffer has data")?;
    ensure(
        b.size() == 0 && b.capacity() == 0 && b.is_empty(),
        "empty sizes",
    )?;
    ensure(
        b.memory_resource().is_equal(&*mr),
        "explicit resource not kept",
    )?;
    ensure(b.stream() == CudaStreamView::default(), "default stream")?;
    ensure(b.alignment() == 256, "default alignment")?;
    ensure(b.to_vec(b.stream())?.is_empty(), "empty contents")?;
    let d = DeviceBuffer::new(0, CudaStreamView::default())?;
    ensure(
        d.memory_resource()
            .is_equal(&*rmm_mr::current_device_resource()?),
        "default resource is not the current one",
    )?;
    ensure(d.device() == rmm_sys::current_device()?, "device")?;
    done()
}

fn buffer_resources_and_streams(mr: SharedResource) -> Outcome {
    let mut rng = Lcg(1);
    let n = rng.size();
    let b = DeviceBuffer::new(n, CudaStreamView::default())?;
    ensure(
        !b.data().is_null() && b.size() == n && b.capacity() == n,
        "sizes",
    )?;
    ensure(b.data().is_aligned(256), "256-byte alignment")?;
    ensure(
        b.memory_resource()
            .is_equal(&*rmm_mr::current_device_resource()?),
        "default resource",
    )?;
    let stream = Arc::new(CudaStream::non_blocking()?);
    let e = DeviceBuffer::new_in(n, &stream, Arc::clone(&mr))?;
    ensure(e.stream() == stream.view(), "explicit stream not recorded")?;
    ensure(e.memory_resource().is_equal(&*mr), "explicit resource")?;
    ensure(
        e.buffer_stream().as_shared().is_some(),
        "owned stream not shared",
    )?;
    done()
}

fn buffer_on_a_stream_pool_stream(mr: SharedResource) -> Outcome {
    let pool = rmm_stream::CudaStreamPool::new(2, rmm_stream::StreamFlags::NonBlocking)?;
    let src = pattern(Lcg(9).size(), 3);
    let b = DeviceBuffer::from_host(&src, pool.get_shared_stream(), Some(mr))?;
    ensure(
        b.stream() == pool.get_stream_by_id(0),
        "not the pool's stream",
    )?;
    // The buffer keeps its stream alive after the pool is gone, and frees on it when dropped.
    drop(pool);
    let s = b.buffer_stream().clone();
    ensure(
        b.to_vec(s.view())? == src,
        "contents after the pool was dropped",
    )?;
    drop(b);
    s.view().synchronize()?;
    done()
}

fn buffer_host_round_trip(mr: SharedResource) -> Outcome {
    let s = CudaStreamView::default();
    let src = pattern(Lcg(2).size(), 7);
    let mut b = DeviceBuffer::from_host(&src, s, Some(mr))?;
    ensure(b.size() == src.len() && b.capacity() == src.len(), "sizes")?;
    ensure(b.to_vec(s)? == src, "contents after from_host")?;
    let part = pattern(100, 99);
    b.copy_from_host(&part, s)?;
    let mut head = vec![0u8; 150];
    b.copy_to_host(&mut head, s)?;
    ensure(
        head[..100] == part[..] && head[100..] == src[100..150],
        "partial copies",
    )?;
    ensure(
        matches!(
            b.copy_to_host(&mut vec![0; src.len() + 1], s),
            Err(MrError::OutOfRange(_))
        ),
        "oversized destination",
    )?;
    done()
}

fn buffer_copy_from_device_pointer(mr: SharedResource) -> Outcome {
    let s = CudaStreamView::default();
    let src = pattern(Lcg(3).size(), 1);
    let a = DeviceBuffer::from_host(&src, s, Some(Arc::clone(&mr)))?;
    // SAFETY: `a` holds `src.len()` bytes and outlives the copy (synchronized below).
    let b = unsafe { DeviceBuffer::from_device(a.data(), a.size(), s, Some(Arc::clone(&mr)))? };
    // SAFETY: as above.
    let c = unsafe {
        DeviceBuffer::from_device_aligned(a.data(), a.size(), 128, s, Some(Arc::clone(&mr)))?
    };
    // A host pointer through the same constructor (cudaMemcpyDefault infers the direction).
    // SAFETY: `src` lives until the synchronize below.
    let h = unsafe {
        DeviceBuffer::from_device(
            DevicePtr::from_host_ptr(src.as_ptr().cast_mut()),
            src.len(),
            s,
            Some(mr),
        )?
    };
    sync()?;
    ensure(b.data() != a.data(), "copy shares storage")?;
    ensure(b.to_vec(s)? == src, "device copy contents")?;
    ensure(c.alignment() == 128 && c.to_vec(s)? == src, "aligned copy")?;
    ensure(h.to_vec(s)? == src, "host-pointer copy contents")?;
    done()
}

fn buffer_copy_from_null(mr: SharedResource) -> Outcome {
    let (rec, log) = recording(mr);
    // SAFETY: a null source with size 0 is never read.
    let e = unsafe {
        DeviceBuffer::from_device(
            DevicePtr::NULL,
            0,
            CudaStreamView::default(),
            Some(Arc::clone(&rec)),
        )?
    };
    ensure(e.data().is_null() && e.size() == 0, "null, 0")?;
    // SAFETY: rejected before any copy.
    let r = unsafe {
        DeviceBuffer::from_device(DevicePtr::NULL, 16, CudaStreamView::default(), Some(rec))
    };
    ensure(
        matches!(r, Err(MrError::InvalidArgument(_))),
        format!("null, 16: {r:?}"),
    )?;
    ensure(events(&log).is_empty(), "a rejected copy allocated")?;
    done()
}

fn buffer_clone(mr: SharedResource) -> Outcome {
    let s = CudaStreamView::default();
    let n = Lcg(4).size();
    let src = pattern(n, 3);
    let mut a = DeviceBuffer::from_host_aligned(&src, 128, s, Some(Arc::clone(&mr)))?;
    a.resize(n / 2, s)?;
    ensure(a.capacity() == n, "resize smaller reallocated")?;
    let other: SharedResource = Arc::new(CudaMemoryResource::new());
    let b = a.try_clone_on(s, Some(Arc::clone(&other)))?;
    sync()?;
    ensure(
        b.size() == n / 2 && b.capacity() == n / 2,
        "copy capacity is the source size",
    )?;
    ensure(b.alignment() == 128, "copy keeps the alignment")?;
    ensure(
        b.memory_resource().is_equal(&*other),
        "copy uses the given resource",
    )?;
    ensure(b.data() != a.data(), "copy shares storage")?;
    ensure(b.to_vec(s)? == src[..n / 2], "copy contents")?;
    let c = a.try_clone_on(BufferStream::legacy(), None)?;
    ensure(
        c.memory_resource()
            .is_equal(&*rmm_mr::current_device_resource()?),
        "default copy resource",
    )?;
    ensure(c.stream() == CudaStreamView::legacy(), "copy stream")?;
    ensure(
        c.to_vec(CudaStreamView::legacy())? == src[..n / 2],
        "default copy contents",
    )?;
    done()
}

fn buffer_resize_reserve_shrink(mr: SharedResource) -> Outcome {
    let s = CudaStreamView::default();
    let n = Lcg(5).size();
    let src = pattern(n, 5);
    let mut b = DeviceBuffer::from_host(&src, s, Some(mr))?;
    let p = b.data();
    b.resize(n / 2, s)?;
    ensure(
        b.data() == p && b.size() == n / 2 && b.capacity() == n,
        "resize smaller",
    )?;
    b.reserve(n / 4, s)?;
    ensure(b.data() == p && b.capacity() == n, "reserve smaller")?;
    b.resize(2 * n, s)?;
    ensure(
        b.size() == 2 * n && b.capacity() == 2 * n,
        "resize bigger sizes",
    )?;
    // Only the first n / 2 bytes were ever written: reading the rest would read uninitialized
    // device memory (compute-sanitizer's initcheck reports it).
    let mut kept = vec![0u8; n / 2];
    b.copy_to_host(&mut kept, s)?;
    ensure(kept == src[..n / 2], "resize bigger lost contents")?;
    b.resize(n / 2, s)?;
    b.reserve(3 * n, s)?;
    ensure(
        b.size() == n / 2 && b.capacity() == 3 * n,
        "reserve bigger sizes",
    )?;
    ensure(b.to_vec(s)? == src[..n / 2], "reserve bigger lost contents")?;
    b.shrink_to_fit(s)?;
    ensure(b.capacity() == n / 2 && b.size() == n / 2, "shrink sizes")?;
    ensure(b.to_vec(s)? == src[..n / 2], "shrink lost contents")?;
    b.resize(0, s)?;
    ensure(
        b.capacity() == n / 2 && b.is_empty(),
        "resize to 0 keeps capacity",
    )?;
    b.shrink_to_fit(s)?;
    ensure(
        b.data().is_null() && b.capacity() == 0,
        "shrink of empty frees",
    )?;
    b.resize(1000, s)?;
    ensure(
        b.capacity() == 1000 && !b.data().is_null(),
        "empty buffer resize larger",
    )?;
    done()
}

fn buffer_stream_recording(mr: SharedResource) -> Outcome {
    let (rec, log) = recording(mr);
    let stream = Arc::new(CudaStream::with_default_flags()?);
    let handle = stream.value() as usize;
    let n = Lcg(6).size();
    let mut b = DeviceBuffer::new_in(n, CudaStreamView::default(), rec)?;
    b.set_stream(&stream)?;
    ensure(b.stream() == stream.view(), "set_stream")?;
    b.resize(n / 2, BufferStream::legacy())?;
    ensure(
        b.stream() == CudaStreamView::legacy(),
        "resize records its stream",
    )?;
    b.reserve(n / 4, &stream)?;
    ensure(b.stream() == stream.view(), "reserve records its stream")?;
    // The buffer keeps the stream alive after the test lets go of it.
    drop(stream);
    drop(b);
    let ev = events(&log);
    let free = ev.iter().find(|e| e.free).ok_or("no free")?;
    ensure(
        free.bytes == n,
        format!("freed {} bytes, capacity {n}", free.bytes),
    )?;
    ensure(
        free.stream == handle,
        "not freed on the last recorded stream",
    )?;
    ensure(free.ptr == ev[0].ptr, "freed another pointer")?;
    done()
}

fn buffer_alignment(mr: SharedResource) -> Outcome {
    let s = CudaStreamView::default();
    let a = DeviceBuffer::with_alignment(1000, 64, s, Some(Arc::clone(&mr)))?;
    ensure(a.alignment() == 64 && a.data().is_aligned(64), "64")?;
    for bad in [0usize, 3] {
        let r = DeviceBuffer::with_alignment(1000, bad, s, Some(Arc::clone(&mr)));
        ensure(
            matches!(r, Err(MrError::InvalidArgument(_))),
            format!("alignment {bad}: {r:?}"),
        )?;
    }
    let r = DeviceBuffer::with_alignment(1000, 512, s, Some(Arc::clone(&mr)));
    ensure(
        matches!(r, Err(MrError::BadAlloc { .. })),
        format!("alignment 512: {r:?}"),
    )?;
    let e = DeviceBuffer::with_alignment(0, 512, s, Some(Arc::clone(&mr)))?;
    ensure(
        e.alignment() == 512 && e.data().is_null(),
        "empty buffer with 512",
    )?;
    let src = pattern(100, 0);
    let r = DeviceBuffer::from_host_aligned(&src, 512, s, Some(Arc::clone(&mr)));
    ensure(
        matches!(r, Err(MrError::BadAlloc { .. })),
        "copy with alignment 512",
    )?;
    let r = DeviceBuffer::from_host_aligned(&src, 3, s, Some(mr));
    ensure(
        matches!(r, Err(MrError::InvalidArgument(_))),
        "copy with alignment 3",
    )?;
    done()
}

// --- device_uvector (device_uvector_tests.cpp) ----------------------------------------------

fn value<T: Pod>(i: usize) -> T {
    let mut v = T::zeroed();
    for (k, b) in bytemuck::bytes_of_mut(&mut v).iter_mut().enumerate() {
        *b = (i.wrapping_mul(7) + k * 13 + 1) as u8;
    }
    v
}

fn same<T: Pod>(a: &[T], b: &[T]) -> bool {
    bytemuck::cast_slice::<T, u8>(a) == bytemuck::cast_slice::<T, u8>(b)
}

fn values<T: Pod>(n: usize) -> Vec<T> {
    (0..n).map(value).collect()
}

fn uvector_basics<T: Pod>(mr: SharedResource) -> Outcome {
    let s = CudaStreamView::default();
    let z = DeviceUvector::<T>::new_in(0, s, Arc::clone(&mr))?;
    ensure(
        z.is_empty() && z.capacity() == 0 && z.data().is_null(),
        "zero size",
    )?;
    ensure(z.memory_resource().is_equal(&*mr), "memory resource")?;
    let n = Lcg(7).size();
    let v = DeviceUvector::<T>::new_in(n, s, Arc::clone(&mr))?;
    ensure(
        v.len() == n && v.size() == n && v.capacity() == n && !v.data().is_null(),
        "sizes",
    )?;
    ensure(
        v.as_buffer().alignment() == std::mem::align_of::<T>(),
        "element alignment",
    )?;
    let host = values::<T>(n);
    let a = DeviceUvector::from_slice(&host, s, Some(Arc::clone(&mr)))?;
    ensure(same(&a.to_vec(s)?, &host), "from_slice/to_vec")?;
    let b = a.try_clone_on(s, Some(Arc::clone(&mr)))?;
    ensure(b.data() != a.data() && same(&b.to_vec(s)?, &host), "copy")?;
    // Pointers (element_ptr, iterators, reverse iterators).
    let sz = std::mem::size_of::<T>() as u64;
    for i in [0, 1, n / 2, n - 1] {
        ensure(
            a.element_ptr(i)?.addr() == a.data().addr() + i as u64 * sz,
            "element_ptr",
        )?;
    }
    ensure(
        a.end_ptr().addr() - a.begin_ptr().addr() == n as u64 * sz,
        "begin/end",
    )?;
    ensure(a.element_ptrs().len() == n, "iterator length")?;
    ensure(
        a.element_ptrs().next_back() == Some(a.element_ptr(n - 1)?),
        "reverse iterator",
    )?;
    done()
}

fn uvector_resizing<T: Pod>(mr: SharedResource) -> Outcome {
    let s = CudaStreamView::default();
    let n = Lcg(8).size();
    let host = values::<T>(n);
    let mut v = DeviceUvector::from_slice(&host, s, Some(Arc::clone(&mr)))?;
    let p = v.data();
    v.resize(n / 2, s)?;
    ensure(
        v.data() == p && v.len() == n / 2 && v.capacity() == n,
        "resize smaller",
    )?;
    ensure(
        same(&v.to_vec(s)?, &host[..n / 2]),
        "resize smaller contents",
    )?;
    v.resize(2 * n, s)?;
    ensure(v.len() == 2 * n && v.capacity() == 2 * n, "resize larger")?;
    {
        // Only the first n / 2 elements were written (the rest of a grown vector is
        // uninitialized; initcheck reports reading it).
        let mut kept = vec![<T as bytemuck::Zeroable>::zeroed(); n / 2];
        v.copy_to_host(&mut kept, s)?;
        ensure(same(&kept, &host[..n / 2]), "resize larger contents")?;
    }
    // Write every element, so that the reallocation below copies only written memory
    // (copying a grown vector's uninitialized tail is allowed, but initcheck reports it).
    let whole = values::<T>(2 * n);
    v.copy_from_host(&whole, s)?;
    v.reserve(n, s)?;
    ensure(v.capacity() == 2 * n, "reserve smaller")?;
    v.reserve(3 * n, s)?;
    ensure(v.capacity() == 3 * n && v.len() == 2 * n, "reserve larger")?;
    ensure(same(&v.to_vec(s)?, &whole), "reserve contents")?;
    v.resize(0, s)?;
    ensure(
        v.is_empty() && v.capacity() == 3 * n,
        "resize to zero keeps capacity",
    )?;
    v.shrink_to_fit(s)?;
    ensure(v.capacity() == 0 && v.data().is_null(), "shrink to zero")?;
    // release() hands over the buffer.
    let w = DeviceUvector::from_slice(&host, s, Some(mr))?;
    let (data, bytes) = (w.data(), w.len() * std::mem::size_of::<T>());
    let buf = w.release();
    ensure(buf.data() == data && buf.size() == bytes, "release")?;
    ensure(
        buf.to_vec(s)? == bytemuck::cast_slice::<T, u8>(&host),
        "released contents",
    )?;
    done()
}

fn uvector_elements<T: Pod>(mr: SharedResource) -> Outcome {
    let s = CudaStreamView::default();
    let n = 1000;
    let mut v = DeviceUvector::<T>::new_in(n, s, Arc::clone(&mr))?;
    for i in [0, 1, n / 2, n - 1] {
        let x = value::<T>(i + 3);
        v.set_element(i, x, s)?;
        ensure(
            same(&[v.element(i, s)?], &[x]),
            format!("get/set element {i}"),
        )?;
    }
    let x = value::<T>(77);
    v.set_element_async(5, &x, s)?;
    s.synchronize()?;
    ensure(same(&[v.element(5, s)?], &[x]), "async set")?;
    v.set_element_to_zero_async(5, s)?;
    ensure(same(&[v.element(5, s)?], &[T::zeroed()]), "set to zero")?;
    let (f, b) = (value::<T>(1), value::<T>(2));
    v.set_element(0, f, s)?;
    v.set_element(n - 1, b, s)?;
    ensure(same(&[v.front_element(s)?], &[f]), "front")?;
    ensure(same(&[v.back_element(s)?], &[b]), "back")?;
    let oob = MrError::OutOfRange("Attempt to access out of bounds element.".into());
    ensure(v.element(n, s).err() == Some(oob.clone()), "OOB get")?;
    ensure(v.set_element(n, f, s).err() == Some(oob.clone()), "OOB set")?;
    ensure(
        v.set_element_async(n + 10, &f, s).err() == Some(oob),
        "OOB async set",
    )?;
    // Streams.
    let stream = Arc::new(CudaStream::non_blocking()?);
    let mut w = DeviceUvector::<T>::new_in(10, &stream, mr)?;
    ensure(w.stream() == stream.view(), "stream")?;
    w.set_stream(CudaStreamView::legacy())?;
    ensure(w.stream() == CudaStreamView::legacy(), "set_stream")?;
    done()
}

fn negative_zero() -> Outcome {
    let s = CudaStreamView::default();
    let mut f = DeviceUvector::<f32>::new(4, s)?;
    f.set_element(1, -0.0, s)?;
    ensure(
        f.element(1, s)?.to_bits() == (-0.0f32).to_bits(),
        "f32 -0.0 lost",
    )?;
    f.set_element_async(2, &-0.0, s)?;
    ensure(
        f.element(2, s)?.to_bits() == (-0.0f32).to_bits(),
        "f32 async -0.0 lost",
    )?;
    let mut d = DeviceUvector::<f64>::from_slice(&[1.0, -0.0], s, None)?;
    ensure(
        d.element(1, s)?.to_bits() == (-0.0f64).to_bits(),
        "f64 -0.0 lost",
    )?;
    d.set_element(0, -0.0, s)?;
    ensure(
        d.to_vec(s)?
            .iter()
            .all(|x| x.to_bits() == (-0.0f64).to_bits()),
        "f64 set -0.0",
    )?;
    done()
}

fn uvector_overflow() -> Outcome {
    let s = CudaStreamView::default();
    let r = DeviceUvector::<u64>::new(usize::MAX / 4, s);
    ensure(matches!(r, Err(MrError::InvalidArgument(_))), "constructor")?;
    let mut v = DeviceUvector::<u32>::new(10, s)?;
    ensure(
        matches!(
            v.reserve(usize::MAX / 2, s),
            Err(MrError::InvalidArgument(_))
        ),
        "reserve",
    )?;
    ensure(
        matches!(
            v.resize(usize::MAX / 2, s),
            Err(MrError::InvalidArgument(_))
        ),
        "resize",
    )?;
    ensure(
        v.len() == 10 && v.capacity() == 10,
        "failed calls changed the vector",
    )?;
    done()
}

#[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
#[repr(C, align(512))]
struct OverAligned([u8; 512]);

#[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
#[repr(C, align(16))]
struct SmallAligned([u8; 16]);

fn alignment_of_elements() -> Outcome {
    let s = CudaStreamView::default();
    let v = DeviceUvector::<SmallAligned>::new(10, s)?;
    ensure(v.data().is_aligned(16), "small alignment")?;
    let r = DeviceUvector::<OverAligned>::new(1, s);
    ensure(
        matches!(r, Err(MrError::BadAlloc { .. })),
        "uvector over-aligned",
    )?;
    let r = DeviceScalar::<OverAligned>::new(s, None);
    ensure(
        matches!(r, Err(MrError::BadAlloc { .. })),
        "scalar over-aligned",
    )?;
    let e = DeviceUvector::<OverAligned>::new(0, s)?;
    ensure(e.is_empty(), "empty over-aligned vector")?;
    let sc = DeviceScalar::<SmallAligned>::new(s, None)?;
    ensure(sc.data().is_aligned(16), "scalar small alignment")?;
    done()
}

// --- device_scalar (device_scalar_tests.cpp) ------------------------------------------------

fn scalar_suite<T: Pod + Debug>(mr: SharedResource) -> Outcome {
    let s = CudaStreamView::default();
    let u = DeviceScalar::<T>::new(s, Some(Arc::clone(&mr)))?;
    // Its value is unwritten: reading it is allowed (any bytes are a `T`) but initcheck
    // reports it, so the test does not.
    ensure(!u.data().is_null() && u.size() == 1, "uninitialized")?;
    let x = value::<T>(11);
    let a = DeviceScalar::with_value(x, s, Some(Arc::clone(&mr)))?;
    ensure(same(&[a.value(s)?], &[x]), "initial value")?;
    let b = a.try_clone_on(s, Some(Arc::clone(&mr)))?;
    ensure(b.data() != a.data() && same(&[b.value(s)?], &[x]), "copy")?;
    let mut c = DeviceScalar::<T>::new(s, Some(Arc::clone(&mr)))?;
    let y = value::<T>(12);
    c.set_value_async(&y, s)?;
    ensure(same(&[c.value(s)?], &[y]), "set value")?;
    c.set_value_to_zero_async(s)?;
    ensure(same(&[c.value(s)?], &[T::zeroed()]), "set to zero")?;
    let stream = Arc::new(CudaStream::non_blocking()?);
    let mut d = DeviceScalar::with_value(x, &stream, Some(mr))?;
    ensure(d.stream() == stream.view(), "stream")?;
    ensure(same(&[d.value(stream.view())?], &[x]), "value on a stream")?;
    d.set_stream(CudaStreamView::legacy())?;
    ensure(d.stream() == CudaStreamView::legacy(), "set_stream")?;
    done()
}

// --- foreign streams: methods given another stream than the container's ---------------------
//
// Stream A (the container's) is stalled by a host function with a write queued behind the
// stall; the method under test then runs on stream B. Without the ordering the containers add,
// B's work runs at once, while A's write is still pending, and the bytes checked afterwards are
// the wrong ones. The checks compare every byte; no timing is asserted (the stall only makes a
// missing ordering certain to show).

/// How long a stream is stalled so that work queued behind the stall is still pending while
/// the test enqueues work on the other stream.
const STALL: Duration = Duration::from_millis(150);
/// The size of the containers these trials use.
const CROSS_BYTES: usize = 1 << 20;

/// Queues a memset of `bytes` bytes at `ptr` to `byte` on `s` (no stall).
fn fill_now(ptr: DevicePtr, bytes: usize, byte: u8, s: &BufferStream) -> Result<(), Failed> {
    // SAFETY: the callers pass the memory of a live container holding at least `bytes` bytes,
    // which it frees on `s` after this memset or on a stream the containers order after `s`.
    unsafe { rmm_sys::memory::memset_d8_async(ptr, byte, bytes, s.view().as_raw())? };
    Ok(())
}

/// Stalls `s`, then queues behind the stall a memset of `bytes` bytes at `ptr` to `byte`.
fn fill_behind_stall(
    ptr: DevicePtr,
    bytes: usize,
    byte: u8,
    s: &BufferStream,
) -> Result<(), Failed> {
    rmm_stream::stall(s.view(), STALL)?;
    fill_now(ptr, bytes, byte, s)
}

/// `got == want`, naming the first differing byte.
fn expect_bytes(got: &[u8], want: &[u8], what: &str) -> Result<(), Failed> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} bytes, expected {}", got.len(), want.len()).into());
    }
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: byte {i} of {} is {:#04x}, expected {:#04x}",
            got.len(),
            got[i],
            want[i]
        )
        .into()),
    }
}

fn expect_words(got: &[u32], want: &[u32], what: &str) -> Result<(), Failed> {
    expect_bytes(bytemuck::cast_slice(got), bytemuck::cast_slice(want), what)
}

fn word(byte: u8) -> u32 {
    u32::from_ne_bytes([byte; 4])
}

/// Which stream one side of a cross-stream trial uses.
#[derive(Clone, Copy, Debug)]
enum Side {
    /// A new non-blocking stream (no implicit synchronization with any other).
    Owned,
    /// Handle 0: the legacy or the per-thread default stream, by the process's mode.
    Default,
    Legacy,
    PerThread,
}

impl Side {
    fn make(self) -> MrResult<BufferStream> {
        Ok(match self {
            Side::Owned => BufferStream::shared(Arc::new(CudaStream::non_blocking()?)),
            Side::Default => BufferStream::default_stream(),
            Side::Legacy => BufferStream::legacy(),
            Side::PerThread => BufferStream::per_thread(),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Side::Owned => "owned",
            Side::Default => "default",
            Side::Legacy => "legacy",
            Side::PerThread => "per_thread",
        }
    }
}

/// (A, B) pairs: one side is always a non-blocking stream, so the pair never synchronizes
/// implicitly (the legacy stream does with blocking streams, the per-thread one with legacy).
const PAIRS: [(Side, Side); 6] = [
    (Side::Owned, Side::Owned),
    (Side::Owned, Side::Legacy),
    (Side::Owned, Side::PerThread),
    (Side::Default, Side::Owned),
    (Side::Legacy, Side::Owned),
    (Side::PerThread, Side::Owned),
];

/// A cross-stream test body: a resource, the container's stream A and the other stream B.
type CrossBody = fn(SharedResource, BufferStream, BufferStream) -> Outcome;

fn cross_trial(s: Subject, (a, b): (Side, Side), case: &str, body: CrossBody) -> Trial {
    gpu(
        format!(
            "cross_stream::{}::{}_to_{}::{case}",
            s.name,
            a.name(),
            b.name()
        ),
        move || {
            if let Some(why) = (s.unsupported)() {
                return Ok(Completion::ignored_with(format!("unsupported here: {why}")));
            }
            body((s.make)()?, a.make()?, b.make()?)
        },
    )
}

const CROSS_CASES: [(&str, CrossBody); 11] = [
    ("CopyToHost", cross_copy_to_host),
    ("CopyFromHost", cross_copy_from_host),
    ("TryCloneOn", cross_try_clone_on),
    ("ResizeLarger", cross_resize_larger),
    ("ResizeWithinCapacity", cross_resize_within_capacity),
    ("Reserve", cross_reserve),
    ("ShrinkToFit", cross_shrink_to_fit),
    ("SetStream", cross_set_stream),
    ("UvectorElements", cross_uvector_elements),
    ("UvectorBulk", cross_uvector_bulk),
    ("Scalar", cross_scalar),
];

fn cross_copy_to_host(mr: SharedResource, a: BufferStream, b: BufferStream) -> Outcome {
    let n = CROSS_BYTES;
    let buf = DeviceBuffer::from_host(&pattern(n, 3), &a, Some(mr))?;
    fill_behind_stall(buf.data(), n, 0xa1, &a)?;
    expect_bytes(
        &buf.to_vec(b.view())?,
        &vec![0xa1; n],
        "to_vec on B while A's write was pending",
    )?;
    fill_behind_stall(buf.data(), n, 0xa2, &a)?;
    let mut head = vec![0u8; 1000];
    buf.copy_to_host(&mut head, b.view())?;
    expect_bytes(
        &head,
        &[0xa2; 1000],
        "copy_to_host on B while A's write was pending",
    )?;
    done()
}

fn cross_copy_from_host(mr: SharedResource, a: BufferStream, b: BufferStream) -> Outcome {
    let n = CROSS_BYTES;
    let mut buf = DeviceBuffer::from_host(&pattern(n, 3), &a, Some(mr))?;
    fill_behind_stall(buf.data(), n, 0xa1, &a)?;
    let new = pattern(n / 2, 9);
    buf.copy_from_host(&new, b.view())?;
    let mut want = vec![0xa1; n];
    want[..n / 2].copy_from_slice(&new);
    expect_bytes(
        &buf.to_vec(a.view())?,
        &want,
        "copy_from_host on B ordered after A's pending write",
    )?;
    done()
}

fn cross_try_clone_on(mr: SharedResource, a: BufferStream, b: BufferStream) -> Outcome {
    let n = CROSS_BYTES;
    let buf = DeviceBuffer::from_host(&pattern(n, 3), &a, Some(Arc::clone(&mr)))?;
    // The copy on B waits for A's pending write.
    fill_behind_stall(buf.data(), n, 0xa1, &a)?;
    let copy = buf.try_clone_on(&b, Some(Arc::clone(&mr)))?;
    ensure(copy.stream() == b.view(), "the copy is not on B")?;
    expect_bytes(
        &copy.to_vec(b.view())?,
        &vec![0xa1; n],
        "copy on B of a buffer A was still writing",
    )?;
    // A's later work waits for the copy on B.
    rmm_stream::stall(b.view(), STALL)?;
    let second = buf.try_clone_on(&b, Some(mr))?;
    fill_now(buf.data(), n, 0xa2, &a)?;
    expect_bytes(
        &second.to_vec(b.view())?,
        &vec![0xa1; n],
        "A overwrote the source before the copy on B read it",
    )?;
    expect_bytes(&buf.to_vec(a.view())?, &vec![0xa2; n], "A's own write")?;
    done()
}

fn cross_resize_larger(mr: SharedResource, a: BufferStream, b: BufferStream) -> Outcome {
    let n = CROSS_BYTES;
    let mut buf = DeviceBuffer::from_host(&pattern(n, 3), &a, Some(mr))?;
    fill_behind_stall(buf.data(), n, 0xa1, &a)?;
    buf.resize(2 * n, &b)?;
    ensure(
        buf.stream() == b.view() && buf.capacity() == 2 * n,
        "resize did not record B or reallocate",
    )?;
    let mut kept = vec![0u8; n];
    buf.copy_to_host(&mut kept, b.view())?;
    expect_bytes(
        &kept,
        &vec![0xa1; n],
        "reallocation on B copied before A's pending write",
    )?;
    done()
}

fn cross_resize_within_capacity(mr: SharedResource, a: BufferStream, b: BufferStream) -> Outcome {
    let n = CROSS_BYTES;
    let mut buf = DeviceBuffer::from_host(&pattern(n, 3), &a, Some(mr))?;
    let p = buf.data();
    fill_behind_stall(p, n, 0xa1, &a)?;
    buf.resize(n / 2, &b)?;
    ensure(
        buf.stream() == b.view() && buf.data() == p && buf.capacity() == n,
        "resize within the capacity reallocated or did not record B",
    )?;
    expect_bytes(
        &buf.to_vec(b.view())?,
        &vec![0xa1; n / 2],
        "B recorded before A's pending write",
    )?;
    done()
}

fn cross_reserve(mr: SharedResource, a: BufferStream, b: BufferStream) -> Outcome {
    let n = CROSS_BYTES;
    let mut buf = DeviceBuffer::from_host(&pattern(n, 3), &a, Some(mr))?;
    fill_behind_stall(buf.data(), n, 0xa1, &a)?;
    buf.reserve(3 * n, &b)?;
    ensure(
        buf.stream() == b.view() && buf.capacity() == 3 * n && buf.size() == n,
        "reserve did not record B or reallocate",
    )?;
    expect_bytes(
        &buf.to_vec(b.view())?,
        &vec![0xa1; n],
        "reallocation on B copied before A's pending write",
    )?;
    done()
}

fn cross_shrink_to_fit(mr: SharedResource, a: BufferStream, b: BufferStream) -> Outcome {
    let n = CROSS_BYTES;
    let mut buf = DeviceBuffer::from_host(&pattern(n, 3), &a, Some(mr))?;
    buf.resize(n / 2, &a)?;
    fill_behind_stall(buf.data(), n / 2, 0xa1, &a)?;
    buf.shrink_to_fit(&b)?;
    ensure(
        buf.stream() == b.view() && buf.capacity() == n / 2,
        "shrink_to_fit did not record B or reallocate",
    )?;
    expect_bytes(
        &buf.to_vec(b.view())?,
        &vec![0xa1; n / 2],
        "reallocation on B copied before A's pending write",
    )?;
    done()
}

fn cross_set_stream(mr: SharedResource, a: BufferStream, b: BufferStream) -> Outcome {
    let n = CROSS_BYTES;
    let mut buf = DeviceBuffer::from_host(&pattern(n, 3), &a, Some(mr))?;
    fill_behind_stall(buf.data(), n, 0xa1, &a)?;
    buf.set_stream(&b)?;
    ensure(buf.stream() == b.view(), "set_stream did not record B")?;
    expect_bytes(
        &buf.to_vec(b.view())?,
        &vec![0xa1; n],
        "B recorded before A's pending write",
    )?;
    done()
}

fn cross_uvector_elements(mr: SharedResource, a: BufferStream, b: BufferStream) -> Outcome {
    let n = CROSS_BYTES / 4;
    let host: Vec<u32> = (0..n as u32).collect();
    let mut v = DeviceUvector::from_slice(&host, &a, Some(mr))?;
    // Reads on B wait for A's pending write.
    for (k, byte) in [0xb0u8, 0xb1, 0xb2].into_iter().enumerate() {
        fill_behind_stall(v.data(), CROSS_BYTES, byte, &a)?;
        let (i, got) = match k {
            0 => (0, v.front_element(b.view())?),
            1 => (n / 2, v.element(n / 2, b.view())?),
            _ => (n - 1, v.back_element(b.view())?),
        };
        ensure(
            got == word(byte),
            format!(
                "element {i} read on B is {got:#x}, expected A's pending {:#x}",
                word(byte)
            ),
        )?;
    }
    // A synchronous write on B comes after A's pending write.
    fill_behind_stall(v.data(), CROSS_BYTES, 0xc0, &a)?;
    v.set_element(7, 0xdead_beef, b.view())?;
    let mut want = vec![word(0xc0); n];
    want[7] = 0xdead_beef;
    expect_words(&v.to_vec(a.view())?, &want, "set_element on B")?;
    // Asynchronous writes on B come after A's pending write ...
    fill_behind_stall(v.data(), CROSS_BYTES, 0xc1, &a)?;
    v.set_element_async(8, &0x0bad_f00d, b.view())?;
    v.set_element_to_zero_async(9, b.view())?;
    b.view().synchronize()?;
    let mut want = vec![word(0xc1); n];
    want[8] = 0x0bad_f00d;
    want[9] = 0;
    expect_words(&v.to_vec(a.view())?, &want, "asynchronous writes on B")?;
    // ... and A's later work comes after them.
    rmm_stream::stall(b.view(), STALL)?;
    v.set_element_async(10, &0x1234_5678, b.view())?;
    want[10] = 0x1234_5678;
    expect_words(
        &v.to_vec(a.view())?,
        &want,
        "A read before set_element_async on B landed",
    )?;
    rmm_stream::stall(b.view(), STALL)?;
    v.set_element_to_zero_async(11, b.view())?;
    want[11] = 0;
    expect_words(
        &v.to_vec(a.view())?,
        &want,
        "A read before set_element_to_zero_async on B landed",
    )?;
    done()
}

fn cross_uvector_bulk(mr: SharedResource, a: BufferStream, b: BufferStream) -> Outcome {
    let n = CROSS_BYTES / 4;
    let host: Vec<u32> = (0..n as u32).collect();
    let mut v = DeviceUvector::from_slice(&host, &a, Some(Arc::clone(&mr)))?;
    fill_behind_stall(v.data(), CROSS_BYTES, 0xd0, &a)?;
    let mut out = vec![0u32; n];
    v.copy_to_host(&mut out, b.view())?;
    expect_words(&out, &vec![word(0xd0); n], "copy_to_host on B")?;

    fill_behind_stall(v.data(), CROSS_BYTES, 0xd1, &a)?;
    let new: Vec<u32> = (0..n as u32 / 2).map(|i| !i).collect();
    v.copy_from_host(&new, b.view())?;
    let mut want = vec![word(0xd1); n];
    want[..n / 2].copy_from_slice(&new);
    expect_words(&v.to_vec(a.view())?, &want, "copy_from_host on B")?;

    fill_behind_stall(v.data(), CROSS_BYTES, 0xd2, &a)?;
    let c = v.try_clone_on(&b, Some(mr))?;
    expect_words(&c.to_vec(b.view())?, &vec![word(0xd2); n], "try_clone_on B")?;

    fill_behind_stall(v.data(), CROSS_BYTES, 0xd3, &a)?;
    v.resize(2 * n, &b)?;
    ensure(v.stream() == b.view() && v.len() == 2 * n, "resize on B")?;
    // Only the first n elements were written (initcheck reports reading the grown tail).
    let mut kept = vec![0u32; n];
    v.copy_to_host(&mut kept, b.view())?;
    expect_words(&kept, &vec![word(0xd3); n], "resize on B")?;
    done()
}

fn cross_scalar(mr: SharedResource, a: BufferStream, b: BufferStream) -> Outcome {
    let dword = |byte: u8| u64::from_ne_bytes([byte; 8]);
    let mut s = DeviceScalar::with_value(5u64, &a, Some(Arc::clone(&mr)))?;
    fill_behind_stall(s.data(), 8, 0xe0, &a)?;
    let got = s.value(b.view())?;
    ensure(
        got == dword(0xe0),
        format!("value on B is {got:#x}, expected A's pending write"),
    )?;
    fill_behind_stall(s.data(), 8, 0xe1, &a)?;
    s.set_value_async(&9, b.view())?;
    b.view().synchronize()?;
    ensure(
        s.value(a.view())? == 9,
        "set_value_async on B before A's pending write",
    )?;
    rmm_stream::stall(b.view(), STALL)?;
    s.set_value_async(&10, b.view())?;
    ensure(
        s.value(a.view())? == 10,
        "A read before set_value_async on B landed",
    )?;
    rmm_stream::stall(b.view(), STALL)?;
    s.set_value_to_zero_async(b.view())?;
    ensure(
        s.value(a.view())? == 0,
        "A read before set_value_to_zero_async on B landed",
    )?;
    fill_behind_stall(s.data(), 8, 0xe2, &a)?;
    let t = s.try_clone_on(&b, Some(mr))?;
    ensure(
        t.value(b.view())? == dword(0xe2),
        "try_clone_on B before A's pending write",
    )?;
    fill_behind_stall(s.data(), 8, 0xe3, &a)?;
    s.set_stream(&b)?;
    ensure(
        s.value(b.view())? == dword(0xe3),
        "set_stream recorded B before A's pending write",
    )?;
    done()
}

/// A pool over cuda whose first chunk is exactly `CROSS_BYTES` (without a maximum it then
/// grows by the request, or the pool size if larger), so the blocks these trials free are the
/// only ones a later allocation of that size can get.
fn exact_pool() -> MrResult<SharedResource> {
    Ok(Arc::new(PoolMemoryResource::new(
        CudaMemoryResource::new(),
        CROSS_BYTES,
    )?))
}

fn pool_trial(
    pair: (Side, Side),
    case: &str,
    body: fn(BufferStream, BufferStream) -> Outcome,
) -> Trial {
    let (a, b) = pair;
    gpu(
        format!("cross_stream::pool::{}_to_{}::{case}", a.name(), b.name()),
        move || body(a.make()?, b.make()?),
    )
}

/// A deep copy on B reads the source; the source is then freed on A and its block handed out
/// again on A and overwritten there: A must not get there before the copy on B has read it.
fn pool_source_freed_on_a_after_clone(a: BufferStream, b: BufferStream) -> Outcome {
    let n = CROSS_BYTES;
    let pool = exact_pool()?;
    let src = DeviceBuffer::from_host(&pattern(n, 5), &a, Some(Arc::clone(&pool)))?;
    let old = src.data();
    rmm_stream::stall(b.view(), STALL)?;
    let copy = src.try_clone_on(&b, Some(Arc::clone(&pool)))?;
    drop(src); // freed on A
    let reuse = DeviceBuffer::new_in(n, &a, Arc::clone(&pool))?;
    ensure(
        reuse.data() == old,
        format!(
            "the pool handed out {} on A, not the freed block {old}: the trial checks nothing",
            reuse.data()
        ),
    )?;
    fill_now(reuse.data(), n, 0xee, &a)?;
    expect_bytes(
        &copy.to_vec(b.view())?,
        &pattern(n, 5),
        "the source's block was reused on A before the copy on B read it",
    )?;
    a.view().synchronize()?;
    done()
}

/// A resize on B copies the old block on B and frees it; a new allocation on A that gets the
/// old block and overwrites it must not get there before B's copy has read it.
///
/// The pool may hold exactly the buffer before and after the resize (`3n`), so the allocation
/// on A cannot grow the pool and must take the block freed on B: without that bound the pool
/// grows rather than take a block another stream freed moments ago, and the trial would check
/// nothing.
fn pool_old_block_after_resize(a: BufferStream, b: BufferStream) -> Outcome {
    let n = CROSS_BYTES;
    let pool: SharedResource = Arc::new(PoolMemoryResource::with_options(
        CudaMemoryResource::new(),
        PoolOptions::new(n).maximum_pool_size(3 * n),
    )?);
    let mut x = DeviceBuffer::from_host(&pattern(n, 6), &a, Some(Arc::clone(&pool)))?;
    let old = x.data().addr();
    rmm_stream::stall(b.view(), STALL)?;
    x.resize(2 * n, &b)?;
    let reuse = DeviceBuffer::new_in(n, &a, Arc::clone(&pool))?;
    let at = reuse.data().addr();
    ensure(
        at < old + n as u64 && old < at + n as u64,
        format!(
            "the pool handed out {} on A, not the old block {old:#x}: the trial checks nothing",
            reuse.data()
        ),
    )?;
    fill_now(reuse.data(), n, 0xee, &a)?;
    // Only the first n bytes were written (initcheck reports reading the grown tail).
    let mut kept = vec![0u8; n];
    x.copy_to_host(&mut kept, b.view())?;
    expect_bytes(
        &kept,
        &pattern(n, 6),
        "the old block was reused on A before the reallocation's copy on B read it",
    )?;
    a.view().synchronize()?;
    done()
}

// --- resources, drop errors -----------------------------------------------------------------

fn default_resource_replaced_while_alive() -> Outcome {
    if let Some(why) = no_pools() {
        return Ok(Completion::ignored_with(why));
    }
    let _reset = ResetResource;
    let (rec, log) = recording(Arc::new(CudaAsyncMemoryResource::new()?));
    set_current_device_resource(Arc::clone(&rec))?;
    let s = CudaStreamView::default();
    let b = DeviceBuffer::from_host(&pattern(4096, 9), s, None)?;
    let v = DeviceUvector::<u32>::from_slice(&[1, 2, 3], s, None)?;
    ensure(
        b.memory_resource().is_equal(&*rec),
        "buffer did not take the current resource",
    )?;
    drop(rec);
    set_current_device_resource(Arc::new(ManagedMemoryResource::new()))?;
    let m = DeviceBuffer::new(100, s)?;
    ensure(
        m.memory_resource().is_equal(&ManagedMemoryResource::new()),
        "new buffer did not take the new resource",
    )?;
    ensure(b.to_vec(s)? == pattern(4096, 9), "old buffer contents")?;
    let p = b.data().addr();
    drop(b);
    drop(v);
    let ev = events(&log);
    ensure(
        ev.iter().any(|e| e.free && e.ptr == p && e.bytes == 4096),
        format!("old buffer not freed into its own resource: {ev:?}"),
    )?;
    ensure(ev.iter().filter(|e| e.free).count() == 2, "both frees seen")?;
    drop(m);
    reset_current_device_resource()?;
    done()
}

fn drop_errors_are_recorded() -> Outcome {
    let cuda = CudaMemoryResource::new();
    let alloc = move |bytes: usize, s: rmm_stream::CudaStreamView<'_>| cuda.allocate(s, bytes, 256);
    let free = move |ptr: rmm_sys::DevicePtr, bytes: usize, s: rmm_stream::CudaStreamView<'_>| {
        // SAFETY: frees what the allocation closure returned.
        unsafe { cuda.deallocate(s, ptr, bytes, 256)? };
        Err(MrError::invalid_argument(
            "test resource refuses to free (gpu_containers)",
        ))
    };
    // SAFETY: the closures forward to a CUDA resource, which keeps the contract.
    let mr = unsafe { CallbackMemoryResource::new(alloc, free) };

    let _ = take_drop_errors();
    let b = DeviceBuffer::new_in(1024, CudaStreamView::default(), Arc::new(mr))?;
    drop(b);
    let errors = take_drop_errors();
    ensure(
        errors.len() == 1 && errors[0].to_string().contains("refuses to free"),
        format!("{errors:?}"),
    )?;
    done()
}

fn pool_configuration() -> Outcome {
    if let Some(why) = no_pools() {
        return Ok(Completion::ignored_with(why));
    }
    let dev = rmm_sys::current_device()?;
    let before = device_pool_state(dev)?;
    let st = configure_device_default_pool(dev, u64::MAX, None)?;
    ensure(st.release_threshold == u64::MAX, "threshold not set")?;
    let s = CudaStreamView::default();
    // SAFETY: the default stream; the memory is freed below on the same stream.
    let p = unsafe { rmm_sys::mempool::mem_alloc_async(1 << 20, s.as_raw())? };
    // SAFETY: `p` came from the device's current pool and is unused.
    unsafe { rmm_sys::mempool::mem_free_async(p, s.as_raw())? };
    s.synchronize()?;
    ensure(
        device_pool_state(dev)?.reserved_current >= 1 << 20,
        "threshold u64::MAX released memory",
    )?;
    let st = configure_device_default_pool(dev, 0, Some(0))?;
    ensure(
        st.release_threshold == 0,
        format!("threshold not reset: {st:?}"),
    )?;
    // Trimming to 0 releases everything not in use (nothing is, in this test process).
    ensure(
        st.used_current > 0 || st.reserved_current == 0,
        format!("trim_to(0) kept unused memory: {st:?}"),
    )?;
    configure_device_default_pool(dev, before.release_threshold, None)?;
    done()
}

// --- multi-device (container_multidevice_tests.cu) -------------------------------------------

/// What a multi-device trial does with its container while device 1 is current.
#[derive(Clone, Copy, Debug)]
enum Op {
    Destroy,
    MoveDestroy,
    Resize,
    Shrink,
}

/// A container type of the multi-device suite, boxed so one runner serves them all.
trait Container: Send {
    fn grow(&mut self, s: CudaStreamView<'static>) -> MrResult<()>;
    fn shrink(&mut self, s: CudaStreamView<'static>) -> MrResult<()>;
}

impl Container for DeviceBuffer {
    fn grow(&mut self, s: CudaStreamView<'static>) -> MrResult<()> {
        self.resize(2 * self.size(), s)
    }
    fn shrink(&mut self, s: CudaStreamView<'static>) -> MrResult<()> {
        self.resize(self.size() / 2, s)?;
        self.shrink_to_fit(s)
    }
}

impl Container for DeviceUvector<i32> {
    fn grow(&mut self, s: CudaStreamView<'static>) -> MrResult<()> {
        self.resize(2 * self.len(), s)
    }
    fn shrink(&mut self, s: CudaStreamView<'static>) -> MrResult<()> {
        self.resize(self.len() / 2, s)?;
        self.shrink_to_fit(s)
    }
}

impl Container for DeviceScalar<i32> {
    // A scalar cannot be resized: "grow" sets its value, which also runs with device 0.
    fn grow(&mut self, s: CudaStreamView<'static>) -> MrResult<()> {
        self.set_value_async(&5, s)?;
        s.synchronize()?;
        Ok(())
    }
    fn shrink(&mut self, s: CudaStreamView<'static>) -> MrResult<()> {
        self.set_value_to_zero_async(s)?;
        Ok(())
    }
}

fn multidevice(make: fn(SharedResource) -> MrResult<Box<dyn Container>>, op: Op) -> Outcome {
    let _back = BackToDevice0;
    rmm_sys::set_current_device(DeviceId(0))?;
    let (rec, log) = recording(Arc::new(CudaMemoryResource::new()));
    let mut c = make(rec)?;
    rmm_sys::set_current_device(DeviceId(1))?;
    // The legacy stream: the default stream's meaning does not matter here and legacy is valid
    // in both devices' contexts.
    let s = CudaStreamView::legacy();
    match op {
        Op::Destroy => drop(c),
        Op::MoveDestroy => {
            let moved = std::thread::spawn(move || c)
                .join()
                .map_err(|_| "thread panicked")?;
            drop(moved);
        }
        Op::Resize => {
            c.grow(s)?;
            drop(c);
        }
        Op::Shrink => {
            c.shrink(s)?;
            drop(c);
        }
    }
    ensure(
        rmm_sys::current_device()? == DeviceId(1),
        "the container did not restore the current device",
    )?;
    let ev = events(&log);
    ensure(!ev.is_empty(), "the resource saw no call")?;
    ensure(
        ev.iter().all(|e| e.device == 0),
        format!("resource called with another device current: {ev:?}"),
    )?;
    let allocs = ev.iter().filter(|e| !e.free).count();
    let frees = ev.iter().filter(|e| e.free).count();
    ensure(
        allocs == frees,
        format!("{allocs} allocations, {frees} frees"),
    )?;
    done()
}

fn multidevice_trials() -> Vec<Trial> {
    type Make = fn(SharedResource) -> MrResult<Box<dyn Container>>;
    let kinds: [(&str, Make); 3] = [
        ("device_buffer", |mr| {
            Ok(Box::new(DeviceBuffer::new_in(
                1000,
                CudaStreamView::legacy(),
                mr,
            )?))
        }),
        ("device_uvector", |mr| {
            Ok(Box::new(DeviceUvector::<i32>::new_in(
                1000,
                CudaStreamView::legacy(),
                mr,
            )?))
        }),
        ("device_scalar", |mr| {
            Ok(Box::new(DeviceScalar::<i32>::with_value(
                3,
                CudaStreamView::legacy(),
                Some(mr),
            )?))
        }),
    ];
    let ops = [
        ("CreateDestroyDifferentActiveDevice", Op::Destroy),
        ("CreateMoveDestroyDifferentActiveDevice", Op::MoveDestroy),
        ("ResizeDifferentActiveDevice", Op::Resize),
        ("ShrinkDifferentActiveDevice", Op::Shrink),
    ];
    let mut trials = Vec::new();
    for (kind, make) in kinds {
        for (name, op) in ops {
            trials.push(two_gpus(
                format!("multidevice::{kind}::{name}"),
                move || multidevice(make, op),
            ));
        }
    }
    trials
}

// --- cudarc interop ---------------------------------------------------------------------------

#[cfg(feature = "cudarc")]
mod with_cudarc {
    use super::*;
    use cudarc::driver::{DeviceSlice, LaunchConfig, PushKernelArg};
    use rmm_containers::interop::{cudarc_context, cudarc_stream_view, static_stream_for_cudarc};

    pub(super) const ADD_ONE_PTX: &str = include_str!("../examples/add_one.ptx");

    pub(super) fn copies() -> Outcome {
        let dev = rmm_sys::current_device()?;
        let ctx = cudarc_context(dev)?;
        ensure(
            rmm_sys::current_device()? == dev,
            "cudarc_context changed the device",
        )?;
        let stream = ctx.new_stream()?;
        let host: Vec<f32> = (0..4096).map(|i| i as f32 * 0.5).collect();
        let mut v = DeviceUvector::from_slice(&host, &stream, None)?;
        ensure(
            v.stream() == cudarc_stream_view(&stream),
            "vector not on the cudarc stream",
        )?;
        ensure(
            Arc::ptr_eq(DeviceSlice::stream(&v), &stream),
            "DeviceSlice::stream",
        )?;
        ensure(stream.clone_dtoh(&v)? == host, "cudarc reads the vector")?;
        let new: Vec<f32> = host.iter().map(|x| -x).collect();
        stream.memcpy_htod(&new, &mut v)?;
        stream.synchronize()?;
        ensure(v.to_vec(v.stream())? == new, "cudarc writes the vector")?;
        // A vector on an rmm-rs stream, read through another (cudarc) stream.
        let own = Arc::new(CudaStream::non_blocking()?);
        let w = DeviceUvector::from_slice(&host, &own, None)?;
        ensure(stream.clone_dtoh(&w)? == host, "cross-stream read")?;
        let _ = DeviceSlice::stream(&w);
        // cudarc's null stream is the legacy stream.
        ensure(
            cudarc_stream_view(&ctx.default_stream()) == CudaStreamView::legacy(),
            "null stream",
        )?;
        done()
    }

    pub(super) fn stream_conversions() -> Outcome {
        let dev = rmm_sys::current_device()?;
        let l = static_stream_for_cudarc(CudaStreamView::legacy(), dev)?;
        ensure(l.cu_stream() as usize == 1, "legacy")?;
        let p = static_stream_for_cudarc(CudaStreamView::per_thread(), dev)?;
        ensure(p.cu_stream() as usize == 2, "per-thread")?;
        let v = DeviceUvector::<u8>::from_slice(&[1, 2, 3], CudaStreamView::legacy(), None)?;
        ensure(
            DeviceSlice::stream(&v).cu_stream() as usize == 1,
            "vector on legacy",
        )?;
        done()
    }

    /// A vector on a foreign `'static` stream (here a leaked rmm-rs stream, whose view is
    /// `'static` without `unsafe`): cudarc sees that very stream, no panic.
    pub(super) fn foreign_static_stream() -> Outcome {
        let leaked: &'static CudaStream = Box::leak(Box::new(CudaStream::non_blocking()?));
        let host: Vec<u32> = (0..1000).collect();
        let v = DeviceUvector::from_slice(&host, leaked.view(), None)?;
        ensure(
            v.buffer_stream().is_static(),
            "the vector does not hold a 'static view",
        )?;
        let s = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Arc::clone(DeviceSlice::stream(&v))
        }))
        .map_err(|_| "DeviceSlice::stream panicked for a vector on a foreign 'static stream")?;
        ensure(
            std::ptr::eq(s.cu_stream(), leaked.value().cast()),
            format!(
                "DeviceSlice::stream is {:p}, not the vector's stream {:p}",
                s.cu_stream(),
                leaked.value()
            ),
        )?;
        ensure(
            s.clone_dtoh(&v)? == host,
            "cudarc read on the vector's stream",
        )?;
        done()
    }

    pub(super) fn kernel() -> Outcome {
        let ctx = cudarc_context(rmm_sys::current_device()?)?;
        let stream = ctx.new_stream()?;
        let host: Vec<f32> = (0..3000).map(|i| i as f32).collect();
        let mut v = DeviceUvector::from_slice(&host, &stream, None)?;
        let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(ADD_ONE_PTX))?;
        let f = module.load_function("add_one")?;
        let n = host.len() as u32;
        let mut launch = stream.launch_builder(&f);
        launch.arg(&mut v).arg(&n);
        // SAFETY: `add_one(float*, unsigned)` reads and writes `n` floats of `v`.
        unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }?;
        let out = v.to_vec(v.stream())?;
        ensure(
            out.iter().zip(&host).all(|(o, h)| *o == h + 1.0),
            "kernel result",
        )?;
        done()
    }
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    for s in SUBJECTS {
        let cases: [(&str, Body); 10] = [
            ("EmptyBuffer", buffer_empty),
            ("ResourcesAndStreams", buffer_resources_and_streams),
            ("StreamPoolStream", buffer_on_a_stream_pool_stream),
            ("HostRoundTrip", buffer_host_round_trip),
            ("CopyFromRawPointers", buffer_copy_from_device_pointer),
            ("CopyFromNullptr", buffer_copy_from_null),
            ("CopyConstructor", buffer_clone),
            ("ResizeReserveShrink", buffer_resize_reserve_shrink),
            ("StreamRecording", buffer_stream_recording),
            ("Alignment", buffer_alignment),
        ];
        for (case, body) in cases {
            trials.push(with_subject("device_buffer", s, case, body));
        }
        macro_rules! typed {
            ($($t:ty),*) => {$(
                trials.push(with_subject("device_uvector", s, concat!(stringify!($t), "::basics"), uvector_basics::<$t>));
                trials.push(with_subject("device_uvector", s, concat!(stringify!($t), "::resizing"), uvector_resizing::<$t>));
                trials.push(with_subject("device_uvector", s, concat!(stringify!($t), "::elements"), uvector_elements::<$t>));
            )*};
        }
        typed!(i8, i32, u64, f32, f64);
        macro_rules! scalars {
            ($($t:ty),*) => {$(
                trials.push(with_subject("device_scalar", s, stringify!($t), scalar_suite::<$t>));
            )*};
        }
        scalars!(u8, i8, i16, i32, i64, f32, f64);
    }
    for s in SUBJECTS {
        // Every pair of stream kinds on cuda; the other resources with two owned streams.
        let pairs: &[(Side, Side)] = if s.name == "cuda" {
            &PAIRS
        } else {
            &PAIRS[..1]
        };
        for &pair in pairs {
            for (case, body) in CROSS_CASES {
                trials.push(cross_trial(s, pair, case, body));
            }
        }
    }
    for pair in PAIRS {
        trials.push(pool_trial(
            pair,
            "SourceFreedOnAAfterClone",
            pool_source_freed_on_a_after_clone,
        ));
        trials.push(pool_trial(
            pair,
            "OldBlockAfterResize",
            pool_old_block_after_resize,
        ));
    }
    trials.push(gpu("device_uvector::NegativeZero", negative_zero));
    trials.push(gpu("device_uvector::Overflow", uvector_overflow));
    trials.push(gpu("containers::ElementAlignment", alignment_of_elements));
    trials.push(gpu(
        "containers::DefaultResourceReplacedWhileAlive",
        default_resource_replaced_while_alive,
    ));
    trials.push(gpu(
        "containers::DropErrorsAreRecorded",
        drop_errors_are_recorded,
    ));
    trials.push(gpu(
        "interop::ConfigureDeviceDefaultPool",
        pool_configuration,
    ));
    trials.extend(multidevice_trials());
    #[cfg(feature = "cudarc")]
    {
        trials.push(gpu("interop::cudarc::Copies", with_cudarc::copies));
        trials.push(gpu(
            "interop::cudarc::StreamConversions",
            with_cudarc::stream_conversions,
        ));
        trials.push(gpu("interop::cudarc::Kernel", with_cudarc::kernel));
        trials.push(gpu(
            "interop::cudarc::ForeignStaticStream",
            with_cudarc::foreign_static_stream,
        ));
    }
    libtest_mimic::run(&args, trials).exit();
}
