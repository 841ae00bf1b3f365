"""Checks that PyTorch's own tools read a snapshot rmm-rs wrote.

    python python/tests/check_snapshot.py snap.pickle snap.pickle.summary

Loads the pickle as torch.cuda._memory_viz does, runs its `segsum` (which asserts that every
segment's blocks add up) and `trace` (which walks every event), counts what they read, and
compares with the counts rmm-rs wrote (`examples/snapshot.rs`). Prints one summary line and
exits 0 when they match, 1 otherwise.
"""

import pickle
import sys

from torch.cuda import _memory_viz as viz


def counts(data):
    segments = data["segments"]
    blocks = [b for s in segments for b in s["blocks"]]
    active = [b for b in blocks if b["state"] == "active_allocated"]
    events = [e for trace in data["device_traces"] for e in trace]
    of = lambda a: sum(1 for e in events if e["action"] == a)
    return {
        "segments": len(segments),
        "active_blocks": len(active),
        "reserved": sum(s["total_size"] for s in segments),
        "allocated": sum(b["size"] for b in active),
        "events": len(events),
        "alloc": of("alloc"),
        "free_completed": of("free_completed"),
        "oom": of("oom"),
    }


def main():
    path, summary_path = sys.argv[1], sys.argv[2]
    with open(path, "rb") as f:
        data = pickle.load(f)
    # torch's own readers: both raise if a key they need is missing.
    stats = viz.segsum(data)
    text = viz.trace(data)
    torch_segments = int(stats.split("segments: ")[1].split()[0])
    got = counts(data)
    assert torch_segments == got["segments"], (torch_segments, got)
    for action in ("alloc", "free_completed", "oom"):
        # `trace` writes one line per event of these kinds.
        marker = {"alloc": " = ", "free_completed": "# free completed", "oom": "raise OutOfMemoryError"}[action]
        lines = sum(1 for l in text.splitlines() if marker in l and not l.startswith("Device") and "cudaMalloc" not in l)
        assert lines == got[action], (action, lines, got[action])
    with open(summary_path) as f:
        want = dict(kv.split("=") for kv in f.read().split())
    want = {k: int(v) for k, v in want.items()}
    line = " ".join(f"{k}={v}" for k, v in got.items())
    ok = want == got
    print(f"torch summary: {line} ({'matches' if ok else 'DIFFERS from ' + str(want)})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
