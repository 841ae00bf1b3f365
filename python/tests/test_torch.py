"""rmm-rs as PyTorch's allocator, on a GPU with torch installed. Plain asserts, no pytest:

    python3 test_torch.py [--library librmm_capi.so] [--replay rmm-replay]

(or RMM_RS_LIBRARY / RMM_REPLAY in the environment). The process installs rmm-rs (a 1 GiB pool
with a 4 GiB maximum, statistics and a CSV log) before its first CUDA use; the reference results
come from a subprocess running the same computations on torch's own allocator, since the
allocator cannot change once CUDA is initialized. Each documented combination of
``use_rmm_rs_allocator``'s arguments (``COMBINATION_CASES``, the defaults first) runs in a
subprocess of its own, for the same reason. The last line is
"test_torch: N passed, M failed, K skipped"; the exit status is 1 when anything failed.
"""

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))

# Deterministic cuBLAS in both processes, so that results can be compared bit for bit.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

try:
    import rmm_rs_torch as rr  # installed (pip install rmm_rs_torch-*.whl)
except ImportError:
    # The repository's python/rmm_rs_torch.py.
    sys.path.insert(0, os.path.join(HERE, ".."))
    import rmm_rs_torch as rr  # noqa: E402

POOL_SIZE = "1GiB"
MAXIMUM_POOL_SIZE = "4GiB"
TOO_LARGE = 5 << 30  # bytes: over the maximum, but an H100 would give it


class Skip(Exception):
    pass


def matmul_result(torch):
    g = torch.Generator().manual_seed(1234)
    a = torch.randn(512, 384, generator=g).cuda()
    b = torch.randn(384, 256, generator=g).cuda()
    return (a @ b).cpu()


def make_mlp(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    ).cuda()


def mlp_result(torch, steps=20):
    model = make_mlp(torch)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(99)
    x = torch.randn(steps, 128, 64, generator=g)
    y = torch.randn(steps, 128, 10, generator=g)
    losses = []
    for i in range(steps):
        loss = torch.nn.functional.mse_loss(model(x[i].cuda()), y[i].cuda())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def deterministic(torch):
    # warn_only: an op without a deterministic kernel warns instead of raising; the comparison
    # with the reference would then show it.
    torch.use_deterministic_algorithms(True, warn_only=True)


def reference_results(torch):
    deterministic(torch)
    losses, params = mlp_result(torch)
    return {"matmul": matmul_result(torch), "losses": losses, "params": params}


def baseline_main(out):
    import torch

    torch.save(reference_results(torch), out)
    return 0


# --------------------------------------------------------------------------------------------
# Every documented combination of use_rmm_rs_allocator's arguments, each in a fresh process.

COMBINATION_CASES = [
    ("defaults", {}),
    ("pool_sized", dict(pool_size="256MiB", maximum_pool_size="1GiB")),
    # Only a maximum, below the old 8 GiB default pool size: the first chunk is capped by it.
    ("pool_maximum_2GiB", dict(maximum_pool_size="2GiB")),
    ("pool_managed", dict(managed_memory=True)),
    ("pool_no_statistics", dict(statistics=False)),
    ("async", dict(resource="async")),
    ("async_primed", dict(resource="async", pool_size="256MiB")),
    ("async_managed", dict(resource="async", managed_memory=True)),
    ("cuda", dict(resource="cuda")),
    ("cuda_managed", dict(resource="cuda", managed_memory=True)),
]


def combination_main(name, library):
    """Installs rmm-rs with the arguments of case ``name``, computes on the GPU, checks what the
    library reports; the last line is "combination NAME: ok", "...: skipped (WHY)" or a
    failure."""
    kwargs = dict(COMBINATION_CASES)[name]
    rr.use_rmm_rs_allocator(library=library, **kwargs)
    import torch

    try:
        a = torch.randn(1024, 1024, device="cuda")
        b = (a @ a).sum().item()
    except RuntimeError as e:
        # The device's resource is built at the first allocation: a capability the device
        # lacks (the driver's managed pool needs CUDA 13) shows up here, typed.
        if "not supported here" in str(e):
            print("combination %s: skipped (%s)" % (name, str(e).splitlines()[0][:200]))
            return 0
        raise
    assert math.isfinite(b), b
    assert rr.is_active(), "allocations do not come from rmm-rs"
    s = rr.statistics(0)
    free, total = torch.cuda.mem_get_info()
    resource = kwargs.get("resource", "pool")
    stats_on = kwargs.get("statistics", True)
    assert s["statistics_enabled"] == (1 if stats_on else 0), s
    if stats_on:
        assert s["current_bytes"] >= 4 << 20, s
    if resource == "pool":
        pool = s["pool_size"]
        if "pool_size" in kwargs:
            assert pool >= rr.parse_size(kwargs["pool_size"]), s
        elif "maximum_pool_size" in kwargs:
            # Half of the free memory, capped by the maximum.
            assert 0 < pool <= rr.parse_size(kwargs["maximum_pool_size"]), s
            assert pool == rr.parse_size(kwargs["maximum_pool_size"]) or pool >= free // 2, s
        elif not kwargs.get("managed_memory"):
            # Half of the free memory when the pool was built: the pool now holds about as
            # much as is still free.
            share = pool / (pool + free)
            assert 0.40 <= share <= 0.60, (pool, free, share)
    print("combination %s: ok (pool_size %d, free %d of %d)" % (name, s["pool_size"], free, total))
    return 0


def make_combination_test(name):
    def test(ctx):
        cmd = [sys.executable, os.path.abspath(__file__), "--combination", name]
        if ctx.library:
            cmd += ["--library", ctx.library]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        lines = run.stdout.strip().splitlines()
        last = lines[-1] if lines else ""
        print("    " + last)
        if run.returncode == 0 and last.startswith("combination %s: skipped" % name):
            raise Skip(last.split("skipped", 1)[1].strip(" ()"))
        assert run.returncode == 0 and last.startswith("combination %s: ok" % name), (
            run.returncode, run.stdout[-2000:], run.stderr[-2000:])

    test.__name__ = "test_combination_" + name
    return test


# --------------------------------------------------------------------------------------------
# The tests (run in this order, in the process that uses rmm-rs).

class Context:
    torch = None
    reference = None
    log_base = None
    replay = None
    library = None


def test_allocations_come_from_rmm_rs(ctx):
    torch = ctx.torch
    before = rr.statistics(0)
    x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    during = rr.statistics(0)
    assert x.data_ptr() != 0
    # The first CUDA use may allocate more than x (PyTorch's own buffers): at least x.
    assert during["current_bytes"] - before["current_bytes"] >= 1 << 20, (before, during)
    assert during["outstanding_allocations"] >= before["outstanding_allocations"] + 1
    assert during["pool_size"] >= rr.parse_size(POOL_SIZE), during
    del x
    after = rr.statistics(0)
    assert after["outstanding_allocations"] == during["outstanding_allocations"] - 1, after
    assert after["current_bytes"] == during["current_bytes"] - (1 << 20), after


def test_matmul_matches_torchs_allocator(ctx):
    torch = ctx.torch
    got = matmul_result(torch)
    want = ctx.reference["matmul"]
    assert torch.equal(got, want), "max |diff| %g" % (got - want).abs().max().item()


def test_mlp_training_matches_torchs_allocator(ctx):
    torch = ctx.torch
    losses, params = mlp_result(torch)
    assert losses == ctx.reference["losses"], list(zip(losses, ctx.reference["losses"]))
    for got, want in zip(params, ctx.reference["params"]):
        assert torch.equal(got, want), "a parameter differs by %g" % (got - want).abs().max().item()


def test_side_streams(ctx):
    torch = ctx.torch
    g = torch.Generator().manual_seed(5)
    host = torch.randn(256, 256, generator=g)
    want = (host.cuda() @ host.cuda()).cpu()
    streams = [torch.cuda.Stream() for _ in range(3)]
    results = []
    for s in streams:
        with torch.cuda.stream(s):
            a = host.cuda(non_blocking=False)
            scratch = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
            scratch.fill_(1)
            results.append((a @ a, scratch))
    for s in streams:
        s.synchronize()
    for product, scratch in results:
        assert torch.equal(product.cpu(), want)
        assert int(scratch.sum().item()) == 3 << 20
    del results
    torch.cuda.synchronize()


def test_fresh_python_threads(ctx):
    torch = ctx.torch
    errors = []
    sums = {}

    def work(k):
        try:
            x = torch.full((1 << 18,), float(k), device="cuda")
            y = (x * 2).sum().item()
            sums[k] = y
        except Exception as e:  # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sums == {k: 2.0 * k * (1 << 18) for k in range(1, 9)}, sums


def test_over_the_maximum_raises_and_training_goes_on(ctx):
    torch = ctx.torch
    failed_before = rr.statistics(0)["failed_allocations"]
    try:
        t = torch.empty(TOO_LARGE, dtype=torch.uint8, device="cuda")
    except Exception as e:  # which class is what the coordinator reads off the output
        kind = "%s.%s" % (type(e).__module__, type(e).__qualname__)
        bases = [c.__name__ for c in type(e).__mro__]
        print("    over-maximum exception: %s (mro %s): %s" % (kind, bases, str(e)[:300]))
        assert "out_of_memory" in str(e), str(e)
    else:
        raise AssertionError(
            "torch.empty(%d bytes) over a %s maximum returned a tensor (data_ptr %#x)"
            % (TOO_LARGE, MAXIMUM_POOL_SIZE, t.data_ptr())
        )
    assert rr.statistics(0)["failed_allocations"] == failed_before + 1
    model = make_mlp(torch)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(5):
        x = torch.randn(64, 64, device="cuda")
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert math.isfinite(loss.item())


def test_memory_stats_with_torchs_names(ctx):
    """rmm_rs_torch's memory_stats, max_memory_allocated and reset_peak_memory_stats, which
    answer where torch's own raise under a pluggable allocator."""
    torch = ctx.torch
    torch.cuda.synchronize()
    rr.reset_peak_memory_stats()
    base = rr.memory_stats()
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                "reserved_bytes.all.current", "reserved_bytes.all.peak", "num_ooms",
                "num_alloc_retries", "allocation.all.allocated", "allocation.all.current"):
        assert key in base, (key, sorted(base))
    assert base["allocated_bytes.all.peak"] == base["allocated_bytes.all.current"], base
    assert base["reserved_bytes.all.peak"] == base["reserved_bytes.all.current"], base
    # The over-maximum test before this one ran out of memory once.
    assert base["num_ooms"] >= 1, base
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    during = rr.memory_stats()
    grew = during["allocated_bytes.all.current"] - base["allocated_bytes.all.current"]
    assert grew >= 64 << 20, (base, during)
    assert rr.max_memory_allocated() >= base["allocated_bytes.all.current"] + (64 << 20)
    assert rr.memory_allocated() == during["allocated_bytes.all.current"]
    assert during["allocation.all.allocated"] >= base["allocation.all.allocated"] + 1
    assert rr.memory_reserved() >= rr.memory_allocated()
    assert rr.max_memory_reserved() >= rr.memory_reserved()
    del x
    torch.cuda.synchronize()
    after = rr.memory_stats()
    assert after["allocated_bytes.all.current"] <= during["allocated_bytes.all.current"] - (64 << 20)
    assert after["allocated_bytes.all.peak"] >= during["allocated_bytes.all.current"], after
    rr.reset_peak_memory_stats()
    assert rr.max_memory_allocated() == rr.memory_allocated()
    print("    memory_stats: peak %d B before the reset, %d after; num_ooms %d" % (
        after["allocated_bytes.all.peak"], rr.max_memory_allocated(), after["num_ooms"]))


def test_dump_snapshot_in_torchs_format(ctx):
    """rmm_rs_torch.dump_snapshot writes what torch.cuda.memory._dump_snapshot writes: a pickle
    PyTorch's own viewer reads."""
    import pickle

    torch = ctx.torch
    keep = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    path = os.path.join(os.path.dirname(ctx.log_base), "rmm_rs_snapshot.pickle")
    try:
        rr.dump_snapshot(path)
    except rr.RmmRsError as e:
        if e.name == "RMM_RS_ERROR_UNSUPPORTED":
            raise Skip(e.message[:200])
        raise
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    assert "segments" in snapshot and "device_traces" in snapshot, sorted(snapshot)
    reserved = sum(seg["total_size"] for seg in snapshot["segments"])
    allocated = sum(b["size"] for seg in snapshot["segments"] for b in seg["blocks"]
                    if b["state"] == "active_allocated")
    assert reserved == rr.memory_reserved(), (reserved, rr.memory_reserved())
    assert allocated >= 8 << 20, allocated
    viz = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "segment_plot", path,
                          "-o", path + ".html"], capture_output=True, text=True, timeout=300)
    assert viz.returncode == 0, (viz.stdout[-2000:], viz.stderr[-2000:])
    print("    snapshot: %d segments, %d B reserved, %d B allocated; segment_plot ok"
          % (len(snapshot["segments"]), reserved, allocated))
    del keep


def test_torch_memory_functions(ctx):
    """What the guide says of PyTorch's memory functions under rmm-rs (PyTorch's
    CUDAPluggableAllocator): the caching allocator's statistics raise, empty_cache() does
    nothing, mem_get_info() is the device's (rmm-rs's pool counts as used)."""
    torch = ctx.torch
    for fn in (torch.cuda.memory_allocated, torch.cuda.memory_reserved,
               torch.cuda.max_memory_allocated, torch.cuda.memory_stats):
        try:
            value = fn()
        except RuntimeError as e:
            assert "getDeviceStats" in str(e) or "does not" in str(e), str(e)
            print("    %s: raises (%s)" % (fn.__name__, str(e).splitlines()[0][:120]))
        else:
            raise AssertionError("%s() returned %r under rmm-rs" % (fn.__name__, value))
    pool_before = rr.statistics(0)["pool_size"]
    torch.cuda.empty_cache()
    assert rr.statistics(0)["pool_size"] == pool_before, "empty_cache changed the pool"
    free, total = torch.cuda.mem_get_info()
    assert 0 < free < total and total - free >= pool_before, (free, total, pool_before)
    print("    empty_cache(): no effect; mem_get_info(): free %d of %d" % (free, total))


def test_the_log_replays(ctx):
    torch = ctx.torch
    torch.cuda.synchronize()
    rr.flush_log()
    path = os.path.join(os.path.dirname(ctx.log_base), "torch_log.dev0.csv")
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines[0] == "Thread,Time,Action,Pointer,Size,Stream", lines[:2]
    rows = [line.split(",") for line in lines[1:]]
    actions = {r[2] for r in rows}
    assert {"allocate", "free", "allocate failure"} <= actions, actions
    streams = {r[5] for r in rows}
    assert len(streams) >= 3, "side streams not in the log: %s" % streams
    print("    log: %d rows, %d streams, %s" % (len(rows), len(streams), path))
    if not ctx.replay:
        raise Skip("no rmm-replay binary (pass --replay or set RMM_REPLAY)")
    run = subprocess.run(
        [ctx.replay, "--simulate", "80GiB", "--resource", "pool", path],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, (run.returncode, run.stdout, run.stderr)
    assert "allocations replayed" in run.stdout, run.stdout
    for line in run.stdout.splitlines():
        print("    replay: " + line)


TESTS = [
    test_allocations_come_from_rmm_rs,
    test_matmul_matches_torchs_allocator,
    test_mlp_training_matches_torchs_allocator,
    test_side_streams,
    test_fresh_python_threads,
    test_over_the_maximum_raises_and_training_goes_on,
    test_memory_stats_with_torchs_names,
    test_dump_snapshot_in_torchs_format,
    test_torch_memory_functions,
    test_the_log_replays,
] + [make_combination_test(name) for name, _ in COMBINATION_CASES]


def find_replay(arg):
    for candidate in (arg, os.environ.get("RMM_REPLAY"), shutil.which("rmm-replay")):
        if candidate and os.path.isfile(candidate):
            return os.path.abspath(candidate)
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--library", help="librmm_capi.so (default: $RMM_RS_LIBRARY or a build)")
    parser.add_argument("--replay", help="the rmm-replay binary (default: $RMM_REPLAY or PATH)")
    parser.add_argument("--baseline", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("--combination", metavar="NAME", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline:
        return baseline_main(args.baseline)
    if args.combination:
        return combination_main(args.combination, args.library)

    workdir = tempfile.mkdtemp(prefix="rmm-rs-torch-")
    reference_file = os.path.join(workdir, "reference.pt")
    base = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--baseline", reference_file],
        capture_output=True,
        text=True,
    )
    if base.returncode != 0:
        print(base.stdout + base.stderr)
        print("the reference run on torch's allocator failed")
        print("test_torch: 0 passed, 1 failed, 0 skipped")
        return 1

    ctx = Context()
    ctx.log_base = os.path.join(workdir, "torch_log.csv")
    ctx.replay = find_replay(args.replay)
    ctx.library = args.library
    path = rr.use_rmm_rs_allocator(
        pool_size=POOL_SIZE,
        maximum_pool_size=MAXIMUM_POOL_SIZE,
        log_file=ctx.log_base,
        library=args.library,
    )
    import torch

    print("rmm-rs library %s (module %s), torch %s, %s" % (path, rr.__file__, torch.__version__,
                                                         torch.cuda.get_device_name(0)))
    deterministic(torch)
    ctx.torch = torch
    ctx.reference = torch.load(reference_file)

    passed = failed = skipped = 0
    for test in TESTS:
        try:
            test(ctx)
        except Skip as s:
            skipped += 1
            print("test %s ... skipped (%s)" % (test.__name__, s))
        except Exception:
            failed += 1
            print("test %s ... FAILED" % test.__name__)
            traceback.print_exc(file=sys.stdout)
        else:
            passed += 1
            print("test %s ... ok" % test.__name__)
        sys.stdout.flush()
    print("statistics: %s" % rr.statistics(0))
    shutil.rmtree(workdir, ignore_errors=True)
    print("test_torch: %d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
