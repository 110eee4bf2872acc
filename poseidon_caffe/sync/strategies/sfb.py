"""Sufficient-factor broadcast for InnerProduct weights (Poseidon's SFB).

The gradient of an InnerProduct weight is a sum of outer products: dW = D^T A, with D the top
diff (K x N) and A the bottom data (K x M) of the batch. Instead of the M x N matrix, each
worker hands its factors to its peers; every worker stacks all factors and rebuilds the summed
gradient itself, then applies the same update to its replica. Level 1 gathers the factors of the
devices of a host into its leader; level 2 exchanges the hosts' factors between leaders; level 1
again gives every device the stacked factors. The factors of several layers travel at once,
told apart by tags from the layer's bucket.

On a device rank (``device_transfers.py``) the factors are read off the device into pinned rows, and
the stacked factors of every worker are left in the item's pinned buffer: the compute thread
rebuilds the gradient there with one GEMM and applies the solver's device update before the
layer's next forward. With clip_gradients the global norm needs every summed gradient on the
host at once, so there the product is taken on the host as on a CPU rank.
"""
import numpy as np

from ..dwbp import SyncError
from ..strategy import ITEMSIZE, Strategy, register
from ..steps import Wait


@register
class SufficientFactors(Strategy):
    name = "sfb"
    preference = 1
    carries_updates = False    # update values are not rank-K: no factors
    follows_svb = True

    @staticmethod
    def carries(item):
        return item.sfb is not None

    @classmethod
    def price(cls, M, N, K, P, S, dedicated=False):
        """Off-host bytes sent plus received by one host: K (M+N) to and from each of P-1 peers."""
        return ITEMSIZE * 2.0 * K * (P - 1) * (M + N)

    @classmethod
    def open(cls, engine, items):
        if not items:
            return None
        return cls(engine.transport, engine.topology, engine.counters, engine.iter_size,
                   transfers=engine.transfers,
                   device_apply=engine.transfers is not None and engine.clip is None)

    def __init__(self, transport, topology, counters, iter_size=1, transfers=None,
                 device_apply=False):
        super().__init__(transport, topology, counters)
        self.iter_size = int(iter_size)
        self.parts = {}            # item index -> [(top diff, bottom data)] of this iteration
        self.peers = topology.leaders.dup(counters) if topology.leaders is not None else None
        self.transfers = transfers   # a device rank's DeviceTransfers: the factors are read there
        self.device_apply = device_apply   # leave the stacked factors for the device

    def capture(self, item):
        # the layer's top diff and bottom data change with the next pass: read them now
        transfers = self.transfers
        read = item.sfb.read if transfers is None else (lambda: transfers.copy_factors(item))
        self.parts.setdefault(item.index, []).append(read())

    def payload(self, item, clock):
        parts = self.parts.pop(item.index, [])
        if len(parts) < self.iter_size:
            raise SyncError("no sufficient factors were captured for %s in iteration %d (its "
                            "layer's backward did not run)" % (item.name, clock))
        if self.transfers is not None:
            # the passes' rows were copied into these pinned buffers, in order: no host work
            # here, as the copies may still be running
            return self.transfers.staged_factors(item)
        return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))

    def run(self, bucket, payloads, clock, what):
        return self.transport.drive(self.start(bucket, payloads, clock, what,
                                               self.transport.default_channel), what)

    def start(self, bucket, payloads, clock, what, channel):
        item = bucket.items[0]
        top_diff, bottom_data = payloads[0]
        if self.device_apply:
            D, A = yield from self.gather(channel, top_diff, bottom_data, bucket.name,
                                          bucket.index)
            rows = D.shape[0]
            # [all top diffs | all bottom data], as the device's GEMM takes them
            stacked = self.transfers.stacked_factors(item)
            stacked[:D.size] = D.reshape(-1)
            stacked[D.size:D.size + A.size] = A.reshape(-1)
            self.transfers.factors_arrived(item, rows)
            return None
        grad = yield from self.aggregate(channel, top_diff, bottom_data, item.sfb.transpose,
                                         bucket.name, bucket.index)
        return [np.ascontiguousarray(grad, dtype=np.float32).reshape(-1)]

    def aggregate(self, channel, top_diff, bottom_data, transpose, key, tag=0):
        """Summed weight gradient over every worker from this worker's factors (the steps of
        an exchange).

        ``top_diff`` is K x N and ``bottom_data`` K x M; the result has the weight's layout:
        N x M, or M x N when the layer's ``transpose`` is set. ``tag`` (the bucket's index)
        keeps its messages apart from other layers' in flight.
        """
        D, A = yield from self.gather(channel, top_diff, bottom_data, key, tag)
        M, N = A.shape[1], D.shape[1]
        grad = yield from self.transport.offload.computed(
            lambda: (A.T @ D) if transpose else (D.T @ A), M * N)
        return grad

    def gather(self, channel, top_diff, bottom_data, key, tag=0):
        """Every worker's factors, stacked in rank order: (all top diffs, all bottom data)."""
        K, N = top_diff.shape
        M = bottom_data.shape[1]
        mine = np.concatenate([top_diff.reshape(-1), bottom_data.reshape(-1)]).astype(np.float32)
        topo = self.topology
        host_factors = np.empty(topo.local_size * mine.size, dtype=np.float32)
        yield from channel.gather(mine, host_factors, key)
        everything = np.empty(topo.num_hosts * host_factors.size, dtype=np.float32)
        if self.peers is not None:
            yield from self._exchange_between_hosts(self.peers, host_factors, everything, key,
                                                    tag)
        yield from channel.broadcast(everything, key)
        stacked = everything.reshape(-1, mine.size)
        return stacked[:, :K * N].reshape(-1, N), stacked[:, K * N:].reshape(-1, M)

    def _exchange_between_hosts(self, comm, host_factors, everything, key, tag):
        """Every leader sends its host's factors to every other leader: 2(P-1) messages."""
        n = host_factors.size
        everything[comm.rank * n:(comm.rank + 1) * n] = host_factors
        reqs = []
        for peer in range(comm.size):
            if peer == comm.rank:
                continue
            reqs.append(comm.isend(host_factors, peer, tag, key))
            reqs.append(comm.irecv(everything[peer * n:(peer + 1) * n], peer, tag, key))
        others = [r for i, r in enumerate(self.topology.leader_ranks) if i != comm.rank]
        yield Wait(reqs, others)

    def close(self, clock=None):
        if self.peers is not None:
            self.peers.free()
            self.peers = None
