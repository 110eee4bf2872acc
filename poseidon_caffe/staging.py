"""Temporary files written beside their target, and the removal of ones a killed writer left.

Every file or database the project writes goes first to a hidden temporary beside its target,
named ``.<target name>.p<pid>-<tag>-<host>.tmp``, and is renamed over the target only once it
is complete. A writer killed on the way leaves its temporary behind; the next write to the same
target removes it (``remove_stale``), and a writer of a family of files (every iteration's
snapshot) removes those of the whole family (``remove_stale_where``). A temporary counts as
stale when the writer it names can no longer be writing it: on this host, its process has ended
(or its process id now belongs to a process started after the temporary was last written, or to
this very process, which knows its own live temporaries); from another host, or in the older
unnamed form, when nothing has written to it for ``FOREIGN_STALE_AFTER`` seconds. A concurrent
writer's temporary is kept.

Only the standard library is used: ``io`` and ``data`` both build on this module.
"""
import os
import re
import secrets
import shutil
import socket
import threading
import time

# no writer leaves its temporary untouched this long while it is still writing
FOREIGN_STALE_AFTER = 3600.0

# temporaries this process is writing now (absolute paths): never stale to itself
_live = set()
_live_lock = threading.Lock()

_OURS = re.compile(r"^p(\d+)-([0-9a-f]+)-(.+)$")
# the random part of the mkstemp-named temporaries earlier versions wrote
_LEGACY = re.compile(r"^[a-z0-9_]{8}$")


def _host():
    return socket.gethostname().replace(".", "_").replace("/", "_") or "localhost"


def temp_path(target):
    """A fresh temporary name beside ``target``, marked as this process's until ``release``."""
    target = os.path.abspath(os.fspath(target))
    directory, name = os.path.split(target)
    path = os.path.join(directory, ".%s.p%d-%s-%s.tmp" % (name, os.getpid(),
                                                        secrets.token_hex(4), _host()))
    with _live_lock:
        _live.add(path)
    return path


def release(path):
    """Forget a temporary made by ``temp_path`` (renamed into place, or removed)."""
    with _live_lock:
        _live.discard(os.path.abspath(path))


def discard(path):
    """Remove a temporary file or database directory, if it is there, and forget it."""
    release(path)
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass                            # gone already, or not ours to remove: leave it


def pid_running(pid):
    """Whether process ``pid`` of this host is alive (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True                     # another user's process
    except OverflowError:
        return False
    return True


_boot_time = None


def _process_start(pid):
    """When process ``pid`` started (seconds since the epoch), or None where /proc cannot say."""
    global _boot_time
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if _boot_time is None:
            with open("/proc/stat") as f:
                _boot_time = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return _boot_time + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _last_written(path):
    """The newest modification time of a temporary file, or of a database directory and the
    files in it."""
    newest = os.lstat(path).st_mtime
    if os.path.isdir(path) and not os.path.islink(path):
        for entry in os.scandir(path):
            try:
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
            except FileNotFoundError:
                pass
    return newest


def is_stale(path, middle, now=None):
    """Whether the temporary ``path`` (``middle``: the part between target name and suffix)
    was left by a writer that can no longer be writing it."""
    now = time.time() if now is None else now
    try:
        written = _last_written(path)
    except FileNotFoundError:
        return False                    # gone already: its writer finished or cleaned it
    ours = _OURS.match(middle)
    if ours is None or ours.group(3) != _host():
        return now - written > FOREIGN_STALE_AFTER
    pid = int(ours.group(1))
    if pid == os.getpid():
        with _live_lock:
            return os.path.abspath(path) not in _live
    if not pid_running(pid):
        return True
    started = _process_start(pid)
    # the id was reused: the process that has it now began after the temporary was written
    return started is not None and started > written + 1.0


def stale_temporaries(target):
    """The temporaries beside ``target`` that killed writers left (see the module's rules)."""
    target = os.path.abspath(os.fspath(target))
    directory, name = os.path.split(target)
    return _stale_in(directory, lambda target_name: target_name == name)


def _stale_in(directory, wanted):
    """The stale temporaries in ``directory`` whose target's name ``wanted(name)`` accepts."""
    found = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return found
    now = time.time()
    for entry in entries:
        if not (entry.name.startswith(".") and entry.name.endswith(".tmp")):
            continue
        # .<target>.<middle>.tmp: the middle has no dot (the host's dots are replaced)
        target_name, _, middle = entry.name[1:-len(".tmp")].rpartition(".")
        if not target_name or not (_OURS.match(middle) or _LEGACY.match(middle)):
            continue
        if not wanted(target_name):
            continue                    # another target's file (``a.b`` beside ``a``)
        try:
            stale = is_stale(entry.path, middle, now)
        except OSError:
            continue                    # unreadable: not ours to judge
        if stale:
            found.append(entry.path)
    return found


def remove_stale(target):
    """Remove the temporaries of ``target`` that killed writers left; returns their paths."""
    removed = stale_temporaries(target)
    for path in removed:
        discard(path)
    return removed


def remove_stale_where(directory, wanted):
    """Remove the temporaries in ``directory`` that killed writers left for any target whose
    name ``wanted(name)`` accepts (a family of files: every iteration's snapshot files, not
    only the one written now); returns their paths."""
    removed = _stale_in(os.fspath(directory) or ".", wanted)
    for path in removed:
        discard(path)
    return removed


def sync_directory(path):
    """Make a rename inside directory ``path`` durable, where the filesystem allows."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass                            # some filesystems cannot fsync a directory
    finally:
        os.close(fd)
