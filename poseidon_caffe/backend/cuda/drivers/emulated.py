"""The emulated driver: the driver interface over host memory, for machines without a GPU.

Device memory is numpy byte buffers whose addresses are the device pointers; kernels are the
host build of the same ``.cu`` sources (build.host_library), called through ctypes; BLAS is
numpy with cuBLAS's column-major semantics (emulated_blas.py). Work runs at once in the calling
thread, so a stream is always idle and an event records the time it is recorded at.

It checks what a real device would fault on, so tests catch it here: an address outside every
allocation (a copy, a BLAS operand or a kernel's pointer argument), and a write past the end
of an allocation (guard bytes after each one, checked after every launch). New memory holds
NaN bytes, as a real allocation holds garbage, so a read of memory never written shows.
"""
import bisect
import ctypes
import os
import threading
import time

import numpy as np

from .. import build
from ..driver import FLOAT, INT, POINTER, DeviceInfo, Driver, DriverError, Function

ALIGNMENT = 256                      # cudaMalloc's
GUARD = 64
GUARD_BYTE = 0xA5
FRESH_BYTE = 0xFF                    # 0xFFFFFFFF is a NaN as a float, -1 as an int
DEVICES_ENV = "POSEIDON_CAFFE_EMULATED_DEVICES"
MEMORY_ENV = "POSEIDON_CAFFE_EMULATED_MEMORY"
FAIL_ENV = "POSEIDON_CAFFE_EMULATED_FAIL"    # kernel:NAME[:N] or alloc:N, a fault to inject
DEFAULT_MEMORY = 4 << 30
_CTYPES = {POINTER: ctypes.c_void_p, INT: ctypes.c_int, FLOAT: ctypes.c_float}


def _cpu_clock_khz():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return int(float(line.split(":")[1]) * 1000)
    except (OSError, ValueError):
        pass
    return 0


class EmulatedStream:
    def __init__(self, driver, handle, non_blocking=False):
        self.driver = driver
        self.handle = handle
        self.non_blocking = non_blocking

    def synchronize(self):
        """Work ran when it was queued: nothing is ever pending (the wait is counted)."""
        self.driver.count_host_sync()


class EmulatedEvent:
    def __init__(self, driver):
        self.driver = driver
        self.time = None

    def record(self, stream=None):
        self.time = time.perf_counter()

    def synchronize(self):
        self.driver.count_host_sync()
        if self.time is None:
            raise DriverError("event synchronized before it was recorded")

    def query(self):
        """Whether the work before the event is done: always, here (and, as CUDA answers, for
        an event never recorded)."""
        return True

    def elapsed_ms(self, start):
        if self.time is None or start.time is None:
            raise DriverError("elapsed time of an event that was not recorded")
        return (self.time - start.time) * 1000.0


class EmulatedModule:
    def __init__(self, path):
        self.path = path
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as exc:
            raise DriverError("cannot load the host kernel library %s: %s" % (path, exc)) from None

    def function(self, name, signature):
        try:
            fn = getattr(self.lib, name)
        except AttributeError:
            raise DriverError("module %s has no kernel %s" % (os.path.basename(self.path),
                                                              name)) from None
        fn.argtypes = [_CTYPES[kind] for kind in signature]
        fn.restype = None
        return Function(name, signature, fn)


def parse_fault(text):
    """(kind, name, n) of a fault to inject from FAIL_ENV's value: ``kernel:NAME[:N]`` fails
    the N-th launch (default the first) of kernel NAME, ``alloc:N`` the N-th allocation; None
    for an empty value; DriverError for anything else."""
    text = (text or "").strip()
    if not text:
        return None
    parts = text.split(":")
    try:
        if parts[0] == "kernel" and len(parts) in (2, 3) and parts[1]:
            n = int(parts[2]) if len(parts) == 3 else 1
            if n >= 1:
                return "kernel", parts[1], n
        if parts[0] == "alloc" and len(parts) == 2 and int(parts[1]) >= 1:
            return "alloc", None, int(parts[1])
    except ValueError:
        pass
    raise DriverError("%s=%r: expected kernel:NAME[:N] (the N-th launch of kernel NAME fails) "
                      "or alloc:N (the N-th allocation fails), N >= 1" % (FAIL_ENV, text))


class EmulatedDriver(Driver):
    kind = "emulated"
    NOTE = ("the emulated device: a test device that runs the kernels on the host, many times "
            "slower than the CPU backend")

    def library_lines(self):
        return [("Driver", self.NOTE)]

    @staticmethod
    def device_count():
        return int(os.environ.get(DEVICES_ENV, "1"))

    def __init__(self, device=0):
        super().__init__()
        count = self.device_count()
        if not 0 <= int(device) < count:
            raise DriverError("emulated device %d does not exist (%d device%s; %s sets how "
                              "many)" % (device, count, "" if count == 1 else "s", DEVICES_ENV))
        self.device = int(device)
        self.capacity = int(os.environ.get(MEMORY_ENV, DEFAULT_MEMORY))
        self._info = DeviceInfo(
            ordinal=self.device, name="Emulated CUDA device (host memory, host-built kernels)",
            compute_capability=(7, 0), total_memory=self.capacity,
            multiprocessors=os.cpu_count() or 1, clock_khz=_cpu_clock_khz(),
            concurrent_copy_and_execution=False, emulated=True)
        # a prefetch thread allocates and copies while the computation runs
        self._lock = threading.RLock()
        self._buffers = {}           # pointer -> (buffer, nbytes)
        self._starts = []            # sorted pointers, for lookups by address
        self._in_use = 0
        self._streams = 0
        self._blas = {}
        # a fault to inject (FAIL_ENV), for tests of how a job meets a failing device
        self._fault = parse_fault(os.environ.get(FAIL_ENV))
        self._counts = {}

    def _inject(self, kind, name):
        """DriverError when this is the call FAIL_ENV names (counted per kernel name)."""
        if self._fault is None or self._fault[0] != kind or self._fault[1] != name:
            return
        key = (kind, name)
        self._counts[key] = self._counts.get(key, 0) + 1
        if self._counts[key] == self._fault[2]:
            what = ("launch %d of kernel %s on emulated device %d: unspecified launch failure"
                    % (self._fault[2], name, self.device) if kind == "kernel" else
                    "allocation %d on emulated device %d failed" % (self._fault[2], self.device))
            raise DriverError("%s (injected by %s)" % (what, FAIL_ENV))

    @property
    def info(self):
        return self._info

    def mem_info(self):
        return self.capacity - self._in_use, self.capacity

    def _synchronize(self):
        pass

    def close(self):
        with self._lock:
            self._buffers.clear()
            self._starts = []
            self._in_use = 0

    @property
    def allocations(self):
        """Live allocations: {pointer: nbytes}."""
        return {ptr: n for ptr, (_, n) in self._buffers.items()}

    # -- memory ----------------------------------------------------------------------------
    def _alloc(self, nbytes):
        with self._lock:
            return self._alloc_locked(nbytes)

    def _alloc_locked(self, nbytes):
        self._inject("alloc", None)
        if self._in_use + nbytes > self.capacity:
            raise DriverError("out of memory: %d bytes asked, %d of %d free on the emulated "
                              "device (%s sets its size)"
                              % (nbytes, self.capacity - self._in_use, self.capacity,
                                 MEMORY_ENV))
        raw = np.full(nbytes + ALIGNMENT + GUARD, FRESH_BYTE, dtype=np.uint8)
        offset = -raw.ctypes.data % ALIGNMENT
        buf = raw[offset:offset + nbytes + GUARD]
        buf[nbytes:] = GUARD_BYTE
        ptr = buf.ctypes.data
        self._buffers[ptr] = (buf, nbytes)
        bisect.insort(self._starts, ptr)
        self._in_use += nbytes
        return ptr

    def _free(self, ptr):
        with self._lock:
            entry = self._buffers.pop(ptr, None)
            if entry is None:
                raise DriverError("free of 0x%x, which is not an allocation's start" % ptr)
            self._starts.remove(ptr)
            self._in_use -= entry[1]

    def span(self, ptr, nbytes):
        """The uint8 view of ``nbytes`` device bytes at ``ptr``; DriverError when they are not
        all inside one allocation (a real device's illegal address)."""
        ptr, nbytes = int(ptr), int(nbytes)
        with self._lock:
            i = bisect.bisect_right(self._starts, ptr) - 1
            if i >= 0:
                start = self._starts[i]
                buf, size = self._buffers[start]
                if ptr + nbytes <= start + size:
                    return buf[ptr - start:ptr - start + nbytes]
        raise DriverError("illegal address: %d bytes at 0x%x are not inside one allocation"
                          % (nbytes, ptr))

    def floats(self, ptr, count):
        """A float32 view of ``count`` values at ``ptr``."""
        if int(ptr) % 4:
            raise DriverError("misaligned float address 0x%x" % int(ptr))
        return self.span(ptr, 4 * int(count)).view(np.float32)

    def pinned_empty(self, shape, dtype):
        return np.empty(shape, dtype=dtype)

    def _memset(self, ptr, byte, nbytes, stream):
        self.span(ptr, nbytes)[...] = byte

    def _memset32(self, ptr, word, count, stream):
        if ptr % 4:
            raise DriverError("misaligned 32-bit memset at 0x%x" % ptr)
        self.span(ptr, 4 * count).view(np.uint32)[...] = word

    def _copy_htod(self, dst, src, stream):
        self.span(dst, src.nbytes)[...] = src.reshape(-1).view(np.uint8)

    def _copy_dtoh(self, dst, src, stream):
        dst.reshape(-1).view(np.uint8)[...] = self.span(src, dst.nbytes)

    def _copy_dtod(self, dst, src, nbytes, stream):
        # cudaMemcpy between overlapping ranges is undefined; a copy through a temporary
        # at least gives one of the answers a device could
        self.span(dst, nbytes)[...] = self.span(src, nbytes).copy()

    # -- streams and events ----------------------------------------------------------------
    def stream(self, non_blocking=False):
        self._streams += 1
        return EmulatedStream(self, self._streams, non_blocking)

    def event(self):
        return EmulatedEvent(self)

    # -- modules and launches --------------------------------------------------------------
    def module_image(self, source_path):
        return build.host_library(source_path)

    def load_module(self, image):
        return EmulatedModule(image)

    def _launch(self, function, grid, block, args, stream):
        if function.signature[:1] == INT and args[0] <= 0:
            return                            # no index to run: its pointers are never read
        self._inject("kernel", function.name)
        for kind, value in zip(function.signature, args):
            if kind == POINTER and value:
                self.span(value, 1)           # a pointer into no allocation faults here
        function.handle(*args)
        self._check_guards(function.name)

    def _check_guards(self, name):
        with self._lock:
            buffers = list(self._buffers.items())
        for ptr, (buf, nbytes) in buffers:
            guard = buf[nbytes:]
            if not (guard == GUARD_BYTE).all():
                where = int(np.flatnonzero(guard != GUARD_BYTE)[0])
                guard[...] = GUARD_BYTE
                raise DriverError("kernel %s wrote past the end of the %d-byte allocation at "
                                  "0x%x (byte %d after it)" % (name, nbytes, ptr, where))

    def blas(self, stream=None):
        key = None if stream is None else stream.handle
        if key not in self._blas:
            from ..emulated_blas import EmulatedBlas
            self._blas[key] = EmulatedBlas(self, stream)
        return self._blas[key]


DRIVER = EmulatedDriver          # what choice.driver_class finds by this module's name
