"""The driver interface over NVIDIA's ``cuda-bindings`` (``cuda.bindings.driver``): the default
real driver, and the only module of the backend that imports it.

cuda-bindings installs as a prebuilt wheel for every Python (no compiler, no toolkit) and loads
the machine's libcuda.so.1 on first use. Each call returns ``(CUresult, values...)``; a failure
becomes one DriverError line naming the call. The device's primary context (the one the CUDA
runtime, and so cuBLAS, uses) is made current with cuCtxSetCurrent: there is no context stack
to unwind, so no thread and no process has anything to pop when it ends.

The wheel's major version must not be newer than the CUDA the driver supports (cuda-bindings
13 asks a CUDA 12 driver for entry points it lacks); that is refused in one line saying which
to install.
"""
import ctypes
import weakref

import numpy as np

from .. import choice
from ..driver import FLOAT, INT, POINTER, DeviceInfo, DriverError, Function
from ..real_driver import RealDriver

_CTYPES = {POINTER: ctypes.c_void_p, INT: ctypes.c_int, FLOAT: ctypes.c_float}


def binding_version():
    """(major, minor) of the installed cuda-bindings, or None when it is not installed."""
    try:
        from cuda import bindings
    except ImportError:
        return None
    parts = str(getattr(bindings, "__version__", "0.0")).split(".")
    return int(parts[0]), int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def _cuda():
    """cuda.bindings.driver, initialised; DriverError (one line) when there is no GPU driver,
    no binding, or a binding newer than the driver."""
    choice.require_nvidia_driver()
    try:
        from cuda.bindings import driver as cu
    except ImportError as exc:
        raise DriverError("the NVIDIA driver is here but its Python binding is not: pip install "
                          "'poseidon-caffe[gpu]' (NVIDIA's cuda-bindings; %s)" % exc) from None
    try:
        err, = cu.cuInit(0)
    except Exception as exc:                     # noqa: BLE001 (the loader's own errors)
        raise DriverError("no usable CUDA driver: %s" % str(exc).strip().splitlines()[0]) \
            from None
    if err == cu.CUresult.CUDA_ERROR_NO_DEVICE:
        raise DriverError(choice.no_device(_driver_version(cu)))
    if err != cu.CUresult.CUDA_SUCCESS:
        raise DriverError("no usable CUDA driver: cuInit failed: %s" % _name(cu, err))
    ours, driver = binding_version(), _driver_version(cu)
    if ours and ours[0] > driver // 1000:
        raise DriverError("cuda-bindings %d.%d needs a driver for CUDA %d, and this one supports "
                          "CUDA %s: pip install 'cuda-bindings>=%d,<%d' (or update the NVIDIA "
                          "driver)" % (ours[0], ours[1], ours[0], choice.version_text(driver),
                                       driver // 1000, driver // 1000 + 1))
    return cu


def _driver_version(cu):
    err, version = cu.cuDriverGetVersion()
    return int(version) if err == cu.CUresult.CUDA_SUCCESS else 0


def _name(cu, err):
    e, text = cu.cuGetErrorName(err)
    return text.decode() if e == cu.CUresult.CUDA_SUCCESS and text else "CUresult %d" % int(err)


def _raw(stream):
    return 0 if stream is None else stream.stream


class BindingsModule:
    def __init__(self, driver, module):
        self.driver, self.module = driver, module

    def function(self, name, signature):
        err, fn = self.driver.cu.cuModuleGetFunction(self.module, name.encode())
        if err != self.driver.cu.CUresult.CUDA_SUCCESS:
            raise DriverError("the module has no kernel %s" % name)
        return Function(name, signature, (fn, tuple(_CTYPES[k] for k in signature)))


class BindingsEvent:
    def __init__(self, driver):
        self.driver = driver
        self.event = driver.call("cuEventCreate", 0)
        self.recorded = False

    def record(self, stream=None):
        self.driver.call("cuEventRecord", self.event, _raw(stream))
        self.recorded = True

    def synchronize(self):
        self.driver.count_host_sync()
        self.driver.call("cuEventSynchronize", self.event)

    def query(self):
        cu = self.driver.cu
        err, = cu.cuEventQuery(self.event)
        if err == cu.CUresult.CUDA_ERROR_NOT_READY:
            return False
        if err != cu.CUresult.CUDA_SUCCESS:
            raise DriverError("cuEventQuery failed: %s" % _name(cu, err))
        return True

    def elapsed_ms(self, start):
        if not (self.recorded and start.recorded):
            raise DriverError("elapsed time of an event that was not recorded")
        return float(self.driver.call("cuEventElapsedTime", start.event, self.event))


class BindingsStream:
    def __init__(self, driver, non_blocking=False):
        self.driver = driver
        flags = driver.cu.CUstream_flags
        self.stream = driver.call("cuStreamCreate", flags.CU_STREAM_NON_BLOCKING if non_blocking
                                  else flags.CU_STREAM_DEFAULT)
        self.handle = int(self.stream)

    def synchronize(self):
        self.driver.count_host_sync()
        self.driver.call("cuStreamSynchronize", self.stream)


class CudaBindingsDriver(RealDriver):
    kind = "cuda-bindings"

    @staticmethod
    def device_count():
        """Devices the driver sees; DriverError when there is no driver or binding."""
        cu = _cuda()
        err, count = cu.cuDeviceGetCount()
        return int(count) if err == cu.CUresult.CUDA_SUCCESS else 0

    def __init__(self, device=0):
        super().__init__()
        cu = self.cu = _cuda()
        self.driver_version = _driver_version(cu)
        count = self.call("cuDeviceGetCount")
        if count == 0:
            raise DriverError(choice.no_device(self.driver_version))
        if not 0 <= int(device) < count:
            raise DriverError("CUDA device %d does not exist (%d found)" % (device, count))
        self.device = self.call("cuDeviceGet", int(device))
        self.context = self.call("cuDevicePrimaryCtxRetain", self.device)
        self.make_current()
        self.binding = "cuda-bindings %d.%d" % binding_version()
        self._info = self._read_info(int(device))

    def call(self, name, *args):
        """cu.NAME(*args), its values without the status; DriverError naming NAME on failure."""
        result = getattr(self.cu, name)(*args)
        err, values = result[0], result[1:]
        if err != self.cu.CUresult.CUDA_SUCCESS:
            raise DriverError("%s failed: %s" % (name, _name(self.cu, err)))
        return values[0] if len(values) == 1 else values or None

    def _read_info(self, ordinal):
        attribute = self.cu.CUdevice_attribute

        def get(name):
            return int(self.call("cuDeviceGetAttribute",
                                 getattr(attribute, "CU_DEVICE_ATTRIBUTE_" + name), self.device))
        name = self.call("cuDeviceGetName", 256, self.device)
        return DeviceInfo(
            ordinal=ordinal, name=bytes(name).split(b"\0", 1)[0].decode(errors="replace"),
            compute_capability=(get("COMPUTE_CAPABILITY_MAJOR"), get("COMPUTE_CAPABILITY_MINOR")),
            total_memory=int(self.call("cuDeviceTotalMem", self.device)),
            multiprocessors=get("MULTIPROCESSOR_COUNT"), clock_khz=get("CLOCK_RATE"),
            shared_memory_per_block=get("MAX_SHARED_MEMORY_PER_BLOCK"),
            registers_per_block=get("MAX_REGISTERS_PER_BLOCK"), warp_size=get("WARP_SIZE"),
            memory_pitch=get("MAX_PITCH"), max_threads_per_block=get("MAX_THREADS_PER_BLOCK"),
            max_block_dim=(get("MAX_BLOCK_DIM_X"), get("MAX_BLOCK_DIM_Y"), get("MAX_BLOCK_DIM_Z")),
            max_grid_dim=(get("MAX_GRID_DIM_X"), get("MAX_GRID_DIM_Y"), get("MAX_GRID_DIM_Z")),
            total_constant_memory=get("TOTAL_CONSTANT_MEMORY"),
            texture_alignment=get("TEXTURE_ALIGNMENT"),
            concurrent_copy_and_execution=bool(get("GPU_OVERLAP")),
            kernel_execution_timeout=bool(get("KERNEL_EXEC_TIMEOUT")))

    def mem_info(self):
        free, total = self.call("cuMemGetInfo")
        return int(free), int(total)

    def _synchronize(self):
        self.call("cuCtxSynchronize")

    def make_current(self):
        self.call("cuCtxSetCurrent", self.context)

    def release_current(self):
        """Nothing to undo: cuCtxSetCurrent keeps no stack that a thread's end would find."""

    def close(self):
        if self.context is None:
            return
        self._release_all()
        self.cu.cuDevicePrimaryCtxRelease(self.device)
        self.context = None

    # -- memory ----------------------------------------------------------------------------
    def _device_alloc(self, nbytes):
        err, ptr = self.cu.cuMemAlloc(nbytes)
        if err == self.cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            free, total = self.mem_info()
            raise DriverError("out of device memory: %d bytes asked, %d of %d free"
                              % (nbytes, free, total))
        if err != self.cu.CUresult.CUDA_SUCCESS:
            raise DriverError("cuMemAlloc failed: %s" % _name(self.cu, err))
        return int(ptr), None

    def _device_free(self, ptr, keeper):
        self.call("cuMemFree", ptr)

    def pinned_empty(self, shape, dtype):
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = max(1, count * dtype.itemsize)
        ptr = int(self.call("cuMemHostAlloc", nbytes, 0))
        buffer = (ctypes.c_byte * nbytes).from_address(ptr)
        weakref.finalize(buffer, self.cu.cuMemFreeHost, ptr)
        return np.frombuffer(buffer, np.uint8)[:count * dtype.itemsize].view(dtype).reshape(shape)

    def _memset(self, ptr, byte, nbytes, stream):
        if stream is None:
            self.call("cuMemsetD8", ptr, byte, nbytes)
        else:
            self.call("cuMemsetD8Async", ptr, byte, nbytes, _raw(stream))

    def _memset32(self, ptr, word, count, stream):
        if stream is None:
            self.call("cuMemsetD32", ptr, word, count)
        else:
            self.call("cuMemsetD32Async", ptr, word, count, _raw(stream))

    def _copy_htod(self, dst, src, stream):
        if stream is None:
            self.call("cuMemcpyHtoD", dst, src.ctypes.data, src.nbytes)
        else:
            self.call("cuMemcpyHtoDAsync", dst, src.ctypes.data, src.nbytes, _raw(stream))

    def _copy_dtoh(self, dst, src, stream):
        if stream is None:
            self.call("cuMemcpyDtoH", dst.ctypes.data, src, dst.nbytes)
        else:
            self.call("cuMemcpyDtoHAsync", dst.ctypes.data, src, dst.nbytes, _raw(stream))

    def _copy_dtod(self, dst, src, nbytes, stream):
        if stream is None:
            self.call("cuMemcpyDtoD", dst, src, nbytes)
        else:
            self.call("cuMemcpyDtoDAsync", dst, src, nbytes, _raw(stream))

    # -- streams and events ----------------------------------------------------------------
    def stream(self, non_blocking=False):
        return BindingsStream(self, non_blocking)

    def event(self):
        return BindingsEvent(self)

    # -- modules and launches --------------------------------------------------------------
    def load_module(self, image):
        # PTX is text the driver reads up to its NUL; a CUBIN is read by its ELF headers
        data = bytes(image) if image[:4] == b"\x7fELF" else bytes(image) + b"\0"
        err, module = self.cu.cuModuleLoadData(data)
        if err != self.cu.CUresult.CUDA_SUCCESS:
            raise DriverError("the device cannot load the kernel module: %s"
                              % _name(self.cu, err))
        return BindingsModule(self, module)

    def _launch(self, function, grid, block, args, stream):
        fn, types = function.handle
        self.call("cuLaunchKernel", fn, grid, 1, 1, block, 1, 1, 0, _raw(stream),
                  (tuple(args), types), 0)


DRIVER = CudaBindingsDriver          # what choice.driver_class finds by this module's name
