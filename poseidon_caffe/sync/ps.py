"""A Bösen-style parameter server, sharded by rows, with a staleness bound (SSP).

Every parameter blob is cut into contiguous row ranges, one per shard; the shards live on the
host leaders (one per host, as in Poseidon), and the range given to shard 0 rotates with the
blob so small blobs do not all land on one shard. Per iteration (clock) a host leader pushes
its host's summed gradient rows to the shards that own them. A shard that has the pushes of
every host for clock c averages them, applies the solver's update to its rows with the history
it keeps, and pushes the fresh rows to every host (server push). A host at clock c may go on
once every shard of a blob has applied clock c - s (s = staleness; 0 is bulk-synchronous).
"""
import numpy as np

ITEMSIZE = 4


class _Shard:
    """The rows [lo, hi) of one blob that this host's shard owns."""

    def __init__(self, index, lo, hi, data, history, sources, start_clock):
        self.index = index
        self.lo, self.hi = lo, hi
        self.data = data
        self.history = history
        self.sources = sources            # leader-comm ranks that push to this shard
        self.next_clock = {s: start_clock for s in sources}
        self.buffers = {s: np.empty(hi - lo, dtype=np.float32) for s in sources}
        self.requests = {}
        self.pending = {}                  # clock -> [sum, count]
        self.applied = start_clock         # clocks < applied are in self.data


class ParameterServer:
    name = "ps"
    remote_update = True

    @staticmethod
    def price(M, N, K, P, S):
        """Off-host bytes sent plus received by one host when every host holds a shard:
        push and pull of the (S-1)/S rows owned elsewhere, and, as a shard, the P-1 other
        hosts' pushes and pulls of its 1/S rows: 2MN(P+S-2)/S."""
        return ITEMSIZE * 2.0 * M * N * (P + S - 2) / S

    def __init__(self, transport, topology, counters, rule, staleness, start_clock, workers):
        self.transport = transport
        self.topology = topology
        self.counters = counters
        self.rule = rule
        self.staleness = int(staleness)
        self.start_clock = int(start_clock)
        self.workers = workers
        self.items = {}
        self.layout = {}          # index -> [(shard, lo, hi)]
        self.shards = {}          # index -> _Shard owned here
        self.replicas = {}        # index -> flat copy of the blob as last pulled (leaders)
        self.versions = {}        # index -> {shard: clocks applied in what we hold}
        self.stages = {}          # (index, shard) -> receive buffer
        self.pull_requests = {}
        self.in_flight = []       # (request, buffer kept alive until sent)
        self.reads = {}           # index -> worst staleness read (clock - version)
        self.push_comm = self.pull_comm = None
        if topology.is_leader:
            self.push_comm = topology.leaders.Dup()
            self.pull_comm = topology.leaders.Dup()
            transport.progress_hooks.append(self.progress)

    def add(self, item, flat_data):
        """Register a blob; ``flat_data`` is its current value (the same on every rank)."""
        self.items[item.index] = item
        S = self.topology.num_shards
        rows = item.rows
        per_row = item.count // rows
        bounds = [(j * rows) // S for j in range(S + 1)]
        parts = []
        for j in range(S):
            shard = (j + item.index) % S
            lo, hi = bounds[j] * per_row, bounds[j + 1] * per_row
            if hi > lo:
                parts.append((shard, lo, hi))
        self.layout[item.index] = parts
        if not self.topology.is_leader:
            return
        me = self.topology.host
        self.replicas[item.index] = flat_data.astype(np.float32, copy=True)
        self.versions[item.index] = {shard: self.start_clock for shard, _, _ in parts}
        self.reads[item.index] = 0
        history = self.rule.initial_history(item.index)
        for shard, lo, hi in parts:
            if shard == me:
                rows_history = [h[lo:hi].astype(np.float32, copy=True) for h in history]
                sources = [h for h in range(self.topology.num_hosts) if h != me]
                own = _Shard(item.index, lo, hi, flat_data[lo:hi].astype(np.float32, copy=True),
                             rows_history, sources, self.start_clock)
                self.shards[item.index] = own
                for src in sources:
                    own.requests[src] = self.push_comm.Irecv(own.buffers[src], source=src,
                                                             tag=item.index)
            else:
                stage = np.empty(hi - lo, dtype=np.float32)
                self.stages[(item.index, shard)] = stage
                self.pull_requests[(item.index, shard)] = self.pull_comm.Irecv(
                    stage, source=shard, tag=item.index)

    # -- worker side --------------------------------------------------------------------------
    def exchange(self, item, flat_grad, data_out, clock, what):
        """Push this worker's gradient for ``clock``; leave in ``data_out`` the blob's value
        from the shards, at most ``staleness`` clocks behind. Returns the staleness read."""
        key = item.name
        self.transport.local_sum_to_leader(flat_grad, key, what)
        staleness_read = 0
        if self.topology.is_leader:
            for shard, lo, hi in self.layout[item.index]:
                if shard == self.topology.host:
                    self._deposit(self.shards[item.index], clock, flat_grad[lo:hi])
                else:
                    piece = flat_grad[lo:hi]
                    self.in_flight.append((self.push_comm.Isend(piece, dest=shard,
                                                                tag=item.index), piece))
                    self.counters.add(key, sent=piece.nbytes)
            needed = clock + 1 - self.staleness
            versions = self.versions[item.index]
            owners = [self.topology.leader_ranks[s] for s in versions]
            self.transport.wait_until(lambda: min(versions.values()) >= needed, what, owners)
            staleness_read = clock + 1 - min(versions.values())
            self.reads[item.index] = max(self.reads[item.index], staleness_read)
            data_out[...] = self.replicas[item.index]
        self.transport.local_broadcast(data_out, key, what)
        return staleness_read

    def wait_current(self, clock, what):
        """Wait until every shard has applied every clock before ``clock`` (for snapshots and
        the end of a run), whatever the staleness bound."""
        if not self.topology.is_leader:
            return
        for index, versions in self.versions.items():
            owners = [self.topology.leader_ranks[s] for s in versions]
            self.transport.wait_until(lambda v=versions: min(v.values()) >= clock, what, owners)

    def current_value(self, index):
        return self.replicas[index]

    # -- shard side ---------------------------------------------------------------------------
    def progress(self):
        for index, own in self.shards.items():
            key = self.items[index].name
            for src in own.sources:
                req = own.requests[src]
                while req.Test():
                    clock = own.next_clock[src]
                    own.next_clock[src] += 1
                    self.counters.add(key, received=own.buffers[src].nbytes)
                    self._deposit(own, clock, own.buffers[src])
                    req = own.requests[src] = self.push_comm.Irecv(own.buffers[src], source=src,
                                                                  tag=index)
        for (index, shard), req in list(self.pull_requests.items()):
            while req.Test():
                stage = self.stages[(index, shard)]
                lo, hi = self._range(index, shard)
                self.replicas[index][lo:hi] = stage
                self.versions[index][shard] += 1
                self.counters.add(self.items[index].name, received=stage.nbytes)
                req = self.pull_requests[(index, shard)] = self.pull_comm.Irecv(
                    stage, source=shard, tag=index)
        if self.in_flight:
            self.in_flight = [(r, b) for r, b in self.in_flight if not r.Test()]

    def _range(self, index, shard):
        for s, lo, hi in self.layout[index]:
            if s == shard:
                return lo, hi
        raise KeyError((index, shard))

    def _deposit(self, own, clock, grad_rows):
        slot = own.pending.get(clock)
        if slot is None:
            own.pending[clock] = [grad_rows.astype(np.float32, copy=True), 1]
        else:
            slot[0] += grad_rows
            slot[1] += 1
        hosts = self.topology.num_hosts
        while own.applied in own.pending and own.pending[own.applied][1] == hosts:
            total, _ = own.pending.pop(own.applied)
            total *= 1.0 / self.workers
            self.rule.apply(own.index, own.data, total, own.history, own.applied)
            own.applied += 1
            key = self.items[own.index].name
            me = self.topology.host
            self.replicas[own.index][own.lo:own.hi] = own.data
            self.versions[own.index][me] += 1
            for dest in own.sources:
                fresh = own.data.copy()
                self.in_flight.append((self.pull_comm.Isend(fresh, dest=dest, tag=own.index),
                                       fresh))
                self.counters.add(key, sent=fresh.nbytes)

    def gather_history(self):
        """Rank 0 gets {index: [full history arrays]} assembled from every shard (collective
        over the host leaders; None elsewhere)."""
        if not self.topology.is_leader:
            return None
        mine = {index: (own.lo, own.hi, [h.copy() for h in own.history])
                for index, own in self.shards.items()}
        everything = self.topology.leaders.gather(mine, root=0)
        if everything is None:
            return None
        out = {}
        for index, item in self.items.items():
            out[index] = None
        for part in everything:
            for index, (lo, hi, hist) in part.items():
                if out[index] is None:
                    out[index] = [np.zeros(self.items[index].count, np.float32) for _ in hist]
                for full, rows in zip(out[index], hist):
                    full[lo:hi] = rows
        return out

    def close(self):
        for own in self.shards.values():
            for req in own.requests.values():
                req.Cancel()
                req.Wait()
        for req in self.pull_requests.values():
            req.Cancel()
            req.Wait()
        for req, _ in self.in_flight:
            req.Wait()
        self.in_flight = []
        self.shards.clear()
        self.pull_requests.clear()
        if self.push_comm is not None:
            self.transport.progress_hooks.remove(self.progress)
            self.push_comm.Free()
            self.pull_comm.Free()
            self.push_comm = self.pull_comm = None
