"""Memory snapshots of PyTorch's caching allocator, for ``rmm-replay`` (which replays their
``device_traces``) and for PyTorch's viewer (``python -m torch.cuda._memory_viz``).

On a GPU machine with torch:

    python3 make_torch_snapshots.py OUT_DIR

records three workloads with ``torch.cuda.memory._record_memory_history`` and writes, with
``torch.cuda.memory._dump_snapshot``:

    OUT_DIR/torch_two_streams.pickle       a training loop whose batches are copied and
                                           normalized on a side stream (two streams)
    OUT_DIR/torch_autocast_empty_cache.pickle
                                           a convolutional model under autocast (float16), with
                                           torch.cuda.empty_cache() between its two phases
    OUT_DIR/torch_transformer_autocast.pickle
                                           a small transformer encoder trained under autocast
                                           (bfloat16) at batch sizes and sequence lengths that
                                           change every step

Each is recorded without stack frames (``context=None``) unless ``--frames``, so that they stay
small enough to commit as samples. The last line is "make_torch_snapshots: N snapshots in DIR".

Without torch (any machine):

    python3 make_torch_snapshots.py --synthetic OUT.pickle

writes a small synthetic snapshot shaped exactly as ``_dump_snapshot`` writes one (a dict with
``segments``, ``device_traces``, ``allocator_settings``; trace entries with ``action``,
``addr`` (``device_free`` for ``oom``), ``size``, ``stream``, ``time_us``, ``frames``,
``compile_context``, ``user_metadata``): rmm-replay's sample and test input
(``crates/rmm-replay/samples/torch_snapshot.pickle``). It is deterministic: the same bytes on
every run.
"""

import argparse
import os
import pickle
import sys

MIB = 1 << 20

# -------------------------------------------------------------------------------------------
# The synthetic snapshot (no torch).


def _round(size):
    """The caching allocator's block size for a request: 512-byte multiples up to 1 MiB, then
    2 MiB multiples for large requests (above 10 MiB) and 512-byte multiples below."""
    return max(512, (size + 511) // 512 * 512)


class _Synthetic:
    def __init__(self):
        self.trace = []
        self.time_us = 1_700_000_000_000_000
        self.next_addr = {}
        self.segments = []

    def entry(self, action, addr, size, stream, key="addr"):
        self.time_us += 37
        self.trace.append({
            "action": action,
            key: addr,
            "size": size,
            "stream": stream,
            "time_us": self.time_us,
            "frames": [{"filename": "train.py", "line": 10 + len(self.trace), "name": "step"}],
            "compile_context": "N/A",
            "user_metadata": "",
        })


def synthetic_snapshot():
    """A training loop of three steps on two streams, as the caching allocator traces it:
    one 20 MiB segment of the default stream allocated before recording began (its first 4 MiB
    block still held at the end, so it appears only in ``segments``), a block allocated before
    recording and freed during it, segments allocated on demand, frees requested then completed,
    an out-of-memory entry, and an ``empty_cache`` at the end."""
    s = _Synthetic()
    side = 0x55D1C0DE7E50  # a cudaStream_t of a side stream, as torch prints it (an int)
    base = 0x7F3A00000000
    # Before recording: segment A (20 MiB, default stream) with a held 4 MiB block at its start
    # and an 8 MiB block freed during the trace.
    pre_held, pre_freed = base, base + 4 * MIB
    seg_b, seg_c = base + 32 * MIB, base + 64 * MIB  # allocated during the trace
    s.entry("free_requested", pre_freed, 8 * MIB, 0)
    s.entry("free_completed", pre_freed, 8 * MIB, 0)
    s.entry("segment_alloc", seg_b, 20 * MIB, 0)
    s.entry("segment_alloc", seg_c, 2 * MIB, side)
    for step in range(3):
        # Default stream: the batch (2 MiB), activations (6 MiB, 3 MiB), gradients (1 MiB).
        batch = seg_b
        act1, act2, grad = seg_b + 2 * MIB, seg_b + 8 * MIB, seg_b + 11 * MIB
        s.entry("alloc", batch, 2 * MIB, 0)
        # Side stream: the normalized copy (512 KiB) and a small scratch (1536 bytes).
        norm, scratch = seg_c, seg_c + 512 * 1024
        s.entry("alloc", norm, _round(512 * 1024), side)
        s.entry("alloc", scratch, _round(1500), side)
        s.entry("free_requested", scratch, _round(1500), side)
        s.entry("free_completed", scratch, _round(1500), side)
        s.entry("alloc", act1, 6 * MIB, 0)
        s.entry("alloc", act2, 3 * MIB, 0)
        s.entry("free_requested", norm, _round(512 * 1024), side)
        if step == 1:
            # A request the device could not serve (device_free: what the device had free).
            s.entry("oom", 3 * MIB, 64 << 30, 0, key="device_free")
        s.entry("alloc", grad, 1 * MIB, 0)
        s.entry("free_requested", act2, 3 * MIB, 0)
        s.entry("free_completed", act2, 3 * MIB, 0)
        s.entry("free_requested", act1, 6 * MIB, 0)
        s.entry("free_completed", act1, 6 * MIB, 0)
        # The side stream's block is freed once the default stream's use of it is done.
        s.entry("free_completed", norm, _round(512 * 1024), side)
        s.entry("free_requested", grad, 1 * MIB, 0)
        s.entry("free_completed", grad, 1 * MIB, 0)
        if step < 2:
            s.entry("free_requested", batch, 2 * MIB, 0)
            s.entry("free_completed", batch, 2 * MIB, 0)
    # empty_cache(): the side stream's segment (all free) goes back to the device.
    s.entry("segment_free", seg_c, 2 * MIB, side)

    def block(address, size, state):
        return {"address": address, "size": size, "requested_size": size, "state": state,
                "frames": []}

    def segment(address, total, stream, blocks):
        allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        return {
            "device": 0, "address": address, "total_size": total, "stream": stream,
            "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
            "allocated_size": allocated, "active_size": allocated, "requested_size": allocated,
            "frames": [], "blocks": blocks,
        }

    segments = [
        segment(base, 20 * MIB, 0, [block(pre_held, 4 * MIB, "active_allocated"),
                                    block(pre_freed, 16 * MIB, "inactive")]),
        # The last batch is still held at the end.
        segment(seg_b, 20 * MIB, 0, [block(seg_b, 2 * MIB, "active_allocated"),
                                     block(seg_b + 2 * MIB, 18 * MIB, "inactive")]),
    ]
    return {
        "segments": segments,
        "device_traces": [s.trace],
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "",
            "max_split_size": -1,
            "garbage_collection_threshold": 0.0,
            "expandable_segments": False,
            "pinned_num_register_threads": 1,
            "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False,
            "roundup_power2_divisions": {},
        },
        "external_annotations": [],
    }


def write_synthetic(path):
    with open(path, "wb") as f:
        # Protocol 4: what pickle.dump (and so _dump_snapshot) writes on Python 3.8 to 3.13.
        pickle.dump(synthetic_snapshot(), f, protocol=4)
    print("make_torch_snapshots: synthetic snapshot (%d trace entries) in %s"
          % (len(synthetic_snapshot()["device_traces"][0]), path))


# -------------------------------------------------------------------------------------------
# Real snapshots (torch and a GPU).


def record(torch, path, work, frames):
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(
        enabled="all", context="all" if frames else None, stacks="python" if frames else "all",
        max_entries=200_000)
    try:
        work()
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(path)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    trace = snapshot["device_traces"][torch.cuda.current_device()]
    actions = {}
    for e in trace:
        actions[e["action"]] = actions.get(e["action"], 0) + 1
    streams = {e["stream"] for e in trace if e["action"] == "alloc"}
    print("%s: %d trace entries, %d streams, %s, %d bytes" % (
        path, len(trace), len(streams), dict(sorted(actions.items())), os.path.getsize(path)))


def two_streams(torch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    side = torch.cuda.Stream()
    main = torch.cuda.current_stream()
    host = [torch.randn(256, 512).pin_memory() for _ in range(4)]
    labels = torch.randint(0, 10, (256,), device="cuda")

    def work():
        for step in range(12):
            with torch.cuda.stream(side):
                x = host[step % len(host)].to("cuda", non_blocking=True)
                x = (x - x.mean(dim=0)) / (x.std(dim=0) + 1e-5)
            main.wait_stream(side)
            x.record_stream(main)
            loss = torch.nn.functional.cross_entropy(model(x), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            del x, loss
    return work


def autocast_empty_cache(torch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cuda")

    def phase(batch, steps):
        for _ in range(steps):
            x = torch.randn(batch, 3, 64, 64, device="cuda")
            y = torch.randint(0, 10, (batch,), device="cuda")
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

    def work():
        phase(64, 6)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        phase(16, 6)
    return work


def transformer_autocast(torch):
    torch.manual_seed(0)
    vocab, width = 8192, 512
    layer = torch.nn.TransformerEncoderLayer(width, 8, 4 * width, batch_first=True)
    model = torch.nn.ModuleDict({
        "embed": torch.nn.Embedding(vocab, width),
        "encoder": torch.nn.TransformerEncoder(layer, 4),
        "head": torch.nn.Linear(width, vocab),
    }).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    # (batch, sequence length) per step: growing, shrinking, ragged, as a data loader does.
    shapes = [(8, 128), (16, 256), (32, 128), (8, 512), (24, 384), (32, 256), (4, 1024),
              (16, 128), (32, 512), (12, 320), (8, 256), (28, 448)]

    def work():
        for batch, length in shapes:
            tokens = torch.randint(0, vocab, (batch, length), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                hidden = model["encoder"](model["embed"](tokens))
                logits = model["head"](hidden)
                loss = torch.nn.functional.cross_entropy(
                    logits.float().view(-1, vocab), tokens.view(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            del tokens, hidden, logits, loss
    return work


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="output directory (or, with --synthetic, the file)")
    parser.add_argument("--synthetic", action="store_true",
                        help="write the synthetic snapshot (no torch needed)")
    parser.add_argument("--frames", action="store_true",
                        help="record Python stack frames (larger files, for the viewer)")
    args = parser.parse_args()
    if args.synthetic:
        write_synthetic(args.out)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("make_torch_snapshots: no GPU (torch.cuda.is_available() is False)")
        return 1
    os.makedirs(args.out, exist_ok=True)
    written = 0
    for name, make in (("torch_two_streams", two_streams),
                       ("torch_autocast_empty_cache", autocast_empty_cache),
                       ("torch_transformer_autocast", transformer_autocast)):
        record(torch, os.path.join(args.out, name + ".pickle"), make(torch), args.frames)
        written += 1
        torch.cuda.empty_cache()
    print("make_torch_snapshots: %d snapshots in %s (torch %s, %s)" % (
        written, args.out, torch.__version__, torch.cuda.get_device_name()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
