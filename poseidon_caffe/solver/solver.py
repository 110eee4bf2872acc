"""The training loop, as Caffe's Solver: nets, step, test, display, snapshot, restore.

One iteration (``step``): clear parameter diffs, test when due, forward/backward ``iter_size``
times, display, hand over to ``self.job`` (the seam to the job the solver belongs to, see
``job.py``), then snapshot when due. A job of one process simply calls ``apply_update()``:
learning rate, clip, then per parameter ``update_param`` (normalise, regularise, compute the
update value with the rule of the solver's type, apply it). A subclass names its rule
(``type``), checks its fields and says how many history arrays it keeps.
"""
import contextlib
import math
import os
import time

import numpy as np
from google.protobuf import text_format

from .. import io as pio
from .. import log
from .. import rng
from .. import solver_group
from ..data.errors import DataError
from ..memory import available_memory, format_bytes
from ..progress import ProgressBar
from ..proto import caffe_pb2
from . import prefix_lock
from . import signals
from . import snapshot as snap
from . import updates
from .update_rule import UpdateRule
from .device_losses import DeviceLosses
from .job import LocalJob
from .lr_policy import learning_rate
from .param_check import solver_param_problems

TRAIN = caffe_pb2.TRAIN
TEST = caffe_pb2.TEST


class SolverError(ValueError):
    """A solver definition that cannot be run; the message names the field."""


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the message names the iteration and last snapshot."""

    def __init__(self, message, iteration, last_snapshot):
        super().__init__(message)
        self.iteration = iteration
        self.last_snapshot = last_snapshot


def fmt(value):
    """Numbers as C++ streams print them by default (6 significant digits)."""
    return "%g" % value


class Solver:
    type = None
    # how many history arrays per learnable parameter the update rule keeps
    history_sets = 1

    def __init__(self, param, job=None, solver_file=None):
        self.solver_file = solver_file
        if isinstance(param, (str, os.PathLike)):
            self.solver_file = os.fspath(param)
            param = pio.read_solver_param(self.solver_file)
        elif not isinstance(param, caffe_pb2.SolverParameter):
            raise SolverError("a solver is built from a SolverParameter or a solver prototxt "
                              "path, not %r" % type(param).__name__)
        self.param = param
        self.job = job or LocalJob()
        self.action_function = None
        self.requested_early_exit = False
        self.last_snapshot = None
        self.last_snapshot_iter = None
        self.iter = 0
        self.current_step = 0
        self._device_losses = None     # on a device: losses not yet read (device_losses.py)
        self.losses = []
        self.smoothed_loss = 0.0
        self.callbacks = []            # pycaffe's add_callback: on_start / on_gradients_ready
        self._init(param)

    # -- construction ---------------------------------------------------------------------
    def _init(self, param):
        log.info("Initializing solver from parameters: \n%s", text_format.MessageToString(param))
        problems = solver_param_problems(param)
        if problems:
            where = "%s: " % self.solver_file if self.solver_file else ""
            raise SolverError(where + "; ".join(problems))
        if param.regularization_type not in updates.REGULARIZATION_TYPES:
            raise SolverError("Unknown regularization type: %r (expected L2 or L1)"
                              % param.regularization_type)
        self._check_snapshot_write_permissions()
        solver_group.check_consistent()
        if param.random_seed >= 0:
            # as Caffe: each solver of a multi-solver job draws its own stream
            rng.set_random_seed(param.random_seed + solver_group.solver_rank())
        available = available_memory()        # before the nets take their share
        self.net = self._init_train_net()
        self.test_nets = self._init_test_nets()
        log.info("Solver scaffolding done.")
        self.check_param()
        self._check_memory(*available)
        self._update_rule = None            # made at first use (update_rule)
        self.history = []
        try:
            for _ in range(self.history_sets):
                for blob in self.net.learnable_params:
                    self.history.append(blob.backend.zeros(blob.shape))
        except MemoryError:
            size = sum(blob.nbytes for blob in self.net.learnable_params) * self.history_sets
            raise SolverError("out of memory for the %s solver's history (%s beside the net's "
                              "blobs)" % (self.type, format_bytes(size))) from None

    def _check_memory(self, limit, has):
        """Each net was checked alone as it was built; together with the test nets (whose
        blobs stay allocated between tests, their trained layers' weights shared) and the
        update history, they must fit as well. Nothing large is allocated yet: blobs are
        made at first use and data layers start reading at the first batch."""
        if limit is None:
            return
        trained = set(self.net.layer_names)
        parts = [("train net", self.net.memory_needed)]
        for i, net in enumerate(self.test_nets):
            shared = sum(blob.nbytes for name, layer in zip(net.layer_names, net.layers)
                         if name in trained for blob in layer.blobs)
            parts.append(("test net #%d" % i, net.memory_needed - shared))
        parts.append(("history", self.history_sets
                      * sum(blob.nbytes for blob in self.net.learnable_params)))
        total = sum(nbytes for _, nbytes in parts)
        if total <= limit:
            return
        where = "%s: " % self.solver_file if self.solver_file else ""
        raise SolverError("%sthe nets and the %s solver's history need %s together (%s); %s"
                          % (where, self.type, format_bytes(total), ", ".join(
                              "%s %s" % (name, format_bytes(nbytes)) for name, nbytes in parts),
                             has))

    def check_param(self):
        """Rule-specific checks of the solver fields (Caffe's CHECKs in each solver's PreSolve)."""

    def _resolve(self, path):
        """Net paths are relative to the working directory, as in Caffe; a path found only
        next to the solver prototxt is taken from there."""
        if os.path.exists(path) or self.solver_file is None:
            return path
        beside = os.path.join(os.path.dirname(os.path.abspath(self.solver_file)), path)
        return beside if os.path.exists(beside) else path

    def _init_train_net(self):
        p = self.param
        fields = "net, net_param, train_net, train_net_param"
        count = sum([p.HasField("net"), p.HasField("net_param"), p.HasField("train_net"),
                     p.HasField("train_net_param")])
        if count < 1:
            raise SolverError("SolverParameter must specify a train net using one of these "
                              "fields: " + fields)
        if count > 1:
            raise SolverError("SolverParameter must not contain more than one of these fields "
                              "specifying a train_net: " + fields)
        if p.HasField("train_net_param"):
            log.info("Creating training net specified in train_net_param.")
            net_param, source = _copy(p.train_net_param), self._embedded("train_net_param")
        elif p.HasField("train_net"):
            log.info("Creating training net from train_net file: %s", p.train_net)
            source = self._resolve(p.train_net)
            net_param = pio.read_net_param(source)
        elif p.HasField("net_param"):
            log.info("Creating training net specified in net_param.")
            net_param, source = _copy(p.net_param), self._embedded("net_param")
        else:
            log.info("Creating training net from net file: %s", p.net)
            source = self._resolve(p.net)
            net_param = pio.read_net_param(source)
        state = caffe_pb2.NetState()
        state.phase = TRAIN
        state.MergeFrom(net_param.state)
        state.MergeFrom(p.train_state)
        net = self._build_net(net_param, state, source)
        snap.load_weights_files(net, self._weights_paths(), message="Finetuning from")
        return net

    def _init_test_nets(self):
        p = self.param
        num_generic = int(p.HasField("net_param")) + int(p.HasField("net"))
        if num_generic > 1:
            raise SolverError("Both net_param and net_file may not be specified.")
        num_specific = len(p.test_net_param) + len(p.test_net)
        if (len(p.test_iter) < num_specific if num_generic else len(p.test_iter) != num_specific):
            raise SolverError("test_iter must be specified for each test network (%d test_iter "
                              "for %d test nets)" % (len(p.test_iter), num_specific))
        num_instances = len(p.test_iter)
        if len(p.test_state) and len(p.test_state) != num_instances:
            raise SolverError("test_state must be unspecified or specified once per test net "
                              "(%d test_state for %d test nets)" % (len(p.test_state), num_instances))
        if num_instances and p.test_interval <= 0:
            raise SolverError("test_interval must be > 0 when test nets are given (got %d)"
                              % p.test_interval)
        sources, params, origins = [], [], []
        for i, net_param in enumerate(p.test_net_param):
            sources.append("test_net_param")
            params.append(_copy(net_param))
            origins.append(self._embedded("test_net_param[%d]" % i))
        for path in p.test_net:
            sources.append("test_net file: " + path)
            params.append(pio.read_net_param(self._resolve(path)))
            origins.append(self._resolve(path))
        for _ in range(num_instances - num_specific):
            if p.HasField("net_param"):
                sources.append("net_param")
                params.append(_copy(p.net_param))
                origins.append(self._embedded("net_param"))
            else:
                sources.append("net file: " + p.net)
                params.append(pio.read_net_param(self._resolve(p.net)))
                origins.append(self._resolve(p.net))
        nets = []
        for i, net_param in enumerate(params):
            state = caffe_pb2.NetState()
            state.phase = TEST
            state.MergeFrom(net_param.state)
            if len(p.test_state):
                state.MergeFrom(p.test_state[i])
            log.info("Creating test net (#%d) specified by %s", i, sources[i])
            net = self._build_net(net_param, state, origins[i])
            _set_debug_info(net, p.debug_info)
            # layers shared with the training net take its weights at every test; the others
            # must find theirs in the files
            snap.load_weights_files(net, self._weights_paths(), require_match=False,
                                    skip=self.net.layer_names, message="Finetuning from")
            nets.append(net)
        return nets

    def _build_net(self, net_param, state, source):
        """The net ``net_param`` describes; its errors name ``source``: the net file, or the
        solver file and the field that holds the net."""
        from ..layers.base import LayerError
        from ..net import Net, NetError
        net_param.state.CopyFrom(state)
        try:
            return Net(net_param, state.phase, level=state.level, stages=tuple(state.stage))
        except (NetError, LayerError) as exc:
            if source in str(exc):
                raise
            raise type(exc)("%s: %s" % (source, exc)) from exc

    def _embedded(self, field):
        return "%s (%s)" % (self.solver_file or "the solver", field)

    def _weights_paths(self):
        return [path for entry in self.param.weights for path in entry.split(",") if path]

    # -- the loop -------------------------------------------------------------------------
    def set_action_function(self, fn):
        """``fn()`` -> "stop" | "snapshot" | "none", asked after every iteration (signals)."""
        self.action_function = fn

    def local_action(self):
        """This process's own request (its signals): "stop" | "snapshot" | "none"."""
        return self.action_function() if self.action_function else signals.NONE

    def requested_action(self):
        """The request to act on at this iteration boundary, as the job answers it."""
        return self.job.requested_action(self)

    def set_job(self, job):
        """Make ``job`` the solver's seam to the job it belongs to (see ``job.LocalJob`` for
        the methods it offers); the distributed runner gives the solver its own this way."""
        self.job = job

    def solve(self, resume_file=None):
        log.info("Solving %s", self.net.name)
        log.info("Learning Rate Policy: %s", self.param.lr_policy)
        self.requested_early_exit = False
        if resume_file:
            log.info("Restoring previous solver status from %s", resume_file)
            self.restore(resume_file)
        start_iter = self.iter
        p = self.param
        if (p.snapshot_after_train and not p.snapshot and self.iter < p.max_iter
                and (p.HasField("snapshot_prefix") or self.solver_file)):
            # the snapshot at the end must be writable before the training it would keep
            self._probe_snapshot_prefix()
        # a second job on this prefix is refused now, before it trains, not at its first write
        writes = ((p.snapshot or p.snapshot_after_train) and self.iter < p.max_iter
                  and (p.HasField("snapshot_prefix") or self.solver_file))
        with self.job.claim_snapshot_prefix(self) if writes else contextlib.nullcontext():
            try:
                self.step(self.param.max_iter - self.iter)
            except DataError:
                # the weights are those of a whole iteration still: keep the work so far
                if writes:
                    self.job.snapshot_after_failure(self)
                raise
            snapshot_here = p.snapshot and self.iter % p.snapshot == 0
            if ((p.snapshot_after_train or self.requested_early_exit) and not snapshot_here
                    and self.last_snapshot_iter != self.iter and solver_group.root_solver()):
                self.snapshot()
        if self.requested_early_exit:
            log.info("Optimization stopped early.")
            return
        if p.display and self.iter % p.display == 0:
            loss, _ = forward_outputs(self.net)
            self._update_smoothed_loss(loss, start_iter)
            log.info("Iteration %d, loss = %s", self.iter, fmt(self.smoothed_loss))
        if p.test_interval and self.iter % p.test_interval == 0 and solver_group.root_solver():
            self.test_all()
        log.info("Optimization Done.")

    # the smoothed loss, and the losses it averages, as of the last iteration: on a device the
    # losses wait there until one of these is read (or a display, or the end of a step)
    @property
    def smoothed_loss(self):
        self._read_device_losses()
        return self._smoothed_loss

    @smoothed_loss.setter
    def smoothed_loss(self, value):
        self._smoothed_loss = value

    @property
    def losses(self):
        self._read_device_losses()
        return self._losses

    @losses.setter
    def losses(self, value):
        self._losses = value

    def _read_device_losses(self):
        record = self._device_losses
        if record is None or not record.pending:
            return
        for iteration, loss in record.read():
            if not math.isfinite(loss):
                self._diverged(loss, iteration)
            self._update_smoothed_loss(loss, self._step_start, iteration)

    def _forward_backward(self, display):
        """The iteration's forward/backward passes; the loss as a float, or None when it stays
        on the device (read at display, or later)."""
        p = self.param
        if not _on_device(self.net):
            loss = 0.0
            for _ in range(p.iter_size):
                loss += float(self.net.forward_backward())
            return loss / p.iter_size
        record = self._device_losses
        if record is None or record.iter_size != p.iter_size:
            record = self._device_losses = DeviceLosses(self.net, p.iter_size)
        if record.full:
            self._read_device_losses()
        for k in range(p.iter_size):
            self.net.forward_backward(read_loss=False)
            record.record(self.iter, k)
        if display:
            self._read_device_losses()
        return None

    def step(self, iters):
        p = self.param
        start_iter = self.iter
        stop_iter = self.iter + int(iters)
        self._read_device_losses()         # a previous step's, for their NaN check
        self._step_start = start_iter
        self.losses = []
        self.smoothed_loss = 0.0
        self._timer = time.perf_counter()
        self._iterations_last = self.iter
        bar = None
        try:
            while self.iter < stop_iter:
                self.net.clear_param_diffs()
                if (p.test_interval and self.iter % p.test_interval == 0
                        and (self.iter > 0 or p.test_initialization)
                        and solver_group.root_solver()):
                    if bar is not None:
                        bar.close()
                        bar = None
                    self.test_all()
                    if self.requested_early_exit:
                        break
                for callback in self.callbacks:
                    callback.on_start()
                display = bool(p.display) and self.iter % p.display == 0
                _set_debug_info(self.net, display and p.debug_info)
                loss = self._forward_backward(display)
                if loss is not None:
                    if not math.isfinite(loss):
                        self._diverged(loss)
                    self._update_smoothed_loss(loss, start_iter)
                if display:
                    if bar is not None:
                        bar.close()
                        bar = None
                    self._display()
                for callback in self.callbacks:
                    callback.on_gradients_ready()
                self.job.after_gradients(self)
                self.iter += 1
                if p.display and self.iter < stop_iter:
                    if bar is None:
                        bar = ProgressBar(p.display, "Iteration")
                    bar.update(self.iter % p.display or p.display,
                               "(next display at %d)" % ((self.iter // p.display + 1) * p.display))
                request = self.requested_action()
                if (((p.snapshot and self.iter % p.snapshot == 0) or request == signals.SNAPSHOT)
                        and solver_group.root_solver()):
                    self.snapshot()
                if request == signals.STOP:
                    self.requested_early_exit = True
                    break
            self._read_device_losses()
        finally:
            if bar is not None:
                bar.close()

    def _diverged(self, loss, iteration=None):
        iteration = self.iter if iteration is None else iteration
        self._device_losses = None          # what it held is past
        where = ("the last good snapshot is %s" % self.last_snapshot if self.last_snapshot
                 else "no snapshot was written in this run")
        message = ("Iteration %d: the loss is %s; training stopped (%s)"
                   % (iteration, fmt(loss), where))
        log.error(message)
        raise TrainingDiverged(message, iteration, self.last_snapshot)

    def _update_smoothed_loss(self, loss, start_iter, iteration=None):
        iteration = self.iter if iteration is None else iteration
        average = self.param.average_loss
        losses = self._losses
        if len(losses) < average:
            losses.append(loss)
            size = len(losses)
            self._smoothed_loss = (self._smoothed_loss * (size - 1) + loss) / size
        else:
            idx = (iteration - start_iter) % average
            self._smoothed_loss += (loss - losses[idx]) / average
            losses[idx] = loss

    def _display(self):
        lapse = time.perf_counter() - self._timer
        per_s = (self.iter - self._iterations_last) / (lapse or 1.0)
        log.info("Iteration %d (%s iter/s, %ss/%d iters), loss = %s", self.iter, fmt(per_s),
                 fmt(lapse), self.param.display, fmt(self.smoothed_loss))
        self._timer = time.perf_counter()
        self._iterations_last = self.iter
        score_index = 0
        for name, values, weight in output_values(self.net):
            for value in values:
                log.info("    Train net output #%d: %s = %s%s", score_index, name, fmt(value),
                         loss_note(weight, value))
                score_index += 1

    # -- testing --------------------------------------------------------------------------
    def test_all(self):
        for test_net_id in range(len(self.test_nets)):
            if self.requested_early_exit:
                break
            self.job.test(self, test_net_id)

    def test(self, test_net_id=0, shard=(0, 1), reduce=None):
        """One test pass: ``test_iter`` batches, the outputs averaged and logged.

        ``shard`` = (index, count) shares the batches between ``count`` workers: batch ``i``
        runs on worker ``i % count``, and the others skip it in their data layers, so every
        worker's record stream stays where a single worker's would be. Stop and snapshot
        requests are asked for once per round of ``count`` batches (the same batches on every
        worker). ``reduce(sums, names, weights)`` -> the same three for the whole job: the sums
        (the loss, then every output value) over the workers, and the names and loss weights
        of the outputs (a worker that ran no batch has none of its own).
        """
        p = self.param
        index, count = shard
        log.info("Iteration %d, Testing net (#%d)", self.iter, test_net_id)
        test_net = self.test_nets[test_net_id]
        test_net.share_trained_layers_with(self.net)
        test_iter = p.test_iter[test_net_id]
        feeders = [layer for layer in test_net.layers if hasattr(layer, "skip_batch")]
        scores, names, weights = [], [], []
        loss = 0.0
        with ProgressBar(test_iter, "Testing net (#%d)" % test_net_id) as bar:
            for i in range(test_iter):
                if i % count == 0:
                    for request in self.job.pending_requests(self):
                        if request == signals.SNAPSHOT:
                            self.snapshot()
                        elif request == signals.STOP:
                            self.requested_early_exit = True
                    if self.requested_early_exit:
                        break
                if i % count != index:
                    for layer in feeders:
                        layer.skip_batch()
                    continue
                iter_loss, outputs = forward_outputs(test_net)
                if p.test_compute_loss:
                    loss += iter_loss
                flat = [(name, weight, value) for name, values, weight in outputs
                        for value in values]
                if not names:
                    scores = [value for _, _, value in flat]
                    names = [name for name, _, _ in flat]
                    weights = [weight for _, weight, _ in flat]
                else:
                    for k, (_, _, value) in enumerate(flat):
                        scores[k] += value
                bar.update(i + 1)
        if self.requested_early_exit:
            log.info("Test interrupted.")
            return
        if reduce is not None:
            sums, names, weights = reduce([loss] + scores, names, weights)
            loss, scores = sums[0], list(sums[1:])
        if p.test_compute_loss and test_iter:
            log.info("Test loss: %s", fmt(loss / test_iter))
        for k, score in enumerate(scores):
            mean = score / test_iter
            log.info("    Test net output #%d: %s = %s%s", k, names[k], fmt(mean),
                     loss_note(weights[k], mean))

    # -- the update -----------------------------------------------------------------------
    def get_learning_rate(self):
        rate, step = learning_rate(self.param, self.iter, self.current_step)
        if self.param.lr_policy == "multistep" and step != self.current_step:
            log.info("MultiStep Status: Iteration %d, step = %d", self.iter, step)
        self.current_step = step
        return rate

    def apply_update(self):
        """Learning rate, global clipping, then every parameter's update (Caffe's ApplyUpdate)."""
        rate = self.get_learning_rate()
        if self.param.display and self.iter % self.param.display == 0:
            log.info("Iteration %d, lr = %s", self.iter, fmt(rate))
        self.clip_gradients()
        for param_id in range(len(self.net.learnable_params)):
            try:
                self.update_param(param_id, rate)
            except MemoryError:
                raise SolverError("Iteration %d: out of memory updating learnable parameter #%d "
                                  "(layer %s)" % (self.iter, param_id,
                                                  self._param_layer(param_id))) from None

    def _param_layer(self, param_id):
        uses = self.net.param_uses()[param_id]
        return self.net.layer_names[uses[0][0]] if uses else "?"

    def clip_gradients(self):
        clip = self.param.clip_gradients
        if clip < 0:
            return
        params = self.net.learnable_params
        sumsq = sum(float(blob.backend.sumsq(blob.dev_diff)) for blob in params)
        scale = updates.clip_scale(sumsq, clip)
        if scale is not None:
            for blob in params:
                blob.backend.scale(scale, blob.mutable_dev_diff)

    @property
    def update_rule(self):
        """Caffe's update sequence for this solver's type (``update_rule.py``), the one the
        distributed exchanges apply too."""
        if self._update_rule is None:
            self._update_rule = UpdateRule(self.param, self.type, self.net.params_lr,
                                           self.net.params_weight_decay)
        return self._update_rule

    def update_param(self, param_id, rate):
        """Normalise, regularise, compute the update value, and apply it to one parameter."""
        if self.type not in updates.UPDATE_RULES:
            raise SolverError("%s defines no update rule" % type(self).__name__)
        blob = self.net.learnable_params[param_id]
        history = self.param_history(param_id)
        if blob.backend.on_device:
            # the whole step in the device's kernels, the same rule and order
            self.update_rule.apply_on_device(blob.backend, param_id, blob.mutable_dev_data,
                                             blob.mutable_dev_diff, history, rate, self.iter)
            return
        self.update_rule.compute(param_id, blob.data, blob.diff, history, rate, self.iter)
        blob.update()

    def local_rate(self, param_id, rate):
        return self.update_rule.local_rate(param_id, rate)

    def param_history(self, param_id):
        """The history arrays of learnable parameter ``param_id``, in the order its rule
        takes them (history[i], then history[i + N] for the rules that keep two)."""
        return self.history[param_id::len(self.net.learnable_params)]

    # -- snapshots ------------------------------------------------------------------------
    def snapshot_prefix(self):
        if self.param.HasField("snapshot_prefix"):
            return self.param.snapshot_prefix
        if self.solver_file:
            # Caffe's upgrade: an empty prefix becomes the solver file's name
            stem = self.solver_file
            return stem[:-len(".prototxt")] if stem.endswith(".prototxt") else stem
        return ""

    def _check_snapshot_write_permissions(self):
        if not self.param.snapshot:
            return
        if not self.param.HasField("snapshot_prefix") and not self.solver_file:
            raise SolverError("In solver params, snapshot is specified but snapshot_prefix is not")
        self._probe_snapshot_prefix()

    def _probe_snapshot_prefix(self):
        # the process id keeps the probes of several workers sharing a folder apart
        probe = "%s_iter_%d.tempfile.%d" % (self.snapshot_prefix(), self.iter, os.getpid())
        try:
            with open(probe, "w"):
                pass
            os.remove(probe)
        except OSError:
            raise SolverError("Cannot write to snapshot prefix '%s'.  Make sure that the "
                              "directory exists and is writable." % self.snapshot_prefix()) from None

    def _check_params_finite(self):
        for i, blob in enumerate(self.net.learnable_params):
            if not np.all(np.isfinite(blob.host_data)):
                where = ("the last good snapshot is %s" % self.last_snapshot
                         if self.last_snapshot else "no snapshot was written in this run")
                message = ("Iteration %d: learnable parameter #%d holds NaN or infinite values; "
                           "the snapshot was not written (%s)" % (self.iter, i, where))
                log.error(message)
                raise TrainingDiverged(message, self.iter, self.last_snapshot)

    def snapshot_filenames(self):
        """(model path, solver state path) of a snapshot taken at this iteration."""
        prefix = self.snapshot_prefix()
        fmt_ = self.param.snapshot_format
        return (snap.model_filename(prefix, self.iter, fmt_),
                snap.state_filename(prefix, self.iter, fmt_))

    def record_snapshot(self, state):
        """Remember ``state`` as the latest snapshot (named when training diverges)."""
        self.last_snapshot = state
        self.last_snapshot_iter = self.iter

    def snapshot(self):
        """A snapshot of this iteration, as the job takes it; returns the solver state path."""
        return self.job.snapshot(self)

    def snapshot_before_failing(self):
        """The snapshot of a run that a data error ends (``LocalJob.snapshot_after_failure``),
        unless this iteration's is written; one that cannot be written is a warning, the
        data error stays the report."""
        if self.last_snapshot_iter == self.iter or not solver_group.root_solver():
            return
        log.info("Iteration %d: the data could not be read; snapshotting the work so far",
                 self.iter)
        try:
            self.snapshot()
        except (snap.SnapshotError, OSError, SolverError) as exc:
            log.warning("the snapshot of the work so far was not written: %s", exc)

    @contextlib.contextmanager
    def hold_snapshot_prefix(self):
        """Hold the snapshot prefix's lock for the block (``prefix_lock``): another live job
        on the same prefix is refused, naming its host and pid (PrefixInUse)."""
        key = prefix_lock.claim(self.snapshot_prefix())
        try:
            yield
        finally:
            prefix_lock.release(key)

    def write_snapshot(self):
        """Write ``<prefix>_iter_N``: the model, the random-state side file, and the solver
        state last, so that a solver state on disk always has its whole set beside it (a
        resume names the solver state); returns the solver state path."""
        self._check_params_finite()
        fmt_ = self.param.snapshot_format
        model, state = self.snapshot_filenames()
        kind = "HDF5 file" if fmt_ == snap.HDF5 else "binary proto file"
        with self.hold_snapshot_prefix():
            # what writers killed on the way left of any iteration's files
            snap.remove_stale_temporaries(self.snapshot_prefix())
            writing = model
            try:
                log.info("Snapshotting to %s %s", kind, model)
                snap.write_model(self.net, model, fmt_, self.param.snapshot_diff)
                writing = snap.rngstate_filename(state)
                snap.write_rngstate(state, self.layer_resume_states())
                log.info("Snapshotting solver state to %s %s", kind, state)
                writing = state
                history = [blob.backend.to_host(h) for blob, h in
                           zip(self.net.learnable_params * self.history_sets, self.history)]
                snap.write_state(state, self.iter, model, self.current_step, history, fmt_)
            except (OSError, pio.ProtoFileError) as exc:
                raise self._snapshot_not_written(writing, exc) from None
        self.record_snapshot(state)
        return state

    def _snapshot_not_written(self, path, exc):
        """The one-line error of a snapshot write that failed (a full disk, a lost mount):
        the file, the iteration and the set to resume from."""
        reason = getattr(exc, "strerror", None) or str(exc)
        if isinstance(exc, pio.ProtoFileError) or path in reason:
            reason = str(exc)           # it names the file already
        else:
            reason = "cannot write %s: %s" % (path, reason)
        where = ("the last complete snapshot set to resume from is %s" % self.last_snapshot
                 if self.last_snapshot else "no complete snapshot set was written in this run")
        error = snap.SnapshotError("Iteration %d: the snapshot was not written (%s); %s"
                                   % (self.iter, reason, where))
        error.filename = path
        return error

    def restore(self, state_file):
        """Resume from a ``.solverstate`` (or ``.solverstate.h5``) as Caffe's Solver::Restore."""
        state_file = os.fspath(state_file)
        it, learned_net, current_step, history = snap.read_state(state_file)
        if learned_net:
            snap.load_weights(self.net, snap.resolve_learned_net(learned_net, state_file))
        if len(history) != len(self.history):
            raise snap.SnapshotError(
                "Incorrect length of history blobs: %s holds %d, the %s solver keeps %d"
                % (state_file, len(history), self.type, len(self.history)))
        # every rule inherits this from SGDSolver in Caffe, so the line names SGDSolver
        log.info("SGDSolver: restoring history")
        for i, (target, source) in enumerate(zip(self.history, history)):
            if int(np.prod(source.shape)) != target.size:
                raise snap.SnapshotError("history blob #%d in %s has %d values; the solver's has %d"
                                         % (i, state_file, int(np.prod(source.shape)), target.size))
            blob = self.net.learnable_params[i % len(self.net.learnable_params)]
            blob.backend.upload(np.asarray(source, dtype=np.float32).reshape(target.shape),
                                target)
        self.iter = it
        self.current_step = current_step
        extra = snap.read_rngstate(state_file)
        if extra is None and snap.written_with_side_files(state_file):
            # a set of this project's that lost its side file: not a Caffe snapshot
            log.warning("Snapshot set %s is incomplete: %s is missing, so the random generator "
                        "and the data layers' record positions of iteration %d are not restored "
                        "(the data is read again from its start, the random draws differ): the "
                        "resumed run will not repeat an uninterrupted one",
                        state_file, snap.rngstate_filename(state_file), it)
        elif extra is None:
            log.info("No %s beside %s: the random stream continues from its current state",
                     os.path.basename(snap.rngstate_filename(state_file)), state_file)
        else:
            rng.set_state(extra["rng"])
            self.set_layer_resume_states(extra.get("layers", {}))
        self.record_snapshot(state_file)

    def _all_nets(self):
        yield "train", self.net
        for i, net in enumerate(self.test_nets):
            yield "test%d" % i, net

    def layer_resume_states(self):
        """{"train/<layer>" or "test<i>/<layer>": state} of every layer that keeps one (the
        data layers' record cursors), as a snapshot's side file holds them."""
        states = {}
        for tag, net in self._all_nets():
            for name, layer in zip(net.layer_names, net.layers):
                getter = getattr(layer, "get_resume_state", None)
                if getter is not None:
                    states["%s/%s" % (tag, name)] = getter()
        return states

    def set_layer_resume_states(self, states):
        """Give each layer its state from ``layer_resume_states`` of a saved run."""
        for tag, net in self._all_nets():
            for name, layer in zip(net.layer_names, net.layers):
                key = "%s/%s" % (tag, name)
                setter = getattr(layer, "set_resume_state", None)
                if setter is not None and key in states:
                    setter(states[key])

    # -- pycaffe conveniences ---------------------------------------------------------------
    def add_callback(self, on_start, on_gradients_ready=None):
        """pycaffe's ``add_callback(on_start, on_gradients_ready)``: two callables, run every
        iteration before forward and once the gradients are complete (before the update);
        or one object with ``on_start()`` and ``on_gradients_ready()`` methods (an NCCL)."""
        if on_gradients_ready is None:
            callback = on_start
            if not (callable(getattr(callback, "on_start", None))
                    and callable(getattr(callback, "on_gradients_ready", None))):
                raise TypeError("add_callback takes two callables (on_start, "
                                "on_gradients_ready) or an object with those methods, not %s"
                                % type(callback).__name__)
        else:
            if not (callable(on_start) and callable(on_gradients_ready)):
                raise TypeError("add_callback(on_start, on_gradients_ready) takes callables")
            callback = _CallbackPair(on_start, on_gradients_ready)
        self.callbacks.append(callback)

    @property
    def lr(self):
        """The learning rate of the current iteration (Caffe's GetLearningRate)."""
        return self.get_learning_rate()

    def share_weights(self, net):
        """Make ``net`` use this solver's training weights (shared storage, by layer name)."""
        net.share_trained_layers_with(self.net)


class _CallbackPair:
    def __init__(self, on_start, on_gradients_ready):
        self.on_start = on_start
        self.on_gradients_ready = on_gradients_ready


# -- helpers shared with the command line ----------------------------------------------------
def _on_device(net):
    """Whether the net's blobs live on a device (its layers share one backend)."""
    return bool(net.layers) and net.layers[0].backend.on_device


def _copy(message):
    out = type(message)()
    out.CopyFrom(message)
    return out


def _set_debug_info(net, value):
    net.param.debug_info = bool(value)


def loss_note(weight, value):
    return " (* %s = %s loss)" % (fmt(weight), fmt(weight * value)) if weight else ""


def blob_loss_weight(net, name):
    weights = net.blob_loss_weights
    if isinstance(weights, dict):
        return float(weights.get(name, 0.0))
    return float(weights[list(net.blobs).index(name)])


def output_values(net):
    """[(output blob name, flat values, loss weight)] for the net's outputs, in order."""
    result = []
    for name in net.outputs:
        blob = net.blobs[name]
        values = np.asarray(blob.host_data, dtype=np.float64).ravel()
        result.append((name, [float(v) for v in values], blob_loss_weight(net, name)))
    return result


def forward_outputs(net):
    """One forward pass -> (loss, output_values)."""
    loss = net.forward_prefilled()
    return float(loss), output_values(net)
