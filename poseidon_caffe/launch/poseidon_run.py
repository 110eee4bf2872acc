"""``poseidon-run``: one command started as one MPI job on a cluster over ssh, the way Poseidon's
TensorFlow release started jobs with ``psd_run``. This module does the work; the command's
arguments are read in ``tools/poseidon_run.py``.

    poseidon-run -c config.json [-o OUTPUT_FOLDER] [--dry-run] "poseidon-caffe train --solver=S"

The cluster config is a JSON object with psd_run's keys: ``worker_nodes`` (one worker rank per
entry; repeat a node to run several workers there), ``server_nodes`` (one dedicated
parameter-server rank per entry, the job's last ranks; may be empty), and optionally
``master_node`` (this machine's address as the nodes reach it), ``username``, ``pem_file`` and
``virtualenv`` (its path on the nodes). Keys only: a config holding a password is refused.

Before launching, every node is checked over ssh (the login works, the working directory and the
virtualenv are there); a node that fails is named in one line. The job is MPICH's ``mpiexec``
with its ssh launcher pointed at a generated ``remote_shell`` that logs in with the key and
user and activates the virtualenv before starting hydra's proxy. ``poseidon_run.log`` (appended)
records every run where it was started; the run's folder ``poseidon_log_<timestamp>`` (or
OUTPUT_FOLDER) holds ``rank<r>.log`` (what rank r printed to its console, collected on this
machine), ``caffe.rank<r>.log`` (rank r's own training log, for a ``poseidon-caffe train``
command), the machinefile and the remote shell.

The job ends as the ranks' job would end under run_local.py: SIGINT and SIGTERM sent to
poseidon-run reach every rank, SIGHUP becomes a snapshot, the exit status is the job's. A rank
killed outright is named on the console (rank, role, node, host, signal) and the job is ended
from here within seconds (mpiexec over ssh would leave the other ranks waiting on it); what a
job that ended abnormally left on a node (ranks, MPICH's /dev/shm files) is removed.

Where no sshd runs (tests, containers), the environment variable ``POSEIDON_RUN_SSH`` names the
program used in place of ``ssh``; it receives exactly the arguments ssh would.
"""
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from .launcher import FORWARDED_SIGNALS

CONFIG_KEYS = ("virtualenv", "username", "pem_file", "master_node", "worker_nodes",
               "server_nodes")
SSH_OVERRIDE_ENV = "POSEIDON_RUN_SSH"
SSH_OPTIONS = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
               "-o", "StrictHostKeyChecking=accept-new"]
CHECK_TIMEOUT_S = 30
RUN_LOG = "poseidon_run.log"
_SECRET = re.compile(r"pass|secret", re.IGNORECASE)     # password, passwd, passphrase...
_LOOPBACK = ("localhost", "127.0.0.1", "::1", "")


class ConfigError(ValueError):
    """A cluster config or command that cannot run; the message is one line naming the file
    and the key."""


class ClusterConfig:
    def __init__(self, path, workers, servers, master="", username="", pem_file="",
                 virtualenv=""):
        self.path = path
        self.workers = list(workers)
        self.servers = list(servers)
        self.master = master
        self.username = username
        self.pem_file = pem_file
        self.virtualenv = virtualenv

    @property
    def nodes(self):
        """Every node once, in order of first appearance."""
        return list(dict.fromkeys(self.workers + self.servers))


# -- the config ---------------------------------------------------------------------------------
def _refuse_secrets(path, value, where=""):
    if isinstance(value, dict):
        for key, inner in value.items():
            name = "%s.%s" % (where, key) if where else key
            if _SECRET.search(str(key)):
                raise ConfigError("%s: key %r is refused: poseidon-run logs in with ssh keys only "
                                  "(pem_file or ssh-agent), never with passwords; remove it"
                                  % (path, name))
            _refuse_secrets(path, inner, name)
    elif isinstance(value, list):
        for inner in value:
            _refuse_secrets(path, inner, where)


def _word(path, key, value, what):
    """A node, a user: one word that can be neither an ssh option nor break a machinefile."""
    if not isinstance(value, str) or not value:
        raise ConfigError("%s: %s must be a non-empty string, not %s"
                          % (path, key, json.dumps(value)))
    if value.startswith("-") or any(c.isspace() for c in value) or any(c in value for c in ":@'\""):
        raise ConfigError("%s: %s %r is not a valid %s (no spaces, quotes, ':' or '@', and no "
                          "leading '-')" % (path, key, value, what))
    return value


def _nodes(path, data, key, required_nonempty):
    if key not in data:
        raise ConfigError("%s: %r is missing: list the nodes' addresses, e.g. "
                          "\"%s\": [\"192.168.1.11\", \"192.168.1.15\"]" % (path, key, key))
    value = data[key]
    if not isinstance(value, list):
        raise ConfigError("%s: %s must be a list of node addresses, not %s"
                          % (path, key, json.dumps(value)))
    if required_nonempty and not value:
        raise ConfigError("%s: %s is empty: the job needs at least one worker" % (path, key))
    return [_word(path, "%s[%d]" % (key, i), node, "node address")
            for i, node in enumerate(value)]


def check_pem_file(path, pem_file):
    """ConfigError unless ``pem_file`` is a private key ssh will use."""
    if not os.path.isfile(pem_file):
        raise ConfigError("%s: pem_file %s does not exist (the private key ssh logs in with)"
                          % (path, pem_file))
    if not os.access(pem_file, os.R_OK):
        raise ConfigError("%s: pem_file %s is not readable" % (path, pem_file))
    mode = os.stat(pem_file).st_mode & 0o777
    if mode & 0o077:
        # ssh itself would ignore such a key and fall back to asking for a password
        raise ConfigError("%s: pem_file %s is open to others (mode %03o) and ssh refuses such "
                          "keys: chmod 600 %s" % (path, pem_file, mode, pem_file))


def load_config(path, check_key=True):
    """The ClusterConfig of a psd_run-style JSON file; ConfigError names the file and key.
    ``check_key=False`` (a dry run) leaves the pem_file on disk unchecked."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError("cannot read cluster config %s: %s" % (path, exc.strerror)) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError("%s: not valid JSON: %s" % (path, exc)) from None
    if not isinstance(data, dict):
        raise ConfigError("%s: expected a JSON object with keys %s" % (path, ", ".join(CONFIG_KEYS)))
    _refuse_secrets(path, data)
    unknown = [k for k in data if k not in CONFIG_KEYS]
    if unknown:
        raise ConfigError("%s: unknown key %r (the keys are %s)"
                          % (path, unknown[0], ", ".join(CONFIG_KEYS)))
    workers = _nodes(path, data, "worker_nodes", True)
    servers = _nodes(path, data, "server_nodes", False)
    master = data.get("master_node", "")
    if master:
        master = _word(path, "master_node", master, "address")
    username = data.get("username", "")
    if username:
        username = _word(path, "username", username, "user name")
    pem_file = data.get("pem_file", "")
    if pem_file:
        if not isinstance(pem_file, str):
            raise ConfigError("%s: pem_file must be a path, not %s" % (path, json.dumps(pem_file)))
        pem_file = os.path.abspath(os.path.expanduser(pem_file))
        if check_key:
            check_pem_file(path, pem_file)
    virtualenv = data.get("virtualenv", "")
    if virtualenv:
        if not isinstance(virtualenv, str) or not virtualenv.startswith("/"):
            raise ConfigError("%s: virtualenv must be the absolute path of the virtualenv on the "
                              "nodes (what echo $VIRTUAL_ENV prints there), not %s"
                              % (path, json.dumps(virtualenv)))
        virtualenv = virtualenv.rstrip("/") or "/"
    return ClusterConfig(path, workers, servers, master, username, pem_file, virtualenv)


# -- the command each rank runs -----------------------------------------------------------------
def _train_index(argv):
    """Index of ``train`` when argv is ``poseidon-caffe train ...`` (or ``python -m
    poseidon_caffe.cli train ...``), else None."""
    if len(argv) >= 2 and os.path.basename(argv[0]) == "poseidon-caffe" and argv[1] == "train":
        return 1
    if (len(argv) >= 4 and os.path.basename(argv[0]).startswith("python")
            and argv[1:3] == ["-m", "poseidon_caffe.cli"] and argv[3] == "train"):
        return 3
    return None


def _flag_value(argv, name):
    """The value of gflags-style ``-name=v``, ``--name=v``, ``-name v`` in argv, or None."""
    for i, token in enumerate(argv):
        match = re.match(r"--?%s(=(.*))?$" % re.escape(name), token)
        if match:
            if match.group(1) is not None:
                return match.group(2)
            return argv[i + 1] if i + 1 < len(argv) else ""
    return None


def rank_command(config, argv, log_dir):
    """The argument list every rank runs: CMD, told about the dedicated servers and the log
    folder when it is ``poseidon-caffe train``."""
    argv = list(argv)
    if not argv:
        raise ConfigError("no command to run: give it as one quoted argument, e.g. "
                          "\"poseidon-caffe train --solver=solver.prototxt\"")
    servers = len(config.servers)
    given = _flag_value(argv, "server_ranks")
    if given is not None:
        try:
            given_count = int(given)
        except ValueError:
            raise ConfigError("the command's -server_ranks=%s is not an integer" % given) from None
        if given_count != servers:
            raise ConfigError("the command says -server_ranks=%d but %s lists %d server_nodes"
                              % (given_count, config.path, servers))
    train = _train_index(argv) is not None
    if servers and given is None:
        if not train:
            raise ConfigError("%s lists %d server_nodes, but dedicated server ranks belong to "
                              "poseidon-caffe train (-server_ranks); %r is not a poseidon-caffe "
                              "train command" % (config.path, servers, shlex.join(argv)))
        argv.append("-server_ranks=%d" % servers)
    if train and _flag_value(argv, "output_dir") is None:
        argv.append("-output_dir=%s" % log_dir)
    return argv


# -- ssh ----------------------------------------------------------------------------------------
def ssh_program():
    """``ssh``, or the program named by POSEIDON_RUN_SSH (split like a shell would)."""
    override = os.environ.get(SSH_OVERRIDE_ENV, "").strip()
    return shlex.split(override) if override else ["ssh"]


def ssh_base(config, program=None):
    args = list(program or ssh_program())
    if config.pem_file:
        args += ["-i", config.pem_file]
    if config.username:
        args += ["-l", config.username]
    return args + SSH_OPTIONS


def _activate(config):
    return ". %s" % shlex.quote(config.virtualenv + "/bin/activate")


# what the job needs of a virtualenv, each missing piece said in one line on the node
_VIRTUALENV_READY = (
    "{ command -v hydra_pmi_proxy >/dev/null || { echo \"$VIRTUAL_ENV has no hydra_pmi_proxy "
    "(MPICH): install the project there (pip install poseidon-caffe)\" >&2; exit 1; }; } && "
    "{ python -c 'import poseidon_caffe, mpi4py' 2>/dev/null || { echo \"$VIRTUAL_ENV's python "
    "cannot import poseidon_caffe and mpi4py: install the project there\" >&2; exit 1; }; }")


def check_command(config, node, cwd, program=None):
    """The ssh command that proves a node is ready: login, working directory, and a virtualenv
    that holds the project and MPICH's proxy."""
    remote = "cd %s" % shlex.quote(cwd)
    if config.virtualenv:
        remote += " && " + _activate(config) + " && " + _VIRTUALENV_READY
    return ssh_base(config, program) + [node, remote]


def proxy_command(config, node, program=None, mpiexec="mpiexec"):
    """What the remote shell runs for one node, the arguments mpiexec gives its proxy (ports,
    ids) left as a placeholder."""
    if config.virtualenv:
        remote = "%s && exec hydra_pmi_proxy <proxy arguments>" % _activate(config)
    else:
        # mpiexec names its own proxy, by its path on this machine
        remote = '"%s" <proxy arguments>' % os.path.join(os.path.dirname(mpiexec),
                                                         "hydra_pmi_proxy")
    return ssh_base(config, program) + ["-x", node, remote]


def remote_shell_text(config, program=None):
    """The script mpiexec's ssh launcher calls as ``remote_shell [-x] NODE PROXY ARGS...``: the
    login options added, and the virtualenv activated before the proxy starts (its proxy is
    then the virtualenv's own, wherever it lies on that node)."""
    base = " ".join(shlex.quote(a) for a in ssh_base(config, program))
    lines = ["#!/bin/sh",
             "# poseidon-run: mpiexec's ssh launcher calls this as: remote_shell [-x] NODE PROXY ARGS...",
             "opts=",
             "while [ $# -gt 0 ]; do",
             "  case \"$1\" in -*) opts=\"$opts $1\"; shift ;; *) break ;; esac",
             "done",
             "node=$1",
             "shift"]
    if config.virtualenv:
        lines += ["shift  # the proxy's path on this machine: the node's virtualenv has its own",
                  "exec %s $opts \"$node\" %s\" && exec hydra_pmi_proxy $*\""
                  % (base, shlex.quote(_activate(config)))]
    else:
        lines += ["exec %s $opts \"$node\" \"$@\"" % base]
    return "\n".join(lines) + "\n"


def machinefile_text(config):
    """The ranks in order, workers then servers (the job's last ranks, as -server_ranks
    expects): one ``node:count`` line per run of consecutive ranks on one node. One line is
    one hydra proxy, and the ranks of one proxy share memory and split the node's cores."""
    runs = []
    for node in config.workers + config.servers:
        if runs and runs[-1][0] == node:
            runs[-1][1] += 1
        else:
            runs.append([node, 1])
    return "".join("%s:%d\n" % (node, count) for node, count in runs)


def mpiexec_path():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else (shutil.which("mpiexec") or "mpiexec")


def job_command(config, argv, log_dir, cwd, mpiexec="mpiexec", python=None, tag=None):
    """The mpiexec argument list of the whole job; ``tag`` goes into every rank's environment
    (JOB_TAG_ENV), by which the cleanup after a failed job finds what is left of it."""
    python = python or (config.virtualenv + "/bin/python" if config.virtualenv
                        else sys.executable)
    args = [mpiexec, "-launcher", "ssh",
            "-launcher-exec", os.path.join(log_dir, "remote_shell"),
            "-f", os.path.join(log_dir, "machinefile")]
    if config.master and config.master not in _LOOPBACK:
        args += ["-localhost", config.master]
    args += ["-wdir", cwd,
             "-outfile-pattern", os.path.join(log_dir, "rank%r.log"),
             "-errfile-pattern", os.path.join(log_dir, "rank%r.log")]
    if config.virtualenv:
        # mpiexec hands its own environment to every rank: put the virtualenv first there too
        args += ["-genv", "VIRTUAL_ENV", config.virtualenv,
                 "-genv", "PATH", "%s/bin:%s" % (config.virtualenv, os.environ.get("PATH", ""))]
    if tag:
        args += ["-genv", JOB_TAG_ENV, tag]
    args += ["-n", str(len(config.workers) + len(config.servers)),
             python, "-m", "poseidon_caffe.tools.supervise", "--"]
    return args + rank_command(config, argv, log_dir)


# -- before launching ---------------------------------------------------------------------------
def _roles(config, node):
    roles = ["worker %d" % i for i, n in enumerate(config.workers) if n == node]
    roles += ["server %d" % i for i, n in enumerate(config.servers) if n == node]
    return ", ".join(roles)


def _last_line(text):
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    return lines[-1] if lines else "no message"


def _ssh_failure(err):
    """What ssh's own failure says, from the node's side: refused login, changed host key (with
    ssh's hint to remove the old one) or no connection."""
    last = _last_line(err)
    if "Permission denied" in err:
        return "answered but refused the login: %s (is the key's public half in the user's " \
               "~/.ssh/authorized_keys there?)" % last
    if "IDENTIFICATION HAS CHANGED" in err or "Host key verification failed" in err:
        hint = [l.strip() for l in err.splitlines() if "ssh-keygen" in l]
        return "answered with a host key that differs from the one known here: %s%s" % (
            last, " (if the node was reinstalled: %s)" % hint[0] if hint else "")
    return "is unreachable: %s" % last


def check_nodes(config, cwd, program=None):
    """One line per node that is not ready (all nodes are asked at once); [] when all are."""
    started = []
    for node in config.nodes:
        command = check_command(config, node, cwd, program)
        try:
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        except OSError as exc:
            raise ConfigError("cannot run %s: %s" % (command[0], exc.strerror)) from None
        started.append((node, proc))
    problems = []
    deadline = time.monotonic() + CHECK_TIMEOUT_S
    for node, proc in started:
        try:
            _, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            problems.append("node %s (%s) is unreachable: no answer over ssh within %d s"
                            % (node, _roles(config, node), CHECK_TIMEOUT_S))
            continue
        if proc.returncode == 255:      # ssh's own failure: no connection or no login
            problems.append("node %s (%s) %s" % (node, _roles(config, node), _ssh_failure(err)))
        elif proc.returncode != 0:
            problems.append("node %s (%s) is reachable but not ready: %s"
                            % (node, _roles(config, node), _last_line(err)))
    return problems


def check_master(config):
    """master_node must be an address of this machine: the nodes' proxies connect back to it."""
    if not config.master or config.master in _LOOPBACK:
        return
    try:
        infos = socket.getaddrinfo(config.master, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise ConfigError("%s: master_node %r does not resolve" % (config.path, config.master)) \
            from None
    for family, kind, proto, _, address in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.bind((address[0], 0))
            return
        except OSError:
            continue
    raise ConfigError("%s: master_node %s is not an address of this machine: run poseidon-run on "
                      "the master node (or leave master_node out)" % (config.path, config.master))


def default_log_dir(cwd):
    stamp = time.strftime("%Y%m%d_%H%M%S")
    path = os.path.join(cwd, "poseidon_log_%s" % stamp)
    n = 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(cwd, "poseidon_log_%s_%d" % (stamp, n))
    return path


def check_log_dir(path):
    if "%" in path:
        raise ConfigError("output folder %s: '%%' is not allowed in its path (mpiexec reads it "
                          "as a file-name pattern)" % path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError("output folder %s exists and is not a folder" % path)
    if os.path.isdir(path):
        earlier = sorted(n for n in os.listdir(path) if re.match(r"rank\d+\.log$", n))
        if earlier:
            raise ConfigError("output folder %s already holds the logs of an earlier job (%s): "
                              "give a new folder" % (path, earlier[0]))


# -- the run ------------------------------------------------------------------------------------
class RunLog:
    """poseidon_run.log (appended, one timestamped line each) and the console."""

    def __init__(self, path, stream=None, errors=None):
        self.stream = stream or sys.stdout
        self.errors = errors or sys.stderr
        self.file = open(path, "a") if path else None

    def __call__(self, message, error=False, console=True):
        if console:
            out = self.errors if error else self.stream
            out.write("poseidon-run: %s\n" % message)
            out.flush()
        if self.file:
            self.file.write("%s %s\n" % (time.strftime("%Y-%m-%d %H:%M:%S"), message))
            self.file.flush()

    def close(self):
        if self.file:
            self.file.close()


# supervise's line for a rank killed outright, and any rank's line as it ends the job
_KILLED = re.compile(r"\*\*\* rank (\d+) on host (\S+) \(pid \d+\) was killed by signal (\d+) "
                     r"\((\w+)\)")
_ENDING = re.compile(r"\*\*\* rank (\d+) on host (\S+) .*; ending the job$")
# mpiexec over ssh does not end a job one of whose ranks was killed (its proxy goes, the other
# ranks wait on the dead one until their sync timeout or for ever): poseidon-run ends it
KILLED_GRACE_S = 1.0
# a rank that reports its own failure ends the job with MPI_Abort within failure.ABORT_WAIT
# (5 s) and half a second: only when that abort never lands does poseidon-run end the job
ABORT_GRACE_S = 8.0
# MPICH aborts a survivor (SIGABRT) when a peer's process vanishes under it, and the two
# deaths can reach the logs in either order: a SIGABRT waits this long for the death that
# caused it before it is named as the job's cause
ABORTED_BY_PEER_S = 1.5
# ssh's own logins for the cleanup after a job that ended abnormally
CLEANUP_TIMEOUT_S = 20
JOB_TAG_ENV = "POSEIDON_RUN_JOB"


class Cause:
    """The first rank seen dying or ending the job: who, where, why, and the exit status."""

    def __init__(self, rank, node, role, line, status, grace):
        self.rank, self.node, self.role, self.line = rank, node, role, line
        self.status = status
        self.deadline = time.monotonic() + grace

    def describe(self):
        what = self.line.lstrip("* ")
        if what.endswith("; ending the job"):
            what = what[:-len("; ending the job")]
        return "rank %d (%s on node %s): %s" % (self.rank, self.role, self.node, what)


def rank_places(config):
    """[(node, role)] of every rank, in rank order (workers, then the dedicated servers)."""
    return ([(node, "worker %d" % i) for i, node in enumerate(config.workers)]
            + [(node, "server %d" % i) for i, node in enumerate(config.servers)])


class JobWatch:
    """Follows every rank's log as mpiexec writes it: rank 0's goes to the console as it comes,
    and the first line that says a rank died or is ending the job becomes the job's cause."""

    def __init__(self, log_dir, places, stream, log):
        self.paths = [os.path.join(log_dir, "rank%d.log" % r) for r in range(len(places))]
        self.places = places
        self.stream = stream
        self.log = log
        self.cause = None
        self.unnamed_until = None      # a SIGABRT cause not named yet (see ABORTED_BY_PEER_S)
        self.expected = set()          # signals this job was sent on purpose
        self.answered = None           # one of them, that a rank died by
        self.done = threading.Event()
        self._offsets = [0] * len(places)
        self._partial = [b""] * len(places)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()

    def stop(self):
        self.done.set()
        self._thread.join()

    def _run(self):
        while True:
            finished = self.done.is_set()
            for rank in range(len(self.paths)):
                self._read(rank)
            if self.unnamed_until is not None and (finished or
                                                   time.monotonic() > self.unnamed_until):
                self.unnamed_until = None
                self.log(self.cause.describe(), error=True)
            if finished:
                return
            self.done.wait(0.1)

    def _read(self, rank):
        try:
            with open(self.paths[rank], "rb") as f:
                f.seek(self._offsets[rank])
                chunk = f.read()
        except OSError:
            return
        if not chunk:
            return
        self._offsets[rank] += len(chunk)
        if rank == 0:
            self.stream.write(chunk.decode("utf-8", "replace"))
            self.stream.flush()
        lines = (self._partial[rank] + chunk).split(b"\n")
        self._partial[rank] = lines.pop()
        for line in lines:
            self._check(rank, line.decode("utf-8", "replace").rstrip())

    def _check(self, rank, line):
        killed = _KILLED.search(line)
        ending = killed or _ENDING.search(line)
        if not ending:
            return
        node, role = self.places[rank]
        signum = None
        if killed:
            signum = int(killed.group(3))
            if signum in self.expected:
                # the signal this job was sent: each rank's own answer; a survivor's abort
                # seen before it was its MPI transport failing at this death
                self.answered = signum
                if self.unnamed_until is not None:
                    self.cause = self.unnamed_until = None
                return
            if signum == signal.SIGABRT and self.answered is not None:
                return              # a survivor's transport failing at a rank's answer
            cause = Cause(rank, node, role, line, 128 + signum, KILLED_GRACE_S)
        else:
            cause = Cause(rank, node, role, line, 1, ABORT_GRACE_S)
        if self.cause is None:
            self.cause = cause
            if signum == signal.SIGABRT:
                self.unnamed_until = time.monotonic() + ABORTED_BY_PEER_S
            else:
                self.log(cause.describe(), error=True)
        elif self.unnamed_until is not None and killed and signum != signal.SIGABRT:
            # the death that made the first one abort: it is the job's cause
            aborted, self.cause, self.unnamed_until = self.cause, cause, None
            self.log(cause.describe(), error=True)
            self.log("then %s" % aborted.describe(), error=True)
        elif rank != 0:
            # rank 0's lines are on the console already; another rank's is named here
            self.log("then rank %d (%s on node %s): %s"
                     % (rank, role, node, line.lstrip("* ")), error=True)


def cleanup_script(tag, since):
    """sh that, on a node, kills what is left of the job tagged ``tag`` (ranks whose launcher
    is gone) and removes MPICH's shared-memory files made since ``since`` (epoch seconds) that
    no process maps any more (a killed rank never unlinks them)."""
    return ("me=$$; for d in /proc/[0-9]*; do p=${d#/proc/}; [ \"$p\" = \"$me\" ] && continue; "
            "tr '\\0' '\\n' < $d/environ 2>/dev/null | grep -qxF %s && kill -9 $p 2>/dev/null; "
            "done; sleep 0.2; "
            "find /dev/shm -maxdepth 1 -name 'mpich_shm_*' -user \"$(id -u)\" -newermt @%d "
            "2>/dev/null | while read -r f; do "
            "cat /proc/[0-9]*/maps 2>/dev/null | grep -qF \"$f\" || rm -f \"$f\"; done; true"
            % (shlex.quote("%s=%s" % (JOB_TAG_ENV, tag)), int(since) - 1))


def clean_up_nodes(config, tag, since, log):
    """Run ``cleanup_script`` here and on every node at once (this machine may hold ranks of
    its own: mpiexec starts the master's without ssh)."""
    script = cleanup_script(tag, since)
    env = {k: v for k, v in os.environ.items() if k != JOB_TAG_ENV}
    started = [("this machine", subprocess.Popen(["sh", "-c", script], env=env,
                                                 stdin=subprocess.DEVNULL,
                                                 stdout=subprocess.DEVNULL,
                                                 stderr=subprocess.PIPE, text=True))]
    for node in config.nodes:
        try:
            started.append((node, subprocess.Popen(
                ssh_base(config) + [node, script], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
        except OSError:
            continue
    deadline = time.monotonic() + CLEANUP_TIMEOUT_S
    for where, proc in started:
        try:
            _, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            log("could not clean up on %s: no answer within %d s" % (where, CLEANUP_TIMEOUT_S),
                error=True)
            continue
        if proc.returncode:
            log("could not clean up on %s: %s" % (where, _last_line(err)), error=True)


def _pipe_to_log(pipe, log, quiet):
    for line in pipe:
        # once poseidon-run is ending the job itself, hydra's complaints about the proxies it
        # lost go to poseidon_run.log only
        log("mpiexec: %s" % line.rstrip("\n"), console=not quiet.is_set())


def _send(proc, signum):
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signum)
        except ProcessLookupError:
            pass


def _kill_group(proc):
    """mpiexec, its ssh clients and the master's own proxy: one process group."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_job(config, argv, log_dir, cwd, log, stream):
    """Write the machinefile and remote shell, run mpiexec; returns the job's exit status.

    mpiexec runs in a session of its own, so that a Ctrl-C reaches it once, through here.
    SIGINT and SIGTERM sent to poseidon-run are passed on (mpiexec passes them to every rank);
    SIGHUP goes on as SIGUSR1, which the ranks take as a snapshot request (mpiexec itself would
    die of a SIGHUP); a second SIGINT or SIGTERM ends the job at once. A rank killed outright,
    or one that says it is ending the job without the job ending, is named on the console
    (rank, role, node, host, signal) and the job is ended from here; its status is then the
    job's. After a job that did not end cleanly nothing of it is left on any node: no rank and
    none of MPICH's shared-memory files."""
    os.makedirs(log_dir, exist_ok=True)
    with open(os.path.join(log_dir, "machinefile"), "w") as f:
        f.write(machinefile_text(config))
    shell = os.path.join(log_dir, "remote_shell")
    with open(shell, "w") as f:
        f.write(remote_shell_text(config))
    os.chmod(shell, 0o700)
    mpiexec = mpiexec_path()
    tag = "%s:%d:%s" % (socket.gethostname(), os.getpid(), log_dir)
    command = job_command(config, argv, log_dir, cwd, mpiexec, tag=tag)
    log("run: %s" % shlex.join(command))
    places = rank_places(config)
    watch = JobWatch(log_dir, places, stream, log)
    state = {"proc": None, "early": [], "signals": 0, "ending": None}
    quiet = threading.Event()

    def end_job(why):
        if state["ending"] is None:
            state["ending"] = why
            quiet.set()
            log("ending the job: %s" % why, error=True)
            _kill_group(state["proc"])

    def on_signal(signum, frame):
        proc = state["proc"]
        if proc is None:
            state["early"].append(signum)
            return
        forwarded = FORWARDED_SIGNALS[signum]
        if forwarded == signal.SIGUSR1:
            watch.expected.add(signal.SIGUSR1)
            _send(proc, forwarded)
            return
        state["signals"] += 1
        state["first"] = state.get("first") or signum
        watch.expected.add(forwarded)
        if state["signals"] == 1:
            log("%s: passed on to every rank" % signal.Signals(signum).name)
            _send(proc, forwarded)
        else:
            end_job("%s a second time" % signal.Signals(signum).name)

    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.signal(sig, on_signal) for sig in FORWARDED_SIGNALS}
    since = time.time()
    start = time.monotonic()
    try:
        try:
            proc = subprocess.Popen(command, cwd=cwd, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)
        except OSError as exc:
            raise ConfigError("cannot start %s: %s" % (mpiexec, exc.strerror)) from None
        state["proc"] = proc
        for signum in state["early"]:
            on_signal(signum, None)
        reader = threading.Thread(target=_pipe_to_log, args=(proc.stdout, log, quiet),
                                  daemon=True)
        reader.start()
        watch.start()
        try:
            while proc.poll() is None:
                cause = watch.cause
                if cause is not None and time.monotonic() > cause.deadline:
                    end_job("rank %d (%s on node %s) is gone and mpiexec did not end the job"
                            % (cause.rank, cause.role, cause.node))
                time.sleep(0.05)
        finally:
            if proc.poll() is None:          # poseidon-run itself is going: take the job along
                _kill_group(proc)
            code = proc.wait()
            reader.join(5)
            watch.stop()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    code = 128 - code if code < 0 else code
    cause = watch.cause
    if cause is not None and (state["ending"] is not None or code != 0):
        code = cause.status
    elif state["ending"] is not None:
        code = 128 + state["first"]          # ended here on a second SIGINT or SIGTERM
    elif code != 0 and watch.answered is not None:
        # ranks died by the signal passed on (mpiexec may report a survivor's abort)
        code = 128 + watch.answered
    if code != 0:
        clean_up_nodes(config, tag, since, log)
    ended = "job ended with exit status %d after %.1f s" % (code, time.monotonic() - start)
    if cause is not None:
        ended += ": %s" % cause.describe()
    log("%s; logs in %s" % (ended, log_dir), error=code != 0 and cause is not None)
    return code


def dry_run(config, argv, log_dir, cwd, stream):
    """Print what a run would do, in order, without doing any of it."""
    program = ssh_program()
    out = stream.write
    out("# check every node over ssh (one command per node)\n")
    for node in config.nodes:
        out(shlex.join(check_command(config, node, cwd, program)) + "\n")
    out("# %s\n" % os.path.join(log_dir, "machinefile"))
    out(machinefile_text(config))
    out("# %s: mpiexec starts its proxy on each node with\n"
        % os.path.join(log_dir, "remote_shell"))
    mpiexec = mpiexec_path()
    for node in config.nodes:
        out(shlex.join(proxy_command(config, node, program, mpiexec)) + "\n")
    out("# the job\n")
    out(shlex.join(job_command(config, argv, log_dir, cwd, mpiexec)) + "\n")
    stream.flush()

