//! The `rmm-replay` binary, run as a user runs it. These trials need no GPU (they replay over
//! simulated memory, or check the one-line answer when there is none). In a GPU bundle the
//! binary is not there (only test binaries travel), so there every trial reports itself
//! ignored, with the reason.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use libtest_mimic::{Arguments, Completion, Failed, Trial};

const BIN: &str = env!("CARGO_BIN_EXE_rmm-replay");

fn sample() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/sample.csv")
}

/// The scratch directory of this process.
fn scratch_dir() -> PathBuf {
    std::env::temp_dir().join(format!("rmm-replay-cli-{}", std::process::id()))
}

/// A file in the scratch directory.
fn scratch(name: &str) -> PathBuf {
    let dir = scratch_dir();
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir.join(name)
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("rmm-replay runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Checks `cond`, or fails with `what` and the command's output.
fn check(cond: bool, what: &str, out: &Output) -> Result<(), Failed> {
    if cond {
        Ok(())
    } else {
        Err(format!(
            "{what}\nstatus: {:?}\nstdout:\n{}\nstderr:\n{}",
            out.status.code(),
            text(&out.stdout),
            text(&out.stderr)
        )
        .into())
    }
}

/// The value printed after `label` in a summary.
fn field<'a>(stdout: &'a str, label: &str) -> Option<&'a str> {
    stdout
        .lines()
        .find_map(|l| l.trim_start().strip_prefix(label))
        .map(str::trim)
}

fn help_lists_every_option() -> Result<(), Failed> {
    let out = run(&["--help"]);
    let stdout = text(&out.stdout);
    check(out.status.success(), "--help succeeds", &out)?;
    for needle in [
        "Usage: rmm-replay [OPTIONS] <LOG.csv|SNAPSHOT.pickle>...",
        "PyTorch memory snapshot",
        "--resource <RESOURCE>",
        "--simulate <SIZE>",
        "--write-log <FILE.csv>",
        "--plot <FILE.svg|FILE.png>",
        "pool",
        "arena",
        "binning",
        "fixed",
        "async",
        "cuda",
        "managed",
        "Exit status",
    ] {
        check(
            stdout.contains(needle),
            &format!("--help mentions {needle:?}"),
            &out,
        )?;
    }
    let out = run(&[]);
    check(
        out.status.code() == Some(2) && text(&out.stderr).contains("<LOG.csv|SNAPSHOT.pickle>"),
        "no log is a usage error (status 2)",
        &out,
    )
}

fn replays_the_sample_over_simulated_memory() -> Result<(), Failed> {
    let sample = sample();
    let out = run(&["--simulate", "1GiB", sample.to_str().unwrap()]);
    check(out.status.success(), "the sample fits in 1 GiB", &out)?;
    let stdout = text(&out.stdout);
    // Hand-counted from the sample: 32 allocations, 31 frees, one failure row; the peak is
    // 4 weights of 16 MiB, one batch of 8 MiB + 1 MiB + 512 B and one step's activations
    // (32 MiB + 24 MiB + 4 KiB + 3 MiB + 4 KiB + 100 B), first reached at line 12.
    let expect = [
        ("log rows", "64 (3 threads, 3 streams)"),
        ("allocations replayed", "32"),
        ("frees replayed", "31"),
        ("failures in the log", "1 (counted, not replayed)"),
        ("peak bytes in use", "132.01 MiB (138420836 B) at line 12"),
        // The pool has no maximum, as on a GPU: it grows by the request, then at least
        // doubles (5 chunks), to 256 MiB for the peak's 132 MiB.
        ("peak bytes reserved", "256.00 MiB (268435456 B)"),
        (
            "fragmentation at the peak",
            "48.4% (123.99 MiB reserved then, not in use)",
        ),
        ("peak reserved / peak in use", "1.94"),
        ("growths", "5 (chunks taken from the upstream or mapped)"),
        (
            "never freed in the log",
            "1 allocation, 16.00 MiB (freed after the replay)",
        ),
    ];
    for (label, value) in expect {
        check(
            field(&stdout, label) == Some(value),
            &format!("{label} should be {value:?}"),
            &out,
        )?;
    }
    check(
        field(&stdout, "wall time").is_some_and(|t| t.ends_with('s')),
        "the wall time is printed",
        &out,
    )?;
    check(out.stderr.is_empty(), "nothing on stderr", &out)
}

fn replays_a_pytorch_snapshot() -> Result<(), Failed> {
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/torch_snapshot.pickle");
    let sample = sample.to_str().unwrap();
    let plot = scratch("torch.svg");
    let out = run(&[
        "--simulate",
        "1GiB",
        "--plot",
        plot.to_str().unwrap(),
        sample,
    ]);
    check(out.status.success(), "the torch sample fits in 1 GiB", &out)?;
    let stdout = text(&out.stdout);
    check(
        stdout.starts_with(&format!("{sample} (device 0): ")),
        "the workload is named by the file and the device",
        &out,
    )?;
    // Hand-counted from python/tools/make_torch_snapshots.py --synthetic: 58 entries, 18
    // allocs plus 2 from before the trace (an 8 MiB block freed at entry 2, a 4 MiB block
    // held throughout), 18 completed frees, one oom entry; the peak is the held 4 MiB plus a
    // step's batch (2 MiB), normalized copy (512 KiB), activations (6 + 3 MiB) and gradient
    // (1 MiB), first reached at step 0's gradient, entry 13.
    let expect = [
        ("trace entries", "58 (1 thread, 2 streams)"),
        ("allocations replayed", "20"),
        ("frees replayed", "18"),
        (
            "allocated before the trace",
            "2 allocations (replayed first)",
        ),
        ("failures in the log", "1 (counted, not replayed)"),
        ("peak bytes in use", "16.50 MiB (17301504 B) at entry 13"),
        (
            "never freed in the log",
            "2 allocations, 6.00 MiB (freed after the replay)",
        ),
    ];
    for (label, value) in expect {
        check(
            field(&stdout, label) == Some(value),
            &format!("{label} should be {value:?}"),
            &out,
        )?;
    }
    check(plot.is_file(), "the plot is written", &out)?;
    // A pickle that is not a snapshot is bad input, named.
    let bad = scratch("not_a_snapshot.pickle");
    std::fs::write(&bad, [0x80, 4, b'N', b'.']).unwrap();
    let out = run(&["--simulate", "1GiB", bad.to_str().unwrap()]);
    check(
        out.status.code() == Some(2)
            && text(&out.stderr).contains(
                "not a PyTorch memory snapshot: the pickle should be a dict with device_traces",
            ),
        "a pickle of None is refused as bad input",
        &out,
    )
}

/// A snapshot PyTorch 2.11 wrote on an H200 (`python/tools/make_torch_snapshots.py`: a training
/// loop on two streams) replays whole: every entry read, the blocks held before the trace
/// allocated first.
fn replays_a_real_pytorch_snapshot() -> Result<(), Failed> {
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/torch_two_streams.pickle");
    let out = run(&["--simulate", "80GiB", sample.to_str().unwrap()]);
    check(out.status.success(), "the real torch sample replays", &out)?;
    let stdout = text(&out.stdout);
    // Counted by the script on the GPU machine: 1,197 entries (411 alloc, 390 free_requested,
    // 389 free_completed, 7 segment_alloc) on 2 streams; 7 blocks were held before recording.
    let expect = [
        ("trace entries", "1197 (1 thread, 2 streams)"),
        ("allocations replayed", "418"),
        ("frees replayed", "389"),
        (
            "allocated before the trace",
            "7 allocations (replayed first)",
        ),
        ("failures in the log", "0 (counted, not replayed)"),
    ];
    for (label, value) in expect {
        check(
            field(&stdout, label) == Some(value),
            &format!("{label} should be {value:?}"),
            &out,
        )?;
    }
    Ok(())
}

/// The pages that show the sample's replay, each with the command that prints it.
const DOCUMENTED_OUTPUT: [(&str, &str); 2] = [
    ("README.md", include_str!("../../../README.md")),
    (
        "docs/guide/09-replaying-logs.md",
        include_str!("../../../docs/guide/09-replaying-logs.md"),
    ),
];

/// The first ```text block after `after` in `page`, its lines without the wall time (which
/// varies from run to run).
fn documented_block<'a>(page: &'a str, after: &str) -> Option<Vec<&'a str>> {
    let rest = &page[page.find(after)?..];
    let body = &rest[rest.find("```text\n")? + "```text\n".len()..];
    let body = &body[..body.find("```")?];
    Some(
        body.lines()
            .filter(|l| !l.trim_start().starts_with("wall time"))
            .collect(),
    )
}

/// The README and the replay page show the sample's summary as the tool prints it today, line
/// for line (a new line of the summary must be added there), and name every `--resource`.
fn the_documented_output_is_what_it_prints() -> Result<(), Failed> {
    let sample = sample();
    let out = run(&["--simulate", "1GiB", sample.to_str().unwrap()]);
    check(out.status.success(), "the sample fits in 1 GiB", &out)?;
    let stdout = text(&out.stdout);
    let printed: Vec<&str> = stdout
        .lines()
        .filter(|l| !l.trim_start().starts_with("wall time"))
        .collect();
    for (page_name, page) in DOCUMENTED_OUTPUT {
        let shown = documented_block(page, "--simulate 1GiB crates/rmm-replay/samples/sample.csv")
            .or_else(|| documented_block(page, "over 1 GiB of simulated memory:"))
            .ok_or_else(|| format!("{page_name}: no sample output found"))?;
        // The tool prints the path it was given; the pages show it relative to the repository.
        let shown: Vec<String> = shown
            .iter()
            .map(|l| {
                l.replace(
                    "crates/rmm-replay/samples/sample.csv",
                    sample.to_str().unwrap(),
                )
            })
            .collect();
        if shown != printed {
            return Err(format!(
                "{page_name} shows a different summary than the tool prints\n\
                 shown:\n{}\nprinted:\n{}",
                shown.join("\n"),
                printed.join("\n")
            )
            .into());
        }
        for kind in rmm_replay::ResourceKind::ALL {
            let name = format!("`{}`", kind.name());
            if !page.contains(&name) {
                return Err(format!("{page_name} does not name --resource {name}").into());
            }
        }
    }
    Ok(())
}

fn every_simulated_resource_replays_the_sample() -> Result<(), Failed> {
    let sample = sample();
    for resource in ["pool", "arena", "binning", "fixed", "vmm"] {
        let out = run(&["-r", resource, "-s", "4GiB", sample.to_str().unwrap()]);
        check(
            out.status.success(),
            &format!("{resource} replays the sample"),
            &out,
        )?;
        let stdout = text(&out.stdout);
        check(
            field(&stdout, "allocations replayed") == Some("32")
                && field(&stdout, "peak bytes in use")
                    == Some("132.01 MiB (138420836 B) at line 12"),
            &format!("{resource}: every allocation, the same peak"),
            &out,
        )?;
        check(
            field(&stdout, "peak reserved / peak in use").is_some()
                && field(&stdout, "largest allocation after")
                    .is_some_and(|v| v.ends_with("of 4.00 GiB probed, everything freed)")),
            &format!("{resource}: the ratio and the largest allocation after"),
            &out,
        )?;
    }
    Ok(())
}

fn running_out_names_the_row_and_fails() -> Result<(), Failed> {
    let sample = sample();
    let path = sample.to_str().unwrap();
    // A pool of at most 100 MiB takes 50 MiB, then 25 MiB (half of what is left each time);
    // the three weights fill the first chunk, the fourth and the batch (8 MiB + 1 MiB) the
    // second, and the 32 MiB activation of line 8 finds only 25 MiB of room to grow.
    let out = run(&["--simulate", "100MiB", path]);
    let stderr = text(&out.stderr);
    check(
        out.status.code() == Some(1),
        "out of memory is status 1",
        &out,
    )?;
    check(
        stderr.starts_with(&format!(
            "rmm-replay: {path} line 8: ran out of memory allocating 32.00 MiB on thread 3: \
             std::bad_alloc: out_of_memory: Maximum pool size exceeded"
        )),
        "stderr names the log, the line, the request and the thread",
        &out,
    )?;
    check(stderr.lines().count() == 1, "one line on stderr", &out)?;
    check(
        field(&text(&out.stdout), "allocations replayed") == Some("6 of 32"),
        "the summary says how far it got",
        &out,
    )
}

fn malformed_logs_name_the_file_and_line() -> Result<(), Failed> {
    let bad = scratch("bad.csv");
    let cases = [
        (
            "Thread,Time,Action,Pointer,Size,Stream\n\
             1,00:00:00.000001,allocate,0x100,10,0\n\
             \n\
             1,00:00:00.000002,reallocate,0x100,10,0\n",
            "line 4: invalid action string \"reallocate\"",
        ),
        (
            "Thread,Time,Action,Pointer,Size,Stream\n\
             1,00:00:00.000001,allocate,0x100,10\n",
            "line 2: 5 fields where the header has 6",
        ),
        (
            "Thread,Action,Pointer,Size,Stream\n",
            "line 1: memory-event log header lacks the column Time",
        ),
        (
            "Thread,Time,Action,Pointer,Size,Stream\n\
             1,00:00:00.000001,allocate,0x100,10,0\n\
             2,00:00:00.000002,free,0x100,12,0\n",
            "line 3: free of 0x100 with 12 bytes, allocated with 10 bytes at line 2",
        ),
        ("", "line 1: memory-event log is empty"),
    ];
    for (contents, expected) in cases {
        std::fs::write(&bad, contents).unwrap();
        let path = bad.to_str().unwrap();
        let out = run(&["--simulate", "1GiB", path]);
        check(
            out.status.code() == Some(2)
                && text(&out.stderr).starts_with(&format!("rmm-replay: {path}: {expected}")),
            &format!("status 2 and `{path}: {expected}`"),
            &out,
        )?;
        check(out.stdout.is_empty(), "nothing replayed", &out)?;
    }
    // Binary garbage is an error too, never a panic.
    std::fs::write(&bad, [0xff, 0xfe, 0x00, 0x80, b'\n', 0xc3]).unwrap();
    let out = run(&["--simulate", "1GiB", bad.to_str().unwrap()]);
    check(out.status.code() == Some(2), "garbage is status 2", &out)?;
    let missing = scratch("missing.csv");
    let out = run(&["--simulate", "1GiB", missing.to_str().unwrap()]);
    check(
        out.status.code() == Some(2) && text(&out.stderr).contains("missing.csv"),
        "a missing file is named",
        &out,
    )
}

fn a_bad_log_stops_everything_before_any_replay() -> Result<(), Failed> {
    let bad = scratch("second.csv");
    std::fs::write(&bad, "Thread,Time,Action,Pointer,Size,Stream\nx\n").unwrap();
    let sample = sample();
    let out = run(&[
        "-s",
        "1GiB",
        sample.to_str().unwrap(),
        bad.to_str().unwrap(),
    ]);
    check(
        out.status.code() == Some(2) && out.stdout.is_empty(),
        "the second log is read before the first replays",
        &out,
    )
}

fn simulation_is_only_for_sub_allocators() -> Result<(), Failed> {
    let sample = sample();
    for resource in ["async", "cuda", "managed"] {
        let out = run(&["-r", resource, "-s", "1GiB", sample.to_str().unwrap()]);
        check(
            out.status.code() == Some(2)
                && text(&out.stderr)
                    .contains("--simulate works with pool, arena, binning, fixed and vmm"),
            &format!("{resource} over simulated memory is refused"),
            &out,
        )?;
    }
    Ok(())
}

fn without_a_gpu_it_says_so_in_one_line() -> Result<(), Failed> {
    let sample = sample();
    let out = run(&[sample.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    check(out.status.code() == Some(3), "no GPU is status 3", &out)?;
    check(
        stderr.lines().count() == 1
            && stderr
                .starts_with("rmm-replay: replaying on a GPU needs one, and there is none here")
            && stderr.contains("--simulate SIZE"),
        "one line that says what to do",
        &out,
    )?;
    check(out.stdout.is_empty(), "nothing replayed", &out)
}

fn plots_are_written_as_svg_and_png() -> Result<(), Failed> {
    let sample = sample();
    let svg = scratch("memory.svg");
    let png = scratch("memory.PNG");
    for path in [&svg, &png] {
        let _ = std::fs::remove_file(path);
        let out = run(&[
            "-s",
            "1GiB",
            "--plot",
            path.to_str().unwrap(),
            sample.to_str().unwrap(),
            sample.to_str().unwrap(),
        ]);
        check(out.status.success(), "a plot of two logs", &out)?;
        check(
            text(&out.stdout).contains(&format!("plot written to {}", path.display())),
            "the plot is announced",
            &out,
        )?;
    }
    let svg_text = std::fs::read_to_string(&svg)?;
    if !(svg_text.starts_with("<svg") && svg_text.contains("height=\"840\"")) {
        return Err("the SVG has two panels of 420 pixels".into());
    }
    for label in [
        "in use",
        "reserved",
        "simulated memory",
        "replayed event",
        "bytes (GiB)",
    ] {
        if !svg_text.contains(label) {
            return Err(format!("the SVG lacks {label:?}").into());
        }
    }
    let png_bytes = std::fs::read(&png)?;
    let header = b"\x89PNG\r\n\x1a\n";
    if !png_bytes.starts_with(header) {
        return Err("not a PNG".into());
    }
    // IHDR: width and height, big-endian, after the signature and the chunk's length and name.
    let width = u32::from_be_bytes(png_bytes[16..20].try_into()?);
    let height = u32::from_be_bytes(png_bytes[20..24].try_into()?);
    if (width, height) != (1000, 840) {
        return Err(format!("the PNG is {width}x{height}, not 1000x840").into());
    }
    let out = run(&[
        "-s",
        "1GiB",
        "--plot",
        "memory.jpg",
        sample.to_str().unwrap(),
    ]);
    check(
        out.status.code() == Some(2) && text(&out.stderr).contains(".svg or a .png"),
        "an unknown plot format is refused before replaying",
        &out,
    )
}

/// `--write-log`: the two-stream PyTorch snapshot written as an RMM log replays over simulated
/// memory with the snapshot's own figures (no failure rows, nothing unmatched); two inputs are a
/// usage error.
fn writes_a_snapshot_as_an_rmm_log() -> Result<(), Failed> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples");
    let snap = dir.join("torch_two_streams.pickle");
    let log = scratch("two_streams.csv");
    let out = run(&["--write-log", log.to_str().unwrap(), snap.to_str().unwrap()]);
    check(
        out.status.success(),
        "--write-log writes the snapshot",
        &out,
    )?;
    let head = std::fs::read_to_string(&log).map_err(|e| format!("{e}"))?;
    check(
        head.starts_with("Thread,Time,Action,Pointer,Size,Stream\n"),
        "the log has RMM's header",
        &out,
    )?;
    let of_snapshot = run(&["--simulate", "1GiB", snap.to_str().unwrap()]);
    let of_log = run(&["--simulate", "1GiB", log.to_str().unwrap()]);
    check(of_log.status.success(), "the written log replays", &of_log)?;
    let (snapshot_says, log_says) = (text(&of_snapshot.stdout), text(&of_log.stdout));
    for label in [
        "allocations replayed",
        "frees replayed",
        "peak bytes reserved",
    ] {
        let want = field(&snapshot_says, label);
        check(
            want.is_some() && field(&log_says, label) == want,
            &format!("{label} as the snapshot's ({want:?})"),
            &of_log,
        )?;
    }
    let sample = sample();
    let two = run(&[
        "--write-log",
        log.to_str().unwrap(),
        sample.to_str().unwrap(),
        sample.to_str().unwrap(),
    ]);
    check(
        two.status.code() == Some(2) && text(&two.stderr).contains("one workload"),
        "two inputs are a usage error",
        &two,
    )
}

fn main() {
    let args = Arguments::from_args();
    let missing = !Path::new(BIN).exists();
    let trial = |name: &str, f: fn() -> Result<(), Failed>| {
        Trial::ignorable_test(name, move || {
            if missing {
                // A GPU bundle carries test binaries only.
                return Ok(Completion::ignored_with(format!(
                    "the rmm-replay binary is not here ({BIN})"
                )));
            }
            f().map(|()| Completion::Completed)
        })
    };
    let trials = vec![
        trial("help_lists_every_option", help_lists_every_option),
        trial(
            "replays_the_sample_over_simulated_memory",
            replays_the_sample_over_simulated_memory,
        ),
        trial("replays_a_pytorch_snapshot", replays_a_pytorch_snapshot),
        trial(
            "writes_a_snapshot_as_an_rmm_log",
            writes_a_snapshot_as_an_rmm_log,
        ),
        trial(
            "replays_a_real_pytorch_snapshot",
            replays_a_real_pytorch_snapshot,
        ),
        trial(
            "the_documented_output_is_what_it_prints",
            the_documented_output_is_what_it_prints,
        ),
        trial(
            "every_simulated_resource_replays_the_sample",
            every_simulated_resource_replays_the_sample,
        ),
        trial(
            "running_out_names_the_row_and_fails",
            running_out_names_the_row_and_fails,
        ),
        trial(
            "malformed_logs_name_the_file_and_line",
            malformed_logs_name_the_file_and_line,
        ),
        trial(
            "a_bad_log_stops_everything_before_any_replay",
            a_bad_log_stops_everything_before_any_replay,
        ),
        trial(
            "simulation_is_only_for_sub_allocators",
            simulation_is_only_for_sub_allocators,
        ),
        Trial::ignorable_test("without_a_gpu_it_says_so_in_one_line", move || {
            if missing {
                return Ok(Completion::ignored_with(format!(
                    "the rmm-replay binary is not here ({BIN})"
                )));
            }
            if rmm::sys::gpu_unavailable_reason().is_none() {
                return Ok(Completion::ignored_with("a GPU is present"));
            }
            without_a_gpu_it_says_so_in_one_line().map(|()| Completion::Completed)
        }),
        trial(
            "plots_are_written_as_svg_and_png",
            plots_are_written_as_svg_and_png,
        ),
    ];
    let conclusion = libtest_mimic::run(&args, trials);
    let _ = std::fs::remove_dir_all(scratch_dir());
    conclusion.exit();
}
