"""One job at a time per snapshot prefix.

Two jobs snapshotting under the same prefix would mix their files (one job's model beside the
other's solver state of the same iteration). The process that writes a job's snapshot sets
holds an ``flock`` on ``<prefix>.lock``, with its host and process id written in, while it may
write them; a second job is refused, naming that host and pid. The kernel drops the lock when
its process ends, however it ends (kill -9 included), so a dead job never blocks the resume of
its own snapshots; the file itself stays (removing it would race with a job taking it).
Where the filesystem offers no ``flock``, the host and pid written in decide: a live process
on this host keeps the prefix, anything else is taken over.

Several solvers of one process share the claim (a script that builds a second solver on the
same prefix is the same job); it is dropped when the last of them lets it go.
"""
import errno
import fcntl
import os
import re
import socket
import threading
import time

from .. import staging
from .snapshot import SnapshotError

_held = {}                              # lock file (real path) -> [fd, claims]
_mutex = threading.Lock()
_HOLDER = re.compile(r"^host (\S+) pid (\d+)")
# errors that mean "this filesystem does not lock", not "someone holds it"
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS}


class PrefixInUse(SnapshotError):
    """Another live job holds the snapshot prefix; the message names its host and pid."""


def lock_path(prefix):
    return os.fspath(prefix) + ".lock"


def claim(prefix):
    """Take (or share, within this process) the lock of snapshot prefix ``prefix``; returns the
    key to hand ``release``. Raises PrefixInUse when another live job holds it."""
    path = lock_path(prefix)
    key = os.path.realpath(path)
    with _mutex:
        if key in _held:
            _held[key][1] += 1
            return key
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise SnapshotError("cannot open the snapshot lock file %s: %s"
                                % (path, exc.strerror or exc)) from None
        try:
            _lock(fd, prefix, path)
            _write_holder(fd)
        except BaseException:
            os.close(fd)
            raise
        _held[key] = [fd, 1]
        return key


def release(key):
    """Drop one claim made by ``claim``; the last one unlocks the file."""
    with _mutex:
        entry = _held.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _held[key]
        os.close(entry[0])              # closing the only descriptor drops the flock


def holder(path):
    """(host, pid) written in lock file ``path``, or None when it names nobody (yet)."""
    try:
        with open(path) as f:
            match = _HOLDER.match(f.read())
    except (OSError, ValueError):
        return None
    return (match.group(1), int(match.group(2))) if match else None


def _host():
    return socket.gethostname() or "localhost"


def _lock(fd, prefix, path):
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    except OSError as exc:
        if exc.errno not in _NO_FLOCK:
            raise SnapshotError("cannot lock the snapshot lock file %s: %s"
                                % (path, exc.strerror or exc)) from None
        owner = holder(path)
        if (owner and owner[0] == _host() and owner[1] != os.getpid()
                and staging.pid_running(owner[1])):
            raise _refusal(prefix, path, owner)
        return                          # no flock here, and nobody alive named: take it
    # the holder writes its name right after locking: give it a moment to do so
    owner = holder(path)
    for _ in range(20):
        if owner:
            break
        time.sleep(0.05)
        owner = holder(path)
    raise _refusal(prefix, path, owner)


def _refusal(prefix, path, owner):
    who = ("host %s, pid %d" % owner) if owner else "host and pid not written"
    return PrefixInUse("snapshot prefix '%s' is in use by another job (%s; lock file %s): "
                       "two jobs on one prefix would mix their snapshot files; give this job "
                       "another snapshot_prefix, or end that job first" % (prefix, who, path))


def _write_holder(fd):
    text = ("host %s pid %d\n" % (_host(), os.getpid())).encode("utf-8")
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, text, 0)
    except OSError:
        pass                            # a full disk: the lock holds all the same, unnamed
