"""A command across a fresh lab: make it, run the command in host 0's namespace (where mpiexec
reaches every host, as on a cluster's first node), count the bytes each host's link carried
while it ran, and take the lab down whatever happens — normal exit, the command's failure, a
signal, a failure half way through setup.

SIGINT, SIGTERM and SIGHUP are passed on to the command's process group, as a terminal passes a
Ctrl-C (the command runs in a group of its own, so a Ctrl-C reaches it through here, once); one
that arrives during setup stops the setup and takes down what was made.
"""
import collections
import os
import signal
import subprocess
import threading
import time

from .lab import DEFAULT_MTU, DEFAULT_PORT, Lab, difference

RunResult = collections.namedtuple("RunResult", "returncode name wire seconds stdout stderr")
RunResult.__doc__ = """returncode: the command's exit status (128 + N when signal N ended it or
stopped the setup); name: the lab's name; wire: [HostBytes] counted while the command ran
(None when it never started); seconds: how long it ran; stdout, stderr: what it wrote (text)
when asked for with subprocess.PIPE."""

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _signal_group(proc, signum):
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass


class _Interrupted(BaseException):
    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def run_across(hosts, bandwidth, argv, latency="0", hostfile=None, port=DEFAULT_PORT,
               mtu=DEFAULT_MTU, env=None, cwd=None, stdout=None, stderr=None, timeout=None,
               on_ready=None):
    """Run ``argv`` across a lab of ``hosts`` hosts at ``bandwidth`` (``latency`` one way
    between hosts) and return a RunResult; ``{hostfile}`` in an argument is the lab's host
    file. ``env``: the base environment (default os.environ), to which the lab adds its own
    (``Lab.env``). ``on_ready(lab)`` is called once the lab stands, before the command
    starts. ``timeout``: seconds, after which the command is killed and
    subprocess.TimeoutExpired raised (the lab taken down first). Bad input raises UnitError
    or LabError before anything is made."""
    job = {"phase": "setup", "proc": None, "signum": None}

    def on_signal(signum, frame):
        job["signum"] = job["signum"] or signum
        if job["phase"] == "setup":
            job["phase"] = "teardown"        # later signals must not cut the teardown short
            raise _Interrupted(signum)
        if job["phase"] == "running":
            _signal_group(job["proc"], signum)

    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.signal(sig, on_signal) for sig in FORWARDED}
    made = []
    try:
        try:
            lab = Lab.create(hosts, bandwidth, latency, hostfile=hostfile, port=port, mtu=mtu,
                             made=made)
            if on_ready is not None:
                on_ready(lab)
            before = lab.wire_bytes()
            start = time.monotonic()
            job["proc"] = subprocess.Popen(lab.command(argv), env=lab.env(env), cwd=cwd,
                                           stdin=subprocess.DEVNULL, stdout=stdout,
                                           stderr=stderr, text=True, errors="replace",
                                           start_new_session=True)
            job["phase"] = "running"
        except _Interrupted as exc:
            return RunResult(128 + exc.signum, made[0].name if made else None, None, 0.0, None,
                             None)
        if job["signum"] is not None:          # it came while the command was being started
            _signal_group(job["proc"], job["signum"])
        try:
            out, err = job["proc"].communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            job["proc"].kill()
            job["proc"].communicate()
            raise
        seconds = time.monotonic() - start
        job["phase"] = "teardown"
        wire = difference(lab.wire_bytes(), before)
        code = job["proc"].returncode
        return RunResult(128 - code if code < 0 else code, lab.name, wire, seconds, out, err)
    finally:
        job["phase"] = "teardown"
        try:
            for lab in made:
                lab.destroy()
        finally:
            for sig, previous in handlers.items():
                signal.signal(sig, previous)
