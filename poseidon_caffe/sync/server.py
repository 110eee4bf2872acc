"""A dedicated parameter-server rank (``-server_ranks=N``): it builds no net, it holds its row
shards of every blob the plan sends through the server, with the solver's history for them,
and serves the host leaders' pushes and pulls until rank 0 says the session is over.

One session follows one ``attach`` of the workers:
1. the set-up message (broadcast by rank 0 over ``ps_comm``): the solver's parameters and
   type, the blobs (index, name, shape, lr and decay multipliers), the start clock, the
   multistep position, the staleness bound, the number of workers and hosts;
2. the rows this shard owns, with their history (sent by rank 0);
3. serve: take pushes, apply the update once every host has pushed a clock (or, with
   ``-ps_update=worker``, add the workers' update values) on a thread of its own, so that
   other blobs' pushes and pulls keep moving meanwhile, push the fresh rows back; on a
   snapshot request send the history once the asked clock is applied; on stop finish the
   sends and return.
A failure anywhere (here or on a worker) ends the whole job through ``failure``.
"""
import time

from .. import log
from ..proto import caffe_pb2
from .counters import ByteCounters
from .offload import OFFLOAD_SIZE, Offload
from ..solver.update_rule import UpdateRule
from .update_rules import ClockedRule, ScheduledRates
from .shard_store import CONTROL_TAG, SNAPSHOT, STOP, ShardStore, piece_tag, row_layout


class _ItemShape:
    def __init__(self, index, name, count, rows):
        self.index, self.name, self.count, self.rows = index, name, count, rows


def serve(topology):
    """Run one session on a dedicated server rank; returns its statistics."""
    comm = topology.ps_comm
    setup = comm.bcast_object(None, root=0)
    shard = topology.server_index
    if not setup["items"]:
        log.info("Server %d: no blob goes through the parameter server in this session",
                 shard)
        return {"rank": topology.rank, "server": shard, "iterations": 0, "measured": {},
                "blobs": {}}
    param = caffe_pb2.SolverParameter()
    param.ParseFromString(setup["param"])
    start = setup["start_clock"]
    rates = ScheduledRates(param, start, setup["current_step"], keep=setup["staleness"] + 64)
    lr_mult = {index: lr for index, _, _, _, lr, _ in setup["items"]}
    decay_mult = {index: decay for index, _, _, _, _, decay in setup["items"]}
    rule = ClockedRule(UpdateRule(param, setup["kind"], lr_mult, decay_mult), rates)
    hosts = setup["hosts"]
    counters = ByteCounters()
    push_comm, pull_comm = comm.dup(counters), comm.dup(counters)
    control = comm.dup()                # control messages: not counted
    # the updates run on a thread of their own: pushes and other blobs' pulls keep moving
    # while a large one is computed
    updates = Offload()
    store = ShardStore(push_comm, pull_comm, rule, hosts, setup["workers"],
                       worker_updates=setup.get("update") == "worker", offload=updates.submit,
                       offload_size=setup.get("offload_size", OFFLOAD_SIZE))
    rows = control.recv_object(0, CONTROL_TAG)
    shapes = {}
    for index, name, count, nrows, _, _ in setup["items"]:
        shapes[index] = _ItemShape(index, name, count, nrows)
        for j, (owner, lo, hi) in enumerate(row_layout(index, count, nrows,
                                                      topology.num_servers)):
            if owner != shard:
                continue
            tag = piece_tag(index, j)
            lo_sent, hi_sent, data, history = rows[tag]
            if (lo_sent, hi_sent) != (lo, hi):
                raise RuntimeError("server %d: rank 0 sent rows [%d, %d) of %s, the layout "
                                   "gives this shard [%d, %d)" % (shard, lo_sent, hi_sent, name,
                                                                  lo, hi))
            store.add(tag, index, name, lo, hi, data, history, list(range(hosts)), start)
    log.info("Server %d (rank %d): %d row pieces, %d hosts push to it, from iteration %d",
             shard, topology.rank, len(store.shards), hosts, start)
    request = control.irecv_object(0, CONTROL_TAG)
    waiting = None
    pause = 0.0
    clock = start
    try:
        while True:
            busy = store.poll()
            if waiting is None:
                done, message = request.test()
                if done:
                    waiting = message
            if waiting is not None and store.applied_all(waiting[1]):
                kind, clock = waiting
                if kind == SNAPSHOT:
                    control.send_object(store.history(), 0, CONTROL_TAG)
                    request = control.irecv_object(0, CONTROL_TAG)
                    waiting = None
                elif kind == STOP:
                    while not store.sends_done():
                        store.poll()
                        time.sleep(1e-4)
                    break
            if busy:
                pause = 0.0
            else:
                # back off from a busy spin to at most 1 ms between polls: the machine is shared
                if pause:
                    time.sleep(pause)
                pause = min(pause * 2 or 1e-5, 1e-3)
    finally:
        store.close()
        updates.close()
        for c in (push_comm, pull_comm, control):
            c.free()
    counters.end_iteration(clock - start)
    measured = counters.per_iteration(window=False)
    log.info("Server %d: %d iterations served", shard, clock - start)
    return {"rank": topology.rank, "server": shard, "iterations": clock - start,
            "measured": measured,
            "blobs": {index: [[lo, hi] for owner, lo, hi in
                              row_layout(index, s.count, s.rows, topology.num_servers)
                              if owner == shard] for index, s in shapes.items()}}
