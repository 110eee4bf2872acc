"""Wait-free backprop: the scheduler between the compute thread and the communication thread.

As soon as backward has made a layer's gradients final (the net's grad-ready hook), the blobs of
that layer are copied out and handed to a background thread that exchanges them while backward
goes on below. The next forward waits for a layer's fresh weights only when it reaches that
layer (the before-forward hook), so the bottom layers -- whose gradients came last -- are also
the ones needed first. Small blobs that become ready one after another are fused into one
message (a bucket), decided once at start so that every rank fuses alike. With ``dwbp`` off,
the same exchanges start after backward, all at once, before the next iteration.

Several exchanges are in flight at once (Poseidon gave every layer its own sync thread and
each client several comm channels): bucket ``b`` travels on channel ``b % channels``; a
channel carries one exchange at a time, and exchanges start strictly in bucket (backward)
order, so every communicator sees its collectives in the same order on every rank while up to
``channels`` buckets' messages are on the wire together. An exchange is a generator
(``Strategy.start``) that yields its non-blocking requests; the communication thread tests all
of them and resumes each exchange whose requests have completed.

Each round, one MPI_Testsome tests every request in flight (the exchanges' and those of the
services: this rank's parameter-server shard, its pulls, the stop agreement). Between rounds the
communication thread sleeps (backing off to ``BUSY_PAUSE`` while exchanges are in flight)
rather than blocking in MPI: MPICH's blocking waits poll a core at full speed, which on a host
whose cores run backward costs about as much compute as they could hide (measured: a thread in
MPI_Waitsome doubled the time of a numpy workload beside it on 2 cores). The compute thread
never calls MPI: it appends to a queue and releases a lock that wakes the thread at once.

On a device rank the payloads are pinned host buffers whose copies off the device were only
queued (``device_transfers.py``): such an exchange carries the event recorded after them and starts
once that event has completed, so neither thread waits for the copy by blocking.

Every MPI call after start-up runs on the communication thread. Functions handed over with
``post`` and ``call`` run with no exchange in flight, in the order queued, so their blocking
collectives are matched too.
"""
import collections
import threading
import time


from . import communicator
from .steps import Wait

BUSY_PAUSE = 5e-4      # longest sleep between tests while an exchange is in flight
IDLE_PAUSE = 5e-3      # ... while none is (this rank's parameter-server shard is still served)
# the compute thread's waits end this much after the communication thread's deadline: that
# thread's timeout names the ranks it waited for, so it should be the one reported
NAMING_GRACE = 2.0


class SyncError(RuntimeError):
    pass


class Bucket:
    def __init__(self, index, strategy, items):
        self.index = index
        self.strategy = strategy
        self.items = items
        self.name = items[0].name if len(items) == 1 else "%s..%s" % (items[0].name, items[-1].name)
        self.count = sum(item.count for item in items)
        self.channel = 0           # which lane it travels on (set by the engine)


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
    def __init__(self, bucket, clock, payloads, ready=None):
        self.bucket = bucket
        self.clock = clock
        self.payloads = payloads
        # on a device rank: the event after the copies of the payloads out of the device;
        # the exchange starts once it has completed (None: the payloads are there)
        self.ready = ready


class _Exchange:
    """One bucket's exchange in flight: its generator and what it waits for now."""
    __slots__ = ("task", "channel", "steps", "step", "deadline", "started")

    def __init__(self, task, channel, steps, started):
        self.task = task
        self.channel = channel
        self.steps = steps
        self.step = None
        self.deadline = None
        self.started = started


class Scheduler:
    """Owns the communication thread and the per-item freshness the compute thread waits on.

    It is given what it uses, and nothing else: ``exchange(task, channel)``, the generator of
    one bucket's exchange; the ``transport`` whose requests it tests and whose deadline it
    keeps; the ``channels`` the exchanges travel on; ``on_failure(exc)``, called on the
    communication thread when it fails; and a ``thread_context`` (the device transfers) entered
    and left by that thread, or None."""

    def __init__(self, exchange, transport, channels, on_failure, thread_context=None,
                 timeline=None):
        self.exchange = exchange
        self.transport = transport
        self.lanes = list(channels)
        self.channels = len(self.lanes)
        self.on_failure = on_failure
        self.thread_context = thread_context
        self.timeline = timeline
        self.inbox = collections.deque()   # Task, function or None (stop), in order
        # the communication thread sleeps on this lock; the compute thread releases it to
        # wake the thread at once (a bare lock: no Python-level machinery on either side)
        self.bell = threading.Lock()
        self.bell.acquire()
        self.cond = threading.Condition()
        self.error = None
        self.done_tasks = 0
        self.queued_tasks = 0
        self.comm_busy = 0.0       # seconds with at least one exchange in flight
        self.exchanges = 0         # exchanges started
        self.overlapped = 0        # ... of them while another one was in flight
        self.in_flight_peak = 0    # the most exchanges in flight at once
        self.polls = 0             # rounds of tests the communication thread made
        self.cpu_seconds = 0.0     # the communication thread's own CPU time
        if timeline is not None:
            for k in range(self.channels):
                timeline.name_thread(1 + k, "communication, channel %d" % k)
        self.thread = threading.Thread(target=self._run, name="sync-comm", daemon=True)
        self.thread.start()

    # -- compute thread ------------------------------------------------------------------------
    def submit(self, bucket, clock, payloads, ready=None):
        self.submit_all([(bucket, clock, payloads, ready)])

    def submit_all(self, tasks):
        """Hand several exchanges over at once (the communication thread sees all or none)."""
        if not tasks:
            return
        with self.cond:
            self.queued_tasks += len(tasks)
        self.inbox.extend([Task(*task) for task in tasks])
        self.ring()

    def post(self, fn):
        """Run ``fn`` on the communication thread, after everything queued, without waiting."""
        with self.cond:
            self.queued_tasks += 1
        self.inbox.append(fn)
        self.ring()

    def call(self, fn):
        """Run ``fn`` on the communication thread, after everything queued; return its result."""
        box = {}
        done = threading.Event()

        def job():
            try:
                box["value"] = fn()
            finally:
                done.set()
        self.post(job)
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
        timeout = self.transport.timeout
        deadline = time.monotonic() + timeout + min(timeout, NAMING_GRACE)
        with self.cond:
            while True:
                if self.error is not None:
                    raise SyncError("the communication thread failed: %s" % self.error)
                if condition():
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SyncError("%s: nothing arrived within %.0f s"
                                    % (what, self.transport.timeout))
                self.cond.wait(min(remaining, 0.5))

    def stop(self):
        self.inbox.append(None)
        self.ring()
        self.thread.join()

    def ring(self):
        """Wake the communication thread now (work handed over, or finished elsewhere)."""
        try:
            self.bell.release()
        except RuntimeError:
            pass                   # rung already: the thread will look at the whole inbox

    # -- communication thread -----------------------------------------------------------------
    def _run(self):
        context = self.thread_context
        try:
            if context is not None:
                context.enter_thread()
            self._loop()
        except BaseException as exc:  # reported to the compute thread, which ends the job
            with self.cond:
                self.error = "%s: %s" % (type(exc).__name__, exc)
                self.cond.notify_all()
            self.on_failure(exc)
        finally:
            if context is not None:
                context.leave_thread()

    def _loop(self):
        waiting = collections.deque()      # handed over, not started yet
        active = []                        # exchanges in flight, in the order started
        lanes = [None] * self.channels     # the exchange each channel carries
        transport = self.transport
        pause = 0.0
        busy_since = None
        while True:
            self.polls += 1
            self.cpu_seconds = time.thread_time()
            while self.inbox:
                waiting.append(self.inbox.popleft())
            moved = copying = False
            # start in order: an exchange when its channel is free; a function, or the end,
            # once nothing is in flight
            while waiting:
                head = waiting[0]
                if isinstance(head, Task):
                    lane = head.bucket.channel % self.channels
                    if lanes[lane] is not None:
                        break
                    if head.ready is not None and not head.ready.query():
                        copying = True     # its payloads are still on their way off the device
                        break
                    waiting.popleft()
                    now = time.perf_counter()
                    if busy_since is None:
                        busy_since = now
                    self.exchanges += 1
                    if active:
                        self.overlapped += 1
                    exchange = _Exchange(head, lane, self.exchange(head, self.lanes[lane]), now)
                    lanes[lane] = exchange
                    active.append(exchange)
                    if self._advance(exchange, transport):
                        self._finished(exchange, active, lanes)
                    moved = True
                    continue
                if active:
                    break
                waiting.popleft()
                if head is None:
                    return
                head()
                self._task_done()
                moved = True
            if len(active) > self.in_flight_peak:
                self.in_flight_peak = len(active)
            # one test of every request in flight, the exchanges' and the services'
            transport.progress([r for exchange in active if isinstance(exchange.step, Wait)
                                for r in exchange.step.requests])
            for exchange in list(active):
                if self._ready(exchange, transport, tested=True):
                    moved = True
                    if self._advance(exchange, transport):
                        self._finished(exchange, active, lanes)
            if busy_since is not None and not active:
                self.comm_busy += time.perf_counter() - busy_since
                busy_since = None
            if moved:
                pause = 0.0
                continue
            # nothing to do until a request completes or the compute thread hands something
            # over: sleep (without the GIL, without a core), backing off
            pause = min(pause * 2 or 5e-5, BUSY_PAUSE if active or copying else IDLE_PAUSE)
            self.bell.acquire(timeout=pause)

    def _ready(self, exchange, transport, tested=False):
        """Whether what ``exchange`` waits for is there (``tested``: its requests were just
        tested, completed ones are null); past its deadline, a SyncTimeout."""
        step = exchange.step
        if isinstance(step, Wait):
            done = not any(step.requests) if tested else (
                not step.requests or communicator.test_all(step.requests))
        else:
            done = step.condition()
        if not done and time.monotonic() > exchange.deadline:
            task = exchange.task
            raise transport.timed_out("exchanging %s (iteration %d)"
                                      % (task.bucket.name, task.clock), step.peers)
        return done

    def _advance(self, exchange, transport):
        """Run ``exchange`` to its next wait that is not over yet; True when it has ended."""
        try:
            while True:
                exchange.step = (next(exchange.steps) if exchange.step is None
                                 else exchange.steps.send(None))
                exchange.deadline = time.monotonic() + transport.timeout
                if not self._ready(exchange, transport):
                    return False
        except StopIteration:
            return True

    def _finished(self, exchange, active, lanes):
        active.remove(exchange)
        lanes[exchange.channel] = None
        if self.timeline is not None:
            task = exchange.task
            self.timeline.span_at("%s %s" % (task.bucket.strategy, task.bucket.name),
                                  "exchange", exchange.started, time.perf_counter(),
                                  1 + exchange.channel, {"clock": task.clock})
        self._task_done()

    def _task_done(self):
        with self.cond:
            self.done_tasks += 1
            self.cond.notify_all()

    def mark_fresh(self, items, clock):
        with self.cond:
            for item in items:
                item.fresh = clock + 1
            self.cond.notify_all()
