"""Row shards of parameter blobs, as a Bösen-style parameter server keeps them: the layout of
a blob's rows over the shards, in pieces, and the store of the shards one process holds (a
host leader co-located with its workers, or a dedicated server rank, ``server.py``); also the
set-up message that tells dedicated servers a session's blobs. The workers' side of the
exchange is the ``ps`` strategy (``strategies/ps.py``).

Every parameter blob is cut into contiguous row ranges, one per shard; the range given to
shard 0 rotates with the blob so small blobs do not all land on one shard. A shard that has
the pushes of every host for clock c averages them, applies the solver's update to its rows
with the history it keeps, and pushes the fresh rows to every host (server push).

A shard's rows of a blob travel in pieces of at most ``PIECE_VALUES`` values, each a message
of its own: a shard updates a piece and sends it back as soon as every host's push of that
piece is in, so the pulls of the first pieces travel while the last ones are still pushed.
Measured between two hosts at 100 Mbit/s (MPICH over TCP): a 4 MB push each way and then a
4 MB pull each way, one message each, took 3 times the wire time of 4 MB in step, and the
engine's hosts drifted out of step (4 times); in 512 KB pieces the same took the 2 times the
bytes need, in step or not.
"""
import collections
import functools

import numpy as np

from . import communicator
from .offload import OFFLOAD_SIZE

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

    def __init__(self, push_comm, pull_comm, rule, num_hosts, workers,
                 on_applied=None, worker_updates=False, offload=None,
                 offload_size=OFFLOAD_SIZE):
        self.worker_updates = bool(worker_updates)   # pushes are update values: add them
        self.push_comm = push_comm
        self.pull_comm = pull_comm
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
            own.requests[src] = self.push_comm.irecv(own.buffers[src], src, tag)
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
            self.in_flight.append((self.pull_comm.isend(fresh, dest, own.tag, own.name),
                                   fresh))
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
        requests = self.requests_in_flight()
        if (requests and communicator.test_some(requests)) or self.busy():
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
                # counted as it arrives: the receive posted now is the next clock's
                self.push_comm.count(own.name, received=own.buffers[src].nbytes)
                self.deposit(tag, clock, own.buffers[src])
                taken += 1
                own.requests[src] = self.push_comm.irecv(own.buffers[src], src, tag)
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
                    communicator.cancel(req)
        for future, _ in self.applying:
            future.result()
        self.applying.clear()
        for req, _ in self.in_flight:
            communicator.wait(req)
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


def setup_message(solver, items, start_clock, staleness, topology, update="server",
                  offload_size=OFFLOAD_SIZE):
    """What rank 0 tells the dedicated servers at the start of a session."""
    net = solver.net
    return {
        "param": solver.param.SerializeToString(), "kind": solver.type,
        "items": [(it.index, it.name, it.count, it.rows, net.params_lr[it.index],
                   net.params_weight_decay[it.index]) for it in items],
        "start_clock": int(start_clock), "current_step": int(solver.current_step),
        "staleness": int(staleness), "workers": topology.size, "hosts": topology.num_hosts,
        "update": update, "offload_size": int(offload_size),
    }
