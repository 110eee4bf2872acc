"""Whole files in and out: reads that fail with one line naming the file, atomic writes.

A write goes to a temporary file in the target's directory (``poseidon_caffe.staging``), is
fsynced, then renamed over the target, so a crash never leaves a truncated model where a good
one was.
"""
import os

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
