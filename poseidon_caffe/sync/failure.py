"""A rank that raises ends the whole job at once, with an error naming the rank, its host and
the cause; never a hang. (A rank that is killed outright is reported by ``supervise``.)"""
import atexit
import os
import sys
import threading
import time
import traceback

from .. import log

_state = {"installed": False, "topology": None, "open": False}


def describe():
    topo = _state["topology"]
    if topo is None:
        who = "rank ? on host %s (pid %d)" % (os.uname().nodename, os.getpid())
    else:
        who = "rank %d on host %s (pid %d)" % (topo.rank, topo.hostname, os.getpid())
    return who + _device()


def _device():
    """", GPU <id>" for a rank in GPU mode (its device is part of where it failed)."""
    from .. import backend
    if backend.mode() != "gpu":
        return ""
    device = getattr(backend.get_backend(), "device", None)
    return "" if device is None else ", GPU %d" % device


def end_job_on_error(exc, where="training"):
    """A rank's error while the job runs ends the whole job (``fail``), so that its line names
    the rank, host and device; outside a job of several ranks this returns and the caller
    reports the error as any command does."""
    if not _state["open"]:
        return
    from mpi4py import MPI
    if MPI.COMM_WORLD.Get_size() > 1:
        fail(exc, where)


def fail(exc, where="training"):
    """Log the failure, then abort every rank of the job."""
    _state["open"] = False          # this line says why: the exit check has nothing to add
    try:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        log.error("%s failed in %s: %s: %s", describe(), where, type(exc).__name__, exc)
        log.error("Traceback of the failure:\n%s", text)
        sys.stderr.write("*** %s failed in %s: %s: %s; ending the job\n"
                         % (describe(), where, type(exc).__name__, exc))
        sys.stderr.flush()
        # MPI_Abort tears the job down at once, and the launcher can drop lines still on their
        # way from this rank's pipe: give it a moment to forward the reason first
        time.sleep(0.5)
    finally:
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(1)


def install(topology):
    """Route uncaught exceptions of every thread of this rank to ``fail``."""
    _state["topology"] = topology
    if _state["installed"]:
        return
    _state["installed"] = True

    def excepthook(kind, value, tb):
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, value, tb)
            from mpi4py import MPI
            MPI.COMM_WORLD.Abort(130)
        fail(value)

    def thread_hook(args):
        fail(args.exc_value, "thread %s" % (args.thread.name if args.thread else "?"))

    sys.excepthook = excepthook
    threading.excepthook = thread_hook
    atexit.register(_exit_check)
    _state["open"] = True


def job_finished():
    """This rank finished its part cleanly: leaving now strands nobody."""
    _state["open"] = False


def _exit_check():
    # a rank leaving mid-job (an error handled by returning a status) would strand its peers
    if _state["open"]:
        from mpi4py import MPI
        if MPI.COMM_WORLD.Get_size() == 1:
            return                 # a one-rank job strands nobody: its error line says it all
        sys.stderr.write("*** %s exited before the job finished (its log above says why); "
                         "ending the job\n" % describe())
        sys.stderr.flush()
        time.sleep(0.5)            # as in fail(): let the launcher forward the line
        MPI.COMM_WORLD.Abort(1)
