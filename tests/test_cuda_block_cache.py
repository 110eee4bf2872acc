"""The CUDA backend's BlockCache on the emulated device: a freed block comes back to the next
allocation of its size on the computation's thread, holding fresh (NaN) bytes again; other
threads, other sizes and a full cache get the driver's memory; a failing allocation first
gives the kept blocks back. The backend's own cache keeps nothing there, so the device's
checks still see a pointer used after its array went."""
import gc
import threading

import numpy as np
import pytest

from poseidon_caffe.backend.cuda.block_cache import BlockCache
from poseidon_caffe.backend.cuda.driver import DriverError
from poseidon_caffe.backend.cuda.drivers.emulated import MEMORY_ENV, EmulatedDriver


@pytest.fixture
def driver():
    d = EmulatedDriver()
    yield d
    d.close()


def test_a_freed_block_comes_back_for_its_size_with_fresh_bytes(driver):
    cache = BlockCache(driver)
    ptr = cache.alloc(4096)
    driver.memset(ptr, 0, 4096)
    cache.free(ptr, 4096)
    assert cache.held_bytes == 4096 and ptr in driver.allocations   # kept, not freed
    assert cache.alloc(4096) == ptr and cache.held_bytes == 0
    back = np.empty(1024, np.float32)
    driver.copy_dtoh(back, ptr)
    assert np.isnan(back).all()                   # as fresh memory on the emulated device
    other = cache.alloc(2048)                     # another size: the driver's memory
    assert other != ptr and len(driver.allocations) == 2


def test_only_the_computations_thread_takes_blocks_back(driver):
    cache = BlockCache(driver)
    ptr = cache.alloc(512)
    cache.free(ptr, 512)
    taken = []
    thread = threading.Thread(target=lambda: taken.append(cache.alloc(512)))
    thread.start()
    thread.join()
    assert taken[0] != ptr and cache.held_bytes == 512


def test_past_the_limit_a_block_is_freed_at_once(driver):
    cache = BlockCache(driver, limit=1000)
    a, b = cache.alloc(600), cache.alloc(600)
    cache.free(a, 600)
    cache.free(b, 600)
    assert cache.held_bytes == 600 and b not in driver.allocations


def test_a_failing_allocation_gives_the_kept_blocks_back_first(monkeypatch):
    monkeypatch.setenv(MEMORY_ENV, str(1 << 20))
    driver = EmulatedDriver()
    try:
        cache = BlockCache(driver)
        kept = [cache.alloc(300 << 10) for _ in range(3)]
        for ptr in kept:
            cache.free(ptr, 300 << 10)
        big = cache.alloc(900 << 10)              # fits only once the kept blocks go
        assert cache.held_bytes == 0 and list(driver.allocations) == [big]
        with pytest.raises(DriverError, match="out of memory"):
            cache.alloc(200 << 10)                # nothing kept to give back: the driver's error
    finally:
        driver.close()


def test_the_backends_arrays_go_back_to_its_cache_which_keeps_none_on_the_emulated_device():
    from poseidon_caffe.backend.cuda.backend import CUDABackend
    be = CUDABackend(driver=EmulatedDriver())
    try:
        a = be.empty((10, 10))
        ptr = a.ptr
        del a
        gc.collect()
        assert be.blocks.held_bytes == 0 and ptr not in be.driver.allocations
        be.blocks = BlockCache(be.driver)                 # as on a real device
        b = be.empty((10, 10))
        ptr = b.ptr
        del b
        gc.collect()
        assert be.blocks.held_bytes == 400
        assert be.empty((4, 25)).ptr == ptr
    finally:
        be.driver.close()
