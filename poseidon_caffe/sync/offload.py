"""The exchanges' numeric work (a GEMM of sufficient factors, an update over a large blob) on a
thread of its own, so that the communication thread goes on testing every other exchange's
requests meanwhile (numpy lets go of the GIL while it computes)."""
import concurrent.futures
import queue
import threading

from .steps import Until

OFFLOAD_SIZE = 1 << 18     # values (1 MiB of float32) from which numeric work goes to a thread


class WorkerThread:
    """One thread that runs the functions handed to it in order; ``submit(fn)`` -> a Future.

    Not a ThreadPoolExecutor: the interpreter's exit shuts those down while daemon threads
    still run, so a communication thread finishing an exchange as the main thread leaves with
    an error (a NaN loss) would fail on its own and add a second, misleading report."""

    def __init__(self, name):
        self.queue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, fn):
        future = concurrent.futures.Future()
        self.queue.put((future, fn))
        return future

    def shutdown(self):
        self.queue.put(None)
        self.thread.join()

    def _run(self):
        while True:
            job = self.queue.get()
            if job is None:
                return
            future, fn = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn()
            except BaseException as exc:  # the exchange that waits for it raises it
                future.set_exception(exc)
            else:
                future.set_result(result)


class Offload:
    """Hands work of ``size`` values and more to one worker thread (made at first use), in the
    order submitted; ``wake`` (the scheduler's bell) is called as each piece of work ends."""

    def __init__(self, size=OFFLOAD_SIZE):
        self.size = int(size)
        self.wake = None
        self.worker = None

    def submit(self, fn):
        """Run ``fn()`` on the worker thread; the future of its result."""
        if self.worker is None:
            self.worker = WorkerThread("sync-work")
        future = self.worker.submit(fn)
        if self.wake is not None:
            future.add_done_callback(lambda done: self.wake())
        return future

    def computed(self, fn, size):
        """The step of an exchange that computes ``fn()`` over ``size`` values: on the worker
        thread, waiting (``Until``) for it to end; small work runs here, as handing it over
        would cost more than it takes. Returns its result."""
        if size < self.size:
            return fn()
            yield  # pragma: no cover -- makes this a generator
        future = self.submit(fn)
        if not future.done():
            yield Until(future.done)
        return future.result()

    def close(self):
        if self.worker is not None:
            self.worker.shutdown()
            self.worker = None
