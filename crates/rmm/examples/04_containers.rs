//! Example 04 (guide: "Stream-ordered allocation"): the containers. A `DeviceBuffer` of bytes,
//! a `DeviceUvector<f64>` and a `DeviceScalar<u64>` on a stream of their own: copies both ways,
//! resize and reserve, deep copies, element access and its out-of-range error. Without a GPU it
//! says so in one line and exits with status 1.

use std::process::ExitCode;
use std::sync::Arc;

use rmm::prelude::*;

fn main() -> ExitCode {
    if let Some(why) = rmm::sys::gpu_unavailable_reason() {
        eprintln!("rmm example 04: no GPU available: {why}");
        return ExitCode::FAILURE;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rmm example 04 failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), MrError> {
    let stream = Arc::new(CudaStream::non_blocking()?);

    // DeviceBuffer: untyped bytes.
    let mut buf = DeviceBuffer::from_host(b"hello from the device", &stream, None)?;
    println!(
        "buffer: size {}, capacity {}, on device {}",
        buf.size(),
        buf.capacity(),
        buf.device()
    );
    buf.reserve(1024, &stream)?; // capacity grows, the contents stay
    buf.resize(32, &stream)?; // within the capacity: only the size changes
    println!(
        "after reserve(1024) and resize(32): size {}, capacity {}",
        buf.size(),
        buf.capacity()
    );
    let copy = buf.try_clone_on(&stream, None)?; // a deep copy: capacity = size
    let text = copy.to_vec(stream.view())?;
    println!(
        "deep copy: size {}, capacity {}, starts with {:?}",
        copy.size(),
        copy.capacity(),
        String::from_utf8_lossy(&text[..21])
    );
    buf.shrink_to_fit(&stream)?;
    println!("after shrink_to_fit: capacity {}", buf.capacity());

    // DeviceUvector<f64>: typed and uninitialized.
    let input: Vec<f64> = (0..1000).map(|i| f64::from(i) * 0.5).collect();
    let mut v = DeviceUvector::from_slice(&input, &stream, None)?;
    v.set_element(0, -0.0, stream.view())?; // bytewise: -0.0 stays -0.0
    let zero = v.element(0, stream.view())?;
    println!(
        "vector of {} f64: element 0 is {zero} (sign bit kept: {}), element 999 is {}",
        v.len(),
        zero.is_sign_negative(),
        v.back_element(stream.view())?
    );
    v.resize(2000, &stream)?; // the first 1000 elements stay, the rest is uninitialized
    v.copy_from_host(&input, stream.view())?; // refill the first 1000
    let mut head = [0.0f64; 4];
    v.copy_to_host(&mut head, stream.view())?;
    println!(
        "after resize(2000): len {}, capacity {}, head {head:?}",
        v.len(),
        v.capacity()
    );
    match v.element(5000, stream.view()) {
        Err(e @ MrError::OutOfRange(_)) => println!("element 5000: {e}"),
        Err(e) => return Err(e),
        Ok(x) => println!("element 5000 unexpectedly read {x}"),
    }
    let back: Vec<f64> = v.to_vec(stream.view())?;
    println!(
        "copied back {} elements; the first 1000 match: {}",
        back.len(),
        back[..1000] == input[..]
    );
    let bytes: DeviceBuffer = v.release(); // the untyped buffer underneath
    println!("released to a buffer of {} bytes", bytes.size());

    // DeviceScalar<u64>: one value.
    let mut s = DeviceScalar::with_value(42u64, &stream, None)?;
    println!("scalar: {}", s.value(stream.view())?);
    s.set_value_async(&7, stream.view())?;
    let t = s.try_clone_on(&stream, None)?;
    println!(
        "scalar after set_value_async(7): {}, its deep copy: {}",
        s.value(stream.view())?,
        t.value(stream.view())?
    );

    // Containers free on their stream when dropped; failures there are kept, not lost.
    drop((buf, copy, bytes, s, t));
    stream.synchronize()?;
    let failed = rmm::take_drop_errors();
    println!("frees that failed in Drop: {}", failed.len());
    Ok(())
}
