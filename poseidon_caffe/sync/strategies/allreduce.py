"""Ring allreduce: the choice beyond Poseidon.

Level 1 sums the gradient over the devices of a host into its leader; level 2 runs a ring over
the host leaders (reduce-scatter, then allgather: each leader sends and receives 2(P-1)/P of the
blob); level 1 again hands the sum to the devices. Every worker then applies the same update
to its replica. Each ring step is one Isend/Irecv pair that the exchange yields on; several
buckets' rings run at once, their messages told apart by tags from the bucket's index.
"""
import numpy as np

from ..strategy import ITEMSIZE, Strategy, register
from ..steps import Wait


@register
class RingAllreduce(Strategy):
    name = "allreduce"
    preference = 2
    fuses = True

    @classmethod
    def price(cls, M, N, K, P, S, dedicated=False):
        """Off-host bytes sent plus received by one host per iteration: 2 MN (P-1)/P each way."""
        return ITEMSIZE * 4.0 * M * N * (P - 1) / P

    def __init__(self, transport, topology, counters):
        super().__init__(transport, topology, counters)
        self.ring = topology.leaders.dup(counters) if topology.leaders is not None else None

    def run(self, bucket, payloads, clock, what):
        return self.transport.drive(self.start(bucket, payloads, clock, what,
                                               self.transport.default_channel), what)

    def start(self, bucket, payloads, clock, what, channel):
        """One fused message for the bucket's blobs; each item's sum is a view into it."""
        flat = payloads[0] if len(payloads) == 1 else np.concatenate(payloads)
        yield from self.reduce(channel, flat, bucket.name, bucket.index)
        sums, offset = [], 0
        for item in bucket.items:
            sums.append(flat[offset:offset + item.count])
            offset += item.count
        return sums

    def aggregate(self, flat, key, what):
        """Sum ``flat`` (a private float32 buffer) over every worker of the job, in place."""
        self.transport.drive(self.reduce(self.transport.default_channel, flat, key), what)
        return flat

    def reduce(self, channel, flat, key, lane=0):
        """The exchange's steps: level 1, the ring over the leaders, level 1 again. ``lane``
        (the bucket's index) keeps the ring's tags apart from other buckets' in flight."""
        yield from channel.sum_to_leader(flat, key)
        if self.ring is not None and self.ring.size > 1:
            yield from self._ring_allreduce(self.ring, flat, key, lane * 2 * self.ring.size)
        yield from channel.broadcast(flat, key)

    def _ring_allreduce(self, ring, flat, key, tag):
        P, r = ring.size, ring.rank
        bounds = [(i * flat.size) // P for i in range(P + 1)]
        chunk = lambda i: flat[bounds[i]:bounds[i + 1]]
        right, left = (r + 1) % P, (r - 1) % P
        peers = [self.topology.leader_ranks[right], self.topology.leader_ranks[left]]
        scratch = np.empty(max(bounds[i + 1] - bounds[i] for i in range(P)), dtype=flat.dtype)
        for step in range(P - 1):
            out, into = chunk((r - step) % P), chunk((r - step - 1) % P)
            incoming = scratch[:into.size]
            reqs = [ring.isend(out, right, tag + step, key),
                    ring.irecv(incoming, left, tag + step, key)]
            yield Wait(reqs, peers)
            into += incoming
        for step in range(P - 1):
            out, into = chunk((r - step + 1) % P), chunk((r - step) % P)
            reqs = [ring.isend(out, right, tag + P + step, key),
                    ring.irecv(into, left, tag + P + step, key)]
            yield Wait(reqs, peers)

    def close(self, clock=None):
        if self.ring is not None:
            self.ring.free()
            self.ring = None
