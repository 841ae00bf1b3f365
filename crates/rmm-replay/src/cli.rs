//! The command line of `rmm-replay`.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufRead, BufReader, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rmm::ByteSize;

use crate::plan::Workload;
use crate::plot::{self, Format};
use crate::run::{replay_log_with, Report, RunError};
use crate::target::{self, BuildError, BuildOptions, Memory, ResourceKind};
use crate::LogError;

/// Exit status of a replay that ran out of memory or that the resource failed.
pub const EXIT_FAILED: u8 = 1;
/// Exit status of bad usage, or of a log that cannot be read or is malformed.
pub const EXIT_BAD_INPUT: u8 = 2;
/// Exit status when a replay needs a GPU and there is none.
pub const EXIT_NO_GPU: u8 = 3;

/// Logs at least this large show a progress bar while they are read (on a terminal).
const BAR_BYTES: u64 = 16 << 20;
/// Logs with at least this many replayed events show a progress bar while they replay (on a
/// terminal).
const BAR_STEPS: usize = 100_000;

const AFTER_HELP: &str = "\
Each log is replayed on its own, on a fresh resource, in the log's order across its threads
(one replay thread per thread of the log, as RMM's replay benchmark). `allocate failure` rows
are counted, not replayed; a free of a pointer the log never allocated is skipped.

A PyTorch memory snapshot (torch.cuda.memory._dump_snapshot's pickle, told from a CSV log by
its first bytes) replays each device's trace as a log of its own: `alloc` entries allocate,
`free_completed` entries free, on their streams, `oom` entries count as failures; allocations
made before the trace began are allocated first (positions are trace entries, not lines).

Over simulated memory (--simulate) every event runs on one stream and no GPU is needed; the
simulated device of SIZE bytes stands for the GPU's free memory and every resource is built as
on the GPU: pool and binning's pool without a maximum (the device refuses what does not fit,
and a refused growth is halved down to the request), vmm with maximum SIZE, arena of SIZE / 2.
So the peak reserved over simulated memory predicts the GPU's. `growths` counts the chunks a
pool took from its upstream or mapped: on a GPU each is a driver allocation of tens of
microseconds.

Exit status: 0 when every log replayed; 1 when a replay ran out of memory (the row is named)
or the resource failed; 2 for bad usage or a log that cannot be read or is malformed (the file
and line are named); 3 when a replay needs a GPU and there is none.

Examples: rmm-replay --simulate 80GiB --resource arena --plot memory.svg rmm_log.dev0.csv
          rmm-replay --simulate 80GiB --resource pool snapshot.pickle";

/// Replay RMM memory-event logs (CSV) or PyTorch memory snapshots against an rmm-rs memory
/// resource.
///
/// Reads logs written by RMM's logging_resource_adaptor (or rmm-rs's LoggingResourceAdaptor)
/// and snapshots written by torch.cuda.memory._dump_snapshot, replays them against the chosen resource on the GPU or over simulated memory, and prints for
/// each log the allocations replayed, the failures the log recorded, the peak bytes in use, the
/// peak bytes the resource reserved (and their ratio), fragmentation at the peak, the largest
/// allocation served after the replay, and the wall time.
#[derive(Debug, Parser)]
#[command(name = "rmm-replay", version, after_help = AFTER_HELP)]
pub struct Args {
    /// The memory resource to replay against.
    #[arg(short, long, value_enum, default_value_t = ResourceKind::Pool)]
    pub resource: ResourceKind,

    /// Replay over SIZE bytes of simulated memory (e.g. 80GiB, 512MiB) instead of a GPU: no GPU
    /// needed (pool, arena, binning, fixed and vmm only).
    #[arg(short, long, value_name = "SIZE", value_parser = parse_size)]
    pub simulate: Option<ByteSize>,

    /// The VMM pool's growth step (--resource vmm): each growth maps at least PERCENT of what is
    /// mapped already (0..=100; 100, the default, doubles; 0 maps just what the request lacks,
    /// rounded up to the 2 MiB granularity).
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u16).range(0..=100))]
    pub vmm_min_growth: Option<u16>,

    /// Write the one log or snapshot given as an RMM memory-event log (CSV) to FILE and stop,
    /// replaying nothing (no GPU needed): a PyTorch snapshot becomes a log that RMM's replay
    /// benchmark and `rmm_peer --replay` read.
    #[arg(long, value_name = "FILE.csv")]
    pub write_log: Option<PathBuf>,

    /// Draw bytes in use and reserved over each log into FILE.svg or FILE.png.
    #[arg(short, long, value_name = "FILE.svg|FILE.png", value_parser = parse_plot_path)]
    pub plot: Option<PathBuf>,

    /// Memory-event logs (CSV with a Thread,Time,Action,Pointer,Size,Stream header) or PyTorch
    /// memory snapshots (pickles).
    #[arg(value_name = "LOG.csv|SNAPSHOT.pickle", required = true)]
    pub logs: Vec<PathBuf>,
}

fn parse_size(text: &str) -> Result<ByteSize, String> {
    let size: ByteSize = text.parse().map_err(|e| format!("{e}"))?;
    if size.bytes() == 0 {
        return Err("the simulated memory needs at least one byte".to_owned());
    }
    Ok(size)
}

fn parse_plot_path(text: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(text);
    match Format::of(&path) {
        Some(_) => Ok(path),
        None => Err("a plot is a .svg or a .png file (by its extension)".to_owned()),
    }
}

/// Runs `rmm-replay` with `args` (the program name first) and returns its exit status.
pub fn main<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args = match Args::try_parse_from(args) {
        Ok(args) => args,
        Err(e) => {
            // Help and version go to stdout with status 0, usage errors to stderr with 2.
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(EXIT_BAD_INPUT));
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure { status, message }) => {
            if let Some(message) = message {
                eprintln!("rmm-replay: {message}");
            }
            ExitCode::from(status)
        }
    }
}

/// An exit status, with the line to print (if not printed already).
struct Failure {
    status: u8,
    message: Option<String>,
}

impl Failure {
    fn new(status: u8, message: impl Into<String>) -> Failure {
        Failure {
            status,
            message: Some(message.into()),
        }
    }
}

fn run(args: &Args) -> Result<(), Failure> {
    let memory = match args.simulate {
        Some(size) => {
            if !args.resource.can_simulate() {
                return Err(Failure::new(
                    EXIT_BAD_INPUT,
                    target::BuildError::CannotSimulate(args.resource).to_string(),
                ));
            }
            Memory::Simulated(size.bytes())
        }
        None => Memory::Device,
    };
    // Every log is read before anything replays: a malformed one fails fast.
    let mut workloads = Vec::with_capacity(args.logs.len());
    for path in &args.logs {
        let read = read(path)
            .map_err(|e| Failure::new(EXIT_BAD_INPUT, format!("{}: {e}", path.display())))?;
        workloads.extend(read);
    }
    if let Some(path) = &args.write_log {
        return write_log(path, &workloads);
    }
    if memory == Memory::Device {
        if let Some(why) = rmm::sys::gpu_unavailable_reason() {
            return Err(Failure::new(
                EXIT_NO_GPU,
                format!(
                    "replaying on a GPU needs one, and there is none here ({why}); use \
                     --simulate SIZE to replay over simulated memory"
                ),
            ));
        }
    }

    let mut panels = Vec::new();
    let mut failed = false;
    let stdout = io::stdout();
    for (i, (name, workload)) in workloads.iter().enumerate() {
        if i > 0 {
            let _ = writeln!(stdout.lock());
        }
        let report = replay_one(name, workload, args.resource, memory, build_options(args))?;
        let _ = write!(stdout.lock(), "{}", report.summary);
        if let Some(message) = report.summary.failure_message() {
            eprintln!("rmm-replay: {message}");
            failed = true;
        }
        if let Some(e) = report.replay.cleanup_error {
            eprintln!(
                "rmm-replay: {name}: returning what was still allocated after the replay failed: {e}"
            );
            failed = true;
        }
        panels.push(report.panel);
    }
    if let Some(plot_path) = &args.plot {
        plot::draw(plot_path, &panels).map_err(|e| Failure::new(EXIT_FAILED, e.to_string()))?;
        println!("\nplot written to {}", plot_path.display());
    }
    if failed {
        Err(Failure {
            status: EXIT_FAILED,
            message: None,
        })
    } else {
        Ok(())
    }
}

/// `--write-log`: the one workload of `workloads` written to `path` as an RMM log.
fn write_log(path: &Path, workloads: &[(String, Workload)]) -> Result<(), Failure> {
    let [(name, workload)] = workloads else {
        return Err(Failure::new(
            EXIT_BAD_INPUT,
            format!(
                "--write-log writes one workload; the input holds {}",
                workloads.len()
            ),
        ));
    };
    let failed = |e: io::Error| Failure::new(EXIT_FAILED, format!("{}: {e}", path.display()));
    let mut out = io::BufWriter::new(File::create(path).map_err(failed)?);
    workload.write_rmm_log(&mut out).map_err(failed)?;
    out.flush().map_err(failed)?;
    println!(
        "{name}: {} steps written to {}",
        workload.steps.len(),
        path.display()
    );
    Ok(())
}

/// Reads and plans one file, with a progress bar for large files on a terminal: a CSV log
/// is one workload, named by its path; a PyTorch snapshot one per device with a trace, named
/// `PATH (device N)`.
fn read(path: &Path) -> Result<Vec<(String, Workload)>, LogError> {
    let file = File::open(path).map_err(|e| LogError::Csv(e.into()))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len >= BAR_BYTES && io::stderr().is_terminal() {
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr())
            .with_style(style("reading", "{binary_bytes}/{binary_total_bytes}"))
            .with_message(path.display().to_string());
        let read = read_from(path, BufReader::new(bar.wrap_read(file)));
        bar.finish_and_clear();
        read
    } else {
        read_from(path, BufReader::new(file))
    }
}

/// [`read`] from `reader`: a pickle by its first bytes is a snapshot, anything else a CSV log.
fn read_from<R: Read>(
    path: &Path,
    mut reader: BufReader<R>,
) -> Result<Vec<(String, Workload)>, LogError> {
    let head = reader.fill_buf().map_err(|e| LogError::Csv(e.into()))?;
    if crate::torch::looks_like_pickle(head) {
        Ok(crate::torch::load_snapshot(reader)?
            .into_iter()
            .map(|(device, w)| (format!("{} (device {device})", path.display()), w))
            .collect())
    } else {
        Ok(vec![(path.display().to_string(), crate::load(reader)?)])
    }
}

fn style(verb: &str, counts: &str) -> ProgressStyle {
    ProgressStyle::with_template(&format!(
        "{verb} {{msg}} [{{wide_bar}}] {counts} ({{eta}} left)"
    ))
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ")
}

/// What the command line tunes in the resource.
fn build_options(args: &Args) -> BuildOptions {
    let mut options = BuildOptions::default();
    if let Some(percent) = args.vmm_min_growth {
        options.vmm_min_growth_percent = usize::from(percent);
    }
    options
}

fn replay_one(
    name: &str,
    workload: &Workload,
    kind: ResourceKind,
    memory: Memory,
    options: BuildOptions,
) -> Result<Report, Failure> {
    let name = name.to_owned();
    let progress = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let show_bar = workload.steps.len() >= BAR_STEPS && io::stderr().is_terminal();
    let result = std::thread::scope(|scope| {
        if show_bar {
            let bar = ProgressBar::with_draw_target(
                Some(workload.steps.len() as u64),
                ProgressDrawTarget::stderr(),
            )
            .with_style(style("replaying", "{human_pos}/{human_len} events"))
            .with_message(name.clone());
            let (progress, done) = (&progress, &done);
            scope.spawn(move || {
                while !done.load(Ordering::Acquire) {
                    bar.set_position(progress.load(Ordering::Relaxed) as u64);
                    std::thread::sleep(Duration::from_millis(100));
                }
                bar.finish_and_clear();
            });
        }
        let result = replay_log_with(&name, workload, kind, memory, options, &progress);
        done.store(true, Ordering::Release);
        result
    });
    result.map_err(|e| {
        let status = match &e {
            RunError::Build(BuildError::CannotSimulate(_)) => EXIT_BAD_INPUT,
            _ => EXIT_FAILED,
        };
        Failure::new(status, format!("{name}: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn arguments_parse() {
        let a = Args::try_parse_from([
            "rmm-replay",
            "--resource",
            "arena",
            "--simulate",
            "80GiB",
            "--plot",
            "m.png",
            "--vmm-min-growth",
            "12",
            "a.csv",
            "b.csv",
        ])
        .unwrap();
        assert_eq!(a.resource, ResourceKind::Arena);
        assert_eq!(a.simulate, Some(ByteSize(80 << 30)));
        assert_eq!(build_options(&a).vmm_min_growth_percent, 12);
        assert_eq!(a.plot, Some(PathBuf::from("m.png")));
        assert_eq!(a.logs, [PathBuf::from("a.csv"), PathBuf::from("b.csv")]);
        let a = Args::try_parse_from(["rmm-replay", "x.csv"]).unwrap();
        assert_eq!(build_options(&a), BuildOptions::default());
        assert_eq!(
            (a.resource, a.simulate, a.plot),
            (ResourceKind::Pool, None, None)
        );
        for bad in [
            &["rmm-replay"][..],
            &["rmm-replay", "--plot", "m.jpg", "x.csv"],
            &["rmm-replay", "--simulate", "lots", "x.csv"],
            &["rmm-replay", "--simulate", "0", "x.csv"],
            &["rmm-replay", "--resource", "slab", "x.csv"],
            &["rmm-replay", "--vmm-min-growth", "101", "x.csv"],
        ] {
            let e = Args::try_parse_from(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
    }
}
