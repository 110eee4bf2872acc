"""A Bösen-style parameter server, sharded by rows, with a staleness bound (SSP).

Every parameter blob is cut into contiguous row ranges, one per shard; the range given to
shard 0 rotates with the blob so small blobs do not all land on one shard. The shards live on
the host leaders (one per host, as in Poseidon) or on dedicated server ranks (``server.py``).
Per iteration (clock) a host leader pushes its host's summed gradient rows to the shards that
own them. A shard that has the pushes of every host for clock c averages them, applies the
solver's update to its rows with the history it keeps, and pushes the fresh rows to every
host (server push). A host at clock c may go on once every shard of a blob has applied clock
c - s (s = staleness; 0 is bulk-synchronous).

The shards and their layout in pieces are ``shard_store.py``'s.

A blob's exchange is one push message per piece owned by a remote shard, then a wait
(``Until``) for each such piece's pull, which the progress hook receives into the host's
replica; the engine keeps several blobs' exchanges in flight, so several layers' pushes and
pulls travel at once, and one blob is never in flight twice (its next push follows the
forward that waited for it). Pushes and pulls travel on duplicates of ``topology.ps_comm``
(leaders, then dedicated servers), tagged by piece (``piece_tag``); a third duplicate carries
the control messages to dedicated servers (gather the history for a snapshot, stop).
"""
import numpy as np

from .. import communicator
from ..shard_store import (CONTROL_TAG, SNAPSHOT, STOP, ShardStore, assemble_history,
                           piece_tag, row_layout, setup_message)
from ..steps import Until
from ..strategy import ITEMSIZE, Strategy, register


@register
class ParameterServer(Strategy):
    """The workers' side of the server (and, co-located, the shards of this host)."""
    name = "ps"
    preference = 0
    local_update = False       # the shards apply the update, blob by blob
    bounded_staleness = True

    @classmethod
    def price(cls, M, N, K, P, S, dedicated=False):
        """Off-host bytes sent plus received by one host per iteration.

        Co-located (every host holds a shard): push and pull of the (S-1)/S rows owned
        elsewhere, and, as a shard, the P-1 other hosts' pushes and pulls of its 1/S rows:
        2MN(P+S-2)/S. Dedicated servers: every row goes out and comes back: 2MN."""
        if dedicated:
            return ITEMSIZE * 2.0 * M * N
        return ITEMSIZE * 2.0 * M * N * (P + S - 2) / S

    @classmethod
    def server_load(cls, M, N, P, S):
        """Bytes one dedicated server node moves per iteration: the P hosts' pushes and
        pulls of its 1/S of the rows: 2MN P/S."""
        return ITEMSIZE * 2.0 * M * N * P / S

    @classmethod
    def cost(cls, M, N, K, P, S, dedicated=False):
        """An iteration waits for the busier of a host and a dedicated server node."""
        host = cls.price(M, N, K, P, S, dedicated)
        return max(host, cls.server_load(M, N, P, S)) if dedicated else host

    @classmethod
    def open(cls, engine, items):
        topology = engine.topology
        if topology.dedicated and topology.is_leader:
            # the dedicated servers learn this session's blobs (none: they have nothing to do)
            setup = (setup_message(engine.rule.solver, items, engine.start_clock,
                                   engine.staleness, topology, engine.update,
                                   engine.transport.offload.size)
                     if topology.rank == 0 else None)
            topology.ps_comm.bcast_object(setup, root=0)
        if not items:
            return None
        server = cls(engine.transport, topology, engine.counters, engine.rule, engine.staleness,
                     engine.start_clock, engine.workers,
                     worker_updates=engine.update == "worker")
        for item in items:
            server.add(item, item.data_flat)
        server.seed_servers()
        return server

    def __init__(self, transport, topology, counters, rule, staleness, start_clock, workers,
                 worker_updates=False):
        super().__init__(transport, topology, counters)
        self.worker_updates = bool(worker_updates)
        self.rule = rule
        self.staleness = int(staleness)
        self.start_clock = int(start_clock)
        self.workers = workers
        self.dedicated = topology.dedicated
        self.items = {}
        self.layout = {}          # index -> [(shard, lo, hi)], piece j tagged piece_tag(index, j)
        self.replicas = {}        # index -> flat copy of the blob as last pulled (leaders)
        self.versions = {}        # index -> {piece tag: clocks applied in what we hold}
        self.owner_ranks = {}     # index -> the job ranks of the shards holding its pieces
        self.stages = {}          # (index, piece tag) -> (receive buffer, lo, its shard's rank)
        self.pull_requests = {}   # (index, piece tag) -> its pull's receive
        self.in_flight = []       # (request, buffer kept alive until sent)
        self.listed = None        # this side's requests in flight, until one is replaced
        self.push_comm = self.pull_comm = self.control_comm = None
        self.store = None
        if topology.is_leader:
            comm = topology.ps_comm
            self.push_comm = comm.dup(counters)
            self.pull_comm = comm.dup(counters)
            if self.dedicated:
                self.control_comm = comm.dup()      # control messages: not counted
            else:
                self.store = ShardStore(self.push_comm, self.pull_comm, rule,
                                        topology.num_hosts, workers, self._own_rows_applied,
                                        worker_updates, offload=transport.offload.submit,
                                        offload_size=transport.offload.size)
            transport.services.append(self)

    def add(self, item, flat_data):
        """Register a blob; ``flat_data`` is its current value (the same on every rank)."""
        self.items[item.index] = item
        topo = self.topology
        parts = row_layout(item.index, item.count, item.rows, topo.num_shards)
        self.layout[item.index] = parts
        if not topo.is_leader:
            return
        me = None if self.dedicated else topo.host
        self.replicas[item.index] = flat_data.astype(np.float32, copy=True)
        self.versions[item.index] = {piece_tag(item.index, j): self.start_clock
                                     for j in range(len(parts))}
        self.owner_ranks[item.index] = sorted({topo.shard_job_ranks[s] for s, _, _ in parts})
        history = self.rule.initial_history(item.index)
        for j, (shard, lo, hi) in enumerate(parts):
            tag = piece_tag(item.index, j)
            if shard == me:
                sources = [h for h in range(topo.num_hosts) if h != me]
                self.store.add(tag, item.index, item.name, lo, hi, flat_data[lo:hi],
                               [h[lo:hi] for h in history], sources, self.start_clock)
            else:
                stage = np.empty(hi - lo, dtype=np.float32)
                source = topo.shard_comm_ranks[shard]
                self.stages[(item.index, tag)] = (stage, lo, source)
                self.pull_requests[(item.index, tag)] = self.pull_comm.irecv(stage, source, tag)
        self.listed = None

    def seed_servers(self):
        """Rank 0 hands every dedicated server the rows it owns: the blobs' values and the
        solver's history (restored from a snapshot, or zero), after the servers learnt the
        items from the set-up message."""
        topo = self.topology
        if not self.dedicated or topo.rank != 0:
            return
        pieces = [dict() for _ in range(topo.num_servers)]
        for index, parts in self.layout.items():
            history = self.rule.initial_history(index)
            for j, (shard, lo, hi) in enumerate(parts):
                pieces[shard][piece_tag(index, j)] = (lo, hi, self.replicas[index][lo:hi].copy(),
                                                      [h[lo:hi].copy() for h in history])
        for shard, piece in enumerate(pieces):
            self.control_comm.send_object(piece, topo.shard_comm_ranks[shard], CONTROL_TAG)

    # -- worker side --------------------------------------------------------------------------
    def run(self, bucket, payloads, clock, what):
        return self.transport.drive(self.start(bucket, payloads, clock, what,
                                               self.transport.default_channel), what)

    def start(self, bucket, payloads, clock, what, channel):
        """Push the gradients, pull the shards' weights into the items (one blob a bucket)."""
        for item, flat_grad in zip(bucket.items, payloads):
            read = yield from self.exchange(channel, item, flat_grad, item.data_flat, clock)
            self.stale_reads[item.index] = max(self.stale_reads.get(item.index, 0), read)
        return None

    def exchange(self, channel, item, flat_grad, data_out, clock):
        """Push this worker's gradient for ``clock``; leave in ``data_out`` the blob's value
        from the shards, at most ``staleness`` clocks behind (the steps of an exchange: one
        push message per remote shard, then the wait for each shard's pull). Returns the
        staleness read."""
        key = item.name
        topo = self.topology
        yield from channel.sum_to_leader(flat_grad, key)
        staleness_read = 0
        if topo.is_leader:
            me = None if self.dedicated else topo.host
            for j, (shard, lo, hi) in enumerate(self.layout[item.index]):
                tag = piece_tag(item.index, j)
                if shard == me:
                    self.store.deposit(tag, clock, flat_grad[lo:hi])
                else:
                    piece = flat_grad[lo:hi]
                    self.in_flight.append((self.push_comm.isend(
                        piece, topo.shard_comm_ranks[shard], tag, key), piece))
                    self.listed = None
            needed = clock + 1 - self.staleness
            versions = self.versions[item.index]
            if min(versions.values()) < needed:
                yield Until(lambda: min(versions.values()) >= needed,
                            self.owner_ranks[item.index])
            staleness_read = clock + 1 - min(versions.values())
            replica = self.replicas[item.index]
            # bounded staleness: pulls of older clocks may still land in the replica, so
            # the copy is taken here, between them
            offload = self.transport.offload
            yield from offload.computed(lambda: data_out.__setitem__(Ellipsis, replica),
                                        item.count if self.staleness == 0 else 0)
        yield from channel.broadcast(data_out, key)
        return staleness_read

    def wait(self, clock):
        """With a staleness bound the replicas may lag: bring them to every clock before
        ``clock``."""
        if self.staleness == 0:
            return
        self.wait_current(clock, "waiting for the parameter server to apply iteration %d"
                          % (clock - 1))
        for item in self.items.values():
            flat = item.data_flat
            if self.topology.is_leader:
                flat[...] = self.current_value(item.index)
            self.transport.drive(self.transport.default_channel.broadcast(flat, item.name),
                                 "refreshing " + item.name)

    def wait_current(self, clock, what):
        """Wait until every shard has applied every clock before ``clock`` (for snapshots and
        the end of a run), whatever the staleness bound."""
        if not self.topology.is_leader:
            return
        for index, versions in self.versions.items():
            self.transport.wait_until(lambda v=versions: min(v.values()) >= clock, what,
                                      self.owner_ranks[index])

    def current_value(self, index):
        return self.replicas[index]

    def requests_in_flight(self):
        if self.listed is None:
            self.listed = (list(self.pull_requests.values())
                           + [req for req, _ in self.in_flight])
        if self.store is None:
            return self.listed
        return self.listed + self.store.requests_in_flight()

    def progress(self):
        """Take the pulls that have arrived into the replicas (and, co-located, the pushes
        into this host's shard); every request was tested by the transport."""
        if self.store is not None:
            self.store.progress()
        for (index, tag), req in self.pull_requests.items():
            if req:
                continue
            stage, lo, source = self.stages[(index, tag)]
            self.replicas[index][lo:lo + stage.size] = stage
            self.versions[index][tag] += 1
            # counted as it arrives: a pull posted now is the next clock's
            self.pull_comm.count(self.items[index].name, received=stage.nbytes)
            self.pull_requests[(index, tag)] = self.pull_comm.irecv(stage, source, tag)
        if self.in_flight:
            self.in_flight = [(r, b) for r, b in self.in_flight if r]
        self.listed = None

    def busy(self):
        return self.store is not None and self.store.busy()

    def _own_rows_applied(self, own, fresh):
        self.replicas[own.index][own.lo:own.hi] = fresh
        self.versions[own.index][own.tag] += 1

    # -- snapshots and the end -----------------------------------------------------------------
    def gather_history(self, clock):
        """Rank 0 gets {index: [full history arrays]} assembled from every shard, as they stand
        once clock - 1 is applied (None on the other ranks, and with -ps_update=worker, where
        each worker keeps its own history)."""
        topo = self.topology
        if self.worker_updates:
            return None
        if self.dedicated:
            if topo.rank != 0:
                return None
            parts = []
            for shard in range(topo.num_servers):
                self.control_comm.send_object((SNAPSHOT, clock), topo.shard_comm_ranks[shard],
                                              CONTROL_TAG)
            for shard in range(topo.num_servers):
                source = topo.shard_comm_ranks[shard]
                # probe first, then receive: a history is larger than the fixed buffer that a
                # pickled irecv() posts (32 KiB), and recv() sizes its buffer from the probe
                self.transport.wait_until(
                    lambda: self.control_comm.iprobe(source, CONTROL_TAG),
                    "gathering the server history for the snapshot",
                    [topo.shard_job_ranks[shard]])
                parts.append(self.control_comm.recv_object(source, CONTROL_TAG))
            return assemble_history(self.items, parts)
        if not topo.is_leader:
            return None
        everything = topo.leaders.gather_object(self.store.history(), root=0)
        if everything is None:
            return None
        return assemble_history(self.items, everything)

    def stop_servers(self, clock):
        """Rank 0 tells the dedicated servers that the session ends after ``clock`` - 1."""
        topo = self.topology
        if self.dedicated and topo.rank == 0:
            for shard in range(topo.num_servers):
                self.control_comm.send_object((STOP, clock), topo.shard_comm_ranks[shard],
                                              CONTROL_TAG)

    def close(self, clock=None):
        """With ``clock``: first let the shards apply every clock before it, and tell dedicated
        servers that the session is over."""
        if clock is not None:
            what = "finishing the parameter server"
            self.wait_current(clock, what)
            if self.topology.leaders is not None:
                req = self.topology.leaders.ibarrier()
                self.transport.wait([req], what, self.topology.leader_ranks)
            self.stop_servers(clock)
        for req in self.pull_requests.values():
            if req:
                communicator.cancel(req)
        for req, _ in self.in_flight:
            communicator.wait(req)
        self.in_flight = []
        self.pull_requests.clear()
        if self.store is not None:
            self.store.close()
        if self.push_comm is not None:
            self.transport.services.remove(self)
            for comm in (self.push_comm, self.pull_comm, self.control_comm):
                if comm is not None:
                    comm.free()
            self.push_comm = self.pull_comm = self.control_comm = None
