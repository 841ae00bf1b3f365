"""The ctypes layer of rmm_rs_torch without PyTorch: loading the library, the struct layouts,
sizes, configuration errors and statistics. Runs anywhere (no GPU needed; with one, device 0 is
also configured for real). Plain asserts: ``python3 test_ctypes.py [LIBRARY]``; the last line is
"test_ctypes: N passed, M failed, K skipped"."""

import ctypes
import os
import sys
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import rmm_rs_torch as rr  # noqa: E402

SKIPPED = []


class Skip(Exception):
    pass


def test_layouts_match_the_header():
    assert ctypes.sizeof(rr.Options) == 48, ctypes.sizeof(rr.Options)
    assert rr.Options.log_file.offset == 24
    assert rr.Options.devices.offset == 40
    assert ctypes.sizeof(rr.Statistics) == 88, ctypes.sizeof(rr.Statistics)
    assert rr.Statistics.statistics_enabled.offset == 80


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
        (dict(resource="cuda", maximum_pool_size="1GiB"), "RMM_RS_RESOURCE_POOL"),
        (dict(devices=[0, 0]), "twice"),
    ]:
        try:
            rr.configure(**kwargs)
        except rr.RmmRsError as e:
            assert e.name == "RMM_RS_ERROR_INVALID_ARGUMENT", e
            assert words in e.message, (words, e.message)
        else:
            raise AssertionError("accepted %r" % (kwargs,))
    try:
        rr.configure(resource="arena")
    except ValueError:
        pass
    else:
        raise AssertionError("accepted resource='arena'")


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
