"""Freed device blocks kept for the next allocation of the same size.

Freeing device memory waits for the device (cuMemFree returns once the work queued before it
is done), so a temporary freed in the middle of a pass stalls the host until the GPU drains,
and the launches that follow no longer overlap the work before them: GoogLeNet frees some 70
temporaries an iteration. A block that goes is kept here instead, by its exact size, and an
allocation of that size takes it back without asking the driver. A block is handed out again
only on the thread that made the cache (the computation), whose work runs in one stream
order, so a kernel still reading the old contents runs before any that writes the new.

The cache holds at most LIMIT bytes (a block past that is freed at once), and gives every
block back to the driver when an allocation fails, before trying it once more. The backend
keeps none on the emulated device, whose checks then still catch a pointer used after its
array went; where a cache there does keep blocks (its tests), a block taken back is filled
with NaN bytes again, as fresh memory is there, so a read of memory never written still shows.
"""
import threading

from .driver import DriverError

LIMIT = 1 << 30
FRESH_BYTE = 0xFF                 # the emulated device's fresh memory: NaN as a float


class BlockCache:
    def __init__(self, driver, limit=LIMIT):
        self.driver = driver
        self.limit = limit
        self.held_bytes = 0
        self._blocks = {}                       # nbytes -> [pointer]
        self._lock = threading.Lock()
        self._thread = threading.get_ident()

    def alloc(self, nbytes):
        """A device pointer to ``nbytes`` bytes (DriverError when the device has none)."""
        if threading.get_ident() == self._thread:
            with self._lock:
                kept = self._blocks.get(nbytes)
                ptr = kept.pop() if kept else None
                if ptr is not None:
                    self.held_bytes -= nbytes
            if ptr is not None:
                if self.driver.info.emulated:
                    self.driver.memset(ptr, FRESH_BYTE, nbytes)
                return ptr
        try:
            return self.driver.alloc(nbytes)
        except DriverError:
            if not self.release():
                raise
            return self.driver.alloc(nbytes)

    def free(self, ptr, nbytes):
        """Keep the block for a later allocation of its size (called from any thread, by the
        garbage collector too)."""
        with self._lock:
            if self.held_bytes + nbytes <= self.limit:
                self._blocks.setdefault(nbytes, []).append(ptr)
                self.held_bytes += nbytes
                return
        self.driver.free(ptr)

    def release(self):
        """Give every kept block back to the driver; whether there was any."""
        with self._lock:
            blocks = [p for kept in self._blocks.values() for p in kept]
            self._blocks.clear()
            self.held_bytes = 0
        for ptr in blocks:
            self.driver.free(ptr)
        return bool(blocks)
