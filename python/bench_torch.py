"""Times PyTorch on its own caching allocator and on rmm-rs, each in a subprocess (the
allocator cannot change once CUDA is initialized):

    python3 bench_torch.py [--library librmm_capi.so] [--repeats 7] [--pairs 20000] [--steps 50]
                           [--rounds 3]

Prints one table: ``torch.empty`` + ``del`` per pair (1 KiB, 256 KiB, 4 MiB; the median over
repeats of the mean over ``--pairs`` pairs, Python's loop included, as a user sees it) and the
time of one training step of an MLP (median over repeats of ``--steps`` steps, synchronized).
Columns: torch's caching allocator, the rmm-rs pool, and the rmm-rs pool with statistics.

Each round runs every column in a fresh process, in alternating order (forward, then
backward), and each process measures the sizes in a rotated order, so that neither a column
nor a size always comes first; a cell is the median over rounds, and the spread line gives the
largest max - min over rounds of each column (noise: differences smaller than it are not
differences).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

SIZES = [("1 KiB", 1 << 10), ("256 KiB", 256 << 10), ("4 MiB", 4 << 20)]
MODES = [
    ("torch", "torch caching"),
    ("rmm-rs", "rmm-rs pool"),
    ("rmm-rs-stats", "rmm-rs pool+stats"),
]
MLP = "MLP 1024-4096-4096-1024, batch 512, Adam"


def worker(mode, args):
    if mode != "torch":
        import rmm_rs_torch

        rmm_rs_torch.use_rmm_rs_allocator(
            pool_size="4GiB", library=args.library, statistics=(mode == "rmm-rs-stats")
        )
    import torch

    torch.ones(1, device="cuda")  # CUDA initialized outside the timings
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "pairs": {}}
    k = args.rotate % len(SIZES)
    for label, size in SIZES[k:] + SIZES[:k]:
        for _ in range(1000):  # warm up: the pool's blocks, torch's cache
            t = torch.empty(size, dtype=torch.uint8, device="cuda")
            del t
        runs = []
        for _ in range(args.repeats):
            start = time.perf_counter_ns()
            for _ in range(args.pairs):
                t = torch.empty(size, dtype=torch.uint8, device="cuda")
                del t
            runs.append((time.perf_counter_ns() - start) / args.pairs / 1000.0)
        out["pairs"][label] = statistics.median(runs)

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096),
        torch.nn.ReLU(),
        torch.nn.Linear(4096, 4096),
        torch.nn.ReLU(),
        torch.nn.Linear(4096, 1024),
    ).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(512, 1024, device="cuda")
    y = torch.randn(512, 1024, device="cuda")

    def step():
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    runs = []
    for _ in range(args.repeats):
        start = time.perf_counter_ns()
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
        runs.append((time.perf_counter_ns() - start) / args.steps / 1e6)
    out["step_ms"] = statistics.median(runs)
    print("RESULT " + json.dumps(out))
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--library", help="librmm_capi.so (default: $RMM_RS_LIBRARY or a build)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--pairs", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", choices=[m for m, _ in MODES], help=argparse.SUPPRESS)
    parser.add_argument("--rotate", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args)

    runs = {mode: [] for mode, _ in MODES}
    for r in range(max(args.rounds, 1)):
        order = MODES if r % 2 == 0 else MODES[::-1]
        for mode, _ in order:
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", mode]
            cmd += ["--repeats", str(args.repeats), "--pairs", str(args.pairs)]
            cmd += ["--steps", str(args.steps), "--rotate", str(r)]
            if args.library:
                cmd += ["--library", args.library]
            run = subprocess.run(cmd, capture_output=True, text=True)
            lines = [l for l in run.stdout.splitlines() if l.startswith("RESULT ")]
            if run.returncode != 0 or not lines:
                print("bench_torch: the %s run failed (status %d):\n%s%s"
                      % (mode, run.returncode, run.stdout, run.stderr))
                print("bench_torch: 0 passed, 1 failed")
                return 1
            runs[mode].append(json.loads(lines[-1][len("RESULT "):]))

    def cells(mode):
        """(median, max - min) over rounds of each pair size and of the step."""
        out = {}
        for label, _ in SIZES:
            xs = [run["pairs"][label] for run in runs[mode]]
            out[label] = (statistics.median(xs), max(xs) - min(xs))
        xs = [run["step_ms"] for run in runs[mode]]
        out["step"] = (statistics.median(xs), max(xs) - min(xs))
        return out

    results = {mode: cells(mode) for mode, _ in MODES}
    first = runs[MODES[0][0]][0]
    print("torch %s on %s; medians of %d repeats, median over %d rounds"
          % (first["torch"], first["device"], args.repeats, len(runs[MODES[0][0]])))
    header = "%-34s" % "" + "".join("%20s" % title for _, title in MODES)
    print(header)
    for label, _ in SIZES:
        row = "%-34s" % ("empty+del %s (us/pair)" % label)
        row += "".join("%20.2f" % results[m][label][0] for m, _ in MODES)
        print(row)
    row = "%-34s" % "training step (ms/step)"
    row += "".join("%20.3f" % results[m]["step"][0] for m, _ in MODES)
    print(row)
    row = "%-34s" % "spread over rounds (us/pair)"
    row += "".join("%20.2f" % max(results[m][label][1] for label, _ in SIZES) for m, _ in MODES)
    print(row)
    print("(%s; %d pairs and %d steps per repeat)" % (MLP, args.pairs, args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
