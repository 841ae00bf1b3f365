"""rmm-rs as PyTorch's CUDA allocator, through the C library of rmm-rs (crate rmm-capi).

    import rmm_rs_torch
    rmm_rs_torch.enable()          # a pool of half the free memory, per device
    import torch   # (or before; what matters is that no CUDA work ran yet)
    x = torch.randn(1024, 1024, device="cuda")   # served by an rmm-rs pool
    assert rmm_rs_torch.is_active()
    print(rmm_rs_torch.memory_stats())           # torch's key names
    print(rmm_rs_torch.max_memory_allocated())
    rmm_rs_torch.reset_peak_memory_stats()
    rmm_rs_torch.dump_snapshot("snapshot.pickle") # torch.cuda.memory._dump_snapshot's format

Linux only (the library is librmm_capi.so; PyTorch's CUDAPluggableAllocator), Python 3, and a
PyTorch with CUDA; tested with torch 2.11. Which arguments go together (``resource`` "pool",
"async" or "cuda"; ``pool_size``, ``maximum_pool_size``, ``managed_memory``) is the table of
``COMBINATIONS`` below and of the guide page; anything else raises ValueError before any
library or torch is touched.

The library is found from the ``library`` argument, else the ``RMM_RS_LIBRARY`` environment
variable, else the library installed with this module by its wheel (``pip install
rmm_rs_torch-*.whl``, built by ``cargo xtask wheel``), else ``librmm_capi.so`` beside this file or
in the repository's ``target/release``,
``target/gpu`` or ``target/debug`` (``cargo build --release -p rmm-capi`` builds it). No CUDA
toolkit is needed: the library loads the driver itself.

``enable`` is ``use_rmm_rs_allocator``. PyTorch's own ``torch.cuda.memory_stats()``,
``max_memory_allocated()`` and ``reset_peak_memory_stats()`` do not work under a pluggable
allocator; the functions of the same names here answer from rmm-rs's statistics instead.

The functions below but ``use_rmm_rs_allocator`` need no torch: ``configure``, ``statistics``,
``memory_stats`` and the other statistics, ``dump_snapshot``, ``flush_log``, ``parse_size``
work through ctypes alone (for C-level tests, or for any other
program that loads the same library).

A failed allocation raises in Python: the hook throws a C++ ``std::bad_alloc`` subclass with the
library's message (``std::bad_alloc: out_of_memory: ...``, with the resource's out-of-memory
report: the request, the bytes in use, reserved and free), which PyTorch turns into a Python
exception. See the guide page "Using rmm-rs from PyTorch and C" for which class.
"""

import ctypes
import os
import pathlib

__all__ = [
    "COMBINATIONS",
    "RmmRsError",
    "check_combination",
    "is_active",
    "use_rmm_rs_allocator",
    "enable",
    "configure",
    "statistics",
    "memory_stats",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "dump_snapshot",
    "flush_log",
    "parse_size",
    "find_library",
    "load_library",
]

ENV_LIBRARY = "RMM_RS_LIBRARY"
LIBRARY_NAME = "librmm_capi.so"
ABI_VERSION = 3

SUCCESS = 0
ERROR_NAMES = {
    1: "RMM_RS_ERROR_INVALID_ARGUMENT",
    2: "RMM_RS_ERROR_OUT_OF_MEMORY",
    3: "RMM_RS_ERROR_BAD_ALLOC",
    4: "RMM_RS_ERROR_INVALID_FREE",
    5: "RMM_RS_ERROR_NO_DEVICE",
    6: "RMM_RS_ERROR_CUDA",
    7: "RMM_RS_ERROR_NOT_CONFIGURED",
    8: "RMM_RS_ERROR_BUSY",
    9: "RMM_RS_ERROR_PANIC",
    10: "RMM_RS_ERROR_UNSUPPORTED",
}
ERROR_NO_DEVICE = 5
ERROR_NOT_CONFIGURED = 7
ERROR_UNSUPPORTED = 10

RESOURCES = {"cuda": 0, "pool": 1, "async": 2}
SIZE_DEFAULT = (1 << 64) - 1

# What each resource does with the sizes, and whether it takes managed memory: the rules
# ``configure`` checks (and the guide's table states). ``pool_size=None`` is the default
# everywhere: for "pool", half of the device's free memory when its pool is built (capped by
# ``maximum_pool_size``), as RMM's Python; for "async", no priming.
COMBINATIONS = {
    "pool": {"pool_size": "the first chunk", "maximum_pool_size": "the most the pool takes",
             "managed_memory": True},
    "async": {"pool_size": "bytes allocated and freed once to prime the driver's pool "
                           "(not with managed_memory)",
              "maximum_pool_size": None, "managed_memory": True},
    "cuda": {"pool_size": None, "maximum_pool_size": None, "managed_memory": True},
}


def check_combination(resource="pool", pool_size=None, maximum_pool_size=None,
                      managed_memory=False):
    """Raises ValueError, saying why, for arguments that do not go together (see
    ``COMBINATIONS``). Needs neither the library nor torch."""
    if resource not in RESOURCES:
        raise ValueError("resource must be one of %s, not %r" % (sorted(RESOURCES), resource))
    rules = COMBINATIONS[resource]
    for name, value in (("pool_size", pool_size), ("maximum_pool_size", maximum_pool_size)):
        if value is not None and rules[name] is None:
            takes = [r for r in sorted(COMBINATIONS) if COMBINATIONS[r][name] is not None]
            raise ValueError(
                "%s is for resource=%s; resource=%r has none (leave it None)"
                % (name, " or ".join(repr(r) for r in takes), resource)
            )
    if resource == "async" and managed_memory and pool_size is not None:
        raise ValueError(
            "pool_size (priming) is not supported for the driver's managed pool "
            "(resource='async' with managed_memory=True): leave it None"
        )


class Options(ctypes.Structure):
    """``rmm_rs_options`` of rmm_rs.h."""

    _fields_ = [
        ("resource", ctypes.c_int32),
        ("managed_memory", ctypes.c_int32),
        ("initial_pool_size", ctypes.c_uint64),
        ("maximum_pool_size", ctypes.c_uint64),
        ("log_file", ctypes.c_char_p),
        ("statistics", ctypes.c_int32),
        ("num_devices", ctypes.c_int32),
        ("devices", ctypes.POINTER(ctypes.c_int32)),
    ]


class Statistics(ctypes.Structure):
    """``rmm_rs_statistics`` of rmm_rs.h."""

    _fields_ = [
        ("current_bytes", ctypes.c_int64),
        ("peak_bytes", ctypes.c_int64),
        ("total_bytes", ctypes.c_int64),
        ("current_allocations", ctypes.c_int64),
        ("peak_allocations", ctypes.c_int64),
        ("total_allocations", ctypes.c_int64),
        ("outstanding_allocations", ctypes.c_uint64),
        ("pool_size", ctypes.c_uint64),
        ("failed_allocations", ctypes.c_uint64),
        ("failed_frees", ctypes.c_uint64),
        ("statistics_enabled", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("peak_pool_size", ctypes.c_uint64),
        ("out_of_memory_failures", ctypes.c_uint64),
    ]


class RmmRsError(RuntimeError):
    """A failed call of the library: ``code`` is the RMM_RS_ERROR_* status, ``name`` its name."""

    def __init__(self, code, message):
        self.code = code
        self.name = ERROR_NAMES.get(code, "RMM_RS_ERROR_%d" % code)
        self.message = message
        super().__init__("%s: %s" % (self.name, message))


_library = None
_library_path = None


def find_library(library=None):
    """The absolute path of librmm_capi.so: ``library``, else $RMM_RS_LIBRARY, else a build of
    the repository. Raises FileNotFoundError naming the places looked at."""
    if library is None:
        library = os.environ.get(ENV_LIBRARY) or None
    if library is not None:
        path = pathlib.Path(library).expanduser()
        if path.is_dir():
            path = path / LIBRARY_NAME
        if not path.is_file():
            raise FileNotFoundError("rmm-rs library %s does not exist" % path)
        return str(path.resolve())
    here = pathlib.Path(__file__).resolve().parent
    # Installed from the wheel (``cargo xtask wheel``), the library is the package's native
    # part: rmm_rs_torch/native/libnative.so.
    candidates = [here / LIBRARY_NAME] + sorted((here / "native").glob("lib*.so")) + [
        here.parent / "target" / profile / LIBRARY_NAME for profile in ("release", "gpu", "debug")
    ]
    for path in candidates:
        if path.is_file():
            return str(path)
    raise FileNotFoundError(
        "no %s: pass library=..., set %s, or build it with `cargo build --release -p rmm-capi` "
        "(looked at %s)" % (LIBRARY_NAME, ENV_LIBRARY, ", ".join(str(p) for p in candidates))
    )


def load_library(library=None):
    """Loads the library once per process (later calls return it, whatever ``library``)."""
    global _library, _library_path
    if _library is not None:
        return _library
    path = find_library(library)
    lib = ctypes.CDLL(path)
    sig = {
        "rmm_rs_abi_version": (ctypes.c_uint32, []),
        "rmm_rs_version": (ctypes.c_char_p, []),
        "rmm_rs_options_init": (ctypes.c_int, [ctypes.POINTER(Options)]),
        "rmm_rs_parse_byte_size": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64)]),
        "rmm_rs_configure": (ctypes.c_int, [ctypes.POINTER(Options)]),
        "rmm_rs_alloc": (ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
        "rmm_rs_free": (None, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
        "rmm_rs_allocate": (
            ctypes.c_int,
            [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p],
        ),
        "rmm_rs_deallocate": (
            ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        ),
        "rmm_rs_get_statistics": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(Statistics)]),
        "rmm_rs_reset_peak_statistics": (ctypes.c_int, [ctypes.c_int]),
        "rmm_rs_dump_snapshot": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p]),
        "rmm_rs_flush_log": (ctypes.c_int, [ctypes.c_int]),
        "rmm_rs_last_error": (ctypes.c_char_p, []),
        "rmm_rs_last_error_code": (ctypes.c_int, []),
        "rmm_rs_clear_last_error": (None, []),
    }
    for name, (restype, argtypes) in sig.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    abi = lib.rmm_rs_abi_version()
    if abi != ABI_VERSION:
        raise RuntimeError(
            "%s has ABI version %d; this module speaks version %d" % (path, abi, ABI_VERSION)
        )
    _library, _library_path = lib, path
    return lib


def library_path():
    """The path of the loaded library (None before ``load_library``)."""
    return _library_path


def _check(code):
    if code != SUCCESS:
        lib = load_library()
        raise RmmRsError(code, lib.rmm_rs_last_error().decode("utf-8", "replace"))


def last_error():
    """The calling thread's last error message of the library ("" if none)."""
    return load_library().rmm_rs_last_error().decode("utf-8", "replace")


def parse_size(value):
    """Bytes from an int or a string such as "8GiB", "512MiB", "1.5GB" (the library's parser)."""
    if isinstance(value, bool):
        raise TypeError("a size is an int or a string, not a bool")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size is not negative: %d" % value)
        return value
    if not isinstance(value, str):
        raise TypeError("a size is an int or a string, not %r" % (value,))
    out = ctypes.c_uint64()
    code = load_library().rmm_rs_parse_byte_size(value.encode(), ctypes.byref(out))
    if code != SUCCESS:
        raise ValueError(last_error())
    return out.value


def configure(
    resource="pool",
    pool_size=None,
    maximum_pool_size=None,
    managed_memory=False,
    log_file=None,
    statistics=True,
    devices=None,
    library=None,
):
    """``rmm_rs_configure``: ``resource`` is "pool", "async" or "cuda"; ``pool_size`` the
    initial size (pool) or priming size (async), None for the default; ``maximum_pool_size``
    the pool's maximum, None for none; ``log_file`` the CSV log's base path (device N writes
    <stem>.devN<ext>); ``devices`` None for every device, each built on its first allocation,
    or a list of ordinals built now. Raises RmmRsError."""
    check_combination(resource, pool_size, maximum_pool_size, managed_memory)
    lib = load_library(library)
    options = Options()
    _check(lib.rmm_rs_options_init(ctypes.byref(options)))
    options.resource = RESOURCES[resource]
    options.managed_memory = 1 if managed_memory else 0
    options.initial_pool_size = SIZE_DEFAULT if pool_size is None else parse_size(pool_size)
    options.maximum_pool_size = (
        SIZE_DEFAULT if maximum_pool_size is None else parse_size(maximum_pool_size)
    )
    log_bytes = None
    if log_file is not None:
        log_bytes = os.fsencode(os.path.abspath(os.fspath(log_file)))
        options.log_file = log_bytes
    options.statistics = 1 if statistics else 0
    ordinals = None
    if devices:
        ordinals = (ctypes.c_int32 * len(devices))(*devices)
        options.num_devices = len(devices)
        options.devices = ordinals
    _check(lib.rmm_rs_configure(ctypes.byref(options)))


def use_rmm_rs_allocator(
    pool_size=None,
    maximum_pool_size=None,
    log_file=None,
    library=None,
    *,
    resource="pool",
    managed_memory=False,
    statistics=True,
):
    """Makes rmm-rs PyTorch's CUDA allocator, on every device (each device's resource is built
    on its first allocation). Must run before the first CUDA use of the process: PyTorch cannot
    change its allocator after that. Returns the library's path.

    The defaults work with every ``resource``: ``pool_size=None`` is half of the device's free
    memory for "pool" (capped by ``maximum_pool_size``) and no priming for "async";
    ``maximum_pool_size=None`` is no maximum. Arguments that do not go together raise
    ValueError before torch is imported (``check_combination``)."""
    import atexit

    check_combination(resource, pool_size, maximum_pool_size, managed_memory)
    import torch

    if torch.cuda.is_initialized():
        raise RuntimeError(
            "use_rmm_rs_allocator must run before the first CUDA use of this process "
            "(PyTorch cannot change its allocator once CUDA is initialized)"
        )
    configure(
        resource=resource,
        pool_size=pool_size,
        maximum_pool_size=maximum_pool_size,
        managed_memory=managed_memory,
        log_file=log_file,
        statistics=statistics,
        library=library,
    )
    path = library_path()
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        path, "rmm_rs_torch_alloc", "rmm_rs_torch_free"
    )
    torch.cuda.memory.change_current_allocator(allocator)
    if log_file is not None:
        atexit.register(flush_log)
    return path


enable = use_rmm_rs_allocator


def is_active(device=None):
    """Whether PyTorch's CUDA allocations on ``device`` (default: the current one) come from
    rmm-rs: allocates one small tensor and checks that the library counted it. Needs torch and a
    GPU; initializes CUDA if nothing did yet."""
    import torch

    if device is None:
        device = torch.cuda.current_device()
    device = int(device)
    try:
        before = statistics(device)["outstanding_allocations"]
    except RmmRsError:
        return False
    probe = torch.empty(256, dtype=torch.uint8, device="cuda:%d" % device)
    during = statistics(device)["outstanding_allocations"]
    del probe
    return during == before + 1


def _current_device():
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return 0


def statistics(device=None):
    """The statistics of ``device`` (default: PyTorch's current device) as a dict: the fields of
    ``rmm_rs_statistics`` (current/peak/total bytes and allocations, outstanding allocations,
    pool size, failed allocations and frees, statistics_enabled, device)."""
    if device is None:
        device = _current_device()
    out = Statistics()
    _check(load_library().rmm_rs_get_statistics(int(device), ctypes.byref(out)))
    return {name: getattr(out, name) for name, _ in Statistics._fields_}


def memory_stats(device=None):
    """``torch.cuda.memory_stats`` for rmm-rs: a dict (sorted by key) with torch's key names
    where rmm-rs counts the same thing, all for the pool "all":

    - ``allocated_bytes.all.{current,peak,allocated,freed}``: bytes allocated and not freed,
      their peak (since the last ``reset_peak_memory_stats``), and the totals allocated and
      freed. rmm-rs counts requested bytes (torch counts its rounded blocks), so
      ``requested_bytes.all.*`` are the same numbers.
    - ``allocation.all.{current,peak,allocated,freed}``: the same for the number of allocations.
    - ``reserved_bytes.all.{current,peak}``: bytes the resource holds from the device (the pool's
      size) and their peak.
    - ``num_ooms``: allocations that failed out of memory; ``num_alloc_retries``: 0 (rmm-rs never
      frees its cache to retry an allocation).

    and rmm-rs's own, under ``rmm_rs.``: ``failed_allocations``, ``failed_frees``,
    ``outstanding_allocations``, ``statistics_enabled``. The byte and allocation counts are 0
    when statistics are off (``use_rmm_rs_allocator(statistics=False)``)."""
    s = statistics(device)
    stats = {
        "num_ooms": s["out_of_memory_failures"],
        "num_alloc_retries": 0,
        "reserved_bytes.all.current": s["pool_size"],
        "reserved_bytes.all.peak": s["peak_pool_size"],
        "rmm_rs.failed_allocations": s["failed_allocations"],
        "rmm_rs.failed_frees": s["failed_frees"],
        "rmm_rs.outstanding_allocations": s["outstanding_allocations"],
        "rmm_rs.statistics_enabled": s["statistics_enabled"],
    }
    for prefix in ("allocated_bytes", "requested_bytes"):
        stats[prefix + ".all.current"] = s["current_bytes"]
        stats[prefix + ".all.peak"] = s["peak_bytes"]
        stats[prefix + ".all.allocated"] = s["total_bytes"]
        stats[prefix + ".all.freed"] = s["total_bytes"] - s["current_bytes"]
    stats["allocation.all.current"] = s["current_allocations"]
    stats["allocation.all.peak"] = s["peak_allocations"]
    stats["allocation.all.allocated"] = s["total_allocations"]
    stats["allocation.all.freed"] = s["total_allocations"] - s["current_allocations"]
    return dict(sorted(stats.items()))


def memory_allocated(device=None):
    """Bytes allocated through rmm-rs and not freed (``torch.cuda.memory_allocated``)."""
    return statistics(device)["current_bytes"]


def max_memory_allocated(device=None):
    """The peak of ``memory_allocated`` since the last ``reset_peak_memory_stats``
    (``torch.cuda.max_memory_allocated``)."""
    return statistics(device)["peak_bytes"]


def memory_reserved(device=None):
    """Bytes rmm-rs holds from the device (``torch.cuda.memory_reserved``)."""
    return statistics(device)["pool_size"]


def max_memory_reserved(device=None):
    """The peak of ``memory_reserved`` since the last ``reset_peak_memory_stats``."""
    return statistics(device)["peak_pool_size"]


def reset_peak_memory_stats(device=None):
    """Resets the peaks of ``device`` (bytes and allocations allocated, bytes reserved) to the
    current values (``torch.cuda.reset_peak_memory_stats``)."""
    if device is None:
        device = _current_device()
    _check(load_library().rmm_rs_reset_peak_statistics(int(device)))


def dump_snapshot(path, device=None):
    """Writes the memory snapshot of ``device`` to ``path`` in the format of
    ``torch.cuda.memory._dump_snapshot`` (a pickle with ``segments``, the pool's chunks with their
    blocks, and ``device_traces``), which ``python -m torch.cuda._memory_viz`` and rmm-replay
    read. Raises RmmRsError (RMM_RS_ERROR_UNSUPPORTED when the resource keeps no blocks, e.g.
    ``resource="cuda"``)."""
    if device is None:
        device = _current_device()
    path = os.fsencode(os.path.abspath(os.fspath(path)))
    _check(load_library().rmm_rs_dump_snapshot(int(device), path))


def flush_log(device=-1):
    """Writes the buffered rows of the CSV log of ``device`` (-1: every device) to its file."""
    _check(load_library().rmm_rs_flush_log(int(device)))
