//! PyTorch memory snapshots as replay input: the pickle that
//! `torch.cuda.memory._dump_snapshot(path)` writes after
//! `torch.cuda.memory._record_memory_history()`.
//!
//! The pickle is a dict; what a replay needs is its `device_traces`, one list per device of
//! trace entries (dicts) in the order the caching allocator made them:
//!
//! | `action` | keys read | replayed as |
//! | --- | --- | --- |
//! | `alloc` | `addr`, `size`, `stream` | an allocation of `size` bytes on `stream` |
//! | `free_completed` | `addr`, `size`, `stream` | the free of that allocation |
//! | `oom` | `size` | an `allocate failure` row: counted, not replayed |
//! | `free_requested`, `segment_alloc`, `segment_free`, `segment_map`, `segment_unmap`, `snapshot` | | counted only (what the caching allocator did with its own segments is what the replayed resource decides for itself) |
//!
//! A free is replayed where torch completed it (`free_completed`: after the work of every
//! stream that used the block), not where Python dropped the tensor (`free_requested`). Sizes
//! are the caching allocator's block sizes (its requests rounded up to 512 bytes, or 2 MiB for
//! large ones), which is what it asked of its own pool. Entries have no thread: each device's
//! trace replays on one thread, in trace order, each entry on its stream.
//!
//! The trace is a ring (`max_entries`, 100 000 by default), and recording may start after the
//! program allocated: allocations alive before the trace began are replayed first, at entry 0.
//! They are the frees of the trace whose address no earlier entry allocated, and the blocks of
//! the snapshot's `segments` still allocated at the end (`active_allocated` or
//! `active_pending_free`) whose address no entry of the trace names (they stay allocated for
//! the whole replay).
//!
//! Every device with a trace entry or such a block is a workload of its own.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::io::Read;

use rmm::mr::{Action, EventTime, MemoryEvent};
use serde_pickle::{DeOptions, HashableValue, Value};

use crate::plan::{PlanError, Position, Workload};

/// The first bytes of a pickle of protocol 2 or later (what `pickle.dump` writes): the `PROTO`
/// opcode and the protocol.
#[must_use]
pub fn looks_like_pickle(head: &[u8]) -> bool {
    matches!(head, [0x80, 2..=5, ..])
}

/// One device's trace, as events ready for [`Workload::plan`] with [`Position::Entry`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceTrace {
    /// The device ordinal (the index into `device_traces`).
    pub device: usize,
    /// The events, each with its 1-based trace entry (0 for the allocations made before the
    /// trace began, which come first).
    pub events: Vec<(usize, MemoryEvent)>,
    /// Entries of the trace, every action.
    pub entries: usize,
    /// Allocations made before the trace began (the first events).
    pub before_trace: usize,
}

/// A snapshot that cannot be read or has not the shape torch writes.
#[derive(Debug)]
pub enum SnapshotError {
    /// Not a pickle, or a pickle this reader cannot decode.
    Pickle(serde_pickle::Error),
    /// A pickle, but not a memory snapshot: the path of the value and what is wrong.
    Shape {
        /// Where, e.g. `device_traces[0][12]['addr']`.
        at: String,
        /// What was expected.
        expected: &'static str,
    },
    /// A trace contradicts itself (the error names the device and the entry).
    Plan {
        /// The device.
        device: usize,
        /// The error.
        error: PlanError,
    },
    /// No device has a trace entry or an allocated block.
    Empty,
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::Pickle(e) => write!(f, "not a readable pickle: {e}"),
            SnapshotError::Shape { at, expected } => write!(
                f,
                "not a PyTorch memory snapshot: {at} should be {expected}"
            ),
            SnapshotError::Plan { device, error } => write!(f, "device {device}: {error}"),
            SnapshotError::Empty => f.write_str(
                "the snapshot has no trace entry and no allocated block (was \
                 torch.cuda.memory._record_memory_history() on?)",
            ),
        }
    }
}

impl std::error::Error for SnapshotError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SnapshotError::Pickle(e) => Some(e),
            SnapshotError::Plan { error, .. } => Some(error),
            _ => None,
        }
    }
}

fn shape(at: impl Into<String>, expected: &'static str) -> SnapshotError {
    SnapshotError::Shape {
        at: at.into(),
        expected,
    }
}

/// `value[key]` of a dict with string keys.
fn get<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
    match value {
        Value::Dict(map) => map.get(&HashableValue::String(key.to_owned())),
        _ => None,
    }
}

fn list<'a>(value: Option<&'a Value>, at: &str) -> Result<&'a [Value], SnapshotError> {
    match value {
        Some(Value::List(items) | Value::Tuple(items)) => Ok(items),
        _ => Err(shape(at, "a list")),
    }
}

fn text<'a>(value: Option<&'a Value>, at: &str) -> Result<&'a str, SnapshotError> {
    match value {
        Some(Value::String(s)) => Ok(s),
        Some(Value::Bytes(b)) => std::str::from_utf8(b).map_err(|_| shape(at, "a string")),
        _ => Err(shape(at, "a string")),
    }
}

fn unsigned(value: Option<&Value>, at: &str) -> Result<u64, SnapshotError> {
    match value {
        Some(Value::I64(n)) => u64::try_from(*n).map_err(|_| shape(at, "a non-negative integer")),
        Some(Value::Bool(b)) => Ok(u64::from(*b)),
        _ => Err(shape(at, "a non-negative integer")),
    }
}

fn size(value: Option<&Value>, at: &str) -> Result<usize, SnapshotError> {
    usize::try_from(unsigned(value, at)?).map_err(|_| shape(at, "a size"))
}

/// Reads a snapshot pickle into one [`DeviceTrace`] per device that has something to replay.
///
/// # Errors
///
/// [`SnapshotError`]: not a pickle, not shaped as torch's snapshot (the error names the value),
/// or nothing to replay.
pub fn read_snapshot<R: Read>(reader: R) -> Result<Vec<DeviceTrace>, SnapshotError> {
    // Torch shares stack frames between entries (memoized containers of memoized strings),
    // which serde-pickle counts as recursion when a shared container is read twice: such a
    // reference reads as None. Only the frames are shared; a field the replay reads that came
    // back None would be refused below as the wrong shape.
    let options = DeOptions::new().replace_recursive_structures();
    let root = serde_pickle::value_from_reader(reader, options).map_err(SnapshotError::Pickle)?;
    if !matches!(root, Value::Dict(_)) {
        return Err(shape("the pickle", "a dict with device_traces"));
    }
    let traces = list(get(&root, "device_traces"), "device_traces")?;
    // Blocks still allocated at the end, per device: (address, size, stream).
    let mut held: BTreeMap<usize, Vec<(u64, usize, u64)>> = BTreeMap::new();
    if let Some(segments) = get(&root, "segments") {
        for (i, segment) in list(Some(segments), "segments")?.iter().enumerate() {
            let at = format!("segments[{i}]");
            let device = size(get(segment, "device"), &format!("{at}['device']"))?;
            let stream = unsigned(get(segment, "stream"), &format!("{at}['stream']"))?;
            let blocks = list(get(segment, "blocks"), &format!("{at}['blocks']"))?;
            for (j, block) in blocks.iter().enumerate() {
                let at = format!("{at}['blocks'][{j}]");
                let state = text(get(block, "state"), &format!("{at}['state']"))?;
                if state == "active_allocated" || state == "active_pending_free" {
                    let address = unsigned(get(block, "address"), &format!("{at}['address']"))?;
                    let bytes = size(get(block, "size"), &format!("{at}['size']"))?;
                    held.entry(device)
                        .or_default()
                        .push((address, bytes, stream));
                }
            }
        }
    }
    let mut out = Vec::new();
    for device in 0..traces
        .len()
        .max(held.keys().next_back().map_or(0, |d| d + 1))
    {
        let entries = match traces.get(device) {
            Some(t) => list(Some(t), &format!("device_traces[{device}]"))?,
            None => &[],
        };
        let trace = device_trace(
            device,
            entries,
            held.get(&device).map_or(&[], Vec::as_slice),
        )?;
        if !trace.events.is_empty() {
            out.push(trace);
        }
    }
    if out.is_empty() {
        return Err(SnapshotError::Empty);
    }
    Ok(out)
}

fn device_trace(
    device: usize,
    entries: &[Value],
    held: &[(u64, usize, u64)],
) -> Result<DeviceTrace, SnapshotError> {
    let event = |action, pointer, size, stream| MemoryEvent {
        thread: 0,
        time: EventTime::default(),
        action,
        pointer,
        size,
        stream,
    };
    let mut events = Vec::new();
    // Addresses allocated by the trace and not yet freed, and every address it names.
    let mut live: HashSet<u64> = HashSet::new();
    let mut named: HashSet<u64> = HashSet::new();
    let mut before = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let at = format!("device_traces[{device}][{i}]");
        let action = text(get(entry, "action"), &format!("{at}['action']"))?;
        let position = i + 1;
        match action {
            "alloc" | "free_completed" => {
                let addr = unsigned(get(entry, "addr"), &format!("{at}['addr']"))?;
                let bytes = size(get(entry, "size"), &format!("{at}['size']"))?;
                let stream = unsigned(get(entry, "stream"), &format!("{at}['stream']"))?;
                named.insert(addr);
                if action == "alloc" {
                    live.insert(addr);
                    events.push((position, event(Action::Allocate, addr, bytes, stream)));
                } else {
                    if !live.remove(&addr) {
                        // Allocated before the trace began.
                        before.push((0, event(Action::Allocate, addr, bytes, stream)));
                    }
                    events.push((position, event(Action::Free, addr, bytes, stream)));
                }
            }
            "oom" => {
                let bytes = size(get(entry, "size"), &format!("{at}['size']"))?;
                let stream = match get(entry, "stream") {
                    Some(s) => unsigned(Some(s), &format!("{at}['stream']"))?,
                    None => 0,
                };
                events.push((position, event(Action::AllocateFailure, 0, bytes, stream)));
            }
            _ => {}
        }
    }
    for &(address, bytes, stream) in held {
        if !named.contains(&address) {
            before.push((0, event(Action::Allocate, address, bytes, stream)));
        }
    }
    let before_trace = before.len();
    before.extend(events);
    Ok(DeviceTrace {
        device,
        events: before,
        entries: entries.len(),
        before_trace,
    })
}

/// Plans the replay of `trace`.
///
/// # Errors
///
/// [`SnapshotError::Plan`] for a trace that contradicts itself, naming the entry.
pub fn plan(trace: &DeviceTrace) -> Result<Workload, SnapshotError> {
    let mut w =
        Workload::plan(&trace.events, Position::Entry).map_err(|error| SnapshotError::Plan {
            device: trace.device,
            error,
        })?;
    w.rows = trace.entries;
    w.before_trace = trace.before_trace;
    Ok(w)
}

/// Reads a snapshot and plans each device's trace: `(device, workload)` in device order.
///
/// # Errors
///
/// As [`read_snapshot`] and [`plan`].
pub fn load_snapshot<R: Read>(reader: R) -> Result<Vec<(usize, Workload)>, SnapshotError> {
    read_snapshot(reader)?
        .iter()
        .map(|t| Ok((t.device, plan(t)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Op;

    /// The committed sample (`samples/torch_snapshot.pickle`, written by
    /// `python/tools/make_torch_snapshots.py --synthetic`).
    const SAMPLE: &[u8] = include_bytes!("../samples/torch_snapshot.pickle");

    #[test]
    fn pickles_are_told_from_csv_by_their_first_bytes() {
        assert!(looks_like_pickle(SAMPLE));
        assert!(looks_like_pickle(&[0x80, 4, 0x95]));
        assert!(!looks_like_pickle(b"Thread,Time,Action"));
        assert!(!looks_like_pickle(&[0x80]));
        assert!(!looks_like_pickle(&[0x80, 9]));
    }

    #[test]
    fn the_sample_reads_as_torch_wrote_it() {
        let traces = read_snapshot(SAMPLE).unwrap();
        assert_eq!(traces.len(), 1);
        let t = &traces[0];
        assert_eq!(t.device, 0);
        assert_eq!(t.entries, 58);
        // One block allocated before recording began (in `segments` only) and one freed in
        // the trace that no entry allocated.
        assert_eq!(t.before_trace, 2);
        assert!(t.events[..2]
            .iter()
            .all(|(p, e)| *p == 0 && e.action == Action::Allocate));
        let w = plan(t).unwrap();
        assert_eq!(w.position, Position::Entry);
        assert_eq!(w.rows, 58);
        assert_eq!(w.before_trace, 2);
        assert_eq!(w.failures, 1, "the oom entry");
        assert_eq!(w.unmatched_frees, 0);
        assert_eq!(w.streams.len(), 2, "{:?}", w.streams);
        assert_eq!((w.allocations(), w.frees()), (20, 18));
        assert_eq!(
            w.leaked.len(),
            2,
            "the block held since before the trace, the last batch"
        );
        // Every free is replayed at its free_completed entry, after its allocation.
        for s in &w.steps {
            if let Op::Free { .. } = s.op {
                assert!(s.line > 0);
            }
        }
    }

    fn pickle(value: &Value) -> Vec<u8> {
        serde_pickle::value_to_vec(value, serde_pickle::SerOptions::new()).unwrap()
    }

    fn dict(items: &[(&str, Value)]) -> Value {
        Value::Dict(
            items
                .iter()
                .map(|(k, v)| (HashableValue::String((*k).to_owned()), v.clone()))
                .collect(),
        )
    }

    fn entry(action: &str, addr: i64, size: i64, stream: i64) -> Value {
        dict(&[
            ("action", Value::String(action.to_owned())),
            ("addr", Value::I64(addr)),
            ("size", Value::I64(size)),
            ("stream", Value::I64(stream)),
            ("time_us", Value::I64(1)),
            ("frames", Value::List(vec![])),
        ])
    }

    /// Torch shares stack frames between trace entries: a memoized list of memoized strings
    /// referenced from several entries, which serde-pickle's memo bookkeeping takes for a
    /// recursive structure. The replay reads no frame, so such a snapshot loads.
    #[test]
    fn snapshots_sharing_frames_between_entries_load() {
        // pickle.dumps(protocol=4) of a snapshot whose three entries share one `frames` list
        // of two dicts that share one filename string.
        let bytes: &[u8] = b"\x80\x04\x95\xf0\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x08\x73\x65\x67\x6d\x65\x6e\x74\x73\
          \x94\x5d\x94\x8c\x0d\x64\x65\x76\x69\x63\x65\x5f\x74\x72\x61\x63\x65\x73\x94\x5d\x94\x5d\x94\x28\
          \x7d\x94\x28\x8c\x06\x61\x63\x74\x69\x6f\x6e\x94\x8c\x05\x61\x6c\x6c\x6f\x63\x94\x8c\x04\x61\x64\
          \x64\x72\x94\x4d\x00\x10\x8c\x04\x73\x69\x7a\x65\x94\x4d\x00\x02\x8c\x06\x73\x74\x72\x65\x61\x6d\
          \x94\x4b\x00\x8c\x07\x74\x69\x6d\x65\x5f\x75\x73\x94\x4b\x01\x8c\x06\x66\x72\x61\x6d\x65\x73\x94\
          \x5d\x94\x28\x7d\x94\x28\x8c\x08\x66\x69\x6c\x65\x6e\x61\x6d\x65\x94\x8c\x08\x74\x72\x61\x69\x6e\
          \x2e\x70\x79\x94\x8c\x04\x6c\x69\x6e\x65\x94\x4b\x01\x75\x7d\x94\x28\x68\x10\x68\x11\x68\x12\x4b\
          \x02\x75\x65\x75\x7d\x94\x28\x68\x07\x68\x08\x68\x09\x4d\x00\x20\x68\x0a\x4d\x00\x04\x68\x0b\x4b\
          \x00\x68\x0c\x4b\x01\x68\x0d\x68\x0e\x75\x7d\x94\x28\x68\x07\x8c\x0e\x66\x72\x65\x65\x5f\x63\x6f\
          \x6d\x70\x6c\x65\x74\x65\x64\x94\x68\x09\x4d\x00\x10\x68\x0a\x4d\x00\x02\x68\x0b\x4b\x00\x68\x0c\
          \x4b\x01\x68\x0d\x68\x0e\x75\x65\x61\x75\x2e";
        let loaded = load_snapshot(bytes).unwrap();
        assert_eq!(loaded.len(), 1);
        let w = &loaded[0].1;
        assert_eq!((w.allocations(), w.frees()), (2, 1));
    }

    #[test]
    fn frees_replay_where_torch_completed_them() {
        let snapshot = dict(&[
            ("segments", Value::List(vec![])),
            (
                "device_traces",
                Value::List(vec![
                    Value::List(vec![]),
                    Value::List(vec![
                        entry("segment_alloc", 0x1000, 2 << 20, 7),
                        entry("alloc", 0x1000, 512, 7),
                        entry("free_requested", 0x1000, 512, 7),
                        entry("alloc", 0x1200, 1024, 9),
                        entry("free_completed", 0x1000, 512, 7),
                        dict(&[
                            ("action", Value::String("oom".into())),
                            ("device_free", Value::I64(0)),
                            ("size", Value::I64(1 << 40)),
                            ("stream", Value::I64(9)),
                        ]),
                    ]),
                ]),
            ),
        ]);
        let loaded = load_snapshot(pickle(&snapshot).as_slice()).unwrap();
        assert_eq!(loaded.len(), 1, "device 0 has nothing");
        let (device, w) = &loaded[0];
        assert_eq!(*device, 1);
        let steps: Vec<(usize, Op)> = w.steps.iter().map(|s| (s.line, s.op)).collect();
        assert_eq!(
            steps,
            [
                (2, Op::Allocate { slot: 0, size: 512 }),
                (
                    4,
                    Op::Allocate {
                        slot: 1,
                        size: 1024
                    }
                ),
                (5, Op::Free { slot: 0, size: 512 }),
            ]
        );
        assert_eq!(w.streams, [7, 9]);
        assert_eq!((w.rows, w.failures, w.before_trace), (6, 1, 0));
        assert_eq!(w.leaked, [1]);
    }

    #[test]
    fn allocations_from_before_the_trace_come_first() {
        let block = |address: i64, size: i64, state: &str| {
            dict(&[
                ("address", Value::I64(address)),
                ("size", Value::I64(size)),
                ("requested_size", Value::I64(size)),
                ("state", Value::String(state.to_owned())),
            ])
        };
        let snapshot = dict(&[
            (
                "segments",
                Value::List(vec![dict(&[
                    ("device", Value::I64(0)),
                    ("address", Value::I64(0x10000)),
                    ("total_size", Value::I64(2 << 20)),
                    ("stream", Value::I64(0)),
                    (
                        "blocks",
                        Value::List(vec![
                            block(0x10000, 4096, "active_allocated"),
                            block(0x11000, 4096, "inactive"),
                            block(0x12000, 8192, "active_allocated"),
                        ]),
                    ),
                ])]),
            ),
            (
                "device_traces",
                Value::List(vec![Value::List(vec![
                    entry("free_completed", 0x20000, 1024, 0),
                    entry("alloc", 0x12000, 8192, 0),
                ])]),
            ),
        ]);
        let w = &load_snapshot(pickle(&snapshot).as_slice()).unwrap()[0].1;
        // 0x20000 (freed in the trace) and 0x10000 (held at the end, never named); 0x12000 is
        // allocated by the trace itself.
        assert_eq!(w.before_trace, 2);
        assert_eq!(w.in_use, [1024, 1024 + 4096, 4096, 4096 + 8192]);
        assert_eq!(w.leaked.len(), 2);
        assert!(w.steps[..2].iter().all(|s| s.line == 0));
    }

    /// What rmm-rs writes in PyTorch's format (`Snapshot::write_pickle`, with a history's
    /// trace) replays as torch's own snapshots do.
    #[test]
    fn rmm_rs_snapshots_replay_too() {
        use rmm::mr::{
            DeviceMemoryResource, HistoryResourceAdaptor, PoolMemoryResource, PoolOptions,
            SimulatedMemoryResource,
        };
        let s = rmm::stream::CudaStreamView::legacy();
        let pool = PoolMemoryResource::with_options(
            SimulatedMemoryResource::new(1 << 30).unwrap(),
            PoolOptions::new(0),
        )
        .unwrap();
        let mr = HistoryResourceAdaptor::new(pool);
        mr.allocate(s, 1 << 20, 256).unwrap();
        mr.allocate(s, 3 << 20, 256).unwrap();
        let mut bytes = Vec::new();
        mr.snapshot().unwrap().write_pickle(&mut bytes).unwrap();
        assert!(looks_like_pickle(&bytes));
        let loaded = load_snapshot(bytes.as_slice()).unwrap();
        assert_eq!(loaded.len(), 1);
        let w = &loaded[0].1;
        assert_eq!((w.allocations(), w.frees(), w.before_trace), (2, 0, 0));
        assert_eq!(w.in_use, [1 << 20, 4 << 20]);
    }

    #[test]
    fn wrong_shapes_name_the_value() {
        let e = read_snapshot(pickle(&Value::List(vec![])).as_slice()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "not a PyTorch memory snapshot: the pickle should be a dict with device_traces"
        );
        let bad = dict(&[(
            "device_traces",
            Value::List(vec![Value::List(vec![dict(&[
                ("action", Value::String("alloc".into())),
                ("addr", Value::I64(-5)),
            ])])]),
        )]);
        let e = read_snapshot(pickle(&bad).as_slice()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "not a PyTorch memory snapshot: device_traces[0][0]['addr'] should be a \
             non-negative integer"
        );
        let e = read_snapshot(&b"Thread,Time\n"[..]).unwrap_err();
        assert!(matches!(e, SnapshotError::Pickle(_)), "{e}");
        let empty = dict(&[("device_traces", Value::List(vec![Value::List(vec![])]))]);
        let e = read_snapshot(pickle(&empty).as_slice()).unwrap_err();
        assert!(matches!(e, SnapshotError::Empty), "{e}");
    }

    #[test]
    fn contradictions_name_the_device_and_entry() {
        let snapshot = dict(&[(
            "device_traces",
            Value::List(vec![Value::List(vec![
                entry("alloc", 0x1000, 512, 0),
                entry("free_completed", 0x1000, 1024, 0),
            ])]),
        )]);
        let e = load_snapshot(pickle(&snapshot).as_slice()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "device 0: entry 2: free of 0x1000 with 1024 bytes, allocated with 512 bytes at \
             entry 1"
        );
    }
}
