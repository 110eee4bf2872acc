"""Point-to-point and collective waits over MPI, with byte counting and a deadline.

Every wait polls its requests and, between polls, lets the parameter-server shard of this rank
make progress (so a rank that waits for its peers still serves them). A wait that passes its
deadline raises SyncTimeout naming the ranks it waited for, instead of hanging.
"""
import time

from mpi4py import MPI


class SyncTimeout(RuntimeError):
    pass


class Transport:
    def __init__(self, topology, counters, timeout=600.0):
        self.topology = topology
        self.counters = counters
        self.timeout = float(timeout)
        self.progress_hooks = []

    def progress(self):
        for hook in self.progress_hooks:
            hook()

    def wait(self, requests, what, peers=()):
        """Wait for all ``requests``; ``peers`` are the world ranks they depend on."""
        requests = [r for r in requests if r is not None]
        self.wait_until(lambda: not requests or MPI.Request.Testall(requests), what, peers)
        self.progress()

    def wait_until(self, condition, what, peers=()):
        """Poll ``condition`` (serving this rank's shard between polls) until it holds, backing
        off to at most 1 ms between polls; past the deadline, name the ranks waited for."""
        deadline = time.monotonic() + self.timeout
        pause = 0.0
        while True:
            self.progress()
            if condition():
                return
            if time.monotonic() > deadline:
                names = ", ".join(self.topology.describe_rank(p) for p in sorted(set(peers)))
                raise SyncTimeout("%s: no answer within %.0f s from %s"
                                  % (what, self.timeout, names or "the other ranks"))
            if pause:
                time.sleep(pause)
            pause = min(pause * 2 or 1e-5, 1e-3)

    # -- on-host collectives (level 1) ------------------------------------------------------
    def local_sum_to_leader(self, flat, key, what):
        """Sum ``flat`` over the devices of this host into the leader's ``flat``."""
        local = self.topology.local
        if local.size == 1:
            return
        nbytes = flat.nbytes
        if local.rank == 0:
            req = local.Ireduce(MPI.IN_PLACE, flat, op=MPI.SUM, root=0)
            self.counters.add(key, received=nbytes * (local.size - 1), local=True)
        else:
            req = local.Ireduce(flat, None, op=MPI.SUM, root=0)
            self.counters.add(key, sent=nbytes, local=True)
        self.wait([req], what, self._local_peers())

    def local_broadcast(self, flat, key, what):
        local = self.topology.local
        if local.size == 1:
            return
        nbytes = flat.nbytes
        req = local.Ibcast(flat, root=0)
        if local.rank == 0:
            self.counters.add(key, sent=nbytes * (local.size - 1), local=True)
        else:
            self.counters.add(key, received=nbytes, local=True)
        self.wait([req], what, self._local_peers())

    def local_gather_to_leader(self, flat, gathered, key, what):
        """Concatenate every device's ``flat`` (equal sizes) into the leader's ``gathered``."""
        local = self.topology.local
        if local.size == 1:
            gathered[...] = flat
            return
        req = local.Igather(flat, gathered if local.rank == 0 else None, root=0)
        if local.rank == 0:
            self.counters.add(key, received=flat.nbytes * (local.size - 1), local=True)
        else:
            self.counters.add(key, sent=flat.nbytes, local=True)
        self.wait([req], what, self._local_peers())

    def _local_peers(self):
        topo = self.topology
        return [r for r in range(topo.size)
                if topo.host_of_rank[r] == topo.host and r != topo.rank]
