"""pycaffe's ``caffe.Timer``: ``start()``, ``stop()``, and ``ms``, the milliseconds between
the last start and stop (read while running, it stops the timer first, as Caffe's does)."""
import time

from . import log


class Timer:
    def __init__(self):
        self._running = False
        self._has_run = False
        self._start = self._stop = 0.0

    @property
    def running(self):
        return self._running

    def start(self):
        if not self._running:
            self._start = time.perf_counter()
            self._running = True
            self._has_run = True

    def stop(self):
        if self._running:
            self._stop = time.perf_counter()
            self._running = False

    @property
    def seconds(self):
        if not self._has_run:
            log.warning("Timer has never been run before reading time.")
            return 0.0
        self.stop()
        return self._stop - self._start

    @property
    def ms(self):
        return self.seconds * 1e3

    @property
    def us(self):
        return self.seconds * 1e6
