"""The device of the device tests: the emulated CUDA device (the kernels built for the host),
or the real driver that conftest.py's --gpu-driver names; helpers that move numpy arrays in
and out. Tests that use it skip when no C++ compiler is present."""
import os
import shutil

import numpy as np
import pytest

from poseidon_caffe import backend
from poseidon_caffe.backend.cuda import build, choice
from poseidon_caffe.backend.cuda.choice import open_driver
from poseidon_caffe.backend.cuda.launch import KernelSet

needs_compiler = pytest.mark.skipif(build.host_compiler() is None or
                                    shutil.which(build.host_compiler()) is None,
                                    reason="no C++ compiler for the host build of the kernels")


def driver_under_test():
    """The driver the device tests run on (conftest.py's --gpu-driver; default emulated)."""
    return os.environ.get("POSEIDON_CAFFE_TEST_DRIVER", "emulated")


def on_emulated():
    return driver_under_test() == "emulated"


def use_test_driver(monkeypatch):
    """Point set_mode_gpu() at the test driver for one test."""
    monkeypatch.delenv(choice.LEGACY_ENV, raising=False)
    monkeypatch.setenv(choice.DRIVER_ENV, driver_under_test())


def rounds_like_numpy(driver):
    """Whether ``driver`` runs the host build of the kernels (one rounding per operation,
    as numpy rounds): the emulated device and the stand-in libcuda do; a GPU fuses multiply-
    adds, so its results may differ from numpy's in the last bits."""
    return driver.info.emulated or "stand-in" in driver.info.name.lower()


def assert_kernel_equal(driver, actual, desired):
    """Equal bits where the kernels round as numpy does; else within 4 units in the last
    place (a fused multiply-add rounds once where numpy rounds twice)."""
    if rounds_like_numpy(driver):
        np.testing.assert_array_equal(actual, desired)
    else:
        np.testing.assert_array_max_ulp(actual, desired, maxulp=4)


@pytest.fixture
def gpu_mode(monkeypatch):
    """The process's backend on the test driver's device for one test, back to the CPU
    after."""
    use_test_driver(monkeypatch)
    backend.set_mode_gpu()
    yield backend.get_backend()
    backend.set_mode_cpu()


class Device:
    """A driver, its kernel launcher, and buffers made from numpy arrays (freed by close())."""

    def __init__(self):
        self.driver = open_driver(driver_under_test())
        self.launcher = KernelSet(self.driver)
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
        """Free every allocation and release the device."""
        for ptr in list(getattr(self.driver, "allocations", ())):
            self.driver.free(ptr)
        self.driver.close()


@pytest.fixture
def device():
    d = Device()
    yield d
    d.close()
