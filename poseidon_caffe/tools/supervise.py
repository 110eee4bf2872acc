"""Run one rank's command and report how it ended, so that a rank that is killed outright
(a signal, the out-of-memory killer) is named in the job's output: rank, host and cause.

``python -m poseidon_caffe.tools.supervise -- poseidon-caffe train ...`` is what the launcher
puts in front of every rank. The worker inherits the MPI launcher's environment (and its PMI
descriptor); it dies with its supervisor, so no orphan is left when the job is torn down.

The worker runs in a process group of its own. MPICH's proxy signals each rank's process group,
and the supervisor passes every signal on: were the worker in the supervisor's group, one
snapshot request sent to mpiexec would reach it twice, moments apart, and could be taken as two.
"""
import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def _start_worker():
    """In the new worker, before it runs: a process group of its own; die with the parent."""
    os.setpgid(0, 0)
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def rank_of_environment():
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if var in os.environ:
            return os.environ[var]
    return "?"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        sys.stderr.write("usage: python -m poseidon_caffe.tools.supervise -- COMMAND [ARGS]\n")
        return 2
    keep = [int(os.environ["PMI_FD"])] if os.environ.get("PMI_FD", "").isdigit() else []
    # passed on, once (SIGUSR1 is how mpiexec delivers a snapshot request; see
    # solver/signals.py); one that comes while the worker is being started waits for it
    worker = {"proc": None, "early": []}

    def forward(signum, frame):
        if worker["proc"] is None:
            worker["early"].append(signum)
        else:
            worker["proc"].send_signal(signum)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, forward)
    try:
        child = subprocess.Popen(argv, pass_fds=keep, preexec_fn=_start_worker)
    except OSError as exc:
        sys.stderr.write("*** rank %s on host %s: cannot start %s: %s\n"
                         % (rank_of_environment(), os.uname().nodename, argv[0], exc))
        return 127
    worker["proc"] = child
    for signum in worker["early"]:
        child.send_signal(signum)
    code = child.wait()
    if code < 0:
        name = signal.Signals(-code).name
        sys.stderr.write("*** rank %s on host %s (pid %d) was killed by signal %d (%s); "
                         "ending the job\n" % (rank_of_environment(), os.uname().nodename,
                                               child.pid, -code, name))
        sys.stderr.flush()
        return 128 - code
    return code


if __name__ == "__main__":
    sys.exit(main())
