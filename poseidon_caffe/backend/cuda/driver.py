"""The narrow driver interface: everything the CUDA backend asks of a device, in one class.

The rest of the backend talks to a device only through a ``Driver``: memory, copies, streams,
events, modules and launches, and a BLAS handle. Three implementations exist (choice.py says
which one opens):

- ``drivers/cuda_bindings.CudaBindingsDriver``: a real GPU through NVIDIA's cuda-bindings, with
  cuBLAS (``cublas.py``): the default;
- ``drivers/pycuda.PyCUDADriver``: a real GPU through pycuda, with the same cuBLAS binding;
- ``drivers/emulated.EmulatedDriver``: host buffers, the kernels built for the host, numpy for BLAS,
  so the backend's own code runs unchanged on a machine without a GPU.

Device memory is addressed by plain integers (device pointers), so pointer arithmetic (an
offset into a blob) is integer arithmetic and a pointer passes to a kernel or cuBLAS as is.
Every copy is counted in ``transfers`` (calls and bytes per direction), whichever driver runs,
and so is every wait of the host for the device (``host_syncs``).
"""
import threading
from dataclasses import dataclass, field

from ..ops import Transfers

INT32 = (-2 ** 31, 2 ** 31 - 1)
POINTER, INT, FLOAT = "P", "i", "f"       # kernel parameter types (pycuda's struct letters)


class DriverError(RuntimeError):
    """A device call that failed, or a driver that cannot start; one line saying why."""


@dataclass
class DeviceInfo:
    """What Caffe's device_query prints about a device, and the few figures a launch needs."""
    ordinal: int
    name: str
    compute_capability: tuple
    total_memory: int
    multiprocessors: int
    clock_khz: int
    shared_memory_per_block: int = 49152
    registers_per_block: int = 65536
    warp_size: int = 32
    memory_pitch: int = 2 ** 31 - 1
    max_threads_per_block: int = 1024
    max_block_dim: tuple = (1024, 1024, 64)
    max_grid_dim: tuple = (2 ** 31 - 1, 65535, 65535)
    total_constant_memory: int = 65536
    texture_alignment: int = 512
    concurrent_copy_and_execution: bool = True
    kernel_execution_timeout: bool = False
    emulated: bool = False

    def query_lines(self):
        """(label, value) pairs in the order and words of Caffe's device_query."""
        yes = lambda flag: "Yes" if flag else "No"
        return [
            ("Device id", self.ordinal),
            ("Major revision number", self.compute_capability[0]),
            ("Minor revision number", self.compute_capability[1]),
            ("Name", self.name),
            ("Total global memory", self.total_memory),
            ("Total shared memory per block", self.shared_memory_per_block),
            ("Total registers per block", self.registers_per_block),
            ("Warp size", self.warp_size),
            ("Maximum memory pitch", self.memory_pitch),
            ("Maximum threads per block", self.max_threads_per_block),
            ("Maximum dimension of block", ", ".join(map(str, self.max_block_dim))),
            ("Maximum dimension of grid", ", ".join(map(str, self.max_grid_dim))),
            ("Clock rate", self.clock_khz),
            ("Total constant memory", self.total_constant_memory),
            ("Texture alignment", self.texture_alignment),
            ("Concurrent copy and execution", yes(self.concurrent_copy_and_execution)),
            ("Number of multiprocessors", self.multiprocessors),
            ("Kernel execution timeout", yes(self.kernel_execution_timeout)),
        ]


@dataclass
class Function:
    """A kernel of a loaded module: its name, parameter types and the driver's handle."""
    name: str
    signature: str
    handle: object = field(repr=False, default=None)


def check_signature(signature):
    bad = set(signature) - {POINTER, INT, FLOAT}
    if bad:
        raise DriverError("kernel signature %r has unknown parameter types %s (expected "
                          "P, i, f)" % (signature, sorted(bad)))


class Driver:
    """One device, opened: the interface the CUDA backend uses. Subclasses implement the
    ``_``-prefixed methods; the public ones check arguments and count copies."""

    kind = None

    def __init__(self):
        self.transfers = Transfers()
        self._compute_thread = threading.get_ident()
        # a prefetch thread copies while the computation runs: the counts stay exact
        self._count_lock = threading.Lock()

    def _count(self, calls, nbytes, direction):
        with self._count_lock:
            t = self.transfers
            setattr(t, direction + "_calls", getattr(t, direction + "_calls") + calls)
            setattr(t, direction + "_bytes", getattr(t, direction + "_bytes") + nbytes)

    def transfers_now(self):
        """A copy of ``transfers`` taken whole while a prefetch thread may be counting."""
        with self._count_lock:
            return self.transfers.snapshot()

    def count_host_sync(self):
        """Note one wait of the host for the device (see Transfers.host_syncs)."""
        with self._count_lock:
            if threading.get_ident() == self._compute_thread:
                self.transfers.host_syncs += 1
            else:
                self.transfers.background_syncs += 1

    def make_current(self):
        """Make this device current on the calling thread (a prefetch thread's first call)."""

    def release_current(self):
        """Undo make_current on the calling thread; a thread that made the device current
        calls it before it ends (pycuda aborts the process otherwise)."""

    # -- the device ------------------------------------------------------------------------
    def library_lines(self):
        """(label, value) lines saying what drives this device (device_query prints them)."""
        return [("Driver", self.kind)]

    @property
    def info(self):
        """DeviceInfo of the opened device."""
        raise NotImplementedError

    def mem_info(self):
        """(free bytes, total bytes) of device memory."""
        raise NotImplementedError

    def synchronize(self):
        """Wait for everything queued on the device."""
        self.count_host_sync()
        self._synchronize()

    def close(self):
        """Release the device (its memory goes with it)."""

    # -- memory ----------------------------------------------------------------------------
    def alloc(self, nbytes):
        """A device pointer to ``nbytes`` of uninitialised memory (0 for 0 bytes)."""
        nbytes = int(nbytes)
        if nbytes < 0:
            raise DriverError("cannot allocate %d bytes" % nbytes)
        return self._alloc(nbytes) if nbytes else 0

    def free(self, ptr):
        if ptr:
            self._free(int(ptr))

    def pinned_empty(self, shape, dtype):
        """A numpy array in page-locked host memory (fast, asynchronous copies)."""
        raise NotImplementedError

    def memset(self, ptr, byte, nbytes, stream=None):
        """Set ``nbytes`` bytes at ``ptr`` to ``byte``."""
        if nbytes:
            self._memset(int(ptr), int(byte) & 0xFF, int(nbytes), stream)

    def memset32(self, ptr, word, count, stream=None):
        """Set ``count`` 32-bit words at ``ptr`` to ``word`` (a float's bits fill floats)."""
        if count:
            self._memset32(int(ptr), int(word) & 0xFFFFFFFF, int(count), stream)

    # -- copies (synchronous without a stream, queued on ``stream`` with one) ----------------
    def copy_htod(self, dst, src, stream=None):
        """Device ``dst`` <- the bytes of the C-contiguous numpy array ``src``."""
        _contiguous(src, "source")
        if src.nbytes:
            self._copy_htod(int(dst), src, stream)
        self._count(1, src.nbytes, "htod")

    def copy_dtoh(self, dst, src, stream=None):
        """The C-contiguous numpy array ``dst`` <- its size in bytes from device ``src``."""
        _contiguous(dst, "destination")
        if dst.nbytes:
            self._copy_dtoh(dst, int(src), stream)
        self._count(1, dst.nbytes, "dtoh")
        if stream is None:
            self.count_host_sync()            # the host waits for the copy, and what precedes it

    def copy_dtod(self, dst, src, nbytes, stream=None):
        if nbytes:
            self._copy_dtod(int(dst), int(src), int(nbytes), stream)
        self._count(1, int(nbytes), "dtod")

    # -- streams and events ----------------------------------------------------------------
    def stream(self, non_blocking=False):
        """A new stream: ``.synchronize()``, ``.handle`` (the CUstream, for cuBLAS). A
        ``non_blocking`` one does not wait for the default stream's work, nor it for its own
        (a prefetch thread's copies then overlap the computation)."""
        raise NotImplementedError

    def event(self):
        """A new event: ``.record(stream=None)``, ``.synchronize()``, ``.query()``,
        ``.elapsed_ms(start_event)`` (milliseconds from ``start_event`` to this one). Every
        ``synchronize()`` of a stream or an event is counted (``count_host_sync``)."""
        raise NotImplementedError

    # -- modules and launches --------------------------------------------------------------
    def module_image(self, source_path):
        """What ``load_module`` takes for one kernel source: PTX for this device's
        architecture, or the host build's library (both built through build.py, cached)."""
        raise NotImplementedError

    def load_module(self, image):
        """A loaded module: ``.function(name, signature)`` -> Function."""
        raise NotImplementedError

    def launch(self, function, grid, block, args, stream=None):
        """Run ``function`` on a ``grid`` of ``block`` threads (ints: one axis) with ``args``
        typed by its signature: pointers (ints; None is a null pointer), int32s and float32s
        (a Python float is rounded to float32, as numpy rounds a scalar)."""
        if len(args) != len(function.signature):
            raise DriverError("kernel %s takes %d arguments, got %d"
                              % (function.name, len(function.signature), len(args)))
        typed = []
        for i, (kind, value) in enumerate(zip(function.signature, args)):
            if kind == POINTER and value is None:
                value = 0                     # a null pointer: an optional output left out
            typed.append(int(value) if kind in (POINTER, INT) else float(value))
            if kind == INT and not INT32[0] <= typed[-1] <= INT32[1]:
                raise DriverError("kernel %s: argument %d is %d, beyond a 32-bit int"
                                  % (function.name, i, typed[-1]))
        grid, block = int(grid), int(block)
        info = self.info
        if not 1 <= block <= info.max_threads_per_block:
            raise DriverError("kernel %s: a block of %d threads (1..%d allowed)"
                              % (function.name, block, info.max_threads_per_block))
        if not 1 <= grid <= info.max_grid_dim[0]:
            raise DriverError("kernel %s: a grid of %d blocks (1..%d allowed)"
                              % (function.name, grid, info.max_grid_dim[0]))
        self._launch(function, grid, block, typed, stream)

    def blas(self, stream=None):
        """The BLAS handle bound to ``stream`` (one per device and stream): cuBLAS's calls
        (sgemm, sgemm_strided_batched, sgemv, saxpy, sscal, sdot, sasum, sgeam) with its
        column-major semantics."""
        raise NotImplementedError


def _contiguous(array, what):
    if not array.flags.c_contiguous:
        raise DriverError("the %s of a copy must be a C-contiguous array (got strides %s)"
                          % (what, array.strides))


def _contiguous(array, what):
    if not array.flags.c_contiguous:
        raise DriverError("the %s of a copy must be a C-contiguous array (got strides %s)"
                          % (what, array.strides))
