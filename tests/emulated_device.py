"""An emulated CUDA device for tests: the driver, the kernels built for the host, and helpers
that move numpy arrays in and out. Tests that use it skip when no C++ compiler is present."""
import shutil

import numpy as np
import pytest

from poseidon_caffe.backend.cuda import build
from poseidon_caffe.backend.cuda.emulated import EmulatedDriver
from poseidon_caffe.backend.cuda.kernels import KernelSet

needs_compiler = pytest.mark.skipif(build.host_compiler() is None or
                                    shutil.which(build.host_compiler()) is None,
                                    reason="no C++ compiler for the host build of the kernels")


class Device:
    """A driver, its kernels, and buffers made from numpy arrays (freed by close())."""

    def __init__(self):
        self.driver = EmulatedDriver()
        self.kernels = KernelSet(self.driver)
        self.blas = self.driver.blas()

    def put(self, array, dtype=np.float32):
        """A device copy of ``array`` (as ``dtype``); returns its pointer."""
        array = np.ascontiguousarray(array, dtype=dtype)
        ptr = self.driver.alloc(max(array.nbytes, 1))
        if array.nbytes:
            self.driver.copy_htod(ptr, array)
        return ptr

    def empty(self, shape, dtype=np.float32):
        """Uninitialised device memory for ``shape`` (NaN bytes on the emulated device)."""
        return self.driver.alloc(max(int(np.prod(shape)) * np.dtype(dtype).itemsize, 1))

    def get(self, ptr, shape, dtype=np.float32):
        out = np.empty(shape, dtype=dtype)
        if out.nbytes:
            self.driver.copy_dtoh(out, ptr)
        return out

    def close(self):
        for ptr in list(self.driver.allocations):
            self.driver.free(ptr)


@pytest.fixture
def device():
    d = Device()
    yield d
    d.close()
