"""Batches on their way to the device: Caffe's prefetch batches with async_gpu_push.

A ring of slots, each a page-locked host buffer and a device buffer per array of a batch (data,
labels). The prefetch thread ``push``es a batch: it waits until the slot's previous batch has
been copied out of it, copies the arrays into the pinned buffers, queues their upload on its
own non-blocking stream, records an event and waits for it (the prefetch thread waits, never
the computation, as Caffe's prefetch thread synchronises its stream). The computation then
``take``s the batch: one device-to-device copy per array into the tops, queued on the default
stream, with no host round trip; an event recorded after those copies tells the prefetch
thread when the slot's device buffers may be written again.

With ``depth`` batches queued, ``depth + 1`` slots are enough: the producer fills slot k only
after batch k - depth - 1 was taken, and a take releases its slot at once.
"""
import threading

import numpy as np


class RingClosed(RuntimeError):
    """The ring was closed while a push waited for a slot."""


class _Slot:
    def __init__(self, driver, index):
        self.index = index
        self.host = []             # page-locked byte buffers, one per array
        self.device = []           # DeviceArrays (uint8 bytes), one per array
        self.capacity = []         # bytes each holds
        self.views = []            # (shape, dtype) of the batch in the slot
        self.ready = driver.event()
        self.copied_out = None     # event after the last take's copies (None: never taken)
        self.free = threading.Event()
        self.free.set()


class DeviceBatchRing:
    def __init__(self, backend, depth):
        self.backend = backend
        self.driver = backend.driver
        self._slots = [_Slot(self.driver, i) for i in range(int(depth) + 1)]
        self._next = 0
        self._stream = None
        self._bound = threading.local()
        self._closed = False
        self.pushed = self.taken = 0

    # -- the prefetch thread -----------------------------------------------------------------
    def push(self, arrays):
        """Upload ``arrays`` (numpy) into the next slot; returns the slot (what ``take`` and
        ``release`` get). Runs on the prefetch thread (or in forward without one)."""
        if not getattr(self._bound, "done", False):
            self.driver.make_current()            # the device is current per thread
            self._bound.done = True
        if self._stream is None:
            self._stream = self.driver.stream(non_blocking=True)
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        while not slot.free.wait(0.05):
            if self._closed:
                raise RingClosed("the batch ring was closed")
        if self._closed:
            raise RingClosed("the batch ring was closed")
        slot.free.clear()
        if slot.copied_out is not None:
            slot.copied_out.synchronize()         # the last take's copies have read the slot
        slot.views = []
        for i, array in enumerate(arrays):
            array = np.ascontiguousarray(array)
            self._ensure(slot, i, array.nbytes)
            host = slot.host[i][:array.nbytes].view(array.dtype).reshape(array.shape)
            host[...] = array
            self.driver.copy_htod(slot.device[i].ptr, host, self._stream)
            slot.views.append((array.shape, array.dtype))
        slot.ready.record(self._stream)
        slot.ready.synchronize()                  # the prefetch thread waits, not forward
        self.pushed += 1
        return slot

    def leave_thread(self):
        """Undo push's make_current on the calling thread; the prefetch thread's last call."""
        if getattr(self._bound, "done", False):
            self.driver.release_current()
            self._bound.done = False

    def _ensure(self, slot, i, nbytes):
        if i < len(slot.capacity) and slot.capacity[i] >= nbytes:
            return
        allocation = self.backend.empty((max(nbytes, 4) + 3) // 4)
        host = self.driver.pinned_empty((max(nbytes, 4),), np.uint8)
        if i < len(slot.capacity):
            slot.host[i], slot.device[i], slot.capacity[i] = host, allocation, nbytes
        else:
            slot.host.append(host)
            slot.device.append(allocation)
            slot.capacity.append(nbytes)

    # -- the computation ---------------------------------------------------------------------
    def shapes(self, slot):
        return [shape for shape, _ in slot.views]

    def take(self, slot, outs):
        """Copy the slot's arrays into the device arrays ``outs`` (shaped as the batch) on the
        default stream, then hand the slot back to the prefetch thread."""
        for (shape, dtype), device, out in zip(slot.views, slot.device, outs):
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            if out.nbytes != nbytes:
                raise ValueError("batch ring: a %d-byte array into a %d-byte top"
                                 % (nbytes, out.nbytes))
            self.driver.copy_dtod(out.ptr, device.ptr, nbytes)
        if slot.copied_out is None:
            slot.copied_out = self.driver.event()
        slot.copied_out.record()
        self.taken += 1
        slot.free.set()

    def release(self, slot):
        """Hand a slot back without copying it out (a skipped batch)."""
        self.taken += 1
        slot.free.set()

    def close(self):
        """Wake a push waiting for a slot (it raises RingClosed); the ring is done."""
        self._closed = True
        for slot in self._slots:
            slot.free.set()
