"""The test-wide switch of the device tests' driver: ``--gpu-driver=emulated|cuda-bindings|
pycuda|real`` (default emulated).

The device tests (the test_cuda_* files) open their device through emulated_device.py, which
reads the choice made here: the emulated device, NVIDIA's cuda-bindings, pycuda, or ``real``
(whichever POSEIDON_CAFFE_DRIVER's automatic choice picks: pycuda when importable, else
cuda-bindings). On a machine without a GPU the real drivers run over the project's stand-in
libcuda and libcublas (tests/standin, test_real_drivers.py). Two marks leave tests out on a
driver other than the emulated one:

- ``emulation_only``: what only the emulated device does (NaN-filled fresh memory, its own
  name and device count, its allocation alignment);
- ``faults_device``: tests that fault on purpose (a kernel through a wild pointer, a BLAS
  call over too small a buffer): the emulated device names the fault at the call, while a
  GPU (and the stand-in, like it) reports it at a later call and loses its context for every
  later test.
"""
import os

import pytest

DRIVERS = ("emulated", "cuda-bindings", "pycuda", "real")
TEST_DRIVER_ENV = "POSEIDON_CAFFE_TEST_DRIVER"     # what emulated_device.py reads


def pytest_addoption(parser):
    parser.addoption("--gpu-driver", choices=DRIVERS, default="emulated",
                     help="the driver of the device tests (default: emulated)")


def pytest_configure(config):
    config.addinivalue_line("markers", "emulation_only: checks what only the emulated "
                            "device does; left out on a real driver")
    config.addinivalue_line("markers", "faults_device: faults a device on purpose; left out "
                            "on a real driver")
    chosen = config.getoption("--gpu-driver")
    if chosen == "real":
        from poseidon_caffe.backend.cuda import choice
        chosen = choice.resolve("auto")
    os.environ[TEST_DRIVER_ENV] = chosen


def pytest_report_header(config):
    return "device tests on driver: %s" % os.environ.get(TEST_DRIVER_ENV, "emulated")


def pytest_collection_modifyitems(config, items):
    driver = os.environ.get(TEST_DRIVER_ENV, "emulated")
    if driver == "emulated":
        return
    for item in items:
        for mark in ("emulation_only", "faults_device"):
            if item.get_closest_marker(mark):
                item.add_marker(pytest.mark.skip(reason="%s: not run on driver %s"
                                                 % (mark, driver)))
