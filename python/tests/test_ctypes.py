"""The ctypes layer of rmm_rs_torch without PyTorch: loading the library, the struct layouts,
sizes, configuration errors and statistics. Runs anywhere (no GPU needed; with one, device 0 is
also configured for real). Plain asserts: ``python3 test_ctypes.py [LIBRARY]``; the last line is
"test_ctypes: N passed, M failed, K skipped"."""

import ctypes
import os
import sys
import traceback

try:
    import rmm_rs_torch as rr  # installed (pip install rmm_rs_torch-*.whl)
except ImportError:
    # The repository's python/rmm_rs_torch.py.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import rmm_rs_torch as rr

SKIPPED = []


class Skip(Exception):
    pass


def test_layouts_match_the_header():
    assert ctypes.sizeof(rr.Options) == 48, ctypes.sizeof(rr.Options)
    assert rr.Options.log_file.offset == 24
    assert rr.Options.devices.offset == 40
    assert ctypes.sizeof(rr.Statistics) == 104, ctypes.sizeof(rr.Statistics)
    assert rr.Statistics.statistics_enabled.offset == 80
    assert rr.Statistics.peak_pool_size.offset == 88
    assert rr.Statistics.out_of_memory_failures.offset == 96


def test_library_loads_with_its_abi():
    lib = rr.load_library()
    assert lib.rmm_rs_abi_version() == rr.ABI_VERSION
    assert lib.rmm_rs_version().decode()
    assert os.path.isabs(rr.library_path())


def test_sizes_parse_like_rmm():
    assert rr.parse_size("8GiB") == 8 << 30
    assert rr.parse_size("1.5GB") == 1_500_000_000
    assert rr.parse_size(4096) == 4096
    for bad in ("lots", -1):
        try:
            rr.parse_size(bad)
        except ValueError as e:
            assert str(e), "empty message"
        else:
            raise AssertionError("parsed %r" % (bad,))


def test_bad_configurations_raise_with_the_reason():
    for kwargs, words in [
        (dict(pool_size=1000), "256"),
        (dict(pool_size="2GiB", maximum_pool_size="1GiB"), "exceeds"),
        (dict(devices=[0, 0]), "twice"),
    ]:
        try:
            rr.configure(**kwargs)
        except rr.RmmRsError as e:
            assert e.name == "RMM_RS_ERROR_INVALID_ARGUMENT", e
            assert words in e.message, (words, e.message)
        else:
            raise AssertionError("accepted %r" % (kwargs,))
    # Combinations the documented rules refuse raise ValueError before the library is called.
    try:
        rr.configure(resource="cuda", maximum_pool_size="1GiB")
    except ValueError as e:
        assert "resource='pool'" in str(e), str(e)
    else:
        raise AssertionError("accepted a maximum for resource='cuda'")
    try:
        rr.configure(resource="arena")
    except ValueError:
        pass
    else:
        raise AssertionError("accepted resource='arena'")


def test_the_defaults_go_with_every_resource():
    import inspect

    params = inspect.signature(rr.use_rmm_rs_allocator).parameters
    # The guide documents None (half of the free memory, for a pool) and no maximum.
    assert params["pool_size"].default is None, params["pool_size"]
    assert params["maximum_pool_size"].default is None, params["maximum_pool_size"]
    assert params["resource"].default == "pool"
    for resource in rr.RESOURCES:
        for managed in (False, True):
            rr.check_combination(resource, managed_memory=managed)


def test_arguments_that_do_not_go_together_raise_before_torch():
    had_torch = "torch" in sys.modules
    for kwargs, words in [
        (dict(resource="cuda", pool_size="1GiB"), "pool_size is for resource='async' or 'pool'"),
        (dict(resource="cuda", maximum_pool_size="1GiB"), "resource='pool'"),
        (dict(resource="async", maximum_pool_size="1GiB"), "resource='pool'"),
        (dict(resource="async", pool_size="1GiB", managed_memory=True), "managed pool"),
        (dict(resource="arena"), "resource must be one of"),
    ]:
        try:
            rr.use_rmm_rs_allocator(**kwargs)
        except ValueError as e:
            assert words in str(e), (words, str(e))
        else:
            raise AssertionError("accepted %r" % (kwargs,))
    assert had_torch or "torch" not in sys.modules, "torch was imported for a refusal"


def test_the_library_agrees_with_the_documented_combinations():
    # Every combination of resource, sizes set or not and managed memory: the Python rules
    # (COMBINATIONS, the guide's table) and the C library's accept and refuse the same ones.
    # Every device is configured lazily (nothing is built), so this needs no GPU.
    import itertools

    lib = rr.load_library()
    for resource, initial, maximum, managed in itertools.product(
        sorted(rr.RESOURCES), (None, 256 << 20), (None, 1 << 30), (False, True)
    ):
        try:
            rr.check_combination(resource, initial, maximum, managed)
            python_ok = True
        except ValueError:
            python_ok = False
        options = rr.Options()
        assert lib.rmm_rs_options_init(ctypes.byref(options)) == rr.SUCCESS
        options.resource = rr.RESOURCES[resource]
        options.managed_memory = 1 if managed else 0
        options.initial_pool_size = rr.SIZE_DEFAULT if initial is None else initial
        options.maximum_pool_size = rr.SIZE_DEFAULT if maximum is None else maximum
        code = lib.rmm_rs_configure(ctypes.byref(options))
        assert code in (rr.SUCCESS, 1), (code, rr.last_error())
        assert (code == rr.SUCCESS) == python_ok, (
            resource, initial, maximum, managed, python_ok, rr.last_error())


def test_status_returning_calls_report_their_own_status():
    lib = rr.load_library()
    out = ctypes.c_void_p(1)
    code = lib.rmm_rs_allocate(ctypes.byref(out), 256, 4000, None)
    assert code == rr.ERROR_NOT_CONFIGURED and out.value is None, (code, out.value)
    code = lib.rmm_rs_deallocate(ctypes.c_void_p(0x1000), 256, 4000, None)
    assert rr.ERROR_NAMES[code] == "RMM_RS_ERROR_INVALID_FREE", (code, rr.last_error())


def test_statistics_of_an_unconfigured_device_raise():
    try:
        rr.statistics(4000)
    except rr.RmmRsError as e:
        assert e.code == rr.ERROR_NOT_CONFIGURED, e
    else:
        raise AssertionError("device 4000 has statistics")


def test_device_zero_configures_or_says_why_not():
    try:
        rr.configure(pool_size="16MiB", maximum_pool_size="64MiB", devices=[0])
    except rr.RmmRsError as e:
        assert e.code == rr.ERROR_NO_DEVICE, e
        raise Skip("no GPU: %s" % e.message)
    s = rr.statistics(0)
    assert s["pool_size"] == 16 << 20, s
    assert s["statistics_enabled"] == 1 and s["device"] == 0, s
    lib = rr.load_library()
    p = lib.rmm_rs_alloc(1 << 20, 0, None)
    assert p, rr.last_error()
    assert rr.statistics(0)["current_bytes"] == 1 << 20
    lib.rmm_rs_free(p, 1 << 20, 0, None)
    assert rr.statistics(0)["outstanding_allocations"] == 0


def main():
    if len(sys.argv) > 1:
        os.environ[rr.ENV_LIBRARY] = sys.argv[1]
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_")]
    passed = failed = skipped = 0
    for name, fn in tests:
        try:
            fn()
        except Skip as s:
            skipped += 1
            print("test %s ... skipped (%s)" % (name, s))
        except Exception:
            failed += 1
            print("test %s ... FAILED" % name)
            traceback.print_exc()
        else:
            passed += 1
            print("test %s ... ok" % name)
    print("test_ctypes: %d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
