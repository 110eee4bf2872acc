"""Point-to-point and collective waits over MPI, with byte counting and a deadline.

An exchange is written as a generator: it starts non-blocking MPI calls and yields what it
needs before it can go on -- ``Wait(requests, peers)`` (every request complete) or
``Until(condition, peers)`` (a condition that the services make true, e.g. a parameter
server's fresh rows) -- and returns its result. The scheduler (``dwbp.py``) keeps several
such generators in flight and resumes each as its requests complete; ``drive`` runs one to
the end on its own, waiting where it yields (snapshots, the end of a run, direct callers).

Every wait tests its requests together with the services' (the parameter-server shard of this
rank, its pulls, the stop agreement) in one MPI_Testsome, so a rank that waits for its peers
still serves them. A wait that passes its
deadline raises SyncTimeout naming the ranks it waited for, instead of hanging. The on-host
collectives an exchange yields on are its channel's (``channels.py``).
"""
import time

from . import communicator
from .channels import Channel
from .offload import Offload
from .steps import Until, Wait  # noqa: F401  (what exchanges yield; waited for here)


class SyncTimeout(RuntimeError):
    pass


class Transport:
    def __init__(self, topology, counters, timeout=600.0):
        self.topology = topology
        self.counters = counters
        self.timeout = float(timeout)
        # what must be served while anything waits (this rank's parameter-server shard and
        # pulls, the stop agreement): objects with requests_in_flight(), progress() -- take
        # the requests that have completed (null ones) -- and busy() -- work finished
        # elsewhere (an update on the worker thread) waits for progress()
        self.services = []
        # the blocking calls' own lane (snapshots, the end of a run, strategies that only
        # offer the blocking run): the topology's communicators
        self.default_channel = Channel.default(topology, counters)
        # the exchanges' numeric work, on a thread of its own (offload.py)
        self.offload = Offload()

    def close(self):
        self.offload.close()

    def progress(self, extra=()):
        """Test ``extra`` and every service's requests in one call into MPI (which moves them
        all on; completed ones become null), then let the services whose requests completed
        take them. Whether anything completed."""
        requests = list(extra)
        spans = []
        for service in self.services:
            start = len(requests)
            requests.extend(service.requests_in_flight())
            spans.append((service, start, len(requests)))
        if not requests and not any(service.busy() for service, _, _ in spans):
            return False
        done = ()
        if requests:
            done = communicator.test_some(requests)
        moved = bool(done)
        for service, start, end in spans:
            if any(start <= i < end for i in done) or service.busy():
                service.progress()
                moved = True
        return moved

    def wait(self, requests, what, peers=()):
        """Wait for all ``requests``; ``peers`` are the world ranks they depend on."""
        requests = [r for r in requests if r is not None]
        self.wait_until(lambda: not any(requests), what, peers, requests)

    def wait_until(self, condition, what, peers=(), requests=()):
        """Test (serving this rank's shard between tests) until ``condition`` holds, backing
        off to at most 1 ms between tests; past the deadline, name the ranks waited for."""
        deadline = time.monotonic() + self.timeout
        pause = 0.0
        while True:
            self.progress(requests)
            if condition():
                return
            if time.monotonic() > deadline:
                raise self.timed_out(what, peers)
            if pause:
                time.sleep(pause)
            pause = min(pause * 2 or 1e-5, 1e-3)

    def timed_out(self, what, peers):
        names = ", ".join(self.topology.describe_rank(p) for p in sorted(set(peers)))
        return SyncTimeout("%s: no answer within %.0f s from %s"
                           % (what, self.timeout, names or "the other ranks"))

    def drive(self, exchange, what):
        """Run an exchange generator to its end here, waiting where it yields; its result."""
        try:
            step = next(exchange)
            while True:
                if isinstance(step, Wait):
                    self.wait(step.requests, what, step.peers)
                else:
                    self.wait_until(step.condition, what, step.peers)
                step = exchange.send(None)
        except StopIteration as done:
            return done.value
