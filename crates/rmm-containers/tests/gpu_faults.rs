//! GPU tests of device buffers when a driver call fails halfway (rmm-sys's fault injection,
//! feature `testing`): a copy into a fresh allocation failing must free that allocation and
//! leave the buffer as it was; a failed cross-stream ordering falls back to a synchronization.
//! Allocations are counted by a statistics adaptor under the buffers. Without a GPU every trial
//! reports itself ignored, with the reason.

use std::sync::Arc;

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use rmm_containers::DeviceBuffer;
use rmm_mr::{shared, CudaMemoryResource, SharedResource, StatisticsResourceAdaptor};
use rmm_stream::{CudaStream, CudaStreamView, StreamFlags};
use rmm_sys::fault::{self, DriverCall, Fault, FaultScope};

type Outcome = Result<Completion, Failed>;

fn gpu(name: &str, f: fn() -> Outcome) -> Trial {
    Trial::ignorable_test(name, move || match rmm_sys::gpu_unavailable_reason() {
        Some(why) => Ok(Completion::ignored_with(format!("needs a CUDA GPU: {why}"))),
        None => {
            let _scope = FaultScope::new();
            f()
        }
    })
}

fn ensure(cond: bool, msg: impl Into<String>) -> Result<(), Failed> {
    if cond {
        Ok(())
    } else {
        Err(msg.into().into())
    }
}

/// A counted CUDA resource, and a handle to read its counters.
fn counted() -> (
    SharedResource,
    StatisticsResourceAdaptor<CudaMemoryResource>,
) {
    let stats = StatisticsResourceAdaptor::new(CudaMemoryResource::new());
    (shared(stats.clone()), stats)
}

fn live(stats: &StatisticsResourceAdaptor<CudaMemoryResource>) -> i64 {
    stats.allocations_counter().value
}

fn bytes(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

/// `from_host`: the copy failing frees the new allocation.
fn from_host_copy() -> Outcome {
    let (mr, stats) = counted();
    let s = CudaStreamView::default();
    fault::inject(Fault::next(DriverCall::Copy));
    ensure(
        DeviceBuffer::from_host(&bytes(4096), s, Some(mr)).is_err(),
        "the copy did not fail",
    )?;
    ensure(fault::injected(DriverCall::Copy) == 1, "no copy was made")?;
    ensure(live(&stats) == 0, "the allocation leaked")?;
    Ok(Completion::Completed)
}

/// `resize` beyond the capacity: the copy into the new allocation failing frees it and leaves
/// the buffer (address, size, capacity, contents) as it was.
fn resize_copy() -> Outcome {
    let (mr, stats) = counted();
    let s = CudaStreamView::default();
    let data = bytes(4096);
    let mut buf = DeviceBuffer::from_host(&data, s, Some(mr))?;
    let before = (buf.data(), buf.size(), buf.capacity());
    fault::inject(Fault::next(DriverCall::Copy));
    ensure(buf.resize(1 << 20, s).is_err(), "the copy did not fail")?;
    ensure(
        (buf.data(), buf.size(), buf.capacity()) == before,
        "the buffer changed",
    )?;
    ensure(live(&stats) == 1, "the new allocation leaked")?;
    ensure(buf.to_vec(s)? == data, "the contents changed")?;
    buf.resize(1 << 20, s)?;
    ensure(live(&stats) == 1, "the old allocation leaked")?;
    drop(buf);
    ensure(live(&stats) == 0, "an allocation is left")?;
    Ok(Completion::Completed)
}

/// `try_clone_on` another stream: the copy failing frees the copy's allocation; a failed event
/// ordering between the streams falls back to synchronizing the source stream, and the clone
/// still holds the contents.
fn clone_faults() -> Outcome {
    let (mr, stats) = counted();
    let (s1, s2) = (
        Arc::new(CudaStream::new(StreamFlags::NonBlocking)?),
        Arc::new(CudaStream::new(StreamFlags::NonBlocking)?),
    );
    let data = bytes(8192);
    let buf = DeviceBuffer::from_host(&data, &s1, Some(mr.clone()))?;
    fault::inject(Fault::next(DriverCall::Copy));
    ensure(
        buf.try_clone_on(&s2, Some(mr.clone())).is_err(),
        "the copy did not fail",
    )?;
    ensure(live(&stats) == 1, "the clone's allocation leaked")?;
    for call in [DriverCall::EventRecord, DriverCall::StreamWait] {
        fault::inject(Fault::next(call));
        let copy = buf.try_clone_on(&s2, Some(mr.clone()))?;
        ensure(fault::injected(call) == 1, format!("no {call:?} was made"))?;
        ensure(
            copy.to_vec(s2.view())? == data,
            format!("{call:?}: wrong contents"),
        )?;
    }
    // Both the ordering and its fallback failing: the clone fails and leaks nothing.
    fault::inject(Fault::next(DriverCall::EventRecord));
    fault::inject(Fault::next(DriverCall::Synchronize));
    ensure(
        buf.try_clone_on(&s2, Some(mr.clone())).is_err(),
        "the clone succeeded without any ordering",
    )?;
    s1.synchronize()?;
    s2.synchronize()?;
    ensure(live(&stats) == 1, "a clone's allocation leaked")?;
    drop(buf);
    ensure(live(&stats) == 0, "an allocation is left")?;
    Ok(Completion::Completed)
}

fn main() {
    let mut args = Arguments::from_args();
    args.test_threads.get_or_insert(1);
    let trials = vec![
        gpu("faults/buffer/from_host_copy", from_host_copy),
        gpu("faults/buffer/resize_copy", resize_copy),
        gpu("faults/buffer/clone", clone_faults),
    ];
    libtest_mimic::run(&args, trials).exit();
}
