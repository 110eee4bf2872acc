"""SIGINT / SIGHUP turned into solver requests, as Caffe's SignalHandler.

The handler only records that a signal arrived; the solver asks ``requested_action()`` at safe
points (after an iteration, between test batches), so a stop never cuts an update in half.
SIGUSR1 counts as SIGHUP: MPICH's mpiexec passes SIGUSR1 on to every rank but ends the whole
job on SIGHUP, so the launcher forwards a SIGHUP it receives as SIGUSR1.
"""
import signal
import threading

STOP = "stop"
SNAPSHOT = "snapshot"
NONE = "none"
ACTIONS = (STOP, SNAPSHOT, NONE)


def parse_action(value, flag_name="signal effect"):
    if value not in ACTIONS:
        raise ValueError("Invalid %s %r was specified (expected stop, snapshot or none)"
                         % (flag_name, value))
    return value


class SignalHandler:
    """Installs SIGINT, SIGHUP and SIGUSR1 handlers for its lifetime (a context manager)."""

    def __init__(self, sigint_effect=STOP, sighup_effect=SNAPSHOT):
        self.sigint_effect = parse_action(sigint_effect, "sigint_effect")
        self.sighup_effect = parse_action(sighup_effect, "sighup_effect")
        self._got_sigint = False
        self._got_sighup = False
        self._previous = {}

    def _on_sigint(self, signum, frame):
        self._got_sigint = True

    def _on_sighup(self, signum, frame):
        self._got_sighup = True

    def install(self):
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("signal handlers can only be installed from the main thread")
        self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_sigint)
        for name in ("SIGHUP", "SIGUSR1"):
            if hasattr(signal, name):
                signum = getattr(signal, name)
                self._previous[signum] = signal.signal(signum, self._on_sighup)
        return self

    def reassert(self):
        """Take SIGINT and SIGHUP back after a library set its own handlers (UCX, loaded by the
        MPI library, puts a debug hook on SIGHUP). SIGUSR1 stays with the MPI library: MPICH's
        handler passes it on to the one installed before it."""
        signal.signal(signal.SIGINT, self._on_sigint)
        if hasattr(signal, "SIGHUP"):
            signal.signal(signal.SIGHUP, self._on_sighup)

    def ignore_after_exit(self):
        """Leave these signals ignored, not restored, when the handler is uninstalled: once a
        distributed job has stopped on every rank, a signal that comes late changes nothing."""
        for signum in self._previous:
            self._previous[signum] = signal.SIG_IGN

    def uninstall(self):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def __enter__(self):
        return self.install()

    def __exit__(self, *exc):
        self.uninstall()

    def requested_action(self):
        """The action of the oldest pending signal (SIGINT first), clearing it; else none."""
        if self._got_sigint:
            self._got_sigint = False
            return self.sigint_effect
        if self._got_sighup:
            self._got_sighup = False
            return self.sighup_effect
        return NONE
