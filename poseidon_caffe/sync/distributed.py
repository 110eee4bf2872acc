"""``attach(solver, options)``: make a solver one worker of a distributed job.

What it does on every rank: find the topology, give the data layers this worker's shard, write
this rank's log in the output folder (rank 0 also on the console), broadcast rank 0's weights,
build the sync engine over the train net's learnable blobs and hook it to the net (grad-ready,
before-forward), and become the solver's job (``Solver.set_job``, see ``solver/job.py``): it
exchanges the gradients after backward, shares each test pass between the workers
(``Solver.test`` with this worker's shard; outputs summed over the job and averaged), takes
the snapshots (rank 0 writes the model and a solver state that includes the parameter server's
history; every rank keeps its own random and data-cursor state beside it, written before the
solver state that a resume names) and answers the stop and snapshot requests (a signal on any
rank becomes the same action on every rank at the same iteration).

It reads the solver, the net and the layers only through their public methods (the list is in
docs/DEVELOPING.md). The rank's start is ``startup.py``'s, the engine's items ``net_items.py``'s,
what each rank keeps beside a snapshot ``rank_state.py``'s, the ``.netoutputs`` rows
``net_outputs.py``'s and the statistics at the end ``job_stats.py``'s; the flags are read once
into ``options.SyncOptions``.
"""
import contextlib
import os

import numpy as np

from .. import log
from .. import rng
from ..solver import signals
from ..solver import snapshot as snap
from . import job_stats, rank_state
from .engine import SyncEngine
from .net_items import build_items
from .net_outputs import NetOutputs
from .options import SyncOptions
from .update_rules import SolverRule
from .startup import broadcast_weights, prepare, this_client_id
from .stop import StopAgreement
from .timeline import Timeline
from ..launch.timeouts import SYNC_TIMEOUT_VARIABLE, seconds_from_env


class DistributedRunner:
    """What ``attach`` returns: ``solve()`` trains, then finishes the job's exchanges. It is
    also the solver's job (``after_gradients``, ``requested_action``, ``pending_requests``,
    ``test``, ``snapshot``: the methods of ``solver.job.LocalJob``)."""

    def __init__(self, solver, options, topology):
        self.solver = solver
        self.topology = topology
        self.options = options
        net = solver.net
        p = solver.param
        broadcast_weights(net, topology)
        if p.random_seed >= 0:
            # weights agree (broadcast); dropout and random crops must differ per worker
            rng.set_random_seed(p.random_seed + 7919 * topology.rank)
        self.worker_updates = options.ps_update == "worker"
        rank_state.restore(solver, topology, options.snapshot, self.worker_updates)
        self.rule = SolverRule(solver, keep=options.staleness + 8)
        self.timeline = None
        if options.timeline:
            path = options.timeline
            if topology.rank != 0:
                stem, ext = os.path.splitext(path)
                path = "%s.rank%d%s" % (stem, topology.rank, ext or ".json")
            self.timeline = Timeline(path, topology.rank)
        timeout = options.sync_timeout
        if timeout is None:
            timeout = seconds_from_env(SYNC_TIMEOUT_VARIABLE, 300)
        self.engine = SyncEngine(
            topology, build_items(net), self.rule, mode=options.sync,
            staleness=options.staleness, svb=options.svb, dwbp=options.dwbp,
            iter_size=p.iter_size, start_clock=solver.iter, clip=p.clip_gradients,
            fuse_bytes=options.fuse_bytes, timeout=float(timeout), timeline=self.timeline,
            announce=True, update=options.ps_update, channels=options.comm_channels,
            offload_size=options.offload_size)
        self.engine.failure_handler = self._comm_failed
        net.set_grad_ready_hook(self._grad_ready)
        net.set_before_forward_hook(self.engine.before_forward)
        if self.timeline is not None:
            timeline, names = self.timeline, net.layer_names
            net.set_layer_timing_hook(lambda kind, i, start, end: timeline.span_at(
                "%s %s" % (kind, names[i]), "compute", start, end, 0))
        # this rank's signals (solver.local_action) feed the job's agreed answer
        self.stop = StopAgreement(topology.world, solver.local_action,
                                  self.engine.scheduler, self.engine.transport,
                                  lag=options.staleness + 1)
        solver.set_job(self)
        self.net_outputs = NetOutputs(solver, topology, self.engine.scheduler,
                                      options.output_dir, options.net_outputs)

    def _comm_failed(self, exc, where):
        from .failure import fail
        fail(exc, where)

    # -- the solver's seams ---------------------------------------------------------------------
    def _grad_ready(self, layer_index):
        self.rule.rate_at(self.solver.iter)
        self.engine.grad_ready(layer_index)

    def after_gradients(self, solver):
        rate = self.rule.rate_at(solver.iter)
        display = solver.param.display and solver.iter % solver.param.display == 0
        if display:
            log.info("Iteration %d, lr = %g", solver.iter, rate)
        self.engine.after_backward()
        if display:
            # let this iteration's exchanges finish, so the byte window holds whole iterations
            self.engine.scheduler.wait_idle("finishing the exchanges of iteration %d"
                                            % solver.iter)
            self.engine.log_bytes()
            self.net_outputs.write(solver)

    def requested_action(self, solver):
        """The job's agreed answer at this iteration boundary (see ``stop.py``)."""
        return self.stop.requested_action()

    def pending_requests(self, solver):
        """Between test batches: one agreed answer (every ask is a round of the whole job)."""
        action = self.stop.requested_action()
        if action != signals.NONE:
            yield action

    def test(self, solver, test_net_id):
        """Each worker runs its share of the test batches; the outputs are summed over the
        job, so every worker logs the job's averages."""
        self.engine.sync_point()
        topo = self.topology
        solver.test(test_net_id, shard=(topo.rank, topo.size), reduce=self._reduce_test)

    def _reduce_test(self, sums, names, weights):
        local = np.asarray(sums, dtype=np.float64)
        world = self.topology.world

        def combine():
            width = max(world.allgather_object(local.size))
            padded = np.zeros(width)
            padded[:local.size] = local
            # rank 0 always runs batch 0, so it knows the output names and loss weights
            return world.allreduce_object(padded), world.bcast_object((names, weights), root=0)
        total, (names, weights) = self.engine.scheduler.call(combine)
        return list(total), names, weights

    def snapshot(self, solver=None):
        """The job's snapshot of this iteration (the solver's job hook; callable directly);
        returns the solver state path."""
        solver, topo = self.solver, self.topology
        self.engine.sync_point()
        if self.engine.update == "server":
            # a strategy may hold the history away from the workers (the ps shards); with
            # -ps_update=worker each worker keeps its own, and rank 0's goes into the solver state
            clock = self.engine.clock
            strategies = list(self.engine.strategies.values())
            gathered = self.engine.scheduler.call(
                lambda: [s.gather_history(clock) for s in strategies])
            for histories in gathered:
                if topo.rank == 0 and histories:
                    for index, arrays in histories.items():
                        for target, full in zip(self.rule.history(index), arrays):
                            target[...] = full
        # on a device: the host copies of the history into the solver's arrays it writes
        self.rule.store_history()
        model, state = solver.snapshot_filenames()
        if topo.rank != 0:
            side = rank_state.rank_state_path(state, topo.rank)
            self._write_or_fail(lambda: snap.write_rngstate(side, solver.layer_resume_states()),
                                snap.rngstate_filename(side))
            if self.worker_updates:         # rank 0's history is in the solver state
                path = rank_state.history_path(state, topo.rank)
                self._write_or_fail(lambda: rank_state.write_worker_history(solver, path), path)
        # every rank's side file is in place before rank 0 writes the solver state a resume
        # names, so a solver state on disk always has its whole set beside it
        self._barrier("waiting for every rank's snapshot files of iteration %d" % solver.iter)
        if topo.rank == 0:
            state = self._write_or_fail(solver.write_snapshot, model)
        else:
            solver.record_snapshot(state)
        self._barrier("waiting for rank 0's snapshot of iteration %d" % solver.iter)
        return state

    def snapshot_after_failure(self, solver=None):
        """Nothing: a snapshot takes every rank, and the others are not at this point; the
        failing rank ends the job (``failure.py``), and the last snapshot set stands."""

    def claim_snapshot_prefix(self, solver=None):
        """Rank 0 writes the job's snapshot sets, so it alone holds the prefix's lock for
        the run (the job hook; see ``solver.job.LocalJob``)."""
        if self.topology.rank == 0:
            return self.solver.hold_snapshot_prefix()
        return contextlib.nullcontext()

    def _barrier(self, what):
        world, transport = self.topology.world, self.engine.transport
        peers = [r for r in range(world.size) if r != world.rank]
        self.engine.scheduler.call(lambda: transport.wait([world.ibarrier()], what, peers))

    def _write_or_fail(self, write, path):
        """A rank that cannot write its part of a snapshot ends the job, naming itself and the
        file (an OSError knows the file it failed on; else ``path``)."""
        from ..io import ProtoFileError
        from .failure import fail
        try:
            return write()
        except (OSError, ProtoFileError, snap.SnapshotError) as exc:
            failed = (getattr(exc, "filename2", None) or getattr(exc, "filename", None)
                      or path)
            fail(exc, "writing the snapshot file %s" % failed)

    # -- running --------------------------------------------------------------------------------
    def solve(self, resume_file=None):
        self.solver.solve(resume_file)
        self.finish()

    def step(self, iters):
        self.solver.step(iters)

    def finish(self):
        from .failure import job_finished
        self.stop.close()
        self.engine.close()
        job_finished()
        if self.timeline is not None:
            self.timeline.write()
        stats = dict(self.engine.stats(), client_id=this_client_id())
        job_stats.write_rank_stats(stats, self.options.output_dir, self.topology.rank)
        job_stats.write_job_stats(stats, self.topology, self.options.stats_path)
        self.engine.log_bytes(window=False)


def attach(solver, options=None):
    """Make ``solver`` one worker of the MPI job; returns the runner whose ``solve()`` trains."""
    options = SyncOptions.of(options)
    topology = prepare(options)
    if topology.is_server:
        raise RuntimeError("rank %d is a dedicated parameter server (-server_ranks=%d): it "
                           "serves (sync.serve) and trains no solver"
                           % (topology.rank, topology.num_servers))
    return DistributedRunner(solver, options, topology)


def is_server(options=None):
    """Whether this rank of the job is a dedicated parameter-server shard."""
    return prepare(options).is_server


def serve(options=None):
    """Run one session of a dedicated server rank (it answers one ``attach`` of the workers);
    returns the server's statistics, also written to the output folder."""
    from .failure import job_finished
    from .server import serve as _serve
    options = SyncOptions.of(options)
    topology = prepare(options)
    stats = _serve(topology)
    job_finished()
    job_stats.write_rank_stats(stats, options.output_dir, topology.rank)
    return stats
