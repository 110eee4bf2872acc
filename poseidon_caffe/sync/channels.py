"""The on-host collectives (level 1: the devices of one host) as steps of an exchange, on a
``Channel``: the lane of one exchange at a time, with its own duplicate of the host's
communicator. Exchanges in flight together use different channels, so that every
communicator sees its collectives in the same order on every rank. Off-host messages travel on
the strategies' own communicators, told apart by tags that the bucket's index makes unique (a
bucket is never in flight twice)."""
from .steps import Wait


def _host_peers(topology):
    """The other workers of this rank's host (what an on-host collective waits for)."""
    if topology.local is None:
        return []
    return [r for r in range(topology.size)
            if topology.host_of_rank[r] == topology.host and r != topology.rank]


class Channel:
    """``local``: the communicator of this host's devices for one exchange at a time (None
    with one device); ``peers``: the job ranks its collectives wait for."""

    def __init__(self, index, local, peers=(), owned=False):
        self.index = index
        self.local = local if local is not None and local.size > 1 else None
        self.peers = list(peers)
        self.owned = owned

    @classmethod
    def duplicate(cls, index, topology, counters):
        """A channel with a communicator of its own (collective over the host: every worker
        makes its channels in the same order at start-up), counting into ``counters``."""
        local = topology.local
        if local is None or local.size == 1:
            return cls(index, None, owned=True)
        return cls(index, local.dup(counters, local=True), _host_peers(topology), owned=True)

    @classmethod
    def default(cls, topology, counters):
        """The blocking calls' own lane (snapshots, the end of a run, strategies that only
        offer the blocking run): the topology's communicator, counting into ``counters``."""
        local = topology.local
        return cls(-1, None if local is None else local.with_counters(counters, local=True),
                   _host_peers(topology))

    def free(self):
        if self.owned and self.local is not None:
            self.local.free()
        self.local = None

    # -- the steps -------------------------------------------------------------------------
    def sum_to_leader(self, flat, key):
        """Sum ``flat`` over the devices of this host into the leader's ``flat``."""
        if self.local is None:
            return
        yield Wait([self.local.reduce_sum(flat, key)], self.peers)

    def broadcast(self, flat, key):
        """The leader's ``flat`` to every device of this host."""
        if self.local is None:
            return
        yield Wait([self.local.broadcast(flat, key)], self.peers)

    def gather(self, flat, gathered, key):
        """Concatenate every device's ``flat`` (equal sizes) into the leader's ``gathered``."""
        if self.local is None:
            gathered[...] = flat
            return
        yield Wait([self.local.gather(flat, gathered, key)], self.peers)
