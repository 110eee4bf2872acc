"""The launcher's commands: ``python -m poseidon_caffe.tools.launch --solver S [--hostfile F]
[--devices 0,1] ...`` (what the ``train_*.sh`` scripts run) and ``run_local`` (what every
``examples/*/run_local.py`` calls with its settings), over ``launch/launcher.py``.
"""
import argparse
import os
import signal
import sys

from ..launch.command import build_command
from ..launch.hosts import HostFileError, check_reachable, read_localserver
from ..launch.join import JoinError
from ..launch.launcher import (OLD_SETTING_NAMES, PASSED_SETTINGS, launch_from_settings,
                               output_dir, run)
from ..launch.timeouts import TimeoutSettingError


def parse_devices(text):
    try:
        return [int(d) for d in str(text).split(",") if d.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError("devices are integers separated by ',', not %r"
                                         % text) from None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m poseidon_caffe.tools.launch",
                                     description="Start a distributed poseidon-caffe job.")
    parser.add_argument("--solver", required=True)
    parser.add_argument("--hostfile", default="localserver")
    parser.add_argument("--devices", type=parse_devices, default=[0])
    parser.add_argument("--staleness", type=int, default=0)
    parser.add_argument("--svb", default="false", choices=("true", "false"))
    parser.add_argument("--sync", default="auto", choices=("auto", "ps", "sfb", "allreduce"))
    parser.add_argument("--dwbp", default="true", choices=("true", "false"))
    parser.add_argument("--ps_update", default="server", choices=("server", "worker"),
                        help="server: one update of the averaged gradient; worker: Poseidon's "
                             "rule, the workers' own updates added")
    parser.add_argument("--num_servers", type=int, default=0,
                        help="dedicated parameter-server ranks (0: one shard per host)")
    parser.add_argument("--num_app_threads", type=int, default=0,
                        help="devices per host, as Poseidon's scripts name it; when given it "
                             "must match the number of --devices")
    parser.add_argument("--snapshot", default="")
    parser.add_argument("--weights", default="")
    parser.add_argument("--dataset", default="data")
    parser.add_argument("--output_root", default="output")
    parser.add_argument("--dry-run", action="store_true")
    a = parser.parse_args(argv)
    if a.num_app_threads and a.num_app_threads != len(a.devices):
        sys.stderr.write("--devices lists %d devices but --num_app_threads is %d\n"
                         % (len(a.devices), a.num_app_threads))
        return 2
    try:
        hosts = read_localserver(a.hostfile)
    except HostFileError as exc:
        sys.stderr.write("%s\n" % exc)
        return 2
    out = output_dir(a.dataset, a.staleness, len(hosts), len(a.devices), a.output_root)
    if not a.dry_run:
        try:
            check_reachable(hosts, a.hostfile)
        except HostFileError as exc:
            sys.stderr.write("%s\n" % exc)
            return 2
        os.makedirs(out, exist_ok=True)
    extra = ["-net_outputs=%s" % os.path.join(out, a.dataset),
             "-stats_path=%s" % os.path.join(out, "caffe_stats.yaml")]
    if a.ps_update != "server":
        extra.append("-ps_update=%s" % a.ps_update)
    args = build_command(hosts, a.devices, a.solver, staleness=a.staleness,
                         svb=a.svb == "true", sync=a.sync, dwbp=a.dwbp == "true",
                         snapshot=a.snapshot, weights=a.weights, out_dir=out,
                         num_servers=a.num_servers, client_ids=True, extra=extra)
    return run(args, a.dry_run)


RUN_LOCAL_USAGE = """usage: run_local.py [HOSTFILE] [--dry-run]
       run_local.py <client_id> <hostfile> [use-yarn] [--dry-run]
The first form starts the whole job from here; the second is Poseidon's, run once on every
host of the host file (client 0 first or last, in any order).
"""


def parse_run_local_args(argv):
    """(client_id or None, hostfile or None, dry_run) from run_local.py's arguments; raises
    ValueError with the usage for anything else."""
    dry_run = "--dry-run" in argv
    rest = [a for a in argv if a != "--dry-run"]
    options = [a for a in rest if a.startswith("-") and not a[1:].isdigit()]
    if options:
        raise ValueError(RUN_LOCAL_USAGE + "unknown option %r (the only option is --dry-run)\n"
                         % options[0])
    if len(rest) > 3:
        raise ValueError(RUN_LOCAL_USAGE + "expected at most 3 arguments, got %d: %s\n"
                         % (len(rest), " ".join(rest)))
    if len(rest) >= 2:
        try:
            client_id = int(rest[0])
        except ValueError:
            raise ValueError(RUN_LOCAL_USAGE + "client id %r is not an integer\n"
                             % rest[0]) from None
        if len(rest) == 3 and rest[2] not in ("true", "false"):
            raise ValueError(RUN_LOCAL_USAGE + "use-yarn is true or false, not %r\n" % rest[2])
        return client_id, rest[1], dry_run
    return None, (rest[0] if rest else None), dry_run


def run_local(settings, argv=None, repo_root=None, stream=None):
    """``run_local.py [HOSTFILE]`` starts the whole job from here with one mpiexec (the host
    file defaults to ``localserver``); ``run_local.py <client_id> <hostfile>`` is Poseidon's
    form, run once per host: the invocations join one MPI job. ``settings`` are those at the
    top of the script (see ``launch_from_settings``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "-help", "--help") for a in argv):
        (stream or sys.stdout).write(RUN_LOCAL_USAGE)
        return 0
    try:
        client_id, hostfile, dry_run = parse_run_local_args(argv)
    except ValueError as exc:
        sys.stderr.write(str(exc))
        return 2
    try:
        return launch_from_settings(settings, client_id, hostfile, dry_run, repo_root, stream)
    except HostFileError as exc:
        sys.stderr.write("%s\n" % exc)
        return 2
    except (JoinError, TimeoutSettingError) as exc:
        sys.stderr.write("%s\n" % exc)
        return 1


def run_local_script(script_globals, repo_root, argv=None, stream=None):
    """All that an ``examples/*/run_local.py`` does below its settings block: ``run_local``
    with the settings its globals assign (the names run_local reads; others are passed over),
    from ``repo_root``, the working folder of the job. A Ctrl-C that is not passed on to mpiexec
    (one before it starts) ends it quietly with status 130 (128 + SIGINT), as the script does
    while the library loads."""
    known = ("solver", "snapshot", "devices", "table_staleness", "svb", "net_outputs",
             "stats_path", "sync", "dwbp", "num_servers", "dataset", "use_gpu") + \
        PASSED_SETTINGS + tuple(OLD_SETTING_NAMES)
    settings = {name: script_globals[name] for name in known if name in script_globals}
    try:
        os.chdir(repo_root)
        return run_local(settings, argv, repo_root, stream)
    except KeyboardInterrupt:
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
