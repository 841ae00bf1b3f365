//! The writers of PyTorch's snapshot format (`torch.cuda.memory._dump_snapshot`).
//!
//! The file is a pickled dictionary:
//!
//! - `segments`: a list of `{device, address, total_size, stream, segment_type,
//!   allocated_size, active_size, requested_size, blocks}`, each block `{address, size,
//!   requested_size, state, frames}` with `state` `"active_allocated"` or `"inactive"`. The
//!   blocks tile the segment in address order (PyTorch's viewer computes each block's address
//!   from the sizes before it), so gaps are filled with inactive blocks here.
//! - `device_traces`: one list per device of `{action, addr, size, stream, time_us, frames}`
//!   (and `device_free` for `oom`), oldest first.
//!
//! Frames are `{name, filename, line}`. These are the keys `torch.cuda._memory_viz` reads
//! (`segsum`, `trace`, the flame graphs, and `MemoryViz.js` behind `trace_plot` and
//! `segment_plot`).

use std::io::{self, Write};

use serde::Serialize;

use super::snapshot::{BlockRecord, Frame, Segment, Snapshot, TraceAction, TraceEvent};

#[derive(Serialize)]
struct TorchFrame<'a> {
    name: &'a str,
    filename: &'a str,
    line: u32,
}

#[derive(Serialize)]
struct TorchBlock<'a> {
    address: u64,
    size: usize,
    requested_size: usize,
    state: &'static str,
    frames: Vec<TorchFrame<'a>>,
}

#[derive(Serialize)]
struct TorchSegment<'a> {
    device: i32,
    address: u64,
    total_size: usize,
    stream: u64,
    segment_type: &'static str,
    allocated_size: usize,
    active_size: usize,
    requested_size: usize,
    blocks: Vec<TorchBlock<'a>>,
}

#[derive(Serialize)]
struct TorchTraceEntry<'a> {
    action: &'static str,
    addr: u64,
    size: usize,
    stream: u64,
    time_us: u64,
    frames: Vec<TorchFrame<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    device_free: Option<usize>,
}

#[derive(Serialize)]
struct TorchSnapshot<'a> {
    segments: Vec<TorchSegment<'a>>,
    device_traces: Vec<Vec<TorchTraceEntry<'a>>>,
}

fn frames(frames: &[Frame]) -> Vec<TorchFrame<'_>> {
    frames
        .iter()
        .map(|f| TorchFrame {
            name: &f.name,
            filename: &f.filename,
            line: f.line,
        })
        .collect()
}

fn free_block<'a>(address: u64, size: usize) -> TorchBlock<'a> {
    TorchBlock {
        address,
        size,
        requested_size: 0,
        state: "inactive",
        frames: Vec::new(),
    }
}

fn block(b: &BlockRecord) -> TorchBlock<'_> {
    if !b.allocated {
        return free_block(b.address, b.size);
    }
    TorchBlock {
        address: b.address,
        size: b.size,
        requested_size: if b.requested == 0 {
            b.size
        } else {
            b.requested.min(b.size)
        },
        state: "active_allocated",
        frames: frames(&b.frames),
    }
}

/// The segment's blocks in address order, gaps (before, between and after them) filled with
/// inactive blocks, so that their sizes add up to the segment's.
fn tiled(seg: &Segment) -> Vec<TorchBlock<'_>> {
    let mut sorted: Vec<&BlockRecord> = seg.blocks.iter().filter(|b| b.size > 0).collect();
    sorted.sort_by_key(|b| b.address);
    let end = seg.address.saturating_add(seg.size as u64);
    let mut cursor = seg.address;
    let mut out = Vec::with_capacity(sorted.len() + 1);
    for b in sorted {
        // Blocks outside the segment or overlapping the previous one cannot be drawn.
        let b_end = b.address.saturating_add(b.size as u64);
        if b.address < cursor || b_end > end {
            continue;
        }
        if b.address > cursor {
            out.push(free_block(
                cursor,
                usize::try_from(b.address - cursor).unwrap_or(0),
            ));
        }
        out.push(block(b));
        cursor = b_end;
    }
    if cursor < end {
        out.push(free_block(
            cursor,
            usize::try_from(end - cursor).unwrap_or(0),
        ));
    }
    out
}

fn segment(seg: &Segment) -> TorchSegment<'_> {
    let blocks = tiled(seg);
    let allocated: usize = blocks
        .iter()
        .filter(|b| b.state == "active_allocated")
        .map(|b| b.size)
        .sum();
    let requested: usize = blocks
        .iter()
        .filter(|b| b.state == "active_allocated")
        .map(|b| b.requested_size)
        .sum();
    TorchSegment {
        device: seg.device,
        address: seg.address,
        total_size: seg.size,
        stream: seg.stream,
        segment_type: "large",
        allocated_size: allocated,
        active_size: allocated,
        requested_size: requested,
        blocks,
    }
}

fn entry(e: &TraceEvent) -> TorchTraceEntry<'_> {
    TorchTraceEntry {
        action: e.action.torch_name(),
        addr: e.address,
        size: e.size,
        stream: e.stream,
        time_us: e.time_us,
        frames: frames(&e.frames),
        device_free: (e.action == TraceAction::Oom).then_some(e.device_free),
    }
}

fn torch(s: &Snapshot) -> TorchSnapshot<'_> {
    let devices = s
        .segments
        .iter()
        .map(|g| g.device)
        .chain(s.trace.iter().map(|e| e.device))
        .filter_map(|d| usize::try_from(d).ok())
        .max()
        .map_or(1, |d| d + 1);
    let mut device_traces: Vec<Vec<TorchTraceEntry<'_>>> =
        (0..devices).map(|_| Vec::new()).collect();
    for e in &s.trace {
        if let Ok(d) = usize::try_from(e.device) {
            device_traces[d].push(entry(e));
        }
    }
    let mut segments: Vec<&Segment> = s.segments.iter().collect();
    segments.sort_by_key(|g| (g.device, g.address));
    TorchSnapshot {
        segments: segments.into_iter().map(segment).collect(),
        device_traces,
    }
}

impl Snapshot {
    /// Writes the snapshot as `torch.cuda.memory._dump_snapshot` does: a pickle of a dictionary
    /// with `segments` and `device_traces` (see the module docs for the keys). PyTorch's tools
    /// read it: `python -m torch.cuda._memory_viz trace_plot FILE -o trace.html`,
    /// `segment_plot`, `stats`, `trace`; so does the page at `pytorch.org/memory_viz`.
    ///
    /// # Errors
    /// The writer's I/O error.
    #[doc(alias = "torch.cuda.memory._dump_snapshot")]
    pub fn write_pickle(&self, w: impl Write) -> io::Result<()> {
        let mut w = w;
        serde_pickle::to_writer(&mut w, &torch(self), serde_pickle::SerOptions::new()).map_err(
            |e| match e {
                serde_pickle::Error::Io(e) => e,
                other => io::Error::other(other),
            },
        )
    }

    /// Writes the same dictionary as [`write_pickle`](Self::write_pickle), as JSON.
    ///
    /// # Errors
    /// The writer's I/O error.
    pub fn write_json(&self, w: impl Write) -> io::Result<()> {
        serde_json::to_writer(w, &torch(self)).map_err(io::Error::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_pickle::{DeOptions, HashableValue, Value};
    use std::collections::BTreeMap;

    fn sample() -> Snapshot {
        Snapshot {
            segments: vec![Segment {
                device: 0,
                address: 0x1000,
                size: 4096,
                stream: 0,
                blocks: vec![
                    BlockRecord {
                        address: 0x1000,
                        size: 1024,
                        requested: 1000,
                        allocated: true,
                        stream: 0,
                        frames: vec![Frame {
                            name: "main".into(),
                            filename: "src/main.rs".into(),
                            line: 7,
                        }],
                    },
                    // A gap of 1024 bytes, then a block, then a gap to the end.
                    BlockRecord {
                        address: 0x1800,
                        size: 512,
                        requested: 0,
                        allocated: true,
                        stream: 0,
                        frames: vec![],
                    },
                ],
            }],
            trace: vec![
                TraceEvent {
                    action: TraceAction::SegmentAlloc,
                    address: 0x1000,
                    size: 4096,
                    ..TraceEvent::default()
                },
                TraceEvent {
                    action: TraceAction::Alloc,
                    address: 0x1000,
                    size: 1024,
                    time_us: 5,
                    ..TraceEvent::default()
                },
                TraceEvent {
                    action: TraceAction::Oom,
                    size: 1 << 20,
                    device_free: 2048,
                    stream: 0x55,
                    device: 1,
                    ..TraceEvent::default()
                },
            ],
        }
    }

    fn dict(v: &Value) -> BTreeMap<String, Value> {
        let Value::Dict(d) = v else {
            panic!("not a dict: {v:?}")
        };
        d.iter()
            .map(|(k, v)| {
                let HashableValue::String(k) = k else {
                    panic!("key not a str: {k:?}")
                };
                (k.clone(), v.clone())
            })
            .collect()
    }

    fn list(v: &Value) -> &[Value] {
        let Value::List(l) = v else {
            panic!("not a list: {v:?}")
        };
        l
    }

    fn int(v: &Value) -> i64 {
        let Value::I64(i) = v else {
            panic!("not an int: {v:?}")
        };
        *i
    }

    #[test]
    fn pickle_round_trip_has_torch_keys() {
        let mut buf = Vec::new();
        sample().write_pickle(&mut buf).unwrap();
        let v: Value = serde_pickle::value_from_slice(&buf, DeOptions::new()).unwrap();
        let top = dict(&v);
        assert!(top.contains_key("segments") && top.contains_key("device_traces"));
        let segs = list(&top["segments"]);
        assert_eq!(segs.len(), 1);
        let seg = dict(&segs[0]);
        for key in [
            "device",
            "address",
            "total_size",
            "stream",
            "segment_type",
            "allocated_size",
            "active_size",
            "requested_size",
            "blocks",
        ] {
            assert!(seg.contains_key(key), "segment lacks {key}");
        }
        assert_eq!(int(&seg["total_size"]), 4096);
        assert_eq!(int(&seg["allocated_size"]), 1536);
        assert_eq!(int(&seg["requested_size"]), 1512);
        let blocks = list(&seg["blocks"]);
        // allocated, gap, allocated, gap: the sizes tile the segment.
        assert_eq!(blocks.len(), 4);
        let sizes: Vec<i64> = blocks.iter().map(|b| int(&dict(b)["size"])).collect();
        assert_eq!(sizes, [1024, 1024, 512, 1536]);
        let states: Vec<String> = blocks
            .iter()
            .map(|b| match &dict(b)["state"] {
                Value::String(s) => s.clone(),
                o => panic!("{o:?}"),
            })
            .collect();
        assert_eq!(
            states,
            [
                "active_allocated",
                "inactive",
                "active_allocated",
                "inactive"
            ]
        );
        let b0 = dict(&blocks[0]);
        for key in ["address", "size", "requested_size", "state", "frames"] {
            assert!(b0.contains_key(key), "block lacks {key}");
        }
        let f0 = dict(&list(&b0["frames"])[0]);
        assert_eq!(f0["name"], Value::String("main".into()));
        assert_eq!(f0["filename"], Value::String("src/main.rs".into()));
        assert_eq!(int(&f0["line"]), 7);

        let traces = list(&top["device_traces"]);
        assert_eq!(traces.len(), 2, "one list per device up to the highest");
        let dev0 = list(&traces[0]);
        assert_eq!(dev0.len(), 2);
        let e = dict(&dev0[1]);
        for key in ["action", "addr", "size", "stream", "time_us", "frames"] {
            assert!(e.contains_key(key), "trace entry lacks {key}");
        }
        assert_eq!(e["action"], Value::String("alloc".into()));
        assert!(!e.contains_key("device_free"));
        let oom = dict(&list(&traces[1])[0]);
        assert_eq!(oom["action"], Value::String("oom".into()));
        assert_eq!(int(&oom["device_free"]), 2048);
        assert_eq!(int(&oom["stream"]), 0x55);
    }

    #[test]
    fn json_has_the_same_dictionary() {
        let mut buf = Vec::new();
        sample().write_json(&mut buf).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
        assert_eq!(v["segments"][0]["blocks"][1]["state"], "inactive");
        assert_eq!(v["device_traces"][0][0]["action"], "segment_alloc");
        assert_eq!(v["device_traces"][1][0]["device_free"], 2048);
    }

    #[test]
    fn empty_snapshot_has_one_device_list() {
        let mut buf = Vec::new();
        Snapshot::default().write_pickle(&mut buf).unwrap();
        let v: Value = serde_pickle::value_from_slice(&buf, DeOptions::new()).unwrap();
        let top = dict(&v);
        assert_eq!(list(&top["device_traces"]).len(), 1);
        assert!(list(&top["segments"]).is_empty());
    }

    #[test]
    fn action_names_round_trip() {
        for a in [
            TraceAction::Alloc,
            TraceAction::FreeRequested,
            TraceAction::FreeCompleted,
            TraceAction::SegmentAlloc,
            TraceAction::SegmentFree,
            TraceAction::Oom,
        ] {
            assert_eq!(TraceAction::from_torch_name(a.torch_name()), Some(a));
        }
        assert_eq!(TraceAction::from_torch_name("segment_map"), None);
    }
}
