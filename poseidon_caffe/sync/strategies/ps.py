"""A Bösen-style parameter server, sharded by rows, with a staleness bound (SSP).

Every parameter blob is cut into contiguous row ranges, one per shard; the range given to
shard 0 rotates with the blob so small blobs do not all land on one shard. The shards live on
the host leaders (one per host, as in Poseidon) or on dedicated server ranks (``server.py``).
Per iteration (clock) a host leader pushes its host's summed gradient rows to the shards that
own them. A shard that has the pushes of every host for clock c averages them, applies the
solver's update to its rows with the history it keeps, and pushes the fresh rows to every
host (server push). A host at clock c may go on once every shard of a blob has applied clock
c - s (s = staleness; 0 is bulk-synchronous).

A shard's rows of a blob travel in pieces of at most ``PIECE_VALUES`` values, each a message
of its own: a shard updates a piece and sends it back as soon as every host's push of that
piece is in, so the pulls of the first pieces travel while the last ones are still pushed.
Measured between two hosts at 100 Mbit/s (MPICH over TCP): a 4 MB push each way and then a
4 MB pull each way, one message each, took 3 times the wire time of 4 MB in step, and the
engine's hosts drifted out of step (4 times); in 512 KB pieces the same took the 2 times the
bytes need, in step or not.

A blob's exchange is one push message per piece owned by a remote shard, then a wait
(``Until``) for each such piece's pull, which the progress hook receives into the host's
replica; the engine keeps several blobs' exchanges in flight, so several layers' pushes and
pulls travel at once, and one blob is never in flight twice (its next push follows the
forward that waited for it). Pushes and pulls travel on duplicates of ``topology.ps_comm``
(leaders, then dedicated servers), tagged by piece (``piece_tag``); a third duplicate carries
the control messages to dedicated servers (gather the history for a snapshot, stop).
"""
import collections
import functools

import numpy as np

from ..strategy import ITEMSIZE, Strategy, register
from ..transport import OFFLOAD_SIZE, Until

CONTROL_TAG = 1
SNAPSHOT, STOP = "snapshot", "stop"
PIECE_VALUES = 1 << 18     # the most values (1 MiB) a push or pull message carries
PIECE_TAGS = 1 << 12       # tags per blob: piece j of blob i is tagged i * PIECE_TAGS + j


def piece_tag(index, number):
    return index * PIECE_TAGS + number


def row_layout(index, count, rows, num_shards, piece_values=None):
    """[(shard, lo, hi)]: the flat ranges of a blob of ``rows`` rows, piece ``j`` of the list
    tagged ``piece_tag(index, j)``: each shard's contiguous rows, cut into near-equal pieces
    of whole rows, at most ``piece_values`` values each (one row where a row is larger)."""
    per_row = count // rows
    # (read here, not bound at definition: a test may set it smaller)
    piece_values = PIECE_VALUES if piece_values is None else piece_values
    # no blob needs more pieces than a blob has tags
    piece_values = max(piece_values, -(-count // (PIECE_TAGS - num_shards)))
    rows_per_piece = max(1, piece_values // max(per_row, 1))
    bounds = [(j * rows) // num_shards for j in range(num_shards + 1)]
    parts = []
    for j in range(num_shards):
        shard = (j + index) % num_shards
        first, last = bounds[j], bounds[j + 1]
        pieces = -(-(last - first) // rows_per_piece)
        for k in range(pieces):
            lo = first + (k * (last - first)) // pieces
            hi = first + ((k + 1) * (last - first)) // pieces
            if hi > lo:
                parts.append((shard, lo * per_row, hi * per_row))
    return parts


class _Shard:
    """The rows [lo, hi) of one blob that this process's shard owns: one piece, ``tag``."""

    def __init__(self, tag, index, name, lo, hi, data, history, sources, start_clock):
        self.tag = tag
        self.index = index
        self.name = name
        self.lo, self.hi = lo, hi
        self.data = data
        self.history = history
        self.sources = sources            # ps_comm ranks that push to this shard remotely
        self.next_clock = {s: start_clock for s in sources}
        self.buffers = {s: np.empty(hi - lo, dtype=np.float32) for s in sources}
        self.requests = {}
        self.pending = {}                  # clock -> [sum, count]
        self.applied = start_clock         # clocks < applied are in self.data
        self.next_apply = start_clock      # the next clock whose update is to be started


class ShardStore:
    """The shards one process holds: takes pushes, applies the update once every host has
    pushed a clock, and sends the fresh rows to every remote host.

    ``offload(fn)`` (returning a future) runs the updates on another thread, so that the
    thread serving the shards goes on taking pushes and sending other blobs' pulls while a
    large update is computed; the updates still run one at a time, in the order started."""

    def __init__(self, push_comm, pull_comm, counters, rule, num_hosts, workers,
                 on_applied=None, worker_updates=False, offload=None,
                 offload_size=OFFLOAD_SIZE):
        self.worker_updates = bool(worker_updates)   # pushes are update values: add them
        self.push_comm = push_comm
        self.pull_comm = pull_comm
        self.counters = counters
        self.rule = rule
        self.num_hosts = num_hosts
        self.workers = workers
        self.on_applied = on_applied       # a co-located shard refreshes its host's replica
        self.offload = offload
        self.offload_size = offload_size   # smaller shards are updated where they are served
        self.applying = collections.deque()   # (future of the fresh rows, shard), in order
        self.shards = {}                   # piece tag -> _Shard
        self.in_flight = []                # (request, buffer kept alive until sent)
        self.listed = None                 # requests_in_flight(), until one is replaced

    def add(self, tag, index, name, lo, hi, data_rows, history_rows, sources, start_clock):
        own = _Shard(tag, index, name, lo, hi,
                     np.array(data_rows, dtype=np.float32, copy=True),
                     [np.array(h, dtype=np.float32, copy=True) for h in history_rows],
                     sources, start_clock)
        self.shards[tag] = own
        for src in sources:
            own.requests[src] = self.push_comm.Irecv(own.buffers[src], source=src, tag=tag)
        self.listed = None
        return own

    def deposit(self, tag, clock, grad_rows):
        """A push of piece ``tag`` for ``clock``: from this host itself, or received from
        another."""
        own = self.shards[tag]
        slot = own.pending.get(clock)
        if slot is None:
            own.pending[clock] = [grad_rows.astype(np.float32, copy=True), 1]
        else:
            slot[0] += grad_rows
            slot[1] += 1
        while (own.next_apply in own.pending
               and own.pending[own.next_apply][1] == self.num_hosts):
            total, _ = own.pending.pop(own.next_apply)
            job = functools.partial(self._update, own, total, own.next_apply)
            own.next_apply += 1
            if self.offload is None or own.hi - own.lo < self.offload_size:
                self._applied(own, job())
            else:
                self.applying.append((self.offload(job), own))

    def _update(self, own, total, clock):
        """Apply clock ``clock``'s update to the rows; their fresh value (a copy)."""
        if self.worker_updates:
            # Poseidon's rule: the table adds what every worker's solver computed
            own.data -= total
        else:
            total *= 1.0 / self.workers
            self.rule.apply(own.index, own.data, total, own.history, clock)
        return own.data.copy()

    def _applied(self, own, fresh):
        """An update is done: the shard's host sees it, and every remote host gets the fresh
        rows (one copy for every pull)."""
        own.applied += 1
        if self.on_applied is not None:
            self.on_applied(own, fresh)
        for dest in own.sources:
            self.in_flight.append((self.pull_comm.Isend(fresh, dest=dest, tag=own.tag),
                                   fresh))
            self.counters.add(own.name, sent=fresh.nbytes)
            self.listed = None

    def busy(self):
        """Whether an update started on the other thread has finished, for progress()."""
        return bool(self.applying) and self.applying[0][0].done()

    def requests_in_flight(self):
        if self.listed is None:
            self.listed = [req for own in self.shards.values()
                           for req in own.requests.values()]
            self.listed += [req for req, _ in self.in_flight]
        return self.listed

    def poll(self):
        """Test every request of the store (one call into MPI), then take what arrived."""
        from mpi4py import MPI          # here, not at import: the planner loads no MPI
        requests = self.requests_in_flight()
        if (requests and MPI.Request.Testsome(requests)) or self.busy():
            return self.progress()
        return 0

    def progress(self):
        """Send the pulls of the updates done, take every push that has arrived (its request
        tested complete, now null); returns how many of both."""
        taken = 0
        while self.busy():
            future, own = self.applying.popleft()
            self._applied(own, future.result())
            taken += 1
        for tag, own in self.shards.items():
            for src in own.sources:
                if own.requests[src]:
                    continue
                clock = own.next_clock[src]
                own.next_clock[src] += 1
                self.counters.add(own.name, received=own.buffers[src].nbytes)
                self.deposit(tag, clock, own.buffers[src])
                taken += 1
                own.requests[src] = self.push_comm.Irecv(own.buffers[src], source=src,
                                                         tag=tag)
        if self.in_flight:
            self.in_flight = [(r, b) for r, b in self.in_flight if r]
        self.listed = None
        return taken

    def applied_all(self, clock):
        return all(own.applied >= clock for own in self.shards.values())

    def history(self):
        """[(blob index, lo, hi, [history rows])], a piece each."""
        return [(own.index, own.lo, own.hi, [h.copy() for h in own.history])
                for own in self.shards.values()]

    def sends_done(self):
        return not self.in_flight and not self.applying

    def close(self):
        for own in self.shards.values():
            for req in own.requests.values():
                if req:
                    req.Cancel()
                    req.Wait()
        for future, _ in self.applying:
            future.result()
        self.applying.clear()
        for req, _ in self.in_flight:
            req.Wait()
        self.in_flight = []
        self.shards.clear()


def assemble_history(items, parts):
    """{index: [full history arrays]} from the shards' [(index, lo, hi, [rows])] pieces."""
    out = {index: None for index in items}
    for part in parts:
        for index, lo, hi, hist in part:
            if out[index] is None:
                out[index] = [np.zeros(items[index].count, np.float32) for _ in hist]
            for full, rows in zip(out[index], hist):
                full[lo:hi] = rows
    return out


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
        from ..server import setup_message   # server.py builds its shards from this module
        topology = engine.topology
        if topology.dedicated and topology.is_leader:
            # the dedicated servers learn this session's blobs (none: they have nothing to do)
            setup = (setup_message(engine.rule.solver, items, engine.start_clock,
                                   engine.staleness, topology, engine.update,
                                   engine.transport.offload_size)
                     if topology.rank == 0 else None)
            topology.ps_comm.bcast(setup, root=0)
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
            self.push_comm = comm.Dup()
            self.pull_comm = comm.Dup()
            if self.dedicated:
                self.control_comm = comm.Dup()
            else:
                self.store = ShardStore(self.push_comm, self.pull_comm, counters, rule,
                                        topology.num_hosts, workers, self._own_rows_applied,
                                        worker_updates, offload=transport.submit,
                                        offload_size=transport.offload_size)
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
                self.pull_requests[(item.index, tag)] = self.pull_comm.Irecv(
                    stage, source=source, tag=tag)
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
            self.control_comm.send(piece, dest=topo.shard_comm_ranks[shard], tag=CONTROL_TAG)

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
        yield from self.transport.local_sum(channel, flat_grad, key)
        staleness_read = 0
        if topo.is_leader:
            me = None if self.dedicated else topo.host
            for j, (shard, lo, hi) in enumerate(self.layout[item.index]):
                tag = piece_tag(item.index, j)
                if shard == me:
                    self.store.deposit(tag, clock, flat_grad[lo:hi])
                else:
                    piece = flat_grad[lo:hi]
                    self.in_flight.append((self.push_comm.Isend(
                        piece, dest=topo.shard_comm_ranks[shard], tag=tag), piece))
                    self.counters.add(key, sent=piece.nbytes)
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
            yield from self.transport.computed(lambda: data_out.__setitem__(Ellipsis, replica),
                                               item.count if self.staleness == 0 else 0)
        yield from self.transport.local_bcast(channel, data_out, key)
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
            self.transport.local_broadcast(flat, item.name, "refreshing " + item.name)

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
            self.counters.add(self.items[index].name, received=stage.nbytes)
            self.pull_requests[(index, tag)] = self.pull_comm.Irecv(
                stage, source=source, tag=tag)
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
                self.control_comm.send((SNAPSHOT, clock), dest=topo.shard_comm_ranks[shard],
                                       tag=CONTROL_TAG)
            for shard in range(topo.num_servers):
                source = topo.shard_comm_ranks[shard]
                # probe first, then receive: a history is larger than the fixed buffer that a
                # pickled irecv() posts (32 KiB), and recv() sizes its buffer from the probe
                self.transport.wait_until(
                    lambda: self.control_comm.iprobe(source=source, tag=CONTROL_TAG),
                    "gathering the server history for the snapshot",
                    [topo.shard_job_ranks[shard]])
                parts.append(self.control_comm.recv(source=source, tag=CONTROL_TAG))
            return assemble_history(self.items, parts)
        if not topo.is_leader:
            return None
        everything = topo.leaders.gather(self.store.history(), root=0)
        if everything is None:
            return None
        return assemble_history(self.items, everything)

    def stop_servers(self, clock):
        """Rank 0 tells the dedicated servers that the session ends after ``clock`` - 1."""
        topo = self.topology
        if self.dedicated and topo.rank == 0:
            for shard in range(topo.num_servers):
                self.control_comm.send((STOP, clock), dest=topo.shard_comm_ranks[shard],
                                       tag=CONTROL_TAG)

    def close(self, clock=None):
        """With ``clock``: first let the shards apply every clock before it, and tell dedicated
        servers that the session is over."""
        if clock is not None:
            what = "finishing the parameter server"
            self.wait_current(clock, what)
            if self.topology.leaders is not None:
                req = self.topology.leaders.Ibarrier()
                self.transport.wait([req], what, self.topology.leader_ranks)
            self.stop_servers(clock)
        for req in self.pull_requests.values():
            if req:
                req.Cancel()
                req.Wait()
        for req, _ in self.in_flight:
            req.Wait()
        self.in_flight = []
        self.pull_requests.clear()
        if self.store is not None:
            self.store.close()
        if self.push_comm is not None:
            self.transport.services.remove(self)
            for comm in (self.push_comm, self.pull_comm, self.control_comm):
                if comm is not None:
                    comm.Free()
            self.push_comm = self.pull_comm = self.control_comm = None
