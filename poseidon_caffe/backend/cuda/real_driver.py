"""What the two real drivers (cuda-bindings, pycuda) share above the CUDA calls themselves:
the table of live allocations, the kernel images chosen for the device and the driver
(images.py), the cuBLAS handles (one per stream), and what device_query says of them.

A subclass sets ``driver_version`` and ``_info``, and implements ``_device_alloc(nbytes)``
(a pointer and whatever keeps the memory alive), ``_device_free(ptr, keeper)`` and the rest of
the Driver interface.
"""
import threading

from . import choice
from .driver import Driver, DriverError
from .images import module_image


class RealDriver(Driver):
    binding = None                      # "cuda-bindings 13.3": what library_lines names

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()
        self._allocations = {}          # pointer -> what keeps it alive (or None)
        self._blas = {}
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
        return choice.real_driver_lines(self, self.binding)

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
    def module_image(self, source_path):
        return module_image(source_path, self._info.compute_capability, self.driver_version)

    def blas(self, stream=None):
        key = None if stream is None else stream.handle
        if key not in self._blas:
            from .cublas import CublasHandle
            self._blas[key] = CublasHandle(stream, self)
        return self._blas[key]
