"""The ``mpiexec`` argument list of a job: one rank per (host, device), hosts in the host file's
order, every rank ``poseidon-caffe train`` under ``supervise`` (so that a rank killed outright
is named). The launcher (``build_command``) and a client started host by host
(``tools/join_client.py``, through ``job_command``) build it here, the one place.
"""
import importlib.util
import os
import shutil
import sys


def gpu_available():
    """Whether the ranks will have GPUs to bind (-gpu=<id> each): the emulated device when
    the environment chooses it (the ranks inherit the setting), else an NVIDIA driver on this
    machine and a binding of it (cuda-bindings or pycuda) to drive it."""
    from ..backend.cuda import choice
    try:
        if choice.requested() == "emulated":
            return True
    except choice.ChoiceError:
        return False
    if choice.nvidia_driver_missing():
        return False
    return any(importlib.util.find_spec(name) is not None for name in ("cuda.bindings", "pycuda")
               if importlib.util.find_spec(name.split(".")[0]) is not None)


def mpiexec_beside(python):
    """The mpiexec on the PATH, else the one in ``python``'s folder (a virtualenv's)."""
    return shutil.which("mpiexec") or os.path.join(os.path.dirname(python), "mpiexec")


def rank_command(train_args, python=None):
    """What one rank runs: ``poseidon-caffe train TRAIN_ARGS`` under ``supervise``."""
    python = python or sys.executable
    return [python, "-m", "poseidon_caffe.tools.supervise", "--",
            python, "-m", "poseidon_caffe.cli", "train"] + list(train_args)


def job_command(hosts, devices, train_args, *, use_gpu, client_ids, num_servers=0,
                mpiexec=None, python=None):
    """The mpiexec argument list: one rank per (host, device) of ``hosts`` (read_localserver's
    list), then ``num_servers`` dedicated parameter-server ranks, placed on the hosts in turn.
    A rank gets ``-gpu=<device>`` with ``use_gpu`` (a device of None gets none) and, with
    ``client_ids``, its host's ``-client_id``."""
    python = python or sys.executable
    mpiexec = mpiexec or mpiexec_beside(python)
    # hydra places ranks host by host (ip:count); one segment per (host, device) so that
    # each rank gets its own device flag
    # the servers are the last ranks: hydra places them after the workers, one slot each
    places = ["%s:%d" % (ip, len(devices)) for _, ip, _ in hosts]
    places += ["%s:1" % hosts[s % len(hosts)][1] for s in range(num_servers)]
    args = [mpiexec, "-hosts", ",".join(places)]
    rank = rank_command(train_args, python)
    first = True
    for cid, _, _ in hosts:
        for device in devices:
            if not first:
                args.append(":")
            first = False
            args += ["-n", "1"] + rank
            if use_gpu and device is not None:
                args.append("-gpu=%d" % device)
            if client_ids:
                args.append("-client_id=%d" % cid)
    for _ in range(num_servers):
        args += [":", "-n", "1"] + rank
    return args


def build_command(hosts, devices, solver, *, staleness=0, svb=False, sync="auto", dwbp=True,
                  snapshot="", weights="", out_dir="", timeline="", use_gpu=None,
                  mpiexec=None, python=None, extra=(), num_servers=0, client_ids=False):
    """The launcher's job: ``job_command`` with the train flags of these settings.
    ``client_ids``: every rank also gets its host's ``-client_id`` from the host file."""
    if not devices:
        raise ValueError("devices is empty: list at least one device (or CPU worker) per host")
    if num_servers < 0:
        raise ValueError("num_servers is %d: give 0 (shards co-located with the workers) or "
                         "more dedicated server ranks" % num_servers)
    use_gpu = gpu_available() if use_gpu is None else use_gpu
    train = ["-solver=%s" % solver, "-sync=%s" % sync,
             "-svb=%s" % str(bool(svb)).lower(), "-dwbp=%s" % str(bool(dwbp)).lower(),
             "-staleness=%d" % staleness, "-ranks_per_host=%d" % len(devices)]
    if num_servers:
        train.append("-server_ranks=%d" % num_servers)
    if snapshot:
        train.append("-snapshot=%s" % snapshot)
    if weights:
        train.append("-weights=%s" % weights)
    if out_dir:
        train.append("-output_dir=%s" % out_dir)
    if timeline:
        train.append("-timeline=%s" % timeline)
    train.extend(extra)
    return job_command(hosts, devices, train, use_gpu=use_gpu, client_ids=client_ids,
                       num_servers=num_servers, mpiexec=mpiexec, python=python)
