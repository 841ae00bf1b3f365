//! Example 02 (guide: "Stream-ordered allocation", "Pool allocators"): a pool, two streams and an
//! event. Memory allocated on one stream is written there, handed to the other stream through
//! the event, read and freed there; the pool then reuses it safely. Ends with
//! `release_unused`. Without a GPU it says so in one line and exits with status 1.

use std::process::ExitCode;

use rmm::prelude::*;
use rmm::InvalidFree;

fn main() -> ExitCode {
    if let Some(why) = rmm::sys::gpu_unavailable_reason() {
        eprintln!("rmm example 02: no GPU available: {why}");
        return ExitCode::FAILURE;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rmm example 02 failed: {e}");
            ExitCode::FAILURE
        }
    }
}

const WORDS: usize = 1 << 20;
const BYTES: usize = WORDS * 4;

fn run() -> Result<(), MrError> {
    // 64 MiB now, at most 256 MiB.
    let pool = PoolMemoryResource::with_options(
        CudaMemoryResource::new(),
        PoolOptions::new(64 << 20).maximum_pool_size(256 << 20),
    )?;
    let producer = CudaStream::non_blocking()?;
    let consumer = CudaStream::non_blocking()?;
    println!("pool of {} B, two non-blocking streams", pool.pool_size());

    // 1. Allocate on the producer and write there.
    let p = pool.allocate(producer.view(), BYTES, 256)?;
    // SAFETY: `p` holds `BYTES` = 4 * `WORDS` bytes from the pool, ordered on `producer`.
    unsafe { rmm::sys::memory::memset_d32_async(p, 0xC0FF_EE00, WORDS, producer.view().as_raw())? };

    // 2. The consumer waits for that point of the producer (on the GPU; the host goes on).
    let written = CudaEvent::new()?;
    written.record(producer.view())?;
    written.wait(consumer.view())?;

    // 3. Read on the consumer (this copy waits for it on the host).
    let mut host = vec![0u8; BYTES];
    // SAFETY: `p` holds `BYTES` bytes; the consumer is ordered after the producer's write.
    unsafe { rmm::sys::memory::copy_to_host_sync(&mut host, p, consumer.view().as_raw())? };
    let first = u32::from_ne_bytes([host[0], host[1], host[2], host[3]]);
    println!("the consumer read {first:#x} (expected 0xc0ffee00)");

    // 4. Free on the consumer: the last stream that used the memory.
    // SAFETY: `p` came from `pool` with these arguments; every use of it is ordered before this
    // point of `consumer`.
    unsafe { pool.deallocate(consumer.view(), p, BYTES, 256)? };

    // 5. Allocate on the producer again: the pool may hand out the block freed on the consumer,
    //    after making the producer wait for an event recorded at the free.
    let q = pool.allocate(producer.view(), BYTES, 256)?;
    println!(
        "allocated again on the producer: {} ({}), {} allocation(s) outstanding",
        q,
        if q == p {
            "the same block, reused across streams"
        } else {
            "another block"
        },
        pool.outstanding_allocations()
    );
    // SAFETY: `q` came from `pool` with these arguments and only the producer could use it.
    unsafe { pool.deallocate(producer.view(), q, BYTES, 256)? };

    // 6. A wrong free is an error value, and the pool is unchanged.
    // SAFETY: deliberately a double free of `q`: the pool checks every free against its
    // handed-out map and rejects this one without touching memory.
    match unsafe { pool.deallocate(producer.view(), q, BYTES, 256) } {
        Err(
            e @ MrError::InvalidFree {
                kind: InvalidFree::DoubleFree | InvalidFree::UnknownPointer,
                ..
            },
        ) => println!("freeing it twice: {e}"),
        Err(e) => println!("freeing it twice failed otherwise: {e}"),
        Ok(()) => println!("freeing it twice went unnoticed"),
    }

    // 7. Exhaustion is out-of-memory, not a crash.
    match pool.allocate(producer.view(), 512 << 20, 256) {
        Err(e) if e.is_out_of_memory() => println!("512 MiB from a 256 MiB pool: {e}"),
        Err(e) => return Err(e),
        Ok(r) => {
            println!("512 MiB from a 256 MiB pool unexpectedly succeeded");
            // SAFETY: `r` was just allocated with these arguments and is unused.
            unsafe { pool.deallocate(producer.view(), r, 512 << 20, 256)? };
        }
    }

    // 8. Give the wholly free chunks back to the device.
    producer.synchronize()?;
    consumer.synchronize()?;
    let released = pool.release_unused()?;
    println!(
        "release_unused gave back {released} B; the pool now holds {} B",
        pool.pool_size()
    );
    Ok(())
}
