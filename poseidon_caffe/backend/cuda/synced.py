"""SyncedMemory: one array's host and device copies, and which of them is current.

Caffe's head states: UNINITIALIZED (neither exists), HEAD_AT_CPU (the host copy is newer),
HEAD_AT_GPU (the device copy is newer), SYNCED (both equal). Reading one side copies from
the other only when that side is behind; asking for a side mutably makes it the head. The
first use of either side without data zero-fills it, with no copy.

Every copy is counted here (``htod_copies``, ``htod_bytes``, ``dtoh_copies``, ``dtoh_bytes``)
and in the driver's ``transfers``, so a test can assert what crossed the bus, e.g. exactly one
batch in per iteration.
"""
import weakref

import numpy as np

UNINITIALIZED, HEAD_AT_CPU, HEAD_AT_GPU, SYNCED = ("UNINITIALIZED", "HEAD_AT_CPU",
                                                   "HEAD_AT_GPU", "SYNCED")


class SyncedMemory:
    def __init__(self, driver, count, dtype=np.float32):
        self.driver = driver
        self.count = int(count)
        self.dtype = np.dtype(dtype)
        self.nbytes = self.count * self.dtype.itemsize
        self.head = UNINITIALIZED
        self._host = None
        self._device = 0
        self._release = None
        self.htod_copies = self.htod_bytes = 0
        self.dtoh_copies = self.dtoh_bytes = 0

    # -- the two sides ---------------------------------------------------------------------
    def _host_array(self):
        if self._host is None:
            # page-locked, so copies from it can run asynchronously on a stream
            self._host = self.driver.pinned_empty((self.count,), self.dtype)
        return self._host

    def _device_ptr(self):
        if not self._device and self.nbytes:
            self._device = self.driver.alloc(self.nbytes)
            # freed with this object, even if nobody calls release()
            self._release = weakref.finalize(self, self.driver.free, self._device)
        return self._device

    def _to_cpu(self):
        if self.head == UNINITIALIZED:
            self._host_array()[...] = 0
            self.head = HEAD_AT_CPU
        elif self.head == HEAD_AT_GPU:
            self.driver.copy_dtoh(self._host_array(), self._device)
            self.dtoh_copies += 1
            self.dtoh_bytes += self.nbytes
            self.head = SYNCED

    def _to_gpu(self, stream=None):
        if self.head == UNINITIALIZED:
            self.driver.memset(self._device_ptr(), 0, self.nbytes, stream)
            self.head = HEAD_AT_GPU
        elif self.head == HEAD_AT_CPU:
            self.driver.copy_htod(self._device_ptr(), self._host, stream)
            self.htod_copies += 1
            self.htod_bytes += self.nbytes
            self.head = SYNCED

    # -- Caffe's accessors -----------------------------------------------------------------
    def cpu_data(self):
        """The host array, current (copied from the device if that is newer); not to be
        written (use mutable_cpu_data)."""
        self._to_cpu()
        return self._host

    def mutable_cpu_data(self):
        """The host array, current, which becomes the head: the device copy is stale."""
        self._to_cpu()
        self.head = HEAD_AT_CPU
        return self._host

    def gpu_data(self):
        """The device pointer, current (copied from the host if that is newer)."""
        self._to_gpu()
        return self._device

    def mutable_gpu_data(self):
        """The device pointer, current, which becomes the head: the host copy is stale."""
        self._to_gpu()
        self.head = HEAD_AT_GPU
        return self._device

    def async_gpu_push(self, stream):
        """Queue the host copy's upload on ``stream`` (a prefetch thread's): the memory is
        SYNCED once the stream has run it. The host copy must be the head."""
        if self.head != HEAD_AT_CPU:
            raise RuntimeError("async_gpu_push needs the host copy as the head, not %s"
                               % self.head)
        self._to_gpu(stream)

    def release(self):
        """Free the device copy now; newer data there is first copied to the host, which
        becomes the head."""
        if self.head == HEAD_AT_GPU:
            self._to_cpu()
        if self._release is not None:
            self._release()
            self._release = None
            self._device = 0
        if self.head == SYNCED:
            self.head = HEAD_AT_CPU
