//! Launches a kernel through cudarc on an rmm-rs [`DeviceUvector`]: the vector lives on a
//! cudarc stream, is passed to the kernel as `&mut v`, and is read back both with rmm-rs and
//! with cudarc's own copy. The kernel is hand-written PTX (`add_one.ptx`: `data[i] += 1`), so
//! no NVRTC is needed. Without a GPU it says so in one line and exits with status 1, like the
//! other examples (a run that did nothing must not look like a success).
//!
//! Run with `cargo run -p rmm-containers --features cudarc --example cudarc_kernel`.

use std::error::Error;
use std::process::ExitCode;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use rmm_containers::interop::{configure_device_default_pool, cudarc_context};
use rmm_containers::DeviceUvector;

const ADD_ONE_PTX: &str = include_str!("add_one.ptx");

fn main() -> ExitCode {
    // cudarc panics without a driver; ask rmm-rs first.
    if let Some(why) = rmm_sys::gpu_unavailable_reason() {
        eprintln!("cudarc_kernel: no GPU available: {why}");
        return ExitCode::FAILURE;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cudarc_kernel failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let device = rmm_sys::current_device()?;

    // Keep freed memory in the pool cudarc allocates from (its default threshold is 0).
    let pool = configure_device_default_pool(device, u64::MAX, None)?;
    println!(
        "device {device}: current pool release threshold {} bytes",
        pool.release_threshold
    );

    let ctx = cudarc_context(device)?;
    let stream = ctx.new_stream()?;

    // An rmm-rs vector on the cudarc stream (it shares ownership of the stream).
    let host: Vec<f32> = (0..10_000).map(|i| i as f32 * 0.25).collect();
    let mut v = DeviceUvector::from_slice(&host, &stream, None)?;

    let module = ctx.load_module(Ptx::from_src(ADD_ONE_PTX))?;
    let add_one = module.load_function("add_one")?;
    let n = u32::try_from(host.len())?;
    let mut launch = stream.launch_builder(&add_one);
    launch.arg(&mut v).arg(&n);
    // SAFETY: `add_one(float* data, unsigned n)` touches exactly `n` floats of `v`, which holds
    // `n` floats and is ordered on `stream`, the launch stream.
    unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }?;

    // Read back through rmm-rs and through cudarc (`DevicePtr` for `DeviceUvector`).
    let ours = v.to_vec(v.stream())?;
    let theirs = stream.clone_dtoh(&v)?;
    let expected: Vec<f32> = host.iter().map(|x| x + 1.0).collect();
    if ours != expected || theirs != expected {
        return Err("the kernel did not add one to every element".into());
    }
    println!("cudarc_kernel: add_one over {n} floats on an rmm-rs DeviceUvector: ok");
    Ok(())
}
