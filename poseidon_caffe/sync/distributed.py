"""``attach(solver, options)``: make a solver one worker of a distributed job.

What it does on every rank: find the topology, give the data layers this worker's shard, write
this rank's log in the output folder (rank 0 also on the console), broadcast rank 0's weights,
build the sync engine over the train net's learnable blobs and hook it to the net (grad-ready,
before-forward) and to the solver (``solver.exchange``). It also takes over the solver's
``test`` (each worker runs its share of ``test_iter``; outputs are averaged over the job and
logged once), ``snapshot`` (rank 0 writes the model and a solver state that includes the
parameter server's history; every rank keeps its own random and data-cursor state beside it,
written before the solver state that a resume names) and ``requested_action`` (a stop or
snapshot signal on any rank becomes the same action on every rank at the same iteration).
"""
import json
import logging
import os
import time

import numpy as np

from .. import log
from .. import rng
from .engine import FactorSource, Item, SyncEngine
from .failure import install as install_failure_handlers
from .rule import SolverRule
from .stop import StopAgreement
from .timeline import Timeline
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
        topology.job.allgather(None)
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
    ids = [v for v in topology.job.allgather((host, cid)) if v is not None]
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


def _ip_factor_source(net, layer_index):
    """Sufficient factors of an InnerProduct layer (the layer offers them): None when the layer
    cannot use them."""
    layer = net.layers[layer_index]
    bottom, top = net.bottom_vecs[layer_index], net.top_vecs[layer_index]
    if not hasattr(layer, "sufficient_factors") or len(bottom) != 1:
        return None
    M, N = layer.k, layer.num_output
    if layer.blobs[0].count != M * N:
        return None

    def read():
        diff, data = layer.sufficient_factors(bottom, top)
        return np.array(diff, dtype=np.float32), np.array(data, dtype=np.float32)
    return FactorSource(M, N, read, transpose=layer.transpose, rows_per_pass=layer.m)


def build_items(net):
    """One Item per learnable blob of ``net``, with its ready and first-use layers."""
    uses = {}
    for pid, (layer_index, j) in enumerate(net.param_layer_indices):
        uses.setdefault(net.learnable_param_ids[pid], []).append((layer_index, j))
    items = []
    for index, blob in enumerate(net.learnable_params):
        if net.params_lr[index] == 0:
            continue        # never changes: nothing to exchange
        where = uses[index]
        first = min(layer for layer, _ in where)
        layer_index, j = where[0]
        name = "%s[%d]" % (net.layer_names[layer_index], j)
        sfb = _ip_factor_source(net, layer_index) if (len(where) == 1 and j == 0) else None
        items.append(Item(index, name, blob, ready_layer=first, first_use=first, sfb=sfb))
    return items


class DistributedRunner:
    """What ``attach`` returns: ``solve()`` trains, then finishes the job's exchanges."""

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
        timeout = float(_opt(options, "sync_timeout",
                             os.environ.get("POSEIDON_SYNC_TIMEOUT", 300)))
        self.engine = SyncEngine(
            topology, build_items(net), self.rule, mode=mode,
            staleness=staleness, svb=svb,
            dwbp=bool(_opt(options, "dwbp", True)), iter_size=p.iter_size,
            start_clock=solver.iter, clip=p.clip_gradients,
            fuse_bytes=int(_opt(options, "fuse_bytes", 1 << 16)),
            timeout=timeout, timeline=self.timeline, announce=True,
            update=_opt(options, "ps_update", "server"))
        self.engine.failure_handler = self._comm_failed
        net.set_grad_ready_hook(self._grad_ready)
        net.set_before_forward_hook(self.engine.before_forward)
        if self.timeline is not None:
            timeline, names = self.timeline, net.layer_names
            net.set_layer_timing_hook(lambda kind, i, start, end: timeline.span_at(
                "%s %s" % (kind, names[i]), "compute", start, end, 0))
        solver.exchange = self
        solver.test = self.test
        self._solver_snapshot = solver.snapshot
        solver.snapshot = self.snapshot
        # this rank's signals (solver.requested_action) feed the job's agreed answer
        self.stop = StopAgreement(topology.world, solver.requested_action,
                                  self.engine.scheduler, self.engine.transport,
                                  lag=staleness + 1)
        solver.requested_action = self.stop.requested_action
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
            world.Bcast(flat, root=0)
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
        if extra is not None:
            rng.set_state(extra["rng"])
            self.solver._set_layer_resume_states(extra.get("layers", {}))
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
        for target, array in zip(history, arrays):
            target[...] = array
        log.info("Rank %d: restored its own solver history", self.topology.rank)

    def _rank_state_path(self, state_path):
        for ext in (".solverstate.h5", ".solverstate"):
            if state_path.endswith(ext):
                return "%s.rank%d%s" % (state_path[:-len(ext)], self.topology.rank, ext)
        return "%s.rank%d" % (state_path, self.topology.rank)

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
        mean = self.engine.scheduler.call(lambda: world.allreduce(local)) / self.topology.size
        if self._netoutputs is None:
            return
        new = not os.path.exists(self._netoutputs)
        with open(self._netoutputs, "a") as f:
            if new:
                names = ["%s_%d" % (name, k) if len(vals) > 1 else name
                         for name, vals, _ in values for k in range(len(vals))]
                f.write(",".join(["iteration", "seconds", "loss"] + names) + "\n")
            f.write(",".join([str(solver.iter), "%.3f" % (time.perf_counter() - self._started)]
                             + ["%g" % v for v in mean]) + "\n")

    def test(self, test_net_id=0):
        from ..solver.solver import forward_outputs, loss_note, fmt
        solver, topo = self.solver, self.topology
        self.engine.sync_point()
        p = solver.param
        log.info("Iteration %d, Testing net (#%d)", solver.iter, test_net_id)
        test_net = solver.test_nets[test_net_id]
        test_net.share_trained_layers_with(solver.net)
        test_iter = p.test_iter[test_net_id]
        feeders = [layer for layer in test_net.layers if hasattr(layer, "prefetcher")]
        sums, names, weights, loss, runs = None, [], [], 0.0, 0
        for i in range(test_iter):
            # once per round of P batches (the same batches on every rank), as Caffe's loop
            # asks between test batches: a long test pass need not end before a stop
            if i % topo.size == 0 and self._test_interrupted():
                log.info("Test interrupted.")
                return
            if i % topo.size != topo.rank:
                for layer in feeders:      # keep the record stream where one worker has it
                    layer.prefetcher.next()
                continue
            iter_loss, outputs = forward_outputs(test_net)
            loss += iter_loss
            flat = [(n, w, v) for n, values, w in outputs for v in values]
            if sums is None:
                sums = np.zeros(len(flat))
                names = [n for n, _, _ in flat]
                weights = [w for _, w, _ in flat]
            sums += [v for _, _, v in flat]
            runs += 1
        local = np.concatenate([[loss], sums if sums is not None else []])
        world = topo.world

        def combine():
            width = max(world.allgather(local.size))
            padded = np.zeros(width)
            padded[:local.size] = local
            # rank 0 always runs batch 0, so it knows the output names and loss weights
            return world.allreduce(padded), world.bcast((names, weights), root=0)
        total, (names, weights) = self.engine.scheduler.call(combine)
        width = total.size
        if p.test_compute_loss:
            log.info("Test loss: %s", fmt(total[0] / test_iter))
        for k in range(width - 1):
            mean = total[1 + k] / test_iter
            log.info("    Test net output #%d: %s = %s%s", k, names[k], fmt(mean),
                     loss_note(weights[k], mean))

    def _test_interrupted(self):
        """The job's agreed request between test batches: a snapshot is written, a stop ends
        the test pass and then the run."""
        from ..solver import signals
        action = self.solver.requested_action()
        if action == signals.SNAPSHOT:
            self.snapshot()
        elif action == signals.STOP:
            self.solver.requested_early_exit = True
        return self.solver.requested_early_exit

    def snapshot(self):
        from ..solver import snapshot as snap
        solver, topo = self.solver, self.topology
        self.engine.sync_point()
        server = self.engine.strategies.get("ps")
        if server is not None and self.engine.update == "server":
            # the shards hold the history (with -ps_update=worker each worker keeps its own,
            # and rank 0's goes into the solver state)
            clock = self.engine.clock
            histories = self.engine.scheduler.call(lambda: server.gather_history(clock))
            if topo.rank == 0:
                for index, arrays in histories.items():
                    for target, full in zip(self.rule.history(index), arrays):
                        target[...] = full
        fmt_ = solver.param.snapshot_format
        state = snap.state_filename(solver._snapshot_prefix(), solver.iter, fmt_)
        if topo.rank != 0:
            side = self._rank_state_path(state)
            self._write_or_fail(lambda: snap.write_rngstate(side, solver._layer_resume_states()),
                                snap.rngstate_filename(side))
            if self.update == "worker":     # rank 0's history is in the solver state
                self._write_or_fail(
                    lambda: self._write_worker_history(self._history_path(state)),
                    self._history_path(state))
        # every rank's side file is in place before rank 0 writes the solver state a resume
        # names, so a solver state on disk always has its whole set beside it
        self._barrier("waiting for every rank's snapshot files of iteration %d" % solver.iter)
        if topo.rank == 0:
            state = self._write_or_fail(
                self._solver_snapshot,
                snap.model_filename(solver._snapshot_prefix(), solver.iter, fmt_))
        else:
            solver.last_snapshot = state
            solver.last_snapshot_iter = solver.iter
        self._barrier("waiting for rank 0's snapshot of iteration %d" % solver.iter)
        return state

    def _barrier(self, what):
        world, transport = self.topology.world, self.engine.transport
        peers = [r for r in range(world.size) if r != world.rank]
        self.engine.scheduler.call(lambda: transport.wait([world.Ibarrier()], what, peers))

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
        np.savez(buf, **{"h%d" % i: np.asarray(h) for i, h in enumerate(self.solver.history)})
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
            everyone = self.topology.world.gather(stats, root=0)
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
