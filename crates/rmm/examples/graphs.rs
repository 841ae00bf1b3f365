//! Example `graphs` (guide: "CUDA graphs"): a step that allocates device buffers, fills them
//! (memset nodes), adds them into an output with a small PTX kernel and frees them, captured
//! once into a CUDA graph with a graph-private pool serving its allocations, then replayed
//! 1,000 times. Prints where the memory came from and when it went back. Without a GPU it says
//! so in one line and exits with status 1.

use std::error::Error;
use std::ffi::c_void;
use std::process::ExitCode;
use std::sync::Arc;

use rmm::prelude::*;
use rmm::sys::kernel::{Function, Module};
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

/// `add(u32* out, const u32* x, u32 n)`: `out[i] += x[i]` for `i < n`.
const ADD_PTX: &std::ffi::CStr = c"
.version 7.0
.target sm_52
.address_size 64

.visible .entry add(
	.param .u64 add_out,
	.param .u64 add_x,
	.param .u32 add_n
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<8>;

	ld.param.u64 	%rd1, [add_out];
	ld.param.u64 	%rd2, [add_x];
	ld.param.u32 	%r1, [add_n];
	mov.u32 	%r2, %ctaid.x;
	mov.u32 	%r3, %ntid.x;
	mov.u32 	%r4, %tid.x;
	mad.lo.s32 	%r5, %r2, %r3, %r4;
	setp.ge.u32 	%p1, %r5, %r1;
	@%p1 bra 	$L__done;
	mul.wide.u32 	%rd3, %r5, 4;
	cvta.to.global.u64 	%rd4, %rd1;
	cvta.to.global.u64 	%rd5, %rd2;
	add.s64 	%rd4, %rd4, %rd3;
	add.s64 	%rd5, %rd5, %rd3;
	ld.global.u32 	%r6, [%rd4];
	ld.global.u32 	%r7, [%rd5];
	add.u32 	%r6, %r6, %r7;
	st.global.u32 	[%rd4], %r6;
$L__done:
	ret;
}
";

/// `out += x` over `WORDS` words, on `stream`.
fn add(
    k: Function,
    out: DevicePtr,
    x: DevicePtr,
    stream: CudaStreamView<'_>,
) -> Result<(), Box<dyn Error>> {
    let (mut o, mut a, mut n) = (out.addr(), x.addr(), WORDS as u32);
    let mut params: [*mut c_void; 3] = [
        (&raw mut o).cast(),
        (&raw mut a).cast(),
        (&raw mut n).cast(),
    ];
    // SAFETY: the parameters match `add(u32*, u32*, u32)`; both buffers hold `BYTES` and are
    // usable on `stream`; the module stays loaded until the stream is synchronized.
    unsafe {
        k.launch(
            [(WORDS as u32).div_ceil(256), 1, 1],
            [256, 1, 1],
            0,
            stream.as_raw(),
            &mut params,
        )?
    };
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
    let module = Module::load_ptx(ADD_PTX)?;
    let k = module.function(c"add")?;

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
        add(k, out.data(), x.data(), s)?;
        let y = DeviceBuffer::new_in(BYTES, &stream, mr.clone())?;
        fill(y.data(), 2, s)?;
        add(k, out.data(), y.data(), s)?;
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
