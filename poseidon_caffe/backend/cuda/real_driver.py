"""What the two real drivers (cuda-bindings, pycuda) share above the CUDA calls themselves:
the table of live allocations, the kernel images chosen for the device and the driver
(images.py), the cuBLAS handles (one per stream), and what device_query says of them.

A subclass sets ``driver_version`` and ``_info``, and implements ``_device_alloc(nbytes)``
(a pointer and whatever keeps the memory alive), ``_device_free(ptr, keeper)`` and the rest of
the Driver interface.
"""
import threading

from . import build, choice
from .driver import Driver, DriverError
from .images import describe_plan, device_plan


class RealDriver(Driver):
    binding = None                      # "cuda-bindings 13.3": what library_lines names

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()
        self._allocations = {}          # pointer -> what keeps it alive (or None)
        self._blas = {}
        self._plan = None               # (NVRTC, arch, cubin): the same for every source
        self.context = None

    @property
    def info(self):
        return self._info

    @property
    def allocations(self):
        """The live allocations' pointers (as a dict's keys, as the emulated driver gives)."""
        with self._lock:
            return dict.fromkeys(self._allocations)

    def library_lines(self):
        """device_query's lines: the binding and CUDA driver, the NVRTC and target the
        kernels are built with, the cuBLAS library (a part that fails says so instead)."""
        lines = [("Driver", "%s, NVIDIA driver for CUDA %s"
                  % (self.binding, choice.version_text(self.driver_version)))]
        try:
            lines.append(("Kernels", describe_plan(self.image_plan())))
        except DriverError as exc:
            lines.append(("Kernels", "cannot be built: %s" % exc))
        try:
            blas = self.blas()
            lines.append(("cuBLAS", "%s (version %d)" % (blas.lib._name, blas.version())))
        except DriverError as exc:
            lines.append(("cuBLAS", "not available: %s" % exc))
        return lines

    # -- memory ----------------------------------------------------------------------------
    def _alloc(self, nbytes):
        ptr, keeper = self._device_alloc(nbytes)
        with self._lock:
            self._allocations[ptr] = keeper
        return ptr

    def _free(self, ptr):
        if self.context is None:        # closed: the memory went with it (a late finaliser)
            return
        with self._lock:
            if ptr not in self._allocations:
                raise DriverError("free of 0x%x, which is not an allocation's start" % ptr)
            keeper = self._allocations.pop(ptr)
        self._device_free(ptr, keeper)

    def _release_all(self):
        """Drop the BLAS handles and free every live allocation (closing the driver)."""
        for handle in self._blas.values():
            handle.close()
        self._blas.clear()
        with self._lock:
            allocations, self._allocations = self._allocations, {}
        for ptr, keeper in allocations.items():
            self._device_free(ptr, keeper)

    # -- kernels and BLAS ------------------------------------------------------------------
    def image_plan(self):
        """images.device_plan for this device and driver, worked out on first use."""
        if self._plan is None:
            self._plan = device_plan(self._info.compute_capability, self.driver_version)
        return self._plan

    def module_image(self, source_path):
        compiler, arch, cubin = self.image_plan()
        try:
            return build.image(source_path, arch, cubin, compiler)
        except build.BuildError as exc:
            raise DriverError(str(exc)) from None

    def blas(self, stream=None):
        key = None if stream is None else stream.handle
        if key not in self._blas:
            from .cublas import CublasHandle
            self._blas[key] = CublasHandle(stream, self)
        return self._blas[key]
