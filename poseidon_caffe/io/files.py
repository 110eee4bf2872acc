"""Whole files in and out: reads that fail with one line naming the file, atomic writes.

A large binary file is mapped rather than read (``_map_bytes``), so a reader that stops at the
first field that makes no sense has touched only the pages before it, and a device or pipe
(``/dev/zero``) is refused instead of read without end.

A write goes to a temporary file in the target's directory (``poseidon_caffe.staging``), is
fsynced, then renamed over the target, so a crash never leaves a truncated model where a good
one was.
"""
import mmap
import os
import stat

from .. import staging
from .errors import ProtoFileError


def atomic_write(path, data):
    """Write ``data`` (bytes, or an iterable of byte chunks) to ``path`` atomically.

    The bytes go to a temporary file in the same directory (see ``staging``), are fsynced, and
    the file is renamed over ``path``.  On any failure the temporary file is removed and
    ``path`` is untouched; temporaries that killed writers left beside ``path`` are removed
    first.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    chunks = (data,) if isinstance(data, (bytes, bytearray, memoryview)) else data
    staging.remove_stale(path)
    tmp = staging.temp_path(path)
    try:
        # mode 0o666 under the umask: the file gets the mode a plain open() would give it
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:
        staging.release(tmp)
        raise ProtoFileError("cannot write %s: %s" % (path, e.strerror or e)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        staging.release(tmp)
    except BaseException:
        staging.discard(tmp)
        raise
    staging.sync_directory(directory)


def _read_bytes(path, what):
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise ProtoFileError("%s: no such file (expected %s)" % (path, what)) from None
    except IsADirectoryError:
        raise ProtoFileError("%s: is a directory (expected %s)" % (path, what)) from None
    except OSError as e:
        raise ProtoFileError("%s: cannot read %s: %s" % (path, what, e.strerror or e)) from None


_SPECIAL_FILES = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                  (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"))


def _map_bytes(path, what):
    """The bytes of the regular file ``path``, mapped read-only (b"" when empty): pages are
    read when touched and are the kernel's to drop again. Special files are refused."""
    path = os.fspath(path)
    try:
        mode = os.stat(path).st_mode        # before opening: opening a pipe waits for a writer
    except FileNotFoundError:
        raise ProtoFileError("%s: no such file (expected %s)" % (path, what)) from None
    except OSError as e:
        raise ProtoFileError("%s: cannot read %s: %s" % (path, what, e.strerror or e)) from None
    if stat.S_ISDIR(mode):
        raise ProtoFileError("%s: is a directory (expected %s)" % (path, what))
    for test, name in _SPECIAL_FILES:
        if test(mode):
            raise ProtoFileError("%s: is %s, not a file (expected %s)" % (path, name, what))
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return b""
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:
        raise ProtoFileError("%s: cannot read %s: %s"
                             % (path, what, getattr(e, "strerror", None) or e)) from None
