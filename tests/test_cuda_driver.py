"""The driver interface on the test driver's device (emulated unless --gpu-driver says
otherwise): memory, copies (counted), memsets, streams, events, launches and the faults a real
device would raise; the real drivers' and cuBLAS's one-line errors where they are missing;
SyncedMemory's head states and copy counts."""
import importlib.util
import struct

import numpy as np
import pytest

from emulated_device import device, needs_compiler, on_emulated, driver_under_test  # noqa: F401
from poseidon_caffe.backend.cuda import choice, cublas, kernels
from poseidon_caffe.backend.cuda.drivers import emulated
from poseidon_caffe.backend.cuda.choice import open_driver
from poseidon_caffe.backend.cuda.driver import DriverError
from poseidon_caffe.backend.cuda.launch import Kernel
from poseidon_caffe.backend.cuda.synced import (HEAD_AT_CPU, HEAD_AT_GPU, SYNCED,
                                                UNINITIALIZED, SyncedMemory)


@pytest.fixture
def dev():
    d = open_driver(driver_under_test())
    yield d
    d.close()


def test_device_info_says_which_device_it_is(dev):
    info = dev.info
    assert info.emulated == on_emulated() and ("Emulated" in info.name) == on_emulated()
    assert info.ordinal == 0 and info.multiprocessors > 0 and info.compute_capability >= (3, 0)
    labels = [label for label, _ in info.query_lines()]
    assert labels[:4] == ["Device id", "Major revision number", "Minor revision number", "Name"]
    assert "Number of multiprocessors" in labels and "Total global memory" in labels
    assert dict(info.query_lines())["Total global memory"] == dev.mem_info()[1]
    assert choice.device_count(driver_under_test()) >= 1
    driver_line = dict(dev.library_lines())["Driver"]
    assert ("test device" in driver_line) == on_emulated()


def test_a_real_device_that_does_not_exist_is_refused():
    count = choice.device_count(driver_under_test())
    with pytest.raises(DriverError, match="device %d does not exist" % count):
        open_driver(driver_under_test(), count)


@pytest.mark.emulation_only
def test_a_device_that_does_not_exist_is_refused(monkeypatch):
    with pytest.raises(DriverError, match="emulated device 1 does not exist"):
        open_driver("emulated", 1)
    monkeypatch.setenv(emulated.DEVICES_ENV, "2")
    assert open_driver("emulated", 1).info.ordinal == 1
    with pytest.raises(DriverError, match="unknown driver"):
        open_driver("opencl")


def test_alloc_copy_round_trip_and_transfer_counts(dev):
    a = np.arange(10, dtype=np.float32)
    ptr = dev.alloc(a.nbytes)
    assert ptr % emulated.ALIGNMENT == 0                  # cudaMalloc's alignment, or more
    dev.copy_htod(ptr, a)
    other = dev.alloc(a.nbytes)
    dev.copy_dtod(other, ptr, a.nbytes)
    out = np.empty_like(a)
    dev.copy_dtoh(out, other)
    np.testing.assert_array_equal(out, a)
    t = dev.transfers
    assert (t.htod_calls, t.htod_bytes, t.dtoh_calls, t.dtoh_bytes, t.dtod_calls,
            t.dtod_bytes) == (1, 40, 1, 40, 1, 40)
    before = t.snapshot()
    dev.copy_htod(ptr + 8, a[:3])                     # into the middle of an allocation
    dev.copy_dtoh(out, ptr)
    np.testing.assert_array_equal(out[2:5], [0, 1, 2])
    delta = dev.transfers.since(before)
    assert (delta.htod_calls, delta.htod_bytes, delta.dtoh_bytes) == (1, 12, 40)
    assert ptr in dev.allocations and other in dev.allocations
    dev.free(ptr)
    dev.free(other)
    assert dev.allocations == {}
    if on_emulated():                                     # a GPU's own contexts hold memory
        assert dev.mem_info()[0] == dev.mem_info()[1]


@pytest.mark.emulation_only
def test_fresh_memory_holds_nan(dev):
    ptr = dev.alloc(16)
    out = np.empty(4, np.float32)
    dev.copy_dtoh(out, ptr)
    assert np.isnan(out).all()                          # never-written memory shows


def test_memsets_fill_bytes_and_words(dev):
    ptr = dev.alloc(16)
    out = np.empty(4, np.float32)
    dev.memset(ptr, 0, 16)
    dev.copy_dtoh(out, ptr)
    assert (out == 0).all()
    word = struct.unpack("<I", struct.pack("<f", 1.5))[0]
    dev.memset32(ptr + 4, word, 2)
    dev.copy_dtoh(out, ptr)
    np.testing.assert_array_equal(out, [0, 1.5, 1.5, 0])
    dev.free(ptr)


@pytest.mark.faults_device
def test_the_faults_a_device_would_raise(dev):
    ptr = dev.alloc(16)
    with pytest.raises(DriverError, match="illegal address"):
        dev.copy_htod(ptr + 8, np.zeros(4, np.float32))        # 16 bytes from byte 8
    with pytest.raises(DriverError, match="illegal address"):
        dev.copy_dtoh(np.zeros(2, np.float32), 12345)
    with pytest.raises(DriverError, match="not an allocation's start"):
        dev.free(ptr + 4)
    with pytest.raises(DriverError, match="C-contiguous"):
        dev.copy_htod(ptr, np.zeros((4, 2), np.float32)[:, 0])
    with pytest.raises(DriverError, match="out of memory"):
        dev.alloc(dev.mem_info()[1] + 1)
    assert dev.alloc(0) == 0
    dev.free(0)


def test_async_copies_streams_and_events(dev):
    stream = dev.stream()
    pinned = dev.pinned_empty((6,), np.float32)
    pinned[...] = np.arange(6)
    ptr = dev.alloc(pinned.nbytes)
    start, end = dev.event(), dev.event()
    assert start.query()                       # never recorded: nothing to wait for (CUDA's)
    start.record(stream)
    dev.copy_htod(ptr, pinned, stream)
    dev.memset(ptr, 0, 4, stream)
    back = dev.pinned_empty((6,), np.float32)
    dev.copy_dtoh(back, ptr, stream)
    end.record(stream)
    stream.synchronize()
    end.synchronize()
    np.testing.assert_array_equal(back, [0, 1, 2, 3, 4, 5])
    assert end.query() and end.elapsed_ms(start) >= 0
    with pytest.raises(DriverError, match="not recorded"):
        dev.event().elapsed_ms(start)
    assert dev.stream().handle != stream.handle


@needs_compiler
@pytest.mark.faults_device
def test_launch_catches_wild_pointers_and_overruns(device):
    k = device.launcher
    y = device.put(np.zeros(4))
    with pytest.raises(DriverError, match="illegal address"):
        k.run(kernels.math.vec_set, 4, 99, 1.0)  # a pointer into no allocation
    with pytest.raises(DriverError, match="wrote past the end of the 16-byte allocation"):
        k.run(kernels.math.vec_set, 5, y, 1.0)
    end = y + 16                                         # one past the end, as a zero-length view
    k.run(kernels.math.vec_set, 0, end, 1.0)  # has: nothing runs, nothing faults
    top, mask = device.empty(1), device.empty(1, np.int32)
    k.run(kernels.pooling.max_pool_forward, 1, device.put([[3.0]]), 1, 1, 1, 1, 1, 1, 1, 1, 0, 0,
          top, mask, None)
    assert device.get(mask, 1, np.int32)[0] == 0       # None: no float mask asked for
    # a kernel object that its source no longer declares (a stale kernels/<module>.py)
    with pytest.raises(DriverError, match=r"math.no_such_kernel\(iP\) is not in the sources"):
        k.run(Kernel("math", "no_such_kernel", "iP"), 1, y)
    with pytest.raises(DriverError, match=r"kernels/math.cu declares iPf"):
        k.run(Kernel("math", "vec_set", "iPP"), 1, y, y)


def test_grid_sizes_cover_the_count_within_the_device_limits(dev):
    from poseidon_caffe.backend.cuda.launch import BLOCK, grid_for
    info = dev.info
    assert grid_for(0, info) == 1 and grid_for(1, info) == 1
    assert grid_for(BLOCK + 1, info) == 2
    cap = grid_for(10 ** 9, info)
    assert cap == 32 * info.multiprocessors                # the grid-stride loop does the rest


@needs_compiler
def test_launch_refuses_what_no_driver_can_pass(device):
    d, k = device.driver, device.launcher
    y = device.put(np.zeros(4))
    k.run(kernels.math.vec_set, 4, y, 2.5)
    np.testing.assert_array_equal(device.get(y, 4), 2.5)
    fn = k.function(kernels.math.vec_set)
    assert fn.signature == "iPf"
    with pytest.raises(DriverError, match="takes 3 arguments"):
        d.launch(fn, 1, 32, [4, y])
    with pytest.raises(DriverError, match="block of 2048"):
        d.launch(fn, 1, 2048, [4, y, 1.0])
    with pytest.raises(DriverError, match="beyond a 32-bit int"):
        d.launch(fn, 1, 32, [2 ** 31, y, 1.0])
    with pytest.raises(DriverError, match="not in the sources"):
        k.function(Kernel("math", "no_such_kernel", "iPf"))


def test_a_machine_without_an_nvidia_driver_is_told_so_in_one_line(monkeypatch):
    monkeypatch.setattr(choice, "LIBCUDA", "libcuda-that-is-not-here.so.1")
    for kind in choice.REAL:
        with pytest.raises(DriverError) as info:
            open_driver(kind)
        message = str(info.value)
        assert message.startswith("no GPU here: no NVIDIA driver found") and "\n" not in message
        assert "CPU" in message and "emulated" in message and "pycuda" not in message
        with pytest.raises(DriverError, match="no GPU here"):
            choice.device_count(kind)


def test_the_driver_choice_follows_the_environment(monkeypatch):
    monkeypatch.delenv(choice.DRIVER_ENV, raising=False)
    monkeypatch.delenv(choice.LEGACY_ENV, raising=False)
    auto = "pycuda" if importlib.util.find_spec("pycuda") else "cuda-bindings"
    assert choice.driver_kind() == auto
    monkeypatch.setenv(choice.LEGACY_ENV, "emulated")
    assert choice.driver_kind() == "emulated"
    for value, kind in (("pycuda", "pycuda"), ("cuda-bindings", "cuda-bindings"),
                        ("emulated", "emulated"), ("auto", "emulated")):
        monkeypatch.setenv(choice.DRIVER_ENV, value)
        assert choice.driver_kind() == kind
    monkeypatch.setenv(choice.DRIVER_ENV, "opencl")
    with pytest.raises(choice.ChoiceError, match="POSEIDON_CAFFE_DRIVER='opencl': expected"):
        choice.driver_kind()
    assert isinstance(choice.driver_class("emulated")(0), emulated.EmulatedDriver)


def test_cublas_binding_without_a_library_names_where_it_looked(monkeypatch, tmp_path):
    monkeypatch.setenv("POSEIDON_CAFFE_CUBLAS", str(tmp_path / "libcublas.so.12"))
    monkeypatch.setattr(cublas, "_library", [])
    try:
        lib = cublas.load_library(12)
    except DriverError as exc:
        assert "cuBLAS is not available" in str(exc) and "libcublas.so.12" in str(exc)
        assert "nvidia-cublas-cu12" in str(exc) and "POSEIDON_CAFFE_CUBLAS" in str(exc)
    else:                                   # a real cuBLAS is installed: the binding's names exist
        for name in cublas.SIGNATURES:
            assert hasattr(lib, name)
    with pytest.raises(DriverError, match="'N' or 'T'"):
        cublas.op("C")


# -- SyncedMemory -----------------------------------------------------------------------------
def test_synced_memory_head_states_and_copy_counts(dev):
    m = SyncedMemory(dev, 5)
    assert m.head == UNINITIALIZED
    host = m.mutable_cpu_data()                 # first use: zeros, no copy
    assert m.head == HEAD_AT_CPU and (host == 0).all() and dev.transfers.htod_calls == 0
    host[...] = np.arange(5)
    ptr = m.gpu_data()                          # one copy in
    assert m.head == SYNCED and (m.htod_copies, m.htod_bytes) == (1, 20)
    assert m.gpu_data() == ptr and m.cpu_data() is host and m.htod_copies == 1
    m.mutable_gpu_data()
    assert m.head == HEAD_AT_GPU
    dev.memset32(ptr, struct.unpack("<I", struct.pack("<f", 7.0))[0], 5)
    np.testing.assert_array_equal(m.cpu_data(), 7.0)     # one copy out
    assert m.head == SYNCED and (m.dtoh_copies, m.dtoh_bytes) == (1, 20)
    m.cpu_data()
    m.gpu_data()
    assert (m.htod_copies, m.dtoh_copies) == (1, 1)      # synced: nothing moves
    assert (dev.transfers.htod_bytes, dev.transfers.dtoh_bytes) == (20, 20)


def test_synced_memory_first_use_on_the_device_is_zeros_without_a_copy(dev):
    m = SyncedMemory(dev, 3)
    ptr = m.mutable_gpu_data()
    assert m.head == HEAD_AT_GPU and dev.transfers.htod_calls == 0
    out = np.empty(3, np.float32)
    dev.copy_dtoh(out, ptr)
    assert (out == 0).all()
    m.release()                                 # newer data on the device comes home first
    assert m.head == HEAD_AT_CPU and m.dtoh_copies == 1 and ptr not in dev.allocations


def test_synced_memory_async_push_and_freeing(dev):
    m = SyncedMemory(dev, 4)
    with pytest.raises(RuntimeError, match="host copy as the head, not UNINITIALIZED"):
        m.async_gpu_push(dev.stream())
    m.mutable_cpu_data()[...] = 3
    stream = dev.stream()
    m.async_gpu_push(stream)
    stream.synchronize()
    assert m.head == SYNCED and m.htod_copies == 1
    ptr = m.gpu_data()
    assert ptr in dev.allocations
    del m
    import gc
    gc.collect()
    assert ptr not in dev.allocations           # the device copy goes with the object
