"""From Poseidon's settings and host file to one running ``mpiexec`` job.

The host file is read by ``hosts.py``; the job runs one rank per device of every host, its
command an argument list (never a shell string, ``command.py``), printed before it runs.
SIGINT, SIGTERM and SIGHUP sent to the launcher (or a Ctrl-C) are passed on to mpiexec, which
delivers them to every rank; the launcher waits and exits with mpiexec's status.

Its command-line faces live in ``tools/launch.py``: ``python -m poseidon_caffe.tools.launch
--solver S [--hostfile F] [--devices 0,1] ...`` (the ``train_*.sh`` scripts) and ``run_local``
(the ``run_local.py`` files).
"""
import os
import signal
import subprocess
import sys

from . import join
from .command import build_command
from .hosts import HostFileError, check_reachable, read_localserver


def output_dir(dataset, staleness, num_hosts, num_threads, root="output"):
    """Poseidon's output folder name: caffe.<dataset>.S<staleness>.M<hosts>.T<threads>."""
    return os.path.join(root, "caffe.%s.S%d.M%d.T%d" % (dataset, staleness, num_hosts,
                                                        num_threads))


# What the launcher passes on to mpiexec for each signal it gets. MPICH's mpiexec sends SIGINT,
# SIGTERM and SIGUSR1 on to every rank (a second SIGINT aborts the job at once) but dies on
# SIGHUP, so a SIGHUP goes on as SIGUSR1, which the ranks take as SIGHUP.
FORWARDED_SIGNALS = {signal.SIGINT: signal.SIGINT, signal.SIGTERM: signal.SIGTERM,
                     signal.SIGHUP: signal.SIGUSR1}


def run(args, dry_run=False, stream=None):
    """Print the command, run it, and return its exit status (128 + N if signal N ended it).

    mpiexec runs in a process group of its own, so that a Ctrl-C in the terminal reaches it
    once, through this launcher (a second SIGINT would abort the job before its snapshot). Its
    standard input is /dev/null: outside the terminal's foreground group it must not read it.
    A signal that arrives before mpiexec is started ends the launcher without starting it.
    """
    stream = stream or sys.stdout
    stream.write(" ".join(args) + "\n")
    stream.flush()
    if dry_run:
        return 0
    job = {"proc": None, "early": None}

    def forward(signum, frame):
        if job["proc"] is None:
            job["early"] = job["early"] or signum
        elif job["proc"].returncode is None:
            job["proc"].send_signal(FORWARDED_SIGNALS[signum])
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        if job["early"] is None:
            job["proc"] = subprocess.Popen(args, stdin=subprocess.DEVNULL,
                                           preexec_fn=lambda: os.setpgid(0, 0))
        if job["proc"] is None:
            return 128 + job["early"]
        if job["early"] is not None:      # it came while mpiexec was being started
            job["proc"].send_signal(FORWARDED_SIGNALS[job["early"]])
        code = job["proc"].wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


# Poseidon's flags that the settings block may carry and that go to every rank unchanged
PASSED_SETTINGS = ("consistency_model", "num_table_threads", "num_rows_per_table",
                   "num_comm_channels_per_client", "svb_timeout_ms", "init_thread_access_table",
                   "ps_update")
# this project's earlier names for settings that Poseidon names otherwise
OLD_SETTING_NAMES = {"solver_filename": "solver", "snapshot_filename": "snapshot",
                     "staleness": "table_staleness"}


def _setting_text(value):
    return str(value).lower() if isinstance(value, bool) else str(value)


def launch_from_settings(settings, client_id=None, hostfile=None, dry_run=False,
                         repo_root=None, stream=None):
    """What every ``examples/*/run_local.py`` does with the settings at its top (Poseidon's
    names: solver, snapshot, devices, table_staleness, svb, net_outputs, stats_path,
    consistency_model, num_table_threads, ... ; and this project's sync, dwbp, num_servers,
    ps_update, dataset); returns the exit status.

    Without ``client_id`` the whole job starts from here with one mpiexec (``hostfile``
    defaults to ``localserver`` in ``repo_root``); with it this is client ``client_id`` of
    Poseidon's per-host form, run once per host: the invocations join one MPI job
    (``join.py``). HostFileError names a host file that cannot be used or a client it lacks;
    JoinError a join that failed."""
    stream = stream or sys.stdout
    settings = dict(settings)
    for old, new in OLD_SETTING_NAMES.items():
        if old in settings and new not in settings:
            settings[new] = settings.pop(old)
    root = repo_root or os.getcwd()
    hostfile = hostfile or os.path.join(root, "localserver")
    hosts = read_localserver(hostfile)
    if client_id is not None and client_id not in [cid for cid, _, _ in hosts]:
        raise HostFileError("client id %d is not in %s (its clients are %s)"
                            % (client_id, hostfile, ", ".join(str(c) for c, _, _ in hosts)))
    devices = list(settings.get("devices", [0]))
    staleness = int(settings.get("table_staleness", 0))
    dataset = settings.get("dataset", "data")
    out = output_dir(dataset, staleness, len(hosts), len(devices), os.path.join(root, "output"))
    # Poseidon's outputs: <out>/<dataset>.netoutputs, <out>/caffe_stats.yaml, and one log
    # folder per client, <out>/logs.<client_id>
    net_outputs = settings.get("net_outputs") or os.path.join(out, dataset)
    stats_path = settings.get("stats_path") or os.path.join(out, "caffe_stats.yaml")
    extra = ["-net_outputs=%s" % net_outputs, "-stats_path=%s" % stats_path]
    extra += ["-%s=%s" % (name, _setting_text(settings[name]))
              for name in PASSED_SETTINGS if settings.get(name) not in (None, "")]
    lead = join.leader(hosts)
    one_mpiexec = client_id is None or (len(hosts) == 1 and client_id == lead[0])
    if one_mpiexec and not dry_run:
        check_reachable(hosts, hostfile)
    if not dry_run:
        os.makedirs(out, exist_ok=True)
    args = build_command(hosts, devices, settings["solver"], staleness=staleness,
                         svb=settings.get("svb", False), sync=settings.get("sync", "auto"),
                         dwbp=settings.get("dwbp", True),
                         snapshot=settings.get("snapshot", ""), out_dir=out,
                         use_gpu=settings.get("use_gpu"),
                         num_servers=int(settings.get("num_servers", 0)),
                         client_ids=True, extra=extra)
    if client_id is None or len(hosts) == 1:
        if client_id is not None and client_id != lead[0]:
            stream.write("client %d: %s names one host, client %d starts the job\n"
                         % (client_id, hostfile, lead[0]))
            return 0
        return run(args, dry_run, stream)
    if dry_run:
        if client_id == lead[0]:
            stream.write(" ".join(join.manual_launch(args)) + "\n")
        else:
            stream.write("client %d joins client %d at %s:%d\n" % ((client_id,) + lead))
        return 0
    return join.run_client(client_id, hosts, args, stream)
