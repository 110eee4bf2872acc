"""Caffe's command-line brew: train, test, time and device_query, with Caffe's flags and
defaults (and Poseidon's and this project's flags for distributed training).
"""
import importlib
import os
import signal
import time
import types

from .. import log
from ..sync import planner as sync_planner      # light: the strategy registry, no MPI
from . import flags as gflags

CAFFE_FLAGS = [
    gflags.Flag("gpu", "", "Optional; run in GPU mode on the given device IDs separated by ','. "
                "Use '-gpu all' to run on all available GPUs."),
    gflags.Flag("solver", "", "The solver definition protocol buffer text file."),
    gflags.Flag("model", "", "The model definition protocol buffer text file."),
    gflags.Flag("phase", "", "Optional; network phase (TRAIN or TEST). Only used for 'time'."),
    gflags.Flag("level", 0, "Optional; network level."),
    gflags.Flag("stage", "", "Optional; network stages (not to be confused with phase), "
                "separated by ','."),
    gflags.Flag("snapshot", "", "Optional; the snapshot solver state to resume training."),
    gflags.Flag("weights", "", "Optional; the pretrained weights to initialize finetuning, "
                "separated by ','. Cannot be set simultaneously with snapshot."),
    gflags.Flag("iterations", 50, "The number of iterations to run."),
    gflags.Flag("sigint_effect", "stop", "Optional; action to take when a SIGINT signal is "
                "received: snapshot, stop or none."),
    gflags.Flag("sighup_effect", "snapshot", "Optional; action to take when a SIGHUP signal is "
                "received: snapshot, stop or none."),
]

# Read by the distributed engine (poseidon_caffe.sync) when a job runs on several ranks.
SYNC_FLAGS = [
    gflags.Flag("sync", "", "Optional; distributed gradient exchange: auto, ps, sfb or allreduce."),
    gflags.Flag("svb", None, "Optional; Poseidon's switch: true sends every fully connected "
                "(InnerProduct) weight as sufficient factors when the job spans several hosts; "
                "false never (unset: the planner weighs them like the other choices).",
                kind=bool),
    gflags.Flag("dwbp", True, "Wait-free backpropagation: send each layer's gradients as soon as "
                "they are ready (-nodwbp sends after the whole backward pass)."),
    gflags.Flag("comm_channels", 0, "Exchanges in flight at once: layer (bucket) b travels on "
                "channel b mod N, each channel one exchange at a time (0 = a channel per "
                "bucket; 1 = one exchange at a time)."),
    gflags.Flag("staleness", 0, "Stale-synchronous bound in iterations (0 = bulk synchronous)."),
    gflags.Flag("timeline", "", "Optional; write each rank's timeline of layers and exchanges as "
                "Chrome trace JSON: rank 0 to this file, rank r to FILE.rank<r>.json."),
    gflags.Flag("ranks_per_host", 0, "Worker ranks per host (0 = detect from MPI)."),
    gflags.Flag("server_ranks", 0, "Dedicated parameter-server ranks: the last N ranks of the "
                "job hold the server shards and train nothing (0 = one shard per host, "
                "co-located with a worker)."),
    gflags.Flag("output_dir", "", "Optional; directory for per-rank logs and timelines."),
    gflags.Flag("ps_update", "server", "How workers' gradients become one update: server (one "
                "Caffe update of the averaged gradient, as one worker with P times the batch) "
                "or worker (Poseidon's rule: each worker's solver computes its update, the "
                "updates are added)."),
]

# Poseidon's caffe_main flags (its own and Bösen's), taken as Poseidon's scripts give them.
POSEIDON_FLAGS = [
    gflags.Flag("hostfile", "", "Poseidon's host file (<client_id> <ip> <port> per line). Under "
                "mpiexec: checked against the job's hosts, names the clients. Alone: this "
                "process is client -client_id of the job the host file describes, and joins "
                "it (see the launcher)."),
    gflags.Flag("client_id", -1, "This host's client id (Poseidon's; -1: the host's index). "
                "Names the per-client log folder and the data partition <source>_<client_id>."),
    gflags.Flag("num_clients", 0, "Hosts in the job (0: any); checked against the job."),
    gflags.Flag("num_app_threads", 0, "Poseidon's name for -ranks_per_host: worker ranks "
                "(devices) per host (0: detect from MPI)."),
    gflags.Flag("table_staleness", None, "Poseidon's name for -staleness.", kind=int),
    gflags.Flag("consistency_model", "", "SSPPush (Poseidon's default), SSP or SSPAggr: "
                "stale-synchronous with -table_staleness (all served as SSPPush: the servers "
                "push fresh rows); BSP: bulk-synchronous (staleness 0)."),
    gflags.Flag("net_outputs", "", "Prefix of the .netoutputs file (PREFIX.netoutputs): the "
                "train outputs at every display, averaged over the workers."),
    gflags.Flag("stats_path", "", "File for the job's sync statistics (every worker's)."),
    gflags.Flag("num_table_threads", 0, "Bösen tuning knob; no effect here."),
    gflags.Flag("num_rows_per_table", 0, "Bösen tuning knob; no effect here."),
    gflags.Flag("num_comm_channels_per_client", 0, "Bösen tuning knob; no effect here."),
    gflags.Flag("svb_timeout_ms", 0, "Bösen tuning knob; no effect here."),
    gflags.Flag("init_thread_access_table", None, "Bösen tuning knob; no effect here.",
                kind=bool),
]
BOSEN_KNOBS = ("num_table_threads", "num_rows_per_table", "num_comm_channels_per_client",
               "svb_timeout_ms", "init_thread_access_table")
CONSISTENCY_MODELS = ("SSPPush", "SSP", "SSPAggr", "BSP")

ALL_FLAGS = CAFFE_FLAGS + SYNC_FLAGS + POSEIDON_FLAGS

class CommandError(ValueError):
    """A command used wrongly (a missing or conflicting flag); the message says what to give."""


# -- shared set-up ------------------------------------------------------------------------------
def _stages(values):
    return tuple(s for s in values["stage"].split(",") if s)


def _gpus(text):
    if not text:
        return []
    if text == "all":
        count = _gpu_count("-gpu=all")
        if not count:
            raise CommandError("-gpu=all: no GPU found")
        return list(range(count))
    try:
        gpus = [int(g) for g in text.split(",") if g != ""]
    except ValueError:
        raise CommandError("-gpu takes device ids separated by ',' or 'all', not %r" % text) from None
    count = _gpu_count("-gpu=%s" % text)
    missing = [g for g in gpus if not 0 <= g < count]
    if missing:
        raise CommandError("-gpu=%s: no device %s; this host has %d GPU%s (ids 0..%d)"
                           % (text, ",".join(map(str, missing)), count,
                              "" if count == 1 else "s", count - 1))
    return gpus


def _gpu_count(flag):
    """The devices of the GPU driver (POSEIDON_CAFFE_DRIVER=emulated: the emulated ones); a
    CommandError saying why there are none (no NVIDIA driver, no binding, no device)."""
    from .. import backend
    try:
        return backend.gpu_count()
    except backend.GPUUnavailable as exc:
        raise CommandError("%s: %s" % (flag, exc)) from None


def local_rank():
    """(this rank's index among its host's ranks, ranks on the host) from the environment
    mpiexec gives every rank (MPICH's hydra or Open MPI; no MPI import), or None outside one."""
    for rank_var, size_var in (("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
                               ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
                               ("PMI_LOCAL_RANK", "PMI_LOCAL_SIZE")):
        if rank_var in os.environ and size_var in os.environ:
            try:
                return int(os.environ[rank_var]), int(os.environ[size_var])
            except ValueError:
                pass
    return None


def _rank_device(gpus):
    """The one device of this process from -gpu's list: the list itself when it names one;
    under mpiexec, the r-th id for the host's r-th rank (one rank per listed GPU)."""
    if len(gpus) == 1:
        return gpus[0]
    ids = ",".join(map(str, gpus))
    place = local_rank()
    if place is None or world_size() == 1:
        raise CommandError("-gpu=%s names %d devices; one process drives one device: run one "
                           "rank per device with mpiexec (-gpu then names each rank's device)"
                           % (ids, len(gpus)))
    rank, per_host = place
    if per_host != len(gpus):
        raise CommandError("-gpu=%s names %d devices but this host runs %d rank%s: list one "
                           "GPU id per rank of the host" % (ids, len(gpus), per_host,
                                                            "" if per_host == 1 else "s"))
    return gpus[rank]


def _select_device(gpus, from_solver=False):
    from .. import backend, gpu_mode
    if not gpus:
        log.info("Use CPU.")
        backend.set_mode_cpu()
        return
    gpus = [_rank_device(gpus)]
    backend.set_device(gpus[0])
    try:
        gpu_mode.set_mode_gpu()
    except backend.GPUUnavailable as exc:
        if not from_solver:
            raise CommandError("-gpu=%d: %s" % (gpus[0], exc)) from None
        log.warning("The solver asks for solver_mode GPU, but %s; using the CPU.", exc)
        log.info("Use CPU.")
        backend.set_mode_cpu()
        return
    log.info("Use GPU with device ID %d%s", gpus[0],
             " (the emulated device)" if backend.get_backend().emulated else "")


def _device_failure(exc):
    """Whether ``exc`` is this rank's device failing: out of its memory, or a driver error
    (inside a layer, which the net names, or elsewhere)."""
    from .. import backend
    from ..net.errors import LayerDeviceError, NetMemoryError
    return backend.mode() == "gpu" and (
        isinstance(exc, (MemoryError, NetMemoryError, LayerDeviceError))
        or backend.is_device_error(exc))


def _log_rank_device():
    from .. import backend
    if backend.mode() == "gpu":
        gpu = backend.get_backend()
        log.info("This rank drives GPU %d%s", gpu.device,
                 " (the emulated device)" if gpu.emulated else "")


def _iterations(values):
    """-iterations for test and time: a count of batches, at least one."""
    if values["iterations"] < 1:
        raise CommandError("-iterations must be a positive number of iterations, not %d"
                           % values["iterations"])
    return values["iterations"]


def _phase(values, default):
    from ..proto import caffe_pb2
    text = values["phase"]
    if not text:
        return default
    if text not in ("TRAIN", "TEST"):
        raise CommandError("phase must be \"TRAIN\" or \"TEST\", not %r" % text)
    return caffe_pb2.TRAIN if text == "TRAIN" else caffe_pb2.TEST


def world_size():
    """MPI ranks in this job, read from the launcher's environment (no MPI import)."""
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS"):
        if var in os.environ:
            try:
                return int(os.environ[var])
            except ValueError:
                pass
    return 1


def poseidon_flags(values):
    """Fold Poseidon's caffe_main flags into this project's (in ``values``); returns the notes
    to log once (flags that are accepted but have no effect)."""
    if values["ps_update"] not in ("server", "worker"):
        raise CommandError("-ps_update takes server or worker, not %r" % values["ps_update"])
    if values["table_staleness"] is not None:
        if values["staleness"] and values["staleness"] != values["table_staleness"]:
            raise CommandError("-staleness=%d and -table_staleness=%d disagree (they are one "
                               "setting: give one)" % (values["staleness"],
                                                       values["table_staleness"]))
        values["staleness"] = values["table_staleness"]
    if values["num_app_threads"]:
        if values["num_app_threads"] < 0:
            raise CommandError("-num_app_threads must be 1 or more, not %d"
                               % values["num_app_threads"])
        if values["ranks_per_host"] and values["ranks_per_host"] != values["num_app_threads"]:
            raise CommandError("-ranks_per_host=%d and -num_app_threads=%d disagree (they are "
                               "one setting: give one)" % (values["ranks_per_host"],
                                                           values["num_app_threads"]))
        values["ranks_per_host"] = values["num_app_threads"]
    if values["staleness"] < 0:
        raise CommandError("-staleness must be 0 or more, not %d" % values["staleness"])
    notes = []
    model = values["consistency_model"]
    if model:
        if model not in CONSISTENCY_MODELS:
            raise CommandError("-consistency_model takes %s, not %r"
                               % (", ".join(CONSISTENCY_MODELS), model))
        if model == "BSP" and values["staleness"]:
            raise CommandError("-consistency_model=BSP is bulk-synchronous, but the staleness "
                               "is %d: drop one of them" % values["staleness"])
        if model in ("SSP", "SSPAggr"):
            notes.append("-consistency_model=%s is served as SSPPush (the servers push fresh "
                         "rows to every client)" % model)
    if values["client_id"] < -1:
        raise CommandError("-client_id must be 0 or more, not %d" % values["client_id"])
    if values["num_clients"] < 0:
        raise CommandError("-num_clients must be 0 or more, not %d" % values["num_clients"])
    # outside mpiexec, caffe_main's job flags make this process a one-worker job, where they
    # act (outputs, stats, host checks, the svb note) instead of being dropped silently
    job_flags = (values["hostfile"] or values["net_outputs"] or values["stats_path"]
                 or values["svb"] is not None or values["client_id"] >= 0
                 or values["num_clients"] > 0 or values["num_app_threads"] > 0)
    if job_flags and not values["sync"] and world_size() == 1:
        values["sync"] = "auto"
    knobs = ["-%s=%s" % (name, str(values[name]).lower() if isinstance(values[name], bool)
                         else values[name])
             for name in BOSEN_KNOBS if values[name] not in (0, None)]
    if knobs:
        notes.append("Bösen tuning flags accepted, no effect here: " + " ".join(knobs))
    return notes


def _joins_by_hostfile(values):
    """Whether this process is one client of a host-file job started host by host (Poseidon's
    scripts run caffe_main train on every host): no MPI job around it, a host file of several
    clients."""
    if not values["hostfile"] or world_size() > 1:
        return False
    from ..launch.hosts import read_localserver
    return len(read_localserver(values["hostfile"])) > 1


def _is_distributed(values):
    modes = sync_planner.modes()      # auto, or any registered strategy's name
    if values["sync"] and values["sync"] not in modes:
        raise CommandError("-sync takes one of %s, not %r" % (", ".join(modes), values["sync"]))
    return world_size() > 1 or bool(values["sync"])


def _prepare_distributed(values):
    """Start this rank's part of a distributed job (topology, per-rank log, data shard) before
    the solver is built, so its data layers read this worker's share. mpi4py is imported only
    here: a single-process run never loads it. A dedicated server rank (-server_ranks) serves
    here and returns True: it has no solver to build."""
    if not _is_distributed(values):
        return False
    sync = importlib.import_module("poseidon_caffe.sync")
    options = types.SimpleNamespace(**values)
    topology = sync.prepare(options)
    if getattr(topology, "is_server", False):
        # a dedicated parameter-server rank builds no net: it serves until the workers finish.
        # A Ctrl-C or a snapshot request reaches every rank of the job; the workers act on it
        # and tell the servers, so here it is ignored (starting MPI may have put a handler in
        # place that would end the rank, and the job with it)
        for name in ("SIGINT", "SIGHUP", "SIGUSR1"):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
        sync.serve(options)
        return True
    return False


def _distribute(solver, values):
    """Hand the solver to the distributed engine when the job is distributed; returns what to
    run (the engine's runner, or the solver itself)."""
    if not _is_distributed(values):
        return solver
    sync = importlib.import_module("poseidon_caffe.sync")
    runner = sync.attach(solver, types.SimpleNamespace(**values))
    return runner if runner is not None else solver


# -- commands -----------------------------------------------------------------------------------
def train(values):
    from ..io import read_solver_param
    from ..proto import caffe_pb2
    from ..solver import get_solver
    from ..solver.signals import SignalHandler, parse_action
    if not values["solver"]:
        raise CommandError("Need a solver definition to train (-solver=solver.prototxt).")
    if values["snapshot"] and values["weights"]:
        raise CommandError("Give a snapshot to resume training or weights to finetune but not both.")
    notes = poseidon_flags(values)
    if _joins_by_hostfile(values):
        from .join_client import train_client
        return train_client(values, values.get("_argv", []))
    sigint = parse_action(values["sigint_effect"], "sigint_effect")
    sighup = parse_action(values["sighup_effect"], "sighup_effect")
    solver_param = read_solver_param(values["solver"])
    solver_param.train_state.level = values["level"]
    for stage in _stages(values):
        solver_param.train_state.stage.append(stage)
    gpus = _gpus(values["gpu"])
    from_solver = False
    if (not gpus and solver_param.HasField("solver_mode")
            and solver_param.solver_mode == caffe_pb2.SolverParameter.GPU):
        gpus = [solver_param.device_id]
        from_solver = True
    _select_device(gpus, from_solver)
    if values["snapshot"]:
        solver_param.ClearField("weights")
    elif values["weights"]:
        solver_param.ClearField("weights")
        solver_param.weights.append(values["weights"])
    # installed before a distributed job starts, so that a signal during start-up waits for
    # the first iteration boundary; a dedicated server rank keeps it and never asks: the
    # workers decide when the job stops
    with SignalHandler(sigint, sighup) as handler:
        if _prepare_distributed(values):
            handler.ignore_after_exit()     # a server rank, done: a late signal changes nothing
            return 0
        handler.reassert()          # starting MPI may have put other handlers in place
        if _is_distributed(values):
            _log_rank_device()      # into this rank's own log, which prepare opened
        for note in notes:
            log.info("%s", note)
        try:
            solver = get_solver(solver_param, solver_file=values["solver"])
            # nothing in a run of the tool reads an intermediate gradient after backward
            solver.net.share_diffs()
            solver.set_action_function(handler.requested_action)
            if values["snapshot"]:
                log.info("Resuming from %s", values["snapshot"])
                solver.restore(values["snapshot"])
            runner = _distribute(solver, values)
            if runner is not solver:
                handler.ignore_after_exit()
            log.info("Starting Optimization")
            runner.solve()
        except Exception as exc:
            # a rank's device failing (out of memory, a driver error in a layer) ends the
            # whole job at once, in one line naming the rank, host, device and layer
            if _is_distributed(values) and _device_failure(exc):
                from ..sync.failure import end_job_on_error
                end_job_on_error(exc)
            raise
    log.info("Optimization Done.")
    return 0


def test(values):
    from ..net import Net
    from ..progress import ProgressBar
    from ..proto import caffe_pb2
    from ..solver.snapshot import load_weights_files
    from ..solver.solver import fmt, loss_note, output_values
    if not values["model"]:
        raise CommandError("Need a model definition to score (-model=net.prototxt).")
    if not values["weights"]:
        raise CommandError("Need model weights to score (-weights=model.caffemodel).")
    iterations = _iterations(values)
    _select_device(_gpus(values["gpu"]))
    net = Net(values["model"], caffe_pb2.TEST, level=values["level"], stages=_stages(values))
    load_weights_files(net, values["weights"].split(","))
    log.info("Running for %d iterations.", iterations)
    scores, names, weights = [], [], []
    loss = 0.0
    with ProgressBar(iterations, "Testing") as bar:
        for i in range(iterations):
            loss += float(net.forward_prefilled())
            idx = 0
            for name, vals, weight in output_values(net):
                for value in vals:
                    if i == 0:
                        scores.append(value)
                        names.append(name)
                        weights.append(weight)
                    else:
                        scores[idx] += value
                    idx += 1
                    log.info("Batch %d, %s = %s", i, name, fmt(value))
            bar.update(i + 1)
    loss /= max(iterations, 1)
    log.info("Loss: %s", fmt(loss))
    for k, score in enumerate(scores):
        mean = score / iterations
        log.info("%s = %s%s", names[k], fmt(mean), loss_note(weights[k], mean))
    return 0


def time_model(values):
    from ..net import Net
    from ..net.timing import time_layers
    from ..proto import caffe_pb2
    if not values["model"]:
        raise CommandError("Need a model definition to time (-model=net.prototxt).")
    phase = _phase(values, caffe_pb2.TRAIN)
    iterations = _iterations(values)
    _select_device(_gpus(values["gpu"]))
    net = Net(values["model"], phase, level=values["level"], stages=_stages(values))
    if values["weights"]:
        # timing does not depend on the values, but weights given are weights checked
        from ..solver.snapshot import load_weights_files
        load_weights_files(net, values["weights"].split(","))
    net.share_diffs()                  # as train runs it
    from .. import backend
    # a device runs its work queued: every time read waits for it first (Caffe's events)
    wait_for_device = backend.get_backend().synchronize

    def now():
        wait_for_device()
        return time.perf_counter()
    log.info("Memory needed for blobs: %s", net.memory_summary())
    log.info("Performing Forward")
    initial_loss = net.forward_prefilled()
    log.info("Initial loss: %g", initial_loss)
    log.info("Performing Backward")
    net.backward_from_to()
    log.info("*** Benchmark begins ***")
    log.info("Testing for %d iterations.", iterations)
    times = time_layers(net, iterations, clock=now, on_iteration=lambda j, seconds: log.info(
        "Iteration: %d forward-backward time: %g ms.", j + 1, seconds * 1e3))
    total = times["total"]
    per = 1e3 / max(iterations, 1)
    log.info("Average time per layer: ")
    for i, name in enumerate(net.layer_names):
        log.info("%10s\tforward: %g ms.", name, times["forward"][i] * per)
        log.info("%10s\tbackward: %g ms.", name, times["backward"][i] * per)
    log.info("Average Forward pass: %g ms.", times["forward_total"] * per)
    log.info("Average Backward pass: %g ms.", times["backward_total"] * per)
    log.info("Average Forward-Backward: %g ms.", total * per)
    log.info("Total Time: %g ms.", total * 1e3)
    for line in layer_shares(net.layer_names, [t * per for t in times["forward"]],
                             [t * per for t in times["backward"]]):
        log.info("%s", line)
    log.info("*** Benchmark ends ***")
    return 0


def layer_shares(names, forward_ms, backward_ms):
    """Lines giving each layer's share of the time all layers took, forward and backward
    together, in net order, and that time in ms. They follow Caffe's table as a block of their
    own (no line says 'forward:' or 'backward:'), so parsers of Caffe's lines read the same."""
    totals = [f + b for f, b in zip(forward_ms, backward_ms)]
    whole = sum(totals)
    lines = ["Share of forward-backward time per layer: "]
    for name, part in zip(names, totals):
        share = 100.0 * part / whole if whole > 0 else 0.0
        lines.append("%10s\tshare: %5.1f %% (%g ms)" % (name, share, part))
    return lines


def device_query(values):
    import numpy as np
    from .. import backend
    log.info("Querying devices")
    cpu = backend.get_backend() if backend.mode() == "cpu" else None
    if cpu is None:
        backend.set_mode_cpu()
        cpu = backend.get_backend()
    log.info("Device: CPU (backend %s)", cpu.name)
    log.info("Logical cores: %d", os.cpu_count() or 1)
    log.info("Data type: %s", np.dtype(cpu.dtype).name)
    log.info("numpy version: %s", np.__version__)
    for gpu in _gpus(values["gpu"]):
        backend.set_device(gpu)
        try:
            backend.set_mode_gpu()
        except backend.GPUUnavailable as exc:
            raise CommandError("cannot query GPU %d: %s" % (gpu, exc)) from None
        log.info("Querying GPU %d", gpu)
        for line in backend.get_backend().describe():
            log.info("%s", line)
    return 0


COMMANDS = {"train": train, "test": test, "time": time_model, "device_query": device_query}

# what ``COMMAND -help`` prints above the flags, for the commands defined here
COMMAND_USAGE = {
    "train": ("train -solver=SOLVER [-weights=W[,W...] | -snapshot=STATE] [flags]\n"
              "Train or finetune a model; under mpiexec each rank is one worker of the job.",
              ALL_FLAGS),
    "test": ("test -model=NET -weights=W[,W...] [-iterations=N] [flags]\n"
             "Score a model: run N test batches and print each output's mean.", CAFFE_FLAGS),
    "time": ("time -model=NET [-phase=TRAIN|TEST] [-iterations=N] [flags]\n"
             "Benchmark model execution time, layer by layer, forward and backward.",
             CAFFE_FLAGS),
    "device_query": ("device_query [-gpu=IDS]\n"
                     "Show the compute devices (the CPU backend, and GPUs when available).",
                     CAFFE_FLAGS),
}
