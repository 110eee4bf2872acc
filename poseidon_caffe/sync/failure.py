"""A rank that raises ends the whole job at once, with an error naming the rank, its host and
the cause; never a hang. (A rank that is killed outright is reported by ``supervise``.)

The first failure on a rank is its report and ends the job with MPI_Abort. What fails after it
on other threads follows from it and is not reported again, and the rank does not leave before
the abort: its MPI_Finalize would wait for every peer, the one that stopped answering too."""
import atexit
import os
import sys
import threading
import time
import traceback

from .. import log
from . import communicator

_state = {"installed": False, "topology": None, "open": False, "ending": None}
_ending_lock = threading.Lock()
# how long a thread that finds the job already being ended waits for that abort before it
# aborts itself (the failing thread needs half a second to have its line forwarded)
ABORT_WAIT = 5.0


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
    device = backend.get_backend().device
    return "" if device is None else ", GPU %d" % device


def end_job_on_error(exc, where="training"):
    """A rank's error while the job runs ends the whole job (``fail``), so that its line names
    the rank, host and device; outside a job of several ranks this returns and the caller
    reports the error as any command does."""
    if not _state["open"]:
        return
    if communicator.job_size() > 1:
        fail(exc, where)


def fail(exc, where="training"):
    """Log the failure, then abort every rank of the job; a failure after the first one on
    this rank only waits for that one's abort."""
    _state["open"] = False          # this line says why: the exit check has nothing to add
    if not _claim_ending():
        _await_abort()
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
        communicator.abort(1)


def install(topology):
    """Route uncaught exceptions of every thread of this rank to ``fail``."""
    _state["topology"] = topology
    if _state["installed"]:
        return
    _state["installed"] = True

    def excepthook(kind, value, tb):
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, value, tb)
            communicator.abort(130)
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


def _claim_ending():
    """Whether the calling thread is the first to end the job from this rank."""
    with _ending_lock:
        if _state["ending"] is not None:
            return False
        _state["ending"] = threading.current_thread()
        return True


def _await_abort():
    """Another thread of this rank is ending the job: wait for its MPI_Abort, which ends this
    process; should it never come, abort from here."""
    time.sleep(ABORT_WAIT)
    communicator.abort(1)


def _exit_check():
    ending = _state["ending"]
    if ending is not None and ending is not threading.current_thread():
        # the main thread leaving while another one ends the job (a failure seen on both
        # threads): leaving first would reach MPI_Finalize, which waits for every peer
        _await_abort()
    # a rank leaving mid-job (an error handled by returning a status) would strand its peers
    if _state["open"]:
        if communicator.job_size() == 1:
            return                 # a one-rank job strands nobody: its error line says it all
        if not _claim_ending():
            _await_abort()
        sys.stderr.write("*** %s exited before the job finished (its log above says why); "
                         "ending the job\n" % describe())
        sys.stderr.flush()
        time.sleep(0.5)            # as in fail(): let the launcher forward the line
        communicator.abort(1)
