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
docs/DEVELOPING.md).
"""
import contextlib
import json
import logging
import os
import time

import numpy as np

from .. import log
from .. import rng
from ..solver import signals
from . import planner
from .engine import CHANNELS, FactorSource, Item, SyncEngine
from .offload import OFFLOAD_SIZE
from .failure import install as install_failure_handlers
from .rule import SolverRule
from .stop import StopAgreement
from .timeline import Timeline
from .timeouts import SYNC_TIMEOUT_VARIABLE, seconds_from_env
from .topology import Topology, TopologyError

_state = {"topology": None, "log_handler": None}


def _opt(options, name, default):
    value = getattr(options, name, None) if options is not None else None
    if isinstance(options, dict):
        value = options.get(name)
    return default if value is None or value == "" else value


def prepare(options=None):
    """Start this rank's part of a job: topology, logs, failure handling, data shard.

    Call before the solver is built so that its data layers read this worker's shard and its
    set-up is logged to this rank's file; ``attach`` calls it if that was not done.
    """
    if _state["topology"] is not None:
        return _state["topology"]
    topology = Topology(ranks_per_host=int(_opt(options, "ranks_per_host", 0)),
                        server_ranks=int(_opt(options, "server_ranks", 0)))
    _state["topology"] = topology
    install_failure_handlers(topology)
    client_id, named = _client_of(topology, options)
    _state["client_id"] = client_id
    output_dir = _opt(options, "output_dir", "")
    if output_dir:
        # Poseidon's layout: one log folder per client (host), logs.<client_id>, when the job
        # names its clients (-client_id / -hostfile); the rank logs keep their names
        log_dir = os.path.join(output_dir, "logs.%d" % client_id) if named else output_dir
        os.makedirs(log_dir, exist_ok=True)
        _state["log_handler"] = log.add_file(os.path.join(log_dir,
                                                          "caffe.rank%d.log" % topology.rank))
    if topology.job.rank != 0:
        log.set_console_level(logging.ERROR)
    if topology.is_server:
        log.info("Server rank %d of %d on host %s (pid %d): dedicated parameter-server shard "
                 "%d of %d for %d workers", topology.rank, topology.job.size, topology.hostname,
                 os.getpid(), topology.server_index, topology.num_servers, topology.num_workers)
        return topology
    log.info("Worker rank %d of %d on host %s (pid %d): host %d of %d, device %d of %d%s",
             topology.rank, topology.size, topology.hostname, os.getpid(), topology.host,
             topology.num_hosts, topology.local_rank, topology.local_size,
             ", %d dedicated server ranks" % topology.num_servers if topology.dedicated else "")
    from .. import data
    data.set_worker(topology.rank, topology.size,
                    client=(client_id, topology.local_rank, topology.local_size))
    return topology


def _client_of(topology, options):
    """(this rank's Poseidon client id, whether the job named it): -client_id as given to the
    host's ranks, else the host's line of -hostfile, else the host's index. Ids must agree
    within a host and differ between hosts; -num_clients, when given, must count the hosts."""
    from .launcher import HostFileError, read_localserver
    given = int(_opt(options, "client_id", -1))
    hostfile = _opt(options, "hostfile", "")
    num_clients = int(_opt(options, "num_clients", 0))
    host = topology.host
    if topology.is_server:
        topology.job.allgather_object(None)
        return -1, False
    hosts = None
    if hostfile:
        try:
            hosts = read_localserver(hostfile)
        except HostFileError as exc:
            raise TopologyError(str(exc)) from None
        if len(hosts) != topology.num_hosts:
            raise TopologyError("-hostfile=%s lists %d clients, but the job runs on %d hosts"
                                % (hostfile, len(hosts), topology.num_hosts))
        listed = [h[0] for h in hosts]
        if given >= 0 and given not in listed:
            raise TopologyError("-client_id=%d is not in -hostfile=%s (its clients are %s)"
                                % (given, hostfile, ", ".join(map(str, listed))))
    if num_clients and num_clients != topology.num_hosts:
        raise TopologyError("-num_clients=%d, but the job runs on %d hosts (%d workers, %d per "
                            "host)" % (num_clients, topology.num_hosts, topology.size,
                                       topology.local_size))
    if given >= 0:
        cid = given
    elif hosts is not None:
        cid = hosts[host][0]
    else:
        cid = host
    ids = [v for v in topology.job.allgather_object((host, cid)) if v is not None]
    by_host = {}
    for h, c in ids:
        by_host.setdefault(h, set()).add(c)
    for h, cs in sorted(by_host.items()):
        if len(cs) > 1:
            raise TopologyError("the ranks of host %d give different client ids %s: -client_id "
                                "names a host (Poseidon's client)" % (h, sorted(cs)))
    firsts = [min(cs) for _, cs in sorted(by_host.items())]
    if len(set(firsts)) != len(firsts):
        raise TopologyError("hosts share a client id (%s): give every host its own -client_id"
                            % firsts)
    return cid, given >= 0 or hosts is not None


def _factor_source(source):
    """The engine's FactorSource over a layer's sufficient-factor offer (float32 copies)."""
    read_factors = source["read"]

    def read():
        diff, data = read_factors()
        return np.array(diff, dtype=np.float32), np.array(data, dtype=np.float32)
    return FactorSource(source["inputs"], source["outputs"], read,
                        transpose=source["transpose"], rows_per_pass=source["rows_per_pass"])


def _device_factor_source(source, blobs):
    """A device net's factors are read from the layer's (bottom, top) blobs on the device
    (device.py)."""
    return FactorSource(source["inputs"], source["outputs"], None,
                        transpose=source["transpose"], rows_per_pass=source["rows_per_pass"],
                        device_blobs=blobs)


def build_items(net):
    """One Item per learnable blob of ``net``, with its ready and first-use layers."""
    items = []
    for index, name, blob, first, offer in planner.exchanged_params(net):
        factors = None
        if offer is not None:
            if getattr(blob.backend, "on_device", False):
                # the offer is made only by the one layer using the blob: ``first``
                bottoms, tops = net.layer_blobs(first)
                factors = _device_factor_source(offer, (bottoms[0], tops[0]))
            else:
                factors = _factor_source(offer)
        items.append(Item(index, name, blob, ready_layer=first, first_use=first, sfb=factors))
    return items


class DistributedRunner:
    """What ``attach`` returns: ``solve()`` trains, then finishes the job's exchanges. It is
    also the solver's job (``after_gradients``, ``requested_action``, ``pending_requests``,
    ``test``, ``snapshot``: the methods of ``solver.job.LocalJob``)."""

    def __init__(self, solver, options, topology):
        self.solver = solver
        self.topology = topology
        self.output_dir = _opt(options, "output_dir", "")
        net = solver.net
        p = solver.param
        self._broadcast_weights(net)
        if p.random_seed >= 0:
            # weights agree (broadcast); dropout and random crops must differ per worker
            rng.set_random_seed(p.random_seed + 7919 * topology.rank)
        self.update = _opt(options, "ps_update", "server")
        self._restore_rank_state(_opt(options, "snapshot", ""))
        self.rule = SolverRule(solver)
        timeline_path = _opt(options, "timeline", "")
        self.timeline = None
        if timeline_path:
            if topology.rank != 0:
                stem, ext = os.path.splitext(timeline_path)
                timeline_path = "%s.rank%d%s" % (stem, topology.rank, ext or ".json")
            self.timeline = Timeline(timeline_path, topology.rank)
        mode = _opt(options, "sync", "auto")
        svb = getattr(options, "svb", None) if not isinstance(options, dict) else options.get("svb")
        staleness = int(_opt(options, "staleness", 0))
        timeout = _opt(options, "sync_timeout", None)
        if timeout is None:
            timeout = seconds_from_env(SYNC_TIMEOUT_VARIABLE, 300)
        self.engine = SyncEngine(
            topology, build_items(net), self.rule, mode=mode,
            staleness=staleness, svb=svb,
            dwbp=bool(_opt(options, "dwbp", True)), iter_size=p.iter_size,
            start_clock=solver.iter, clip=p.clip_gradients,
            fuse_bytes=int(_opt(options, "fuse_bytes", 1 << 16)),
            timeout=float(timeout), timeline=self.timeline, announce=True,
            update=_opt(options, "ps_update", "server"),
            channels=int(_opt(options, "comm_channels", CHANNELS)),
            offload_size=int(_opt(options, "offload_size", OFFLOAD_SIZE)))
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
                                  lag=staleness + 1)
        solver.set_job(self)
        self._netoutputs = None
        self._started = time.perf_counter()
        self.stats_path = _opt(options, "stats_path", "")
        prefix = _opt(options, "net_outputs", "")
        # every rank takes part in averaging the outputs; rank 0 writes them
        self._outputs_wanted = bool(prefix or self.output_dir)
        if self._outputs_wanted and topology.rank == 0:
            if prefix:
                self._netoutputs = prefix + ".netoutputs"    # Poseidon's -net_outputs prefix
            else:
                name = os.path.splitext(os.path.basename(solver.solver_file or "solver"))[0]
                self._netoutputs = os.path.join(self.output_dir, name + ".netoutputs")
            parent = os.path.dirname(self._netoutputs)
            if parent:
                os.makedirs(parent, exist_ok=True)

    # -- start-up -------------------------------------------------------------------------------
    def _broadcast_weights(self, net):
        world = self.topology.world
        for blob in net.learnable_params:
            flat = blob.data.reshape(-1)
            world.bcast_array(flat, root=0)
        log.info("Rank 0's weights broadcast to %d workers", self.topology.size)

    def _restore_rank_state(self, state_file):
        """Put back this rank's random and data-cursor state from the snapshot being resumed.
        Rank 0's is the solver's own side file (the solver restored it once already, but the
        per-rank seeding above has just replaced it)."""
        if not state_file:
            return
        from ..solver import snapshot as snap
        rank = self.topology.rank
        extra = snap.read_rngstate(state_file if rank == 0 else self._rank_state_path(state_file))
        if rank == 0 and snap.written_with_side_files(state_file):
            # rank 0's own side file the solver's restore has checked; the other ranks' here
            missing = [snap.rngstate_filename(self._rank_state_path(state_file, r))
                       for r in range(1, self.topology.size)]
            missing = [path for path in missing if not os.path.exists(path)]
            if missing:
                log.warning("Snapshot set %s is incomplete: %s missing, so those ranks' random "
                            "generators and data positions are not restored: the resumed run "
                            "will not repeat an uninterrupted one", state_file,
                            " and ".join(missing) + (" are" if len(missing) > 1 else " is"))
        if extra is not None:
            rng.set_state(extra["rng"])
            self.solver.set_layer_resume_states(extra.get("layers", {}))
            log.info("Rank %d: restored its random and data-cursor state", self.topology.rank)
        if self.update == "worker" and rank != 0:
            self._restore_worker_history(self._history_path(state_file))

    def _restore_worker_history(self, path):
        """With -ps_update=worker every worker keeps its own solver history; rank 0's is in
        the solver state, the others' beside their random state."""
        if not os.path.exists(path):
            log.warning("Rank %d: no %s; this worker resumes with rank 0's solver history",
                        self.topology.rank, path)
            return
        with np.load(path) as saved:
            arrays = [saved["h%d" % i] for i in range(len(saved.files))]
        history = self.solver.history
        if len(arrays) != len(history) or any(a.shape != tuple(h.shape)
                                              for a, h in zip(arrays, history)):
            raise ValueError("%s holds %d history blobs that do not fit this solver's %d"
                             % (path, len(arrays), len(history)))
        params = self.solver.net.learnable_params
        for i, (target, array) in enumerate(zip(history, arrays)):
            # upload: the history may live on a device (the identity copy on the CPU)
            params[i % len(params)].backend.upload(array, target)
        log.info("Rank %d: restored its own solver history", self.topology.rank)

    def _rank_state_path(self, state_path, rank=None):
        rank = self.topology.rank if rank is None else rank
        for ext in (".solverstate.h5", ".solverstate"):
            if state_path.endswith(ext):
                return "%s.rank%d%s" % (state_path[:-len(ext)], rank, ext)
        return "%s.rank%d" % (state_path, rank)

    def _comm_failed(self, exc, where):
        from .failure import fail
        fail(exc, where)

    # -- the solver's seams ---------------------------------------------------------------------
    def _rate(self, clock):
        rates = self.rule.rates
        if clock not in rates:
            rates[clock] = self.solver.get_learning_rate()
            for old in [c for c in rates if c < clock - self.engine.staleness - 8]:
                del rates[old]
        return rates[clock]

    def _grad_ready(self, layer_index):
        self._rate(self.solver.iter)
        self.engine.grad_ready(layer_index)

    def after_gradients(self, solver):
        rate = self._rate(solver.iter)
        display = solver.param.display and solver.iter % solver.param.display == 0
        if display:
            log.info("Iteration %d, lr = %g", solver.iter, rate)
        self.engine.after_backward()
        if display:
            # let this iteration's exchanges finish, so the byte window holds whole iterations
            self.engine.scheduler.wait_idle("finishing the exchanges of iteration %d"
                                            % solver.iter)
            self.engine.log_bytes()
            self._write_netoutputs(solver)

    def _write_netoutputs(self, solver):
        """One row per display: the smoothed loss and the train net's outputs, averaged over
        the workers (as Poseidon's .netoutputs)."""
        if not self._outputs_wanted:
            return
        from ..solver.solver import output_values
        values = output_values(solver.net)
        local = np.array([solver.smoothed_loss] + [v for _, vals, _ in values for v in vals],
                         dtype=np.float64)
        world = self.topology.world
        total = self.engine.scheduler.call(lambda: world.allreduce_object(local))
        mean = total / self.topology.size
        if self._netoutputs is None:
            return
        new = not os.path.exists(self._netoutputs)
        with open(self._netoutputs, "a") as f:
            if new:
                names = ["%s_%d" % (name, k) if len(vals) > 1 else name
                         for name, vals, _ in values for k in range(len(vals))]
                f.write(",".join(["iteration", "seconds", "smoothed_loss"] + names) + "\n")
            f.write(",".join([str(solver.iter), "%.3f" % (time.perf_counter() - self._started)]
                             + ["%g" % v for v in mean]) + "\n")

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
        from ..solver import snapshot as snap
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
            side = self._rank_state_path(state)
            self._write_or_fail(lambda: snap.write_rngstate(side, solver.layer_resume_states()),
                                snap.rngstate_filename(side))
            if self.update == "worker":     # rank 0's history is in the solver state
                self._write_or_fail(
                    lambda: self._write_worker_history(self._history_path(state)),
                    self._history_path(state))
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
        from ..solver.snapshot import SnapshotError
        from .failure import fail
        try:
            return write()
        except (OSError, ProtoFileError, SnapshotError) as exc:
            failed = (getattr(exc, "filename2", None) or getattr(exc, "filename", None)
                      or path)
            fail(exc, "writing the snapshot file %s" % failed)

    def _history_path(self, state_path):
        """<prefix>_iter_N.rank<r>.history.npz beside the rank's .rngstate."""
        from ..solver import snapshot as snap
        rank_state = snap.rngstate_filename(self._rank_state_path(state_path))
        return rank_state[:-len(".rngstate")] + ".history.npz"

    def _write_worker_history(self, path):
        import io as _io
        from ..io import atomic_write
        buf = _io.BytesIO()
        params = self.solver.net.learnable_params
        np.savez(buf, **{"h%d" % i: params[i % len(params)].backend.to_host(h)
                         for i, h in enumerate(self.solver.history)})
        atomic_write(path, buf.getvalue())

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
        stats = dict(self.engine.stats(), client_id=_state.get("client_id"))
        if self.output_dir:
            path = os.path.join(self.output_dir, "sync_stats.rank%d.json" % self.topology.rank)
            with open(path, "w") as f:
                json.dump(stats, f, indent=1, sort_keys=True)
        if self.stats_path:
            # Poseidon's -stats_path: one file for the job, every worker's statistics (JSON,
            # which YAML readers take as well)
            everyone = self.topology.world.gather_object(stats, root=0)
            if self.topology.rank == 0:
                parent = os.path.dirname(self.stats_path)
                if parent:
                    os.makedirs(parent, exist_ok=True)
                with open(self.stats_path, "w") as f:
                    json.dump({"workers": everyone}, f, indent=1, sort_keys=True)
                log.info("Sync statistics of %d workers written to %s", len(everyone),
                         self.stats_path)
        self.engine.log_bytes(window=False)

    def __getattr__(self, name):
        return getattr(self.solver, name)


def attach(solver, options=None):
    """Make ``solver`` one worker of the MPI job; returns the runner whose ``solve()`` trains."""
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
    topology = prepare(options)
    stats = _serve(topology)
    job_finished()
    output_dir = _opt(options, "output_dir", "")
    if output_dir:
        path = os.path.join(output_dir, "sync_stats.rank%d.json" % topology.rank)
        with open(path, "w") as f:
            json.dump(stats, f, indent=1, sort_keys=True)
    return stats
