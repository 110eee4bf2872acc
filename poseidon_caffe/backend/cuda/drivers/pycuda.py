"""The driver interface over pycuda: the only module of the backend that imports pycuda.

pycuda is imported on first use, so the package imports on machines without it; a missing
pycuda or CUDA driver is one DriverError line. The device's primary context is retained and
pushed on the thread that opens the driver (the context the CUDA runtime, and so cuBLAS, uses
too).

pycuda aborts the process (status 134, "the context stack was not empty") when a thread ends,
or the interpreter exits, with a context still pushed. So every push is paired with a pop.
The pushes are kept per thread for the module, not per driver: drivers of one device share
its primary context, so a driver closed (or dropped) while another still works on the same
thread must not pop it. A thread that made a device current (a prefetch thread, the
communication thread) calls ``release_current()`` before it ends; at exit the drivers still
open are closed (their memory freed while the context is current) and the main thread's
pushes popped; after that, frees of memory that went with the context are no-ops.
"""
import atexit
import threading
import weakref

import numpy as np

from .. import choice
from ..driver import FLOAT, INT, POINTER, DeviceInfo, DriverError, Function
from ..real_driver import RealDriver

_PYCUDA_FORMAT = {POINTER: "P", INT: "i", FLOAT: "f"}
_NON_BLOCKING = 1                     # CU_STREAM_NON_BLOCKING


_open = weakref.WeakSet()             # drivers to close at exit
_pushes = threading.local()           # .contexts: what this module pushed on this thread


def _pushed_here():
    if not hasattr(_pushes, "contexts"):
        _pushes.contexts = []
    return _pushes.contexts


def _pop_this_thread(cuda):
    """Pop every context this module pushed on the calling thread."""
    pushed = _pushed_here()
    while pushed:
        pushed.pop()
        cuda.Context.pop()


@atexit.register
def _close_at_exit():
    drivers = list(_open)
    for driver in drivers:
        driver.close()
    if drivers:
        _pop_this_thread(drivers[0].cuda)


def _pycuda_package():
    import pycuda
    return pycuda


def _pycuda():
    """pycuda.driver, initialised; DriverError (one line) when there is no GPU driver or no
    pycuda."""
    choice.require_nvidia_driver()
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        raise DriverError("%s=pycuda, but pycuda does not import (pip install "
                          "'poseidon-caffe[pycuda]'): %s" % (choice.DRIVER_ENV, exc)) from None
    try:
        cuda.init()
    except Exception as exc:                    # pycuda raises its own error classes
        raise DriverError("no usable CUDA driver: %s" % str(exc).strip().splitlines()[0]) \
            from None
    return cuda


class PyCUDAModule:
    def __init__(self, module):
        self.module = module

    def function(self, name, signature):
        try:
            fn = self.module.get_function(name)
        except Exception:
            raise DriverError("the module has no kernel %s" % name) from None
        fn.prepare("".join(_PYCUDA_FORMAT[kind] for kind in signature))
        return Function(name, signature, fn)


class PyCUDAEvent:
    def __init__(self, driver):
        self.driver = driver
        self.event = driver.cuda.Event()
        self.recorded = False

    def record(self, stream=None):
        self.event.record(None if stream is None else stream.stream)
        self.recorded = True

    def synchronize(self):
        self.driver.count_host_sync()
        self.event.synchronize()

    def query(self):
        return self.event.query()

    def elapsed_ms(self, start):
        if not (self.recorded and start.recorded):
            raise DriverError("elapsed time of an event that was not recorded")
        return start.event.time_till(self.event)


class PyCUDAStream:
    def __init__(self, driver, non_blocking=False):
        self.driver = driver
        cuda = driver.cuda
        # flags 1 is CU_STREAM_NON_BLOCKING: no implicit order with the legacy default stream
        self.stream = cuda.Stream(flags=_NON_BLOCKING if non_blocking else 0)
        self.handle = self.stream.handle

    def synchronize(self):
        self.driver.count_host_sync()
        self.stream.synchronize()


def _raw(stream):
    return None if stream is None else stream.stream


class PyCUDADriver(RealDriver):
    kind = "pycuda"

    @staticmethod
    def device_count():
        """Devices the driver sees; DriverError when there is no driver or no pycuda."""
        return _pycuda().Device.count()

    def __init__(self, device=0):
        super().__init__()
        cuda = self.cuda = _pycuda()
        self.driver_version = cuda.get_driver_version()
        count = cuda.Device.count()
        if count == 0:
            raise DriverError(choice.no_device(self.driver_version))
        if not 0 <= int(device) < count:
            raise DriverError("CUDA device %d does not exist (%d found)" % (device, count))
        self.device = cuda.Device(int(device))
        self.context = self.device.retain_primary_context()
        self.binding = "pycuda %s" % getattr(_pycuda_package(), "VERSION_TEXT", "?")
        self.make_current()
        _open.add(self)
        self._info = self._read_info(int(device))

    def _read_info(self, ordinal):
        a = self.cuda.device_attribute
        get = self.device.get_attribute
        return DeviceInfo(
            ordinal=ordinal, name=self.device.name(),
            compute_capability=self.device.compute_capability(),
            total_memory=self.device.total_memory(),
            multiprocessors=get(a.MULTIPROCESSOR_COUNT), clock_khz=get(a.CLOCK_RATE),
            shared_memory_per_block=get(a.MAX_SHARED_MEMORY_PER_BLOCK),
            registers_per_block=get(a.MAX_REGISTERS_PER_BLOCK), warp_size=get(a.WARP_SIZE),
            memory_pitch=get(a.MAX_PITCH), max_threads_per_block=get(a.MAX_THREADS_PER_BLOCK),
            max_block_dim=(get(a.MAX_BLOCK_DIM_X), get(a.MAX_BLOCK_DIM_Y),
                           get(a.MAX_BLOCK_DIM_Z)),
            max_grid_dim=(get(a.MAX_GRID_DIM_X), get(a.MAX_GRID_DIM_Y), get(a.MAX_GRID_DIM_Z)),
            total_constant_memory=get(a.TOTAL_CONSTANT_MEMORY),
            texture_alignment=get(a.TEXTURE_ALIGNMENT),
            concurrent_copy_and_execution=bool(get(a.GPU_OVERLAP)),
            kernel_execution_timeout=bool(get(a.KERNEL_EXEC_TIMEOUT)))

    def mem_info(self):
        return self.cuda.mem_get_info()

    def _synchronize(self):
        self.cuda.Context.synchronize()

    def make_current(self):
        current = self.cuda.Context.get_current()
        if current is None or current.handle != self.context.handle:
            self.context.push()
            _pushed_here().append(self.context)

    def release_current(self):
        """Pop what was pushed on the calling thread (before the thread ends)."""
        _pop_this_thread(self.cuda)

    def close(self):
        """Free what is still allocated and drop the BLAS handles; the context stays pushed
        for the other drivers of the thread (popped when the thread releases it, or at
        exit)."""
        if self.context is None:
            return
        _open.discard(self)
        self._release_all()
        self.context = None

    # -- memory ----------------------------------------------------------------------------
    def _device_alloc(self, nbytes):
        try:
            allocation = self.cuda.mem_alloc(nbytes)
        except self.cuda.MemoryError as exc:
            free, total = self.mem_info()
            raise DriverError("out of device memory: %d bytes asked, %d of %d free (%s)"
                              % (nbytes, free, total, exc)) from None
        return int(allocation), allocation        # pycuda frees with the object: keep it

    def _device_free(self, ptr, allocation):
        allocation.free()

    def pinned_empty(self, shape, dtype):
        return self.cuda.pagelocked_empty(shape, dtype)

    def _memset(self, ptr, byte, nbytes, stream):
        if stream is None:
            self.cuda.memset_d8(ptr, byte, nbytes)
        else:
            self.cuda.memset_d8_async(ptr, byte, nbytes, _raw(stream))

    def _memset32(self, ptr, word, count, stream):
        if stream is None:
            self.cuda.memset_d32(ptr, word, count)
        else:
            self.cuda.memset_d32_async(ptr, word, count, _raw(stream))

    def _copy_htod(self, dst, src, stream):
        if stream is None:
            self.cuda.memcpy_htod(dst, src)
        else:
            self.cuda.memcpy_htod_async(dst, src, _raw(stream))

    def _copy_dtoh(self, dst, src, stream):
        if stream is None:
            self.cuda.memcpy_dtoh(dst, src)
        else:
            self.cuda.memcpy_dtoh_async(dst, src, _raw(stream))

    def _copy_dtod(self, dst, src, nbytes, stream):
        if stream is None:
            self.cuda.memcpy_dtod(dst, src, nbytes)
        else:
            self.cuda.memcpy_dtod_async(dst, src, nbytes, _raw(stream))

    # -- streams and events ----------------------------------------------------------------
    def stream(self, non_blocking=False):
        return PyCUDAStream(self, non_blocking)

    def event(self):
        return PyCUDAEvent(self)

    # -- modules and launches --------------------------------------------------------------
    def load_module(self, image):
        try:
            return PyCUDAModule(self.cuda.module_from_buffer(image))
        except Exception as exc:
            raise DriverError("the device cannot load the kernel module: %s"
                              % str(exc).strip().splitlines()[0]) from None

    def _launch(self, function, grid, block, args, stream):
        args = [np.uintp(v) if kind == POINTER else np.int32(v) if kind == INT
                else np.float32(v) for kind, v in zip(function.signature, args)]
        if stream is None:
            function.handle.prepared_call((grid, 1), (block, 1, 1), *args)
        else:
            function.handle.prepared_async_call((grid, 1), (block, 1, 1), stream.stream, *args)


DRIVER = PyCUDADriver          # what choice.driver_class finds by this module's name
