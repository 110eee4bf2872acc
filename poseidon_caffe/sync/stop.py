"""One stop for the whole job: every worker's stop or snapshot request, agreed at the iteration
boundary.

A signal reaches the ranks of a job at different moments (or only one of them). At every
iteration boundary each rank hands its pending request (none, snapshot, stop) to a tiny
non-blocking all-reduce (max) on a communicator of its own; the job's answer for boundary ``n``
is read at boundary ``n + lag`` and acted on by every rank there, so all of them snapshot or
stop after the same iteration. ``lag`` is the staleness bound plus one: by then every other
worker has passed boundary ``n`` anyway (this rank has waited for the gradients it sent just
before), so reading the answer does not make a rank wait where training would not.

One signal sent to every rank (to mpiexec, to the launcher) can reach them on either side of a
boundary. So the all-reduce carries each rank's request in a slot of its own, and rank 0's
clock: a snapshot agreed within ``COALESCE_SECONDS`` (or ``COALESCE_BOUNDARIES`` boundaries) of
the previous one, and asked only by ranks that did not ask for that one, is the same signal
arriving late, and is not taken again.
Every rank decides this from the same answers, so all of them skip it or none does.

The MPI calls run on the communication thread, like every other one after start-up: the
compute thread only queues its request and reads answers the communication thread has already
collected while it polled its exchanges (the transport's progress hook). The traffic (8 bytes
per rank and boundary, plus rank 0's clock) is control, not gradients: the sync byte counters
do not count it, so the measured bytes still equal the plan's.
"""
import time

import numpy as np

from ..solver import signals

CODES = {signals.NONE: 0, signals.SNAPSHOT: 1, signals.STOP: 2}
ACTIONS = {code: action for action, code in CODES.items()}
COALESCE_SECONDS = 1.0
COALESCE_BOUNDARIES = 2


class JobDecision:
    """The job's action at a boundary from every rank's code and rank 0's clock (the same
    answer, so the same decision, on every rank). A snapshot asked soon after the last one by
    ranks that did not ask for that one is the same signal reaching them a boundary later
    (one Ctrl-C or SIGHUP to the launcher reaches every rank, not all at one boundary): it is
    not taken twice."""

    def __init__(self):
        self.last_snapshot = None  # (rank 0's clock, ranks that asked, boundary) of the last

    def decide(self, answer, boundary):
        """``answer``: the all-reduced codes of every rank, then rank 0's clock (ms)."""
        codes, clock = answer[:-1], answer[-1] / 1000.0
        action = ACTIONS[int(codes.max())]
        if action != signals.SNAPSHOT:
            return action
        asking = frozenset(np.flatnonzero(codes == CODES[signals.SNAPSHOT]).tolist())
        last = self.last_snapshot
        # soon after: within the clock's window, or the next COALESCE_BOUNDARIES boundaries
        # (on a loaded host one iteration can outlast the window)
        soon = last is not None and (clock - last[0] < COALESCE_SECONDS or
                                     boundary - last[2] <= COALESCE_BOUNDARIES)
        if soon and not asking & last[1]:
            # the previous snapshot's signal, reaching these ranks a boundary later
            self.last_snapshot = (last[0], last[1] | asking, last[2])
            return signals.NONE
        self.last_snapshot = (clock, asking, boundary)
        return action


class StopAgreement:
    """``requested_action()`` returns the same action on every worker at the same boundary.

    ``scheduler`` runs functions on the communication thread (``post``: without waiting;
    ``call``: waiting for the result); ``transport`` tests its requests with every other
    service's while the communication thread waits (this object is one of its services).
    """

    def __init__(self, comm, local_action, scheduler, transport, lag=1):
        self.comm = comm.dup()
        self.local_action = local_action
        self.scheduler = scheduler
        self.transport = transport
        self.lag = max(1, int(lag))
        self.boundary = 0
        self.requests = {}        # boundary -> (send, recv, request): communication thread
        self.answers = {}         # boundary -> per-rank codes and rank 0's clock (ms)
        self.decision = JobDecision()
        transport.services.append(self)

    # -- compute thread ------------------------------------------------------------------
    def requested_action(self):
        """Queue this rank's request for this boundary; return the job's answer for the
        boundary ``lag`` earlier (none before that)."""
        self.boundary += 1
        boundary, code = self.boundary, CODES[self.local_action()]
        self.scheduler.post(lambda: self._start(boundary, code))
        asked = boundary - self.lag
        if asked < 1:
            return signals.NONE
        if asked not in self.answers:
            # not collected yet: have the communication thread wait for it after what it is
            # doing, and take the answer as soon as any of its polls collects it
            self.scheduler.post(lambda: self._finish(asked))
            self.scheduler.wait_for(lambda: asked in self.answers, self._what(asked))
        return self.decision.decide(self.answers.pop(asked), asked)

    def close(self):
        """Complete what is still in flight (every worker started as many), then let go."""
        def finish_all():
            for boundary in sorted(self.requests):
                self._finish(boundary)
            self.transport.services.remove(self)
            self.comm.free()
        self.scheduler.call(finish_all)
        self.answers.clear()

    # -- communication thread ------------------------------------------------------------
    def _start(self, boundary, code):
        # one slot per rank, then rank 0's clock in milliseconds (the others send 0)
        send = np.zeros(self.comm.size + 1, dtype=np.int64)
        send[self.comm.rank] = code
        if self.comm.rank == 0:
            send[-1] = int(time.monotonic() * 1000)
        recv = np.zeros_like(send)
        self.requests[boundary] = (send, recv, self.comm.iallreduce_max(send, recv))
        self.transport.progress()

    def requests_in_flight(self):
        return [request for _, _, request in self.requests.values()]

    @staticmethod
    def busy():
        return False

    def progress(self):
        """Collect the answers whose all-reduce has completed (the transport tested them)."""
        collected = False
        for boundary in list(self.requests):
            _, recv, request = self.requests[boundary]
            if not request:
                del self.requests[boundary]
                self.answers[boundary] = recv
                collected = True
        if collected:
            self.scheduler.wake()

    def _finish(self, boundary):
        self.transport.wait_until(lambda: boundary not in self.requests, self._what(boundary),
                                  [r for r in range(self.comm.size) if r != self.comm.rank])

    @staticmethod
    def _what(boundary):
        return "agreeing on stop and snapshot requests (boundary %d of this run)" % boundary
