"""Background batch loading with Caffe's prefetch depth, and a clean stop.

A Prefetcher runs ``load()`` in one daemon thread and keeps up to ``depth`` finished batches in
a queue; ``next()`` hands them out in order. An error in the thread is raised again by the next
``next()``. ``stop()`` ends the thread and waits for it, mid-epoch or not, after which the
caller may close what the loader reads from. With depth 0 there is no thread: ``next()`` calls
``load()`` itself, which gives the same batches in the same order.
"""
import queue
import threading

_POLL_SECONDS = 0.05


class _Failure:
    def __init__(self, exc):
        self.exc = exc


class Prefetcher:
    def __init__(self, load, depth, name="prefetch", on_thread_exit=None):
        self._load = load
        self._on_thread_exit = on_thread_exit    # run by the thread as it ends (a release)
        self.name = name
        self.depth = int(depth)
        self._stop = threading.Event()
        self._thread = None
        if self.depth > 0:
            self._queue = queue.Queue(maxsize=self.depth)
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()

    @property
    def thread(self):
        return self._thread

    def _run(self):
        try:
            self._produce()
        finally:
            if self._on_thread_exit is not None:
                self._on_thread_exit()

    def _produce(self):
        while not self._stop.is_set():
            try:
                item = self._load()
            except BaseException as exc:     # handed to the consumer, which raises it
                item = _Failure(exc)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=_POLL_SECONDS)
                    break
                except queue.Full:
                    continue
            if isinstance(item, _Failure):
                return

    def next(self):
        if self._stop.is_set():
            raise RuntimeError("the %s reader was stopped" % self.name)
        if self._thread is None:
            return self._load()
        while True:
            try:
                item = self._queue.get(timeout=_POLL_SECONDS)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("the %s thread has stopped" % self._thread.name)
        if isinstance(item, _Failure):
            raise item.exc
        return item

    def stop(self):
        """End the thread and wait for it; safe to call twice."""
        self._stop.set()
        if self._thread is None:
            return
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join()
        self._thread = None
