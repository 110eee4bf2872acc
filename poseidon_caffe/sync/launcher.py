"""From Poseidon's host file and device list to one ``mpiexec`` command.

The host file (``localserver``) has Poseidon's format, one machine per line:
``<client_id> <ip> <port>``. Ids are distinct integers, the address must resolve, the port is
an integer (MPI does not use it, but the file parses as Poseidon's does). Before mpiexec
starts, every host must answer from here (``check_reachable``). The job runs one rank
per device of every host; the command is an argument list (never a shell string), printed
before it runs, with every rank under ``supervise`` so that a rank killed outright is named.
SIGINT, SIGTERM and SIGHUP sent to the launcher (or a Ctrl-C) are passed on to mpiexec, which
delivers them to every rank; the launcher waits and exits with mpiexec's status.

Its command-line faces live in ``tools/launch.py``: ``python -m poseidon_caffe.tools.launch
--solver S [--hostfile F] [--devices 0,1] ...`` (the ``train_*.sh`` scripts) and ``run_local``
(the ``run_local.py`` files).
"""
import os
import shutil
import signal
import socket
import subprocess
import sys


class HostFileError(ValueError):
    pass


def read_localserver(path):
    """[(client_id, ip, port)] in file order; HostFileError names the file and line."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise HostFileError("cannot read host file %s: %s" % (path, exc.strerror)) from None
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise HostFileError("host file %s is not text: byte %d is not UTF-8"
                            % (path, exc.start)) from None
    hosts, seen = [], {}
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        fields = text.split()
        where = "%s:%d" % (path, number)
        if len(fields) != 3:
            raise HostFileError("%s: expected '<client_id> <ip> <port>' (3 fields), got %d: %r"
                                % (where, len(fields), line))
        cid, ip, port = fields
        try:
            cid = int(cid)
        except ValueError:
            raise HostFileError("%s: client id %r is not an integer" % (where, cid)) from None
        try:
            port = int(port)
        except ValueError:
            raise HostFileError("%s: port %r is not an integer" % (where, port)) from None
        if not 0 < port < 65536:
            raise HostFileError("%s: port %d is out of range 1..65535" % (where, port))
        if cid in seen:
            raise HostFileError("%s: duplicate client id %d (first on line %d)"
                                % (where, cid, seen[cid]))
        seen[cid] = number
        try:
            socket.getaddrinfo(ip, None)
        except (socket.gaierror, UnicodeError):
            raise HostFileError("%s: unknown host %r (it does not resolve)" % (where, ip)) from None
        hosts.append((cid, ip, port))
    if not hosts:
        raise HostFileError("host file %s lists no machines" % path)
    return hosts


def _unreachable(ip, port, timeout):
    """Why ``ip`` cannot be reached from here, or None when it can: it is this machine, or it
    accepts or refuses a TCP connection on the host file's port or on ssh's (a refusal is an
    answer; only silence or an error of the network is not)."""
    try:
        family, _, _, _, address = socket.getaddrinfo(ip, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError):
        return "it does not resolve"
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((address[0], 0))
        return None                               # an address of this machine
    except OSError:
        pass
    for p in dict.fromkeys((port, 22)):
        try:
            with socket.create_connection((address[0], p), timeout=timeout):
                return None
        except ConnectionRefusedError:
            return None
        except socket.timeout:
            continue
        except OSError as exc:
            return exc.strerror or str(exc)
    return "no answer on port %s within %g s" % (" or ".join(str(p) for p in
                                                           dict.fromkeys((port, 22))), timeout)


def check_reachable(hosts, hostfile, timeout=2.0):
    """HostFileError naming the first host of ``hosts`` (read_localserver's list) that this
    machine cannot reach, and the file; the hosts are tried at once, each within 2 x
    ``timeout`` seconds."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=min(len(hosts), 32)) as pool:
        reasons = list(pool.map(lambda h: _unreachable(h[1], h[2], timeout), hosts))
    for (cid, ip, _), reason in zip(hosts, reasons):
        if reason:
            raise HostFileError("%s: client %d's host %s is unreachable from here (%s)"
                                % (hostfile, cid, ip, reason))


def output_dir(dataset, staleness, num_hosts, num_threads, root="output"):
    """Poseidon's output folder name: caffe.<dataset>.S<staleness>.M<hosts>.T<threads>."""
    return os.path.join(root, "caffe.%s.S%d.M%d.T%d" % (dataset, staleness, num_hosts,
                                                        num_threads))


def gpu_available():
    """Whether the ranks will have GPUs to bind (-gpu=<id> each): the emulated device when
    the environment chooses it (the ranks inherit the setting), else an NVIDIA driver on this
    machine and a binding of it (cuda-bindings or pycuda) to drive it."""
    import importlib.util
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


def build_command(hosts, devices, solver, *, staleness=0, svb=False, sync="auto", dwbp=True,
                  snapshot="", weights="", out_dir="", timeline="", use_gpu=None,
                  mpiexec=None, python=None, extra=(), num_servers=0, client_ids=False):
    """The mpiexec argument list: one rank per (host, device), hosts in file order; then
    ``num_servers`` dedicated parameter-server ranks, placed on the hosts in turn.
    ``client_ids``: every rank also gets its host's ``-client_id`` from the host file."""
    if not devices:
        raise ValueError("devices is empty: list at least one device (or CPU worker) per host")
    if num_servers < 0:
        raise ValueError("num_servers is %d: give 0 (shards co-located with the workers) or "
                         "more dedicated server ranks" % num_servers)
    python = python or sys.executable
    mpiexec = mpiexec or shutil.which("mpiexec") or os.path.join(os.path.dirname(python),
                                                                   "mpiexec")
    use_gpu = gpu_available() if use_gpu is None else use_gpu
    train = ["train", "-solver=%s" % solver, "-sync=%s" % sync,
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
    # hydra places ranks host by host (ip:count); one segment per (host, device) so that
    # each rank gets its own device flag
    # the servers are the last ranks: hydra places them after the workers, one slot each
    places = ["%s:%d" % (ip, len(devices)) for _, ip, _ in hosts]
    places += ["%s:1" % hosts[s % len(hosts)][1] for s in range(num_servers)]
    args = [mpiexec, "-hosts", ",".join(places)]
    rank_command = [python, "-m", "poseidon_caffe.tools.supervise", "--",
                    python, "-m", "poseidon_caffe.cli"] + train
    first = True
    for cid, _, _ in hosts:
        for device in devices:
            if not first:
                args.append(":")
            first = False
            args += ["-n", "1"] + rank_command
            if use_gpu:
                args.append("-gpu=%d" % device)
            if client_ids:
                args.append("-client_id=%d" % cid)
    for _ in range(num_servers):
        args += [":", "-n", "1"] + rank_command
    return args


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
    from . import join
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


def run_local(settings, argv=None, repo_root=None, stream=None):
    """``run_local.py [HOSTFILE] [--dry-run]`` or ``run_local.py <client_id> <hostfile>
    [use-yarn] [--dry-run]`` with these settings (``argv``: the script's arguments, by
    default the process's). The command lives in ``tools/launch.py``; the name stays here,
    where every run_local.py imports it from."""
    from ..tools.launch import run_local as command
    return command(settings, argv, repo_root, stream)


if __name__ == "__main__":       # the command's old name, kept for scripts that use it
    from poseidon_caffe.tools.launch import main as command
    sys.exit(command())
