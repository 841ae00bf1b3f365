//! Example `graphs` (guide: "CUDA graphs"): a step that allocates device buffers, fills them
//! (memset nodes), adds them into an output with a small PTX kernel and frees them, captured
//! once into a CUDA graph with a graph-private pool serving its allocations, then replayed
//! 1,000 times. Prints where the memory came from and when it went back. Without a GPU it says
//! so in one line and exits with status 1.

use std::error::Error;
use std::process::ExitCode;
use std::sync::Arc;

use rmm::prelude::*;
use rmm::sys::kernel::AddKernel;
use rmm::{GraphPool, GraphPoolOptions};

fn main() -> ExitCode {
    if let Some(why) = rmm::sys::gpu_unavailable_reason() {
        eprintln!("rmm example graphs: no GPU available: {why}");
        return ExitCode::FAILURE;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rmm example graphs failed: {e}");
            ExitCode::FAILURE
        }
    }
}

const WORDS: usize = 1 << 20;
const BYTES: usize = WORDS * 4;
const REPLAYS: u32 = 1000;

/// `out += x` over `WORDS` words, on `stream`.
fn add(
    k: &AddKernel,
    out: DevicePtr,
    x: DevicePtr,
    stream: CudaStreamView<'_>,
) -> Result<(), Box<dyn Error>> {
    // SAFETY: both buffers hold `BYTES` and are usable on `stream` (`out` is the kernel's
    // output and its first input); the kernel stays loaded until the stream is synchronized.
    unsafe { k.launch(out, out, x, WORDS as u32, stream.as_raw())? };
    Ok(())
}

/// Fills `ptr` (`BYTES`) with `value`, ordered on `stream` (a memset node under capture).
fn fill(ptr: DevicePtr, value: u32, stream: CudaStreamView<'_>) -> Result<(), Box<dyn Error>> {
    // SAFETY: `ptr` holds `BYTES` bytes usable on `stream`.
    unsafe { rmm::sys::memory::memset_d32_async(ptr, value, WORDS, stream.as_raw())? };
    Ok(())
}

fn run() -> Result<(), Box<dyn Error>> {
    let pool = Arc::new(PoolMemoryResource::with_options(
        CudaMemoryResource::new(),
        PoolOptions::new(64 << 20),
    )?);
    let mr: SharedResource = pool.clone();
    let stream = Arc::new(CudaStream::non_blocking()?);
    let s = stream.view();
    let k = AddKernel::load()?;

    // The output lives outside the graph: allocated, zeroed and read eagerly.
    let out = DeviceBuffer::new_in(BYTES, &stream, mr.clone())?;
    fill(out.data(), 0, s)?;
    s.synchronize()?;

    // The graph pool reserves from the same pool; 16 MiB up front, before the capture.
    let graphs =
        GraphPool::with_options(mr.clone(), GraphPoolOptions::new().initial_size(16 << 20))?;
    let scope = graphs.capture(s)?;
    {
        // Allocated inside the capture: served by the graph pool.
        let x = DeviceBuffer::new_in(BYTES, &stream, mr.clone())?;
        fill(x.data(), 1, s)?;
        add(&k, out.data(), x.data(), s)?;
        let y = DeviceBuffer::new_in(BYTES, &stream, mr.clone())?;
        fill(y.data(), 2, s)?;
        add(&k, out.data(), y.data(), s)?;
        println!(
            "captured two buffers at {} and {} from the graph pool ({} B reserved, {} B in use)",
            x.data(),
            y.data(),
            graphs.reserved_bytes(),
            graphs.in_use_bytes()
        );
        // Dropped here, inside the capture: their blocks stay the graph's.
    }
    let graph = scope.end()?;
    println!(
        "graph: {} nodes; graph pool in use after the capture: {} B",
        graph.node_count()?,
        graphs.in_use_bytes()
    );
    let exec = graph.instantiate(0)?;
    drop(graph);
    for _ in 0..REPLAYS {
        exec.launch(s)?;
    }
    let words: Vec<u32> = out
        .to_vec(s)?
        .chunks_exact(4)
        .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    let expected = 3 * REPLAYS;
    if let Some((i, w)) = words.iter().enumerate().find(|&(_, &w)| w != expected) {
        return Err(format!("word {i} is {w}, expected {expected}").into());
    }
    println!("replayed {REPLAYS} times: every word is {expected}");

    let reserved = graphs.reserved_bytes();
    drop(exec);
    drop(graphs);
    println!(
        "graph pool dropped with its graphs: {reserved} B back to the pool (pool size {} B)",
        pool.pool_size()
    );
    drop(out);
    s.synchronize()?;
    Ok(())
}
