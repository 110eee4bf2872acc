"""From Poseidon's host file and device list to one ``mpiexec`` command.

The host file (``localserver``) has Poseidon's format, one machine per line:
``<client_id> <ip> <port>``. Ids are distinct integers, the address must resolve, the port is
an integer (MPI does not use it, but the file parses as Poseidon's does). The job runs one rank
per device of every host; the command is an argument list (never a shell string), printed
before it runs, with every rank under ``supervise`` so that a rank killed outright is named.

``python -m poseidon_caffe.sync.launcher --solver S [--hostfile F] [--devices 0,1] ...`` is the
command-line face that the ``train_*.sh`` scripts and ``run_local.py`` files use.
"""
import argparse
import os
import shutil
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


def output_dir(dataset, staleness, num_hosts, num_threads, root="output"):
    """Poseidon's output folder name: caffe.<dataset>.S<staleness>.M<hosts>.T<threads>."""
    return os.path.join(root, "caffe.%s.S%d.M%d.T%d" % (dataset, staleness, num_hosts,
                                                        num_threads))


def gpu_available():
    try:
        import pycuda  # noqa: F401
    except ImportError:
        return False
    return shutil.which("nvidia-smi") is not None


def build_command(hosts, devices, solver, *, staleness=0, svb=False, sync="auto", dwbp=True,
                  snapshot="", weights="", out_dir="", timeline="", use_gpu=None,
                  mpiexec=None, python=None, extra=(), num_servers=0):
    """The mpiexec argument list: one rank per (host, device), hosts in file order; then
    ``num_servers`` dedicated parameter-server ranks, placed on the hosts in turn."""
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
    rank_command = [python, "-m", "poseidon_caffe.sync.supervise", "--",
                    python, "-m", "poseidon_caffe.cli"] + train
    first = True
    for _ in hosts:
        for device in devices:
            if not first:
                args.append(":")
            first = False
            args += ["-n", "1"] + rank_command
            if use_gpu:
                args.append("-gpu=%d" % device)
    for _ in range(num_servers):
        args += [":", "-n", "1"] + rank_command
    return args


def run(args, dry_run=False, stream=None):
    stream = stream or sys.stdout
    stream.write(" ".join(args) + "\n")
    stream.flush()
    if dry_run:
        return 0
    return subprocess.call(args)


def parse_devices(text):
    try:
        return [int(d) for d in str(text).split(",") if d.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError("devices are integers separated by ',', not %r"
                                         % text) from None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m poseidon_caffe.sync.launcher",
                                     description="Start a distributed poseidon-caffe job.")
    parser.add_argument("--solver", required=True)
    parser.add_argument("--hostfile", default="localserver")
    parser.add_argument("--devices", type=parse_devices, default=[0])
    parser.add_argument("--staleness", type=int, default=0)
    parser.add_argument("--svb", default="false", choices=("true", "false"))
    parser.add_argument("--sync", default="auto", choices=("auto", "ps", "sfb", "allreduce"))
    parser.add_argument("--dwbp", default="true", choices=("true", "false"))
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
        os.makedirs(out, exist_ok=True)
    args = build_command(hosts, a.devices, a.solver, staleness=a.staleness,
                         svb=a.svb == "true", sync=a.sync, dwbp=a.dwbp == "true",
                         snapshot=a.snapshot, weights=a.weights, out_dir=out,
                         num_servers=a.num_servers)
    return run(args, a.dry_run)



def run_local(settings, argv=None, repo_root=None):
    """What every ``examples/*/run_local.py`` does with the settings at its top:
    ``run_local.py [HOSTFILE] [--dry-run]`` (the host file defaults to ``localserver``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    dry_run = "--dry-run" in argv
    rest = [a for a in argv if a != "--dry-run"]
    if len(rest) > 1 or any(a.startswith("-") for a in rest):
        sys.stderr.write("usage: run_local.py [HOSTFILE] [--dry-run]\n")
        return 2
    root = repo_root or os.getcwd()
    hostfile = rest[0] if rest else os.path.join(root, "localserver")
    try:
        hosts = read_localserver(hostfile)
    except HostFileError as exc:
        sys.stderr.write("%s\n" % exc)
        return 2
    devices = list(settings["devices"])
    staleness = int(settings.get("staleness", 0))
    out = output_dir(settings.get("dataset", "data"), staleness, len(hosts), len(devices),
                     os.path.join(root, "output"))
    if not dry_run:
        os.makedirs(out, exist_ok=True)
    args = build_command(hosts, devices, settings["solver_filename"], staleness=staleness,
                         svb=settings.get("svb", False), sync=settings.get("sync", "auto"),
                         dwbp=settings.get("dwbp", True),
                         snapshot=settings.get("snapshot_filename", ""), out_dir=out,
                         use_gpu=settings.get("use_gpu"),
                         num_servers=int(settings.get("num_servers", 0)))
    return run(args, dry_run)


if __name__ == "__main__":
    sys.exit(main())
