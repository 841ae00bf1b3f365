//! Allocate + free pairs through the C entry points PyTorch calls (`rmm_rs_torch_alloc`,
//! `rmm_rs_torch_free`), over a do-nothing resource, in a loop that is easy to count
//! instructions in (the method and the counts: `docs/perf-log/2026-11-26-capi-instructions.md`).
//!
//! ```text
//! capi_pair_count [--instructions] [--cross] [RESOURCE [LAYERS [STREAM [SIZE [PAIRS]]]]]
//! ```
//!
//! - RESOURCE: `pool` (an rmm-rs pool, 4 GiB initial, over the do-nothing resource, as
//!   `bench_torch.py` configures it) or `null` (the do-nothing resource itself: what the C ABI
//!   and the layers above the pool cost), or `all`;
//! - LAYERS: `plain` (no statistics), `stats` (the statistics option) or `log` (statistics and
//!   the CSV log, to a file in the temporary directory), or `all` (`plain` and `stats`);
//! - STREAM: `legacy` (handle 0, PyTorch's default stream) or `stream` (a raw non-default
//!   handle, whose `cuStreamGetId` rmm-sys's simulated driver answers), or `all`;
//! - SIZE: `1KiB`, `256KiB` or `4MiB` (the sizes of `bench_torch.py`), or `all`;
//! - PAIRS: pairs in the measured loop (default 100,000; 20,000 with `--instructions`).
//!
//! `--cross`: the calling thread allocates and a second thread frees, in batches of 64 handed
//! over through a channel (PyTorch's autograd thread allocates gradients the main thread frees):
//! both threads' instructions are counted, channel included.
//!
//! Every case runs in a process of its own (the C API has one table per process): the loop
//! once uncounted, then once measured. Without a flag it prints nanoseconds per pair (a quick
//! look, not a benchmark). `--instructions` runs each case under
//! `valgrind --tool=callgrind --toggle-collect=*capi_pair_count::measured*` and prints the
//! instructions of the measured loop divided by the pairs. What the count leaves out: the
//! driver's own time, and on a GPU the context check of each call (no simulated driver
//! answers it).

use std::ffi::{c_void, CString};
use std::hint::black_box;
use std::process::Command;
use std::time::Instant;

use rmm::sys::fault::{fake_stream, FaultScope};
use rmm_capi::abi::{RMM_RS_RESOURCE_CUDA, RMM_RS_RESOURCE_POOL};
use rmm_capi::ffi::{rmm_rs_configure, rmm_rs_get_statistics, rmm_rs_options_init};
use rmm_capi::torch::{rmm_rs_torch_alloc, rmm_rs_torch_free};
use rmm_capi::{RmmRsOptions, RmmRsStatistics};

/// One case, as named on the command line.
struct Case<'a> {
    resource: &'a str,
    layers: &'a str,
    stream: &'a str,
    size: &'a str,
}

impl Case<'_> {
    fn bytes(&self) -> isize {
        match self.size {
            "1KiB" => 1 << 10,
            "256KiB" => 256 << 10,
            "4MiB" => 4 << 20,
            other => panic!("unknown size {other}"),
        }
    }

    fn stream(&self) -> *mut c_void {
        match self.stream {
            "legacy" => std::ptr::null_mut(),
            "stream" => fake_stream(1).cast(),
            other => panic!("unknown stream {other}"),
        }
    }

    /// Configures every device as the case says (in this process).
    fn configure(&self) {
        assert!(
            rmm_capi::testing::serve_fake_memory(),
            "the table existed already"
        );
        let mut o = std::mem::MaybeUninit::<RmmRsOptions>::uninit();
        // SAFETY: `o` is writable.
        assert_eq!(unsafe { rmm_rs_options_init(o.as_mut_ptr()) }, 0);
        // SAFETY: initialized by the call.
        let mut o = unsafe { o.assume_init() };
        o.resource = match self.resource {
            "pool" => RMM_RS_RESOURCE_POOL,
            "null" => RMM_RS_RESOURCE_CUDA,
            other => panic!("unknown resource {other}"),
        };
        if self.resource == "pool" {
            o.initial_pool_size = 4 << 30;
        }
        let log = std::env::temp_dir().join(format!("capi_pair_count.{}.csv", std::process::id()));
        let log = CString::new(log.to_string_lossy().into_owned()).expect("a path without NUL");
        match self.layers {
            "plain" => o.statistics = 0,
            "stats" => o.statistics = 1,
            "log" => {
                o.statistics = 1;
                o.log_file = log.as_ptr();
            }
            other => panic!("unknown layers {other}"),
        }
        // SAFETY: `o` and its log path are valid for the call.
        assert_eq!(unsafe { rmm_rs_configure(&o) }, 0);
    }
}

/// The measured pass (callgrind counts this function's inclusive instructions; the untimed
/// first pass calls [`run_pairs`] directly, so it is not counted).
#[inline(never)]
fn measured(bytes: isize, stream: *mut c_void, pairs: usize) {
    run_pairs(bytes, stream, pairs);
}

/// `pairs` allocate + free pairs of `bytes` on device 0 and `stream`.
#[inline(never)]
fn run_pairs(bytes: isize, stream: *mut c_void, pairs: usize) {
    for _ in 0..pairs {
        // SAFETY: the stream is 0 or a fake handle the simulated driver answers; the pointer
        // is freed once, with its size, on the same stream.
        unsafe {
            let p = rmm_rs_torch_alloc(black_box(bytes), 0, stream);
            rmm_rs_torch_free(black_box(p), bytes, 0, stream);
        }
    }
}

/// Allocations handed from the allocating thread to the freeing one at a time (`--cross`).
const BATCH: usize = 64;

/// The measured pass of `--cross` on the allocating thread: `pairs` allocations of `bytes`,
/// sent to the freeing thread in batches.
#[inline(never)]
fn measured_allocations(
    bytes: isize,
    stream: usize,
    pairs: usize,
    to: &std::sync::mpsc::SyncSender<Vec<usize>>,
) {
    for _ in 0..pairs / BATCH {
        let batch = (0..BATCH)
            .map(|_| {
                // SAFETY: as in `run_pairs`.
                let p = unsafe { rmm_rs_torch_alloc(black_box(bytes), 0, stream as *mut c_void) };
                p as usize
            })
            .collect();
        to.send(batch).expect("the freeing thread");
    }
}

/// The measured pass of `--cross` on the freeing thread.
#[inline(never)]
fn measured_frees(bytes: isize, stream: usize, from: &std::sync::mpsc::Receiver<Vec<usize>>) {
    for batch in from {
        for p in batch {
            // SAFETY: each came from `rmm_rs_torch_alloc` with `bytes` on `stream`; freed once.
            unsafe {
                rmm_rs_torch_free(black_box(p as *mut c_void), bytes, 0, stream as *mut c_void)
            };
        }
    }
}

/// `--cross`: `pairs` allocations on this thread freed on another (see the module
/// documentation); nanoseconds per pair.
fn run_cross(bytes: isize, stream: *mut c_void, pairs: usize) -> f64 {
    let stream = stream as usize;
    let (to, from) = std::sync::mpsc::sync_channel::<Vec<usize>>(4);
    let freer = std::thread::spawn(move || {
        // The raw stream's driver calls are answered by the simulation on this thread too.
        let _sim = FaultScope::simulated();
        measured_frees(bytes, stream, &from);
    });
    let t = Instant::now();
    measured_allocations(bytes, stream, pairs, &to);
    drop(to);
    freer.join().expect("the freeing thread panicked");
    t.elapsed().as_nanos() as f64 / pairs.max(1) as f64
}

/// Runs one case in this process: nanoseconds per pair.
fn run_here(case: &Case<'_>, pairs: usize, cross: bool) -> f64 {
    // The raw stream's driver calls are answered by the simulation.
    let _sim = FaultScope::simulated();
    case.configure();
    let (bytes, stream) = (case.bytes(), case.stream());
    run_pairs(bytes, stream, pairs);
    let ns = if cross {
        run_cross(bytes, stream, pairs)
    } else {
        let t = Instant::now();
        measured(bytes, stream, pairs);
        t.elapsed().as_nanos() as f64 / pairs.max(1) as f64
    };
    let mut s = RmmRsStatistics::default();
    // SAFETY: `s` is writable.
    assert_eq!(unsafe { rmm_rs_get_statistics(0, &mut s) }, 0);
    assert_eq!(s.outstanding_allocations, 0, "{s:?}");
    assert_eq!(s.failed_allocations + s.failed_frees, 0, "{s:?}");
    ns
}

/// Runs one case in a child process, under callgrind when `instructions`: nanoseconds or
/// instructions per pair.
fn run_child(case: &Case<'_>, pairs: usize, instructions: bool, cross: bool) -> f64 {
    let me = std::env::current_exe().expect("the benchmark's own path");
    let args = [case.resource, case.layers, case.stream, case.size];
    let out = std::env::temp_dir().join(format!(
        "capi_pair_count.{}.{}.callgrind",
        std::process::id(),
        args.join(".")
    ));
    let child = if instructions {
        Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg("--toggle-collect=*capi_pair_count::measured*")
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(me)
            .arg("--child")
            .args(cross.then_some("--cross"))
            .args(args)
            .arg(pairs.to_string())
            .output()
            .expect("valgrind could not be started (is it installed?)")
    } else {
        Command::new(me)
            .arg("--child")
            .args(cross.then_some("--cross"))
            .args(args)
            .arg(pairs.to_string())
            .output()
            .expect("the benchmark could not start itself")
    };
    let stdout = String::from_utf8_lossy(&child.stdout);
    let log = String::from_utf8_lossy(&child.stderr);
    assert!(child.status.success(), "the case failed:\n{stdout}{log}");
    let _ = std::fs::remove_file(&out);
    if instructions {
        let collected: u64 = log
            .lines()
            .find_map(|l| l.split("Collected :").nth(1))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no instruction count in:\n{log}"));
        (collected / pairs as u64) as f64
    } else {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("ns "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no time in:\n{stdout}"))
    }
}

fn pick<'a>(arg: Option<&'a str>, all: &[&'a str]) -> Vec<&'a str> {
    match arg {
        None | Some("all") => all.to_vec(),
        Some(one) => vec![one],
    }
}

fn main() {
    let mut args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mut flag = |name: &str| {
        let found = args.iter().any(|a| a == name);
        args.retain(|a| a != name);
        found
    };
    let instructions = flag("--instructions");
    let child = flag("--child");
    let cross = flag("--cross");
    let arg = |i: usize| args.get(i).map(String::as_str);
    let default_pairs = if instructions { 20_000 } else { 100_000 };
    let pairs: usize = arg(4).map_or(default_pairs, |p| p.parse().expect("PAIRS: a number"));
    if child {
        let case = Case {
            resource: arg(0).expect("RESOURCE"),
            layers: arg(1).expect("LAYERS"),
            stream: arg(2).expect("STREAM"),
            size: arg(3).expect("SIZE"),
        };
        println!("ns {}", run_here(&case, pairs, cross));
        return;
    }
    let resources = pick(arg(0), &["pool", "null"]);
    let layers = pick(arg(1), &["plain", "stats"]);
    let streams = pick(arg(2), &["legacy", "stream"]);
    let sizes = pick(arg(3), &["1KiB", "256KiB", "4MiB"]);
    let unit = if instructions {
        "instructions per pair"
    } else {
        "ns per pair"
    };
    println!("| resource | layers | stream | size | {unit} |");
    println!("|---|---|---|---|---:|");
    for &resource in &resources {
        for &layer in &layers {
            for &stream in &streams {
                for &size in &sizes {
                    let case = Case {
                        resource,
                        layers: layer,
                        stream,
                        size,
                    };
                    let v = run_child(&case, pairs, instructions, cross);
                    println!("| {resource} | {layer} | {stream} | {size} | {v:.0} |");
                }
            }
        }
    }
}
