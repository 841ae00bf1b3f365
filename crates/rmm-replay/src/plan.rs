//! From a parsed log to a [`Workload`]: what to replay, in which order, on which thread and
//! stream, with every free tied to its allocation. Pure bookkeeping: no CUDA, no threads.
//!
//! As RMM's replay benchmark does, the events keep the log's global order, each logged thread
//! gets a replay thread of its own, `allocate failure` rows are counted and not replayed, and a
//! free is matched to the live allocation of its logged pointer. Beyond RMM, a log that
//! contradicts itself is an error naming its line (RMM would replay it into undefined
//! behaviour), and a free of a pointer the log never allocated (a log started late) is counted
//! and skipped rather than crashing the replay.

use std::collections::HashMap;
use std::fmt;

use rmm::mr::{Action, MemoryEvent};

/// What a replayed step does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Allocate `size` bytes and keep the pointer in `slot`.
    Allocate {
        /// The allocation's slot (one per allocation of the log).
        slot: u32,
        /// Bytes requested.
        size: usize,
    },
    /// Free what `slot` holds (`size` bytes).
    Free {
        /// The slot of the allocation being freed.
        slot: u32,
        /// Bytes of that allocation.
        size: usize,
    },
}

/// One replayed row of the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The row's 1-based line in the log file.
    pub line: usize,
    /// The replay thread that runs it (an index into [`Workload::threads`]).
    pub thread: u32,
    /// The stream it is ordered on (an index into [`Workload::streams`]).
    pub stream: u32,
    /// What it does.
    pub op: Op,
}

/// What the positions of a workload's steps ([`Step::line`]) count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Position {
    /// Lines of a CSV log (1-based, the header is line 1).
    #[default]
    Line,
    /// Entries of a PyTorch snapshot's device trace (1-based; 0 for the allocations made
    /// before the trace began, see [`crate::torch`]).
    Entry,
}

impl Position {
    /// `"line"` or `"entry"`, as messages name a position.
    #[must_use]
    pub const fn noun(self) -> &'static str {
        match self {
            Position::Line => "line",
            Position::Entry => "entry",
        }
    }
}

/// A log ready to replay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Workload {
    /// The steps in the log's global order.
    pub steps: Vec<Step>,
    /// The logged id of each replay thread, in order of first appearance.
    pub threads: Vec<u64>,
    /// For each replay thread, the indices of its steps, increasing.
    pub thread_steps: Vec<Vec<u32>>,
    /// The logged handle of each stream, in order of first appearance (`0` is the default
    /// stream, `0x1` the legacy one, `0x2` the per-thread default stream).
    pub streams: Vec<u64>,
    /// For each slot (allocation), its size and the stream it was allocated on.
    pub slots: Vec<(usize, u32)>,
    /// Rows in the log (every action).
    pub rows: usize,
    /// `allocate failure` rows: counted, not replayed.
    pub failures: usize,
    /// Frees of a pointer that no earlier row allocated (or of null): skipped.
    pub unmatched_frees: usize,
    /// Slots still allocated at the end of the log (freed after the replay).
    pub leaked: Vec<u32>,
    /// Bytes in use (as requested) after each step.
    pub in_use: Vec<u64>,
    /// What the steps' positions count: lines of a CSV log or entries of a PyTorch trace.
    pub position: Position,
    /// Allocations made before a PyTorch trace began, replayed first (0 for a CSV log).
    pub before_trace: usize,
}

impl Workload {
    /// Plans the replay of `events`, each with its line number (as
    /// [`parse_log_lines`](rmm::mr::parse_log_lines) returns them).
    ///
    /// # Errors
    ///
    /// A [`PlanError`] naming the first row that contradicts the rows before it.
    pub fn from_events(events: &[(usize, MemoryEvent)]) -> Result<Workload, PlanError> {
        Workload::plan(events, Position::Line)
    }

    /// [`Workload::from_events`] for events whose positions count `position`s.
    ///
    /// # Errors
    ///
    /// As [`Workload::from_events`].
    pub fn plan(
        events: &[(usize, MemoryEvent)],
        position: Position,
    ) -> Result<Workload, PlanError> {
        let mut w = Workload {
            rows: events.len(),
            position,
            ..Workload::default()
        };
        let mut thread_index: HashMap<u64, u32> = HashMap::new();
        let mut stream_index: HashMap<u64, u32> = HashMap::new();
        // Logged pointer -> (slot, line of its allocation).
        let mut live: HashMap<u64, (u32, usize)> = HashMap::new();
        let mut in_use: u64 = 0;
        for &(line, ref e) in events {
            let error = |kind| PlanError {
                line,
                kind,
                position,
            };
            let op = match e.action {
                Action::AllocateFailure => {
                    w.failures += 1;
                    continue;
                }
                Action::Allocate => {
                    if e.pointer == 0 {
                        if e.size == 0 {
                            continue; // A zero-byte allocation: nothing to replay.
                        }
                        return Err(error(PlanErrorKind::NullAllocation { size: e.size }));
                    }
                    let slot = u32::try_from(w.slots.len())
                        .map_err(|_| error(PlanErrorKind::TooManyAllocations))?;
                    if let Some(&(_, since)) = live.get(&e.pointer) {
                        return Err(error(PlanErrorKind::AllocatedTwice {
                            pointer: e.pointer,
                            since,
                        }));
                    }
                    live.insert(e.pointer, (slot, line));
                    // Saturating: a log of absurd sizes must not overflow (the resource refuses them).
                    in_use = in_use.saturating_add(e.size as u64);
                    Op::Allocate { slot, size: e.size }
                }
                Action::Free => {
                    let Some(&(slot, allocated_at)) = live.get(&e.pointer) else {
                        w.unmatched_frees += 1;
                        continue;
                    };
                    let allocated = w.slots[slot as usize].0;
                    if allocated != e.size {
                        return Err(error(PlanErrorKind::SizeMismatch {
                            pointer: e.pointer,
                            size: e.size,
                            allocated,
                            allocated_at,
                        }));
                    }
                    live.remove(&e.pointer);
                    in_use = in_use.saturating_sub(e.size as u64);
                    Op::Free { slot, size: e.size }
                }
            };
            let index = u32::try_from(w.steps.len())
                .map_err(|_| error(PlanErrorKind::TooManyAllocations))?;
            let thread = *thread_index.entry(e.thread).or_insert_with(|| {
                w.threads.push(e.thread);
                w.thread_steps.push(Vec::new());
                (w.threads.len() - 1) as u32
            });
            let stream = *stream_index.entry(e.stream).or_insert_with(|| {
                w.streams.push(e.stream);
                (w.streams.len() - 1) as u32
            });
            if let Op::Allocate { size, .. } = op {
                w.slots.push((size, stream));
            }
            w.thread_steps[thread as usize].push(index);
            w.steps.push(Step {
                line,
                thread,
                stream,
                op,
            });
            w.in_use.push(in_use);
        }
        let mut leaked: Vec<u32> = live.into_values().map(|(slot, _)| slot).collect();
        leaked.sort_unstable();
        w.leaked = leaked;
        Ok(w)
    }

    /// Number of allocations replayed.
    #[must_use]
    pub fn allocations(&self) -> usize {
        self.slots.len()
    }

    /// Number of frees replayed.
    #[must_use]
    pub fn frees(&self) -> usize {
        self.steps.len() - self.slots.len()
    }

    /// Bytes of the allocations the log never frees.
    #[must_use]
    pub fn leaked_bytes(&self) -> u64 {
        self.leaked.iter().fold(0u64, |sum, &s| {
            sum.saturating_add(self.slots[s as usize].0 as u64)
        })
    }

    /// The largest request of the log (0 for a log without allocations).
    #[must_use]
    pub fn largest_request(&self) -> usize {
        self.slots.iter().map(|&(size, _)| size).max().unwrap_or(0)
    }

    /// Writes the steps as an RMM memory-event log (`Thread,Time,Action,Pointer,Size,Stream`,
    /// what RMM's replay benchmark and `rmm_peer --replay` read): each step's logged thread and
    /// stream, each allocation a pointer of its own (slot `s` at `0x7f00_0000_0000 + 256 (s +
    /// 1)`, so no two allocations share one), times counting microseconds from midnight. The
    /// log's `allocate failure` rows and unmatched frees are not steps and are not written;
    /// what it leaves allocated stays allocated.
    ///
    /// # Errors
    ///
    /// What writing to `out` returns.
    pub fn write_rmm_log<W: std::io::Write>(&self, out: &mut W) -> std::io::Result<()> {
        rmm::mr::write_header(out)?;
        for (i, step) in self.steps.iter().enumerate() {
            let thread = self.threads[step.thread as usize];
            let stream = self.streams[step.stream as usize];
            let time = event_time(i);
            let event = match step.op {
                Op::Allocate { slot, size } => {
                    MemoryEvent::allocate(thread, time, slot_pointer(slot), size, stream)
                }
                Op::Free { slot, size } => {
                    MemoryEvent::free(thread, time, slot_pointer(slot), size, stream)
                }
            };
            rmm::mr::write_event(out, &event)?;
        }
        Ok(())
    }
}

/// The pointer [`Workload::write_rmm_log`] gives slot `slot`.
fn slot_pointer(slot: u32) -> u64 {
    0x7f00_0000_0000 + 256 * (u64::from(slot) + 1)
}

/// The `i`-th microsecond after midnight (wrapping after a day).
fn event_time(i: usize) -> rmm::mr::EventTime {
    let us = (i % 86_400_000_000) as u64;
    let (secs, micros) = (us / 1_000_000, (us % 1_000_000) as u32);
    // In range by construction: hours < 24, minutes and seconds < 60.
    rmm::mr::EventTime::new(
        (secs / 3600) as u32,
        (secs / 60 % 60) as u32,
        (secs % 60) as u32,
        micros,
    )
    .unwrap_or(rmm::mr::EventTime::MIDNIGHT)
}

/// A row that contradicts the log before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanError {
    /// The row's 1-based line (or trace entry).
    pub line: usize,
    /// What is wrong with it.
    pub kind: PlanErrorKind,
    /// Whether `line` is a line of a CSV log or an entry of a PyTorch trace.
    pub position: Position,
}

/// What is wrong with a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanErrorKind {
    /// A successful allocation of a non-zero size at the null pointer.
    NullAllocation {
        /// Bytes.
        size: usize,
    },
    /// An allocation at a pointer that is still allocated.
    AllocatedTwice {
        /// The pointer.
        pointer: u64,
        /// The line that allocated it.
        since: usize,
    },
    /// A free whose size is not the allocation's.
    SizeMismatch {
        /// The pointer.
        pointer: u64,
        /// Bytes the free names.
        size: usize,
        /// Bytes the allocation had.
        allocated: usize,
        /// The line that allocated it.
        allocated_at: usize,
    },
    /// More than 2^32 allocations or steps.
    TooManyAllocations,
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let noun = self.position.noun();
        write!(f, "{noun} {}: ", self.line)?;
        match self.kind {
            PlanErrorKind::NullAllocation { size } => {
                write!(f, "a successful allocation of {size} bytes at (nil)")
            }
            PlanErrorKind::AllocatedTwice { pointer, since } => write!(
                f,
                "allocation at {pointer:#x}, which is still allocated since {noun} {since}"
            ),
            PlanErrorKind::SizeMismatch {
                pointer,
                size,
                allocated,
                allocated_at,
            } => write!(
                f,
                "free of {pointer:#x} with {size} bytes, allocated with {allocated} bytes at \
                 {noun} {allocated_at}"
            ),
            PlanErrorKind::TooManyAllocations => {
                f.write_str("more than 4294967295 allocations or events")
            }
        }
    }
}

impl std::error::Error for PlanError {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rmm::mr::parse_log_lines;

    fn plan(body: &str) -> Result<Workload, PlanError> {
        let text = format!("Thread,Time,Action,Pointer,Size,Stream\n{body}");
        Workload::from_events(&parse_log_lines(text.as_bytes()).unwrap())
    }

    /// Three threads interleaved, two streams, a failure and a free of a pointer reused later.
    const LOG: &str = "\
7,00:00:00.000001,allocate,0x1000,1000,0
9,00:00:00.000002,allocate,0x2000,3000,0x2
7,00:00:00.000003,allocate failure,(nil),1099511627776,0

9,00:00:00.000004,free,0x1000,1000,0x2
8,00:00:00.000005,allocate,0x1000,500,0
7,00:00:00.000006,free,0x2000,3000,0
";

    #[test]
    fn keeps_the_global_order_and_gives_each_thread_its_steps() {
        let w = plan(LOG).unwrap();
        let lines: Vec<usize> = w.steps.iter().map(|s| s.line).collect();
        assert_eq!(
            lines,
            [2, 3, 6, 7, 8],
            "every row but the failure, in file order"
        );
        assert_eq!(w.threads, [7, 9, 8]);
        assert_eq!(w.thread_steps, vec![vec![0, 4], vec![1, 2], vec![3]]);
        let threads: Vec<u32> = w.steps.iter().map(|s| s.thread).collect();
        assert_eq!(threads, [0, 1, 1, 2, 0]);
        assert_eq!(w.streams, [0, 2]);
        let streams: Vec<u32> = w.steps.iter().map(|s| s.stream).collect();
        assert_eq!(streams, [0, 1, 1, 0, 0]);
        let ops: Vec<Op> = w.steps.iter().map(|s| s.op).collect();
        assert_eq!(
            ops,
            [
                Op::Allocate {
                    slot: 0,
                    size: 1000
                },
                Op::Allocate {
                    slot: 1,
                    size: 3000
                },
                Op::Free {
                    slot: 0,
                    size: 1000
                },
                Op::Allocate { slot: 2, size: 500 },
                Op::Free {
                    slot: 1,
                    size: 3000
                },
            ],
            "the reused pointer 0x1000 is a new slot"
        );
        assert_eq!(w.slots, [(1000, 0), (3000, 1), (500, 0)]);
    }

    #[test]
    fn counts_failures_leaks_and_bytes_in_use() {
        let w = plan(LOG).unwrap();
        assert_eq!(w.rows, 6);
        assert_eq!(w.failures, 1);
        assert_eq!(w.unmatched_frees, 0);
        assert_eq!((w.allocations(), w.frees()), (3, 2));
        assert_eq!(w.in_use, [1000, 4000, 3000, 3500, 500]);
        assert_eq!(w.leaked, [2]);
        assert_eq!(w.leaked_bytes(), 500);
        assert_eq!(w.largest_request(), 3000);
    }

    #[test]
    fn unknown_and_null_frees_are_skipped_and_zero_byte_allocations_ignored() {
        let w = plan(
            "1,00:00:00.000001,free,0x5000,10,0\n\
             1,00:00:00.000002,free,(nil),0,0\n\
             1,00:00:00.000003,allocate,(nil),0,0\n\
             1,00:00:00.000004,allocate,0x100,10,0\n",
        )
        .unwrap();
        assert_eq!(w.unmatched_frees, 2);
        assert_eq!(w.steps.len(), 1);
        assert_eq!(w.steps[0].line, 5);
        assert_eq!(w.leaked, [0]);
    }

    #[test]
    fn contradictions_name_their_line() {
        let e = plan(
            "1,00:00:00.000001,allocate,0x100,10,0\n\
             2,00:00:00.000002,allocate,0x100,20,0\n",
        )
        .unwrap_err();
        assert_eq!(
            e,
            PlanError {
                line: 3,
                kind: PlanErrorKind::AllocatedTwice {
                    pointer: 0x100,
                    since: 2
                },
                position: Position::Line,
            }
        );
        assert_eq!(
            e.to_string(),
            "line 3: allocation at 0x100, which is still allocated since line 2"
        );

        let e = plan(
            "1,00:00:00.000001,allocate,0x100,10,0\n\
             \n\
             1,00:00:00.000002,free,0x100,11,0\n",
        )
        .unwrap_err();
        assert_eq!(e.line, 4);
        assert_eq!(
            e.to_string(),
            "line 4: free of 0x100 with 11 bytes, allocated with 10 bytes at line 2"
        );

        let e = plan("1,00:00:00.000001,allocate,(nil),64,0\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 2: a successful allocation of 64 bytes at (nil)"
        );
    }

    #[test]
    fn absurd_sizes_do_not_overflow() {
        let w = plan(&format!(
            "1,00:00:00.000001,allocate,0x100,{max},0\n\
             1,00:00:00.000002,allocate,0x200,{max},0\n\
             1,00:00:00.000003,free,0x100,{max},0\n",
            max = usize::MAX
        ))
        .unwrap();
        assert_eq!(w.in_use, [u64::MAX, u64::MAX, u64::MAX - usize::MAX as u64]);
        assert_eq!(w.leaked_bytes(), usize::MAX as u64);
    }

    /// A random log of `threads` threads and two streams, each thread allocating and freeing
    /// its own and others' pointers (a pointer reused after its free), with failures.
    fn arb_log() -> impl Strategy<Value = Vec<(u64, u8, usize, u64)>> {
        // (thread, action: 0 allocate / 1 free the oldest live / 2 failure, size, stream)
        proptest::collection::vec((1u64..5, 0u8..3, 1usize..1 << 20, 0u64..3), 0..200)
    }

    proptest! {
        #[test]
        fn the_plan_matches_a_model_of_the_log(rows in arb_log()) {
            let mut text = String::new();
            let mut live: std::collections::VecDeque<(u64, usize)> = Default::default();
            let mut free_pointers: Vec<u64> = Vec::new();
            let mut next_pointer = 0x1000u64;
            let mut model_in_use = Vec::new();
            let mut in_use = 0u64;
            let (mut failures, mut replayed_rows) = (0, Vec::new());
            for (i, &(thread, action, size, stream)) in rows.iter().enumerate() {
                let line = i + 2;
                let t = format!("00:00:00.{:06}", i);
                match action {
                    0 => {
                        let p = free_pointers.pop().unwrap_or_else(|| {
                            next_pointer += 0x100000;
                            next_pointer
                        });
                        live.push_back((p, size));
                        in_use += size as u64;
                        text += &format!("{thread},{t},allocate,{p:#x},{size},{stream:#x}\n");
                        model_in_use.push(in_use);
                        replayed_rows.push((line, thread));
                    }
                    1 if !live.is_empty() => {
                        let (p, size) = live.pop_front().unwrap();
                        free_pointers.push(p);
                        in_use -= size as u64;
                        text += &format!("{thread},{t},free,{p:#x},{size},{stream:#x}\n");
                        model_in_use.push(in_use);
                        replayed_rows.push((line, thread));
                    }
                    _ => {
                        failures += 1;
                        text += &format!("{thread},{t},allocate failure,(nil),{size},0\n");
                    }
                }
            }
            let w = plan(&text).unwrap();
            prop_assert_eq!(w.rows, rows.len());
            prop_assert_eq!(w.failures, failures);
            prop_assert_eq!(&w.in_use, &model_in_use);
            prop_assert_eq!(w.leaked.len(), live.len());
            prop_assert_eq!(w.leaked_bytes(), live.iter().map(|&(_, s)| s as u64).sum::<u64>());
            // Steps in file order, each on its logged thread.
            let got: Vec<(usize, u64)> =
                w.steps.iter().map(|s| (s.line, w.threads[s.thread as usize])).collect();
            prop_assert_eq!(got, replayed_rows);
            // Each thread's steps partition the steps, increasing.
            let mut all: Vec<u32> = w.thread_steps.iter().flatten().copied().collect();
            prop_assert!(w.thread_steps.iter().all(|s| s.windows(2).all(|p| p[0] < p[1])));
            all.sort_unstable();
            prop_assert_eq!(all, (0..w.steps.len() as u32).collect::<Vec<_>>());
            // Every free follows its own allocation, with its size, and frees it once.
            let mut allocated = vec![false; w.slots.len()];
            for step in &w.steps {
                match step.op {
                    Op::Allocate { slot, size } => {
                        prop_assert!(!allocated[slot as usize]);
                        prop_assert_eq!(w.slots[slot as usize].0, size);
                        allocated[slot as usize] = true;
                    }
                    Op::Free { slot, size } => {
                        prop_assert!(allocated[slot as usize]);
                        prop_assert_eq!(w.slots[slot as usize].0, size);
                        allocated[slot as usize] = false;
                    }
                }
            }
            let still: Vec<u32> = (0..w.slots.len() as u32).filter(|&s| allocated[s as usize]).collect();
            prop_assert_eq!(&still, &w.leaked);
            // Written as a log and planned again: the same steps (but their lines), threads,
            // streams, slots and bytes in use; no failure rows, none unmatched.
            let mut out = Vec::new();
            w.write_rmm_log(&mut out).unwrap();
            let again = Workload::from_events(&parse_log_lines(&out[..]).unwrap()).unwrap();
            let shape = |w: &Workload| {
                w.steps.iter().map(|s| (s.thread, s.stream, s.op)).collect::<Vec<_>>()
            };
            prop_assert_eq!(shape(&again), shape(&w));
            prop_assert_eq!(&again.threads, &w.threads);
            prop_assert_eq!(&again.streams, &w.streams);
            prop_assert_eq!(&again.slots, &w.slots);
            prop_assert_eq!(&again.in_use, &w.in_use);
            prop_assert_eq!(&again.leaked, &w.leaked);
            prop_assert_eq!((again.failures, again.unmatched_frees), (0, 0));
        }
    }

    #[test]
    fn an_empty_log_plans_nothing() {
        let w = plan("").unwrap();
        assert!(w.steps.is_empty() && w.threads.is_empty() && w.in_use.is_empty());
        assert_eq!(w.largest_request(), 0);
    }
}
