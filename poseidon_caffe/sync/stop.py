"""One stop for the whole job: every worker's stop or snapshot request, agreed at the iteration
boundary.

A signal reaches the ranks of a job at different moments (or only one of them). Each rank hands
its pending request (none, snapshot, stop) to a tiny non-blocking all-reduce (max) started at
every iteration boundary, on a communicator of its own; the combined answer of boundary ``n``
is read at boundary ``n + lag`` and acted on by every rank there, so all of them snapshot or
stop after the same iteration. ``lag`` is the staleness bound plus one: by then every other
worker has necessarily passed boundary ``n`` (it has sent the gradients this rank already
waited for), so reading the answer never makes a rank wait where training would not. The
traffic (4 bytes per rank and iteration) is control, not gradients: it is not counted in the
sync byte counters, so the measured bytes still equal the plan's.
"""
import collections
import time

import numpy as np
from mpi4py import MPI

from ..solver import signals
from .transport import SyncTimeout

CODES = {signals.NONE: 0, signals.SNAPSHOT: 1, signals.STOP: 2}
ACTIONS = {code: action for action, code in CODES.items()}


class StopAgreement:
    """``requested_action()`` on every worker returns the same action at the same boundary."""

    def __init__(self, comm, local_action, lag=1, timeout=300.0):
        self.comm = comm.Dup()
        self.local_action = local_action
        self.lag = max(1, int(lag))
        self.timeout = float(timeout)
        self.boundary = 0
        self.pending = collections.deque()     # (boundary, send, recv, request)

    def requested_action(self):
        """Post this rank's request for this boundary; return the job's answer of an earlier
        one (none until ``lag`` boundaries have passed)."""
        self.boundary += 1
        send = np.array([CODES[self.local_action()]], dtype=np.int32)
        recv = np.zeros(1, dtype=np.int32)
        request = self.comm.Iallreduce(send, recv, op=MPI.MAX)
        self.pending.append((self.boundary, send, recv, request))
        if len(self.pending) <= self.lag:
            return signals.NONE
        boundary, _, recv, request = self.pending.popleft()
        self._wait(request, boundary)
        return ACTIONS[int(recv[0])]

    def _wait(self, request, boundary):
        deadline = time.monotonic() + self.timeout
        pause = 0.0
        while not request.Test():
            if time.monotonic() > deadline:
                raise SyncTimeout("agreeing on stop and snapshot requests (boundary %d of this "
                                  "run): no answer within %.0f s from the other ranks"
                                  % (boundary, self.timeout))
            if pause:
                time.sleep(pause)
            pause = min(pause * 2 or 1e-5, 1e-3)

    def close(self):
        """Complete what is still in flight (every worker posted as many), then let go."""
        while self.pending:
            boundary, _, _, request = self.pending.popleft()
            self._wait(request, boundary)
        if self.comm is not None:
            self.comm.Free()
            self.comm = None
