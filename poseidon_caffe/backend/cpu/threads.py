"""How many threads the numeric libraries use, and batch-splitting for memory-bound passes.

BLAS and the FFT have their own threads; the numpy passes of pooling, LRN and the copies of
convolution have none. ``over_batch`` cuts such work into slices of the batch that fit in the
cache (so a chain of passes over one slice reads memory once, not once per pass) and, when
more than one thread is configured, runs the slices on a small persistent pool: numpy releases
the GIL inside ufuncs and copies, so the slices really run side by side. ``over_parts`` cuts
a batch into one part per thread for the batch-split convolution and pooling plans, its part
threads kept off the caller's CPU (``_keep_parts_off_caller``).
"""
import os
import threading

import numpy as np
from concurrent.futures import ThreadPoolExecutor

# bytes a slice of work should touch: measured best between L2 (1 MB) and the shared L3
SLICE_BYTES = 2 * 1024 * 1024


def thread_count():
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return os.cpu_count() or 1


_pool = {"executor": None, "size": 0}
_pool_lock = threading.Lock()
_local = threading.local()
_part_threads = {}          # part index (from 1) -> its own one-thread executor
_part_ids = {}              # part index (from 1) -> its thread's id in the kernel
_kept_off = {"cpu": None}   # the CPU the part threads were last kept off
_getcpu = []                # libc's sched_getcpu, once looked up (None where there is none)


def _executor(size):
    with _pool_lock:
        if _pool["size"] != size:
            if _pool["executor"] is not None:
                _pool["executor"].shutdown(wait=False)
            _pool["executor"] = ThreadPoolExecutor(size, thread_name_prefix="Backend-")
            _pool["size"] = size
        return _pool["executor"]


def _part_executor(i):
    """The thread that runs part ``i`` of every ``over_parts`` call: always the same one, so
    the scratch of a part lives in one thread, not in whichever pool thread took it last."""
    with _pool_lock:
        executor = _part_threads.get(i)
        if executor is None:
            executor = ThreadPoolExecutor(1, thread_name_prefix="Part-%d" % i)
            _part_threads[i] = executor
            _part_ids[i] = executor.submit(threading.get_native_id).result()
            _kept_off["cpu"] = None
        return executor


def _caller_cpu():
    """The CPU the calling thread runs on, or None where it cannot be asked."""
    if not _getcpu:
        try:
            import ctypes
            fn = ctypes.CDLL(None).sched_getcpu
            fn.argtypes, fn.restype = [], ctypes.c_int
        except (OSError, AttributeError, TypeError):     # no C library to load by name
            fn = None
        _getcpu.append(fn)
    cpu = _getcpu[0]() if _getcpu[0] is not None else -1
    return cpu if cpu >= 0 else None


def _keep_parts_off_caller(count):
    """Keeps part threads 1..count-1 off the caller's CPU. Woken after a pause, a thread is
    put on the CPU of the thread that woke it (the other core being idle), where it waits
    for the caller's own part to end: the parts then run one after the other. Asked again
    only when the caller has moved."""
    cpu = _caller_cpu()
    if cpu is None or cpu == _kept_off["cpu"] or not hasattr(os, "sched_setaffinity"):
        return
    allowed = os.sched_getaffinity(0) - {cpu}
    if not allowed:
        return
    for i in range(1, count):
        try:
            os.sched_setaffinity(_part_ids[i], allowed)
        except OSError:             # the thread is gone, or affinity is not ours to set
            return
    _kept_off["cpu"] = cpu


def near_equal(n, count):
    """[(lo, hi), ...]: ``count`` parts of range(n), their sizes differing by one at most."""
    step, extra = divmod(n, count)
    bounds, lo = [], 0
    for i in range(count):
        hi = lo + step + (1 if i < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def slices(n, bytes_per_item, threads, slice_bytes=None):
    """[(lo, hi), ...] covering range(n): each about ``slice_bytes``, at least one per thread
    when there are enough items."""
    per = max(1, int((slice_bytes or SLICE_BYTES) // max(1, bytes_per_item)))
    return near_equal(n, max(-(-n // per), min(threads, n)))


def over_batch(fn, n, bytes_per_item, threads=None):
    """Calls ``fn(lo, hi)`` for slices of range(n) that together cover it once.

    ``bytes_per_item`` is what one item's share of the work touches (all arrays, temporaries
    included); ``fn`` must write only its own slice. With several threads the slices run on
    the pool; a call made from inside a pool thread runs its slices in place.
    """
    threads = thread_count() if threads is None else threads
    parts = slices(n, bytes_per_item, threads)
    if threads <= 1 or len(parts) == 1 or getattr(_local, "inside", False):
        for lo, hi in parts:
            fn(lo, hi)
        return

    def run(part):
        _local.inside = True
        try:
            fn(*part)
        finally:
            _local.inside = False

    for future in [_executor(threads).submit(run, part) for part in parts]:
        future.result()


def scratch(name, shape, dtype=np.float32):
    """A work array of ``shape`` owned by the calling thread and reused across calls: fresh
    temporaries of a few MB are returned to the system when freed and page-fault again on
    every use."""
    store = _local.__dict__.setdefault("scratch", {})
    need = int(np.prod(shape))
    buf = store.get(name)
    if buf is None or buf.size < need or buf.dtype != dtype:
        buf = np.empty(need, dtype=dtype)
        store[name] = buf
    return buf[:need].reshape(shape)


def _blas_thread_setters():
    """ctypes setters of every OpenBLAS loaded in this process (numpy's and scipy's each
    have their own thread count); empty where none is found."""
    import ctypes
    setters = []
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps
                            if "openblas" in line.rsplit("/", 1)[-1] and ".so" in line})
    except OSError:
        return setters
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                     "openblas_set_num_threads64_", "openblas_set_num_threads"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes = [ctypes.c_int]
                fn.restype = None
                setters.append(fn)
                break
    return setters


def set_blas_threads(count):
    """Sets the thread count of every OpenBLAS loaded so far (a no-op where none is found)."""
    for fn in _blas_thread_setters():
        fn(count)


def over_parts(fn, n, threads=None):
    """Calls ``fn(part, lo, hi)`` for ``threads`` near-equal parts of range(n), one per pool
    thread, so that each part's whole chain of copies, GEMMs and passes runs on its own core.
    Returns the bounds used."""
    threads = thread_count() if threads is None else threads
    count = max(1, min(threads, n))
    bounds = near_equal(n, count)
    if count == 1 or getattr(_local, "inside", False):
        for i, (lo, hi) in enumerate(bounds):
            fn(i, lo, hi)
        return bounds

    def run(i):
        _local.inside = True
        try:
            fn(i, *bounds[i])
        finally:
            _local.inside = False

    # the calling thread takes the first part itself: one hand-off fewer to wait for; part i
    # goes to its own thread, which keeps that part's scratch, unless that thread has not
    # started it when the caller is done with its own (woken late: tens of us, a hundred and
    # more where its core was idle): then the caller does it, with its own scratch
    executors = [_part_executor(i) for i in range(1, count)]
    _keep_parts_off_caller(count)
    futures = [executor.submit(run, i) for i, executor in enumerate(executors, 1)]
    try:
        run(0)
        for i, future in enumerate(futures, 1):
            if future.cancel():
                run(i)
    finally:
        for future in futures:
            if not future.cancelled():
                future.result()
    return bounds
