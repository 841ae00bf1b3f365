//! GPU tests of streams, stream pools and events. Without a GPU every trial reports itself
//! ignored, with the reason. Run in both `RMM_DEFAULT_STREAM` modes by the GPU bundle.

use std::collections::HashSet;
use std::time::Duration;

use libtest_mimic::{Arguments, Failed};
use rmm_stream::{
    default_stream_mode, stall, CudaEvent, CudaStream, CudaStreamPool, CudaStreamView,
    DefaultStreamMode, StreamFlags,
};
use rmm_sys::memory;
use rmm_sys::testing::{ensure, gpu};

fn create_sync_destroy() -> Result<(), Failed> {
    for flags in [StreamFlags::SyncDefault, StreamFlags::NonBlocking] {
        let s = CudaStream::new(flags)?;
        let v = s.view();
        ensure(
            !v.is_default() && !v.is_per_thread_default(),
            "owned stream is special",
        )?;
        ensure(v.value() == s.value(), "view handle")?;
        s.synchronize()?;
        ensure(v.is_idle()?, "synchronized stream busy")?;
    }
    Ok(())
}

fn special_streams_synchronize() -> Result<(), Failed> {
    CudaStreamView::default().synchronize()?;
    CudaStreamView::legacy().synchronize()?;
    CudaStreamView::per_thread().synchronize()?;
    let d = CudaStreamView::default();
    match default_stream_mode() {
        DefaultStreamMode::Legacy => {
            ensure(d.is_default() && !d.is_per_thread_default(), "legacy")?
        }
        DefaultStreamMode::PerThread => {
            ensure(d.is_per_thread_default() && !d.is_default(), "per-thread")?;
            ensure(
                d.id()? == CudaStreamView::per_thread().id()?,
                "default stream is not the per-thread stream in per-thread mode",
            )?;
        }
    }
    Ok(())
}

fn stream_ids_are_unique() -> Result<(), Failed> {
    let a = CudaStream::new(StreamFlags::SyncDefault)?;
    let b = CudaStream::new(StreamFlags::SyncDefault)?;
    ensure(a.view().id()? != b.view().id()?, "two streams share an id")?;
    let first = a.view().id()?;
    drop(a);
    let c = CudaStream::new(StreamFlags::SyncDefault)?;
    ensure(
        c.view().id()? != first,
        "a new stream reused a destroyed stream's id",
    )
}

fn views_of_owned_streams_know_their_id() -> Result<(), Failed> {
    use rmm_sys::fault::{self, DriverCall};
    let s = CudaStream::non_blocking()?;
    // SAFETY: the stream is alive; a view made from the raw handle knows no id.
    let driver_id = unsafe { CudaStreamView::from_raw(s.value()) }.id()?;
    let before = fault::calls(DriverCall::StreamId);
    let id = s.view().id()?;
    ensure(id == driver_id, "the view's id is not the driver's")?;
    ensure(
        fault::calls(DriverCall::StreamId) == before,
        "a view of an owned stream asked the driver for its id",
    )?;
    let pool = CudaStreamPool::new(2, StreamFlags::NonBlocking)?;
    let v = pool.get_stream();
    let before = fault::calls(DriverCall::StreamId);
    // SAFETY: the pool's stream is alive while `pool` is.
    let raw_id = unsafe { CudaStreamView::from_raw(v.value()) }.id()?;
    ensure(v.id()? == raw_id, "a pool stream's view id")?;
    ensure(
        fault::calls(DriverCall::StreamId) == before + 1,
        "only the raw view asks the driver",
    )
}

fn pool_round_robin_from_threads() -> Result<(), Failed> {
    ensure(
        CudaStreamPool::new(0, StreamFlags::SyncDefault).is_err(),
        "size 0",
    )?;
    let pool = CudaStreamPool::with_default_size()?;
    ensure(pool.pool_size() == 16, "default size")?;
    let handles: Vec<usize> = std::thread::scope(|s| {
        let joins: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    (0..8)
                        .map(|_| pool.get_stream().value() as usize)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        joins.into_iter().flat_map(|j| j.join().unwrap()).collect()
    });
    // 32 round-robin picks over 16 streams: each stream exactly twice.
    let distinct: HashSet<_> = handles.iter().copied().collect();
    ensure(
        distinct.len() == 16,
        format!("{} distinct streams", distinct.len()),
    )?;
    for h in &distinct {
        ensure(
            handles.iter().filter(|x| *x == h).count() == 2,
            "uneven round robin",
        )?;
    }
    ensure(
        pool.get_stream_by_id(3) == pool.get_stream_by_id(19),
        "get_stream_by_id is not modulo the size",
    )
}

/// Stream B waits on an event recorded on A after A's (stalled) write: B must see A's bytes.
fn event_orders_two_streams() -> Result<(), Failed> {
    let a = CudaStream::non_blocking()?;
    let b = CudaStream::non_blocking()?;
    let n = 1 << 20;
    let buf = memory::mem_alloc(n * 4)?;
    let mut host = vec![0u8; n * 4];
    // SAFETY: `buf` is live for the whole test; streams are live.
    unsafe {
        memory::memset_d32_async(buf, 0, n, a.value())?;
        a.synchronize()?;
        stall(a.view(), Duration::from_millis(200))?;
        memory::memset_d32_async(buf, 0x5a5a_5a5a, n, a.value())?;
        let ev = CudaEvent::new()?;
        ev.record(a.view())?;
        ev.wait(b.view())?;
        memory::memcpy_async(
            rmm_sys::DevicePtr::from_host_ptr(host.as_mut_ptr()),
            buf,
            n * 4,
            b.value(),
        )?;
        b.synchronize()?;
        ensure(
            ev.is_complete()?,
            "event incomplete after the waiter finished",
        )?;
        memory::mem_free(buf)?;
    }
    ensure(
        host.chunks(4).all(|c| c == 0x5a5a_5a5au32.to_ne_bytes()),
        "B read before A's write: the event did not order the streams",
    )
}

fn event_timing() -> Result<(), Failed> {
    let s = CudaStream::new(StreamFlags::SyncDefault)?;
    let start = CudaEvent::with_timing()?;
    let end = CudaEvent::with_timing()?;
    start.record(s.view())?;
    stall(s.view(), Duration::from_millis(50))?;
    end.record(s.view())?;
    end.synchronize()?;
    let ms = CudaEvent::elapsed_ms(&start, &end)?;
    ensure(ms >= 40.0, format!("elapsed {ms} ms for a 50 ms stall"))
}

fn per_thread_streams_differ_between_threads() -> Result<(), Failed> {
    let ids: Vec<u64> = std::thread::scope(|s| {
        let j1 = s.spawn(|| CudaStreamView::per_thread().id());
        let j2 = s.spawn(|| CudaStreamView::per_thread().id());
        vec![j1.join().unwrap(), j2.join().unwrap()]
    })
    .into_iter()
    .collect::<Result<_, _>>()?;
    ensure(
        ids[0] != ids[1],
        "two threads share a per-thread default stream",
    )?;
    let here = CudaStreamView::per_thread().id()?;
    ensure(
        here == CudaStreamView::per_thread().id()?,
        "per-thread id not stable",
    )
}

fn pool_shared_streams_outlive_the_pool() -> Result<(), Failed> {
    let pool = CudaStreamPool::new(2, StreamFlags::NonBlocking)?;
    let a = pool.get_shared_stream_by_id(1);
    ensure(
        a.view() == pool.get_stream_by_id(3),
        "the shared stream is not the pool's stream at that index",
    )?;
    // One counter for both kinds of hand-out.
    let first = pool.get_stream();
    let second = pool.get_shared_stream();
    ensure(first != second.view(), "round robin skipped a turn")?;
    let id = a.view().id()?;
    drop(pool);
    // The pool is gone; the shared stream is still a live stream.
    ensure(a.view().id()? == id, "the stream changed identity")?;
    stall(a.view(), std::time::Duration::from_millis(10))?;
    a.synchronize()?;
    ensure(a.view().is_idle()?, "work still pending after synchronize")
}

fn main() {
    let args = Arguments::from_args();
    let trials = vec![
        gpu("create_sync_destroy", create_sync_destroy),
        gpu("special_streams_synchronize", special_streams_synchronize),
        gpu("stream_ids_are_unique", stream_ids_are_unique),
        gpu(
            "views_of_owned_streams_know_their_id",
            views_of_owned_streams_know_their_id,
        ),
        gpu(
            "pool_round_robin_from_threads",
            pool_round_robin_from_threads,
        ),
        gpu(
            "pool_shared_streams_outlive_the_pool",
            pool_shared_streams_outlive_the_pool,
        ),
        gpu("event_orders_two_streams", event_orders_two_streams),
        gpu("event_timing", event_timing),
        gpu(
            "per_thread_streams_differ_between_threads",
            per_thread_streams_differ_between_threads,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
