"""On a device rank an exchange starts when the copy of its payloads off the device has
completed (its event), not when it is handed over: the communication thread holds it, and
the buckets behind it, until the event says so, and never blocks the hand-over."""
import threading
import time
import types

from poseidon_caffe.sync.dwbp import Bucket, Scheduler


class Event:
    """A copy event whose completion the test decides."""

    def __init__(self):
        self.done = False
        self.queries = 0

    def query(self):
        self.queries += 1
        return self.done


class Engine:
    """What the scheduler is given: a transport, channels, and exchanges that record when
    they start."""

    def __init__(self):
        self.transport = types.SimpleNamespace(timeout=30.0, progress=lambda extra=(): False)
        self.channels = [None, None]
        self.started = []
        self.lock = threading.Lock()

    def exchange(self, task, channel):
        with self.lock:
            self.started.append(task.bucket.name)
        return
        yield  # pragma: no cover -- a generator with no wait

    def on_comm_failure(self, exc):
        raise exc

    def scheduler(self, channels):
        return Scheduler(self.exchange, self.transport, self.channels[:channels],
                         self.on_comm_failure)


def wait_until(condition, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return condition()


def test_an_exchange_waits_for_its_copy_event_and_keeps_the_order():
    engine = Engine()
    scheduler = engine.scheduler(2)
    item = types.SimpleNamespace(name="w", count=1)
    first = Bucket(0, "ps", [item])
    second = Bucket(1, "ps", [types.SimpleNamespace(name="v", count=1)])
    second.channel = 1
    copy_first, copy_second = Event(), Event()
    copy_second.done = True
    try:
        scheduler.submit(first, 0, [None], copy_first)      # returns at once
        scheduler.submit(second, 0, [None], copy_second)
        assert wait_until(lambda: copy_first.queries >= 3)  # asked, again and again
        assert engine.started == []         # neither starts: the second is behind the first
        copy_first.done = True
        assert wait_until(lambda: len(engine.started) == 2)
        assert engine.started == ["w", "v"]
        scheduler.wait_idle("the test's exchanges")
    finally:
        scheduler.stop()


def test_an_exchange_without_an_event_starts_at_once():
    engine = Engine()
    scheduler = engine.scheduler(1)
    try:
        scheduler.submit(Bucket(0, "ps", [types.SimpleNamespace(name="w", count=1)]), 0, [None])
        assert wait_until(lambda: engine.started == ["w"])
        scheduler.wait_idle("the test's exchange")
    finally:
        scheduler.stop()
