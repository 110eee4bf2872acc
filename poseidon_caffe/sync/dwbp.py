"""Wait-free backprop: the scheduler between the compute thread and the communication thread.

As soon as backward has made a layer's gradients final (the net's grad-ready hook), the blobs of
that layer are copied out and handed to a background thread that exchanges them while backward
goes on below. The next forward waits for a layer's fresh weights only when it reaches that
layer (the before-forward hook), so the bottom layers -- whose gradients came last -- are also
the ones needed first. Small blobs that become ready one after another are fused into one
message (a bucket), decided once at start so that every rank fuses alike. With ``dwbp`` off,
the same exchanges run after backward, one after another, before the next iteration.

Every MPI call after start-up runs on the communication thread, in the same order on every
rank (backward order), which is what keeps the collectives matched.
"""
import queue
import threading
import time



class SyncError(RuntimeError):
    pass


class Bucket:
    def __init__(self, index, strategy, items):
        self.index = index
        self.strategy = strategy
        self.items = items
        self.name = items[0].name if len(items) == 1 else "%s..%s" % (items[0].name, items[-1].name)
        self.count = sum(item.count for item in items)


def make_buckets(items, plan, fuse_bytes, fusing):
    """Group items in backward order; consecutive small blobs of one strategy that fuses
    (named in ``fusing``) share one bucket."""
    buckets, open_bucket, open_bytes = [], [], 0
    open_name = None

    def close():
        nonlocal open_bucket, open_bytes
        if open_bucket:
            buckets.append(Bucket(len(buckets), open_name, open_bucket))
        open_bucket, open_bytes = [], 0

    for item in sorted(items, key=lambda it: (-it.ready_layer, it.index)):
        name = plan[item.index]
        nbytes = item.count * 4
        if name in fusing and nbytes < fuse_bytes:
            if name != open_name:
                close()
                open_name = name
            open_bucket.append(item)
            open_bytes += nbytes
            if open_bytes >= fuse_bytes:
                close()
            continue
        close()
        buckets.append(Bucket(len(buckets), name, [item]))
    close()
    for bucket in buckets:
        for item in bucket.items:
            item.bucket = bucket
    return buckets


class Task:
    def __init__(self, bucket, clock, payloads):
        self.bucket = bucket
        self.clock = clock
        self.payloads = payloads


class Scheduler:
    """Owns the communication thread and the per-item freshness the compute thread waits on."""

    def __init__(self, engine, dwbp=True, timeline=None):
        self.engine = engine
        self.dwbp = dwbp
        self.timeline = timeline
        self.tasks = queue.Queue()
        self.cond = threading.Condition()
        self.error = None
        self.done_tasks = 0
        self.queued_tasks = 0
        self.comm_busy = 0.0       # seconds the communication thread spent on exchanges
        self.thread = threading.Thread(target=self._run, name="sync-comm", daemon=True)
        self.thread.start()

    # -- compute thread ------------------------------------------------------------------------
    def submit(self, bucket, clock, payloads):
        with self.cond:
            self.queued_tasks += 1
        self.tasks.put(Task(bucket, clock, payloads))

    def post(self, fn):
        """Run ``fn`` on the communication thread, after everything queued, without waiting."""
        with self.cond:
            self.queued_tasks += 1
        self.tasks.put(fn)

    def call(self, fn):
        """Run ``fn`` on the communication thread, after everything queued; return its result."""
        box = {}
        done = threading.Event()

        def job():
            try:
                box["value"] = fn()
            finally:
                done.set()
        with self.cond:
            self.queued_tasks += 1
        self.tasks.put(job)
        self._wait(lambda: done.is_set(), "waiting for the communication thread")
        return box.get("value")

    def wait_for(self, condition, what):
        """Wait (compute thread) until ``condition()`` holds; whoever makes it true calls
        ``wake``. The deadline and a failed communication thread end the wait."""
        self._wait(condition, what)

    def wake(self):
        with self.cond:
            self.cond.notify_all()

    def wait_items(self, items, clock, what):
        self._wait(lambda: all(item.fresh >= clock for item in items), what)

    def wait_idle(self, what):
        self._wait(lambda: self.done_tasks == self.queued_tasks, what)

    def _wait(self, condition, what):
        deadline = time.monotonic() + self.engine.transport.timeout
        with self.cond:
            while True:
                if self.error is not None:
                    raise SyncError("the communication thread failed: %s" % self.error)
                if condition():
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SyncError("%s: nothing arrived within %.0f s"
                                    % (what, self.engine.transport.timeout))
                self.cond.wait(min(remaining, 0.5))

    def stop(self):
        self.tasks.put(None)
        self.thread.join()

    # -- communication thread -----------------------------------------------------------------
    def _run(self):
        while True:
            task = self.tasks.get()
            if task is None:
                return
            try:
                start = time.perf_counter()
                if callable(task):
                    task()
                else:
                    self.engine.run_task(task)
                    self.comm_busy += time.perf_counter() - start
                    if self.timeline is not None:
                        t1 = self.timeline.now_us()
                        self.timeline.span("%s %s" % (task.bucket.strategy, task.bucket.name),
                                           "exchange", t1 - (time.perf_counter() - start) * 1e6,
                                           t1, 1, {"clock": task.clock})
            except BaseException as exc:  # reported to the compute thread, which ends the job
                with self.cond:
                    self.error = "%s: %s" % (type(exc).__name__, exc)
                    self.cond.notify_all()
                self.engine.on_comm_failure(exc)
                return
            with self.cond:
                self.done_tasks += 1
                self.cond.notify_all()

    def mark_fresh(self, items, clock):
        with self.cond:
            for item in items:
                item.fresh = clock + 1
            self.cond.notify_all()
