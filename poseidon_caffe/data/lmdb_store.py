"""LMDB stores of records: opened read-only with a check of the file, shared within a process,
read through cursors, and written beside their target then swapped in.

LMDB maps ``data.mdb`` into memory: a page past the end of a truncated file is a bus error, a
signal no Python code can catch. So the file is checked against the size its own meta page
records (its last page) when it is opened, and again before each batch is read; LMDB's own
errors become one line naming the database and the record.
"""
import os

import lmdb

from .. import staging
from .errors import DataError, key_text
from .shared_handles import SharedHandles

KIND = "LMDB"
# Large enough for any dataset on a 64-bit machine; LMDB only reserves address space.
MAP_SIZE = 1 << 40
DATA_FILE = "data.mdb"


def holds_database(path):
    return os.path.isfile(os.path.join(path, DATA_FILE))


def _open_env(path, write=False):
    try:
        if write:
            os.makedirs(path, exist_ok=True)
            return lmdb.open(path, map_size=MAP_SIZE, subdir=True, readonly=False,
                             meminit=False, map_async=True)
        return lmdb.open(path, readonly=True, lock=False, readahead=False, subdir=True,
                         max_readers=512)
    except lmdb.Error as exc:
        raise DataError("cannot open LMDB database %r: %s" % (path, exc)) from None


def _needed_bytes(env):
    """The size data.mdb must have: up to the last page its newest meta page counts."""
    return (env.info()["last_pgno"] + 1) * env.stat()["psize"]


def _check_size(path, needed):
    data = os.path.join(path, DATA_FILE)
    try:
        size = os.stat(data).st_size
    except OSError as exc:
        raise DataError("LMDB database %r: cannot read %s: %s"
                        % (path, DATA_FILE, exc.strerror or exc)) from None
    if size < needed:
        raise DataError("LMDB database %r is truncated: %s holds %d bytes but the database "
                        "records %d (was it copied or written only in part?)"
                        % (path, DATA_FILE, size, needed))


def _open_checked(path):
    """(environment, the bytes data.mdb must hold) of a database whose file is whole."""
    env = _open_env(path)
    try:
        needed = _needed_bytes(env)
        _check_size(path, needed)
    except BaseException:
        env.close()
        raise
    return env, needed


# LMDB allows one environment per database per process
_shared = SharedHandles(_open_checked, lambda opened: opened[0].close())


class Store:
    """A read-only LMDB (its environment shared with the process's other readers of it)."""
    kind = KIND

    def __init__(self, path):
        self.path = str(path)
        self._opened = _shared.acquire(self.path)
        self.env, self._needed = self._opened

    def __len__(self):
        return self.env.stat()["entries"]

    def check(self):
        """Refuse, in one line, a data file that shrank since it was opened."""
        _check_size(self.path, self._needed)

    def cursor(self):
        return Cursor(self)

    def close(self):
        if self.env is not None:
            _shared.release(self.path, self._opened)
            self.env = None


class Cursor:
    """A position in one read transaction: first/next/seek move it and say whether it stands
    on a record; key/value read that record."""

    def __init__(self, store):
        self.store = store
        self._txn = store.env.begin(write=False, buffers=False)
        self._cursor = self._txn.cursor()
        self._last = None           # the key of the last record reached, for error lines

    def _move(self, step, *args):
        try:
            found = step(*args)
            self._last = self._cursor.key() if found else self._last
            return found
        except lmdb.Error as exc:
            raise self._damaged(exc) from None

    def _guard(self, read):
        try:
            return read()
        except lmdb.Error as exc:
            raise self._damaged(exc) from None

    def _damaged(self, exc):
        if self._last is None:
            where = "before its first record"
        else:
            where = "after record %r" % key_text(self._last)
        return DataError("LMDB database %r is damaged %s: %s (rebuild it or copy it again)"
                         % (self.store.path, where, str(exc).split(":")[-1].strip() or exc))

    def first(self):
        return self._move(self._cursor.first)

    def next(self):
        return self._move(self._cursor.next)

    def seek(self, key):
        return self._move(self._cursor.set_key, key)

    def key(self):
        return self._guard(self._cursor.key)

    def value(self):
        return self._guard(self._cursor.value)

    def close(self):
        self._cursor = None
        if self._txn is not None:
            self._txn.abort()
            self._txn = None


class Writer:
    """A new LMDB in a staging directory (see ``poseidon_caffe.staging``), put in place at
    ``path`` by ``finish``: replacing swaps the new ``data.mdb`` in with one rename, so the path
    always holds one whole database, old or new."""

    def __init__(self, path, staging_path):
        self.path = path
        self.staging_path = staging_path
        self.env = _open_env(staging_path, write=True)
        self._txn = self.env.begin(write=True)

    def put(self, key, value):
        self._txn.put(key, value)

    def commit(self):
        self._txn.commit()
        self._txn = self.env.begin(write=True)

    def finish(self):
        self._txn.commit()
        self._txn = None
        self.env.sync(True)
        self.env.close()
        self.env = None
        target = os.path.abspath(self.path)
        if os.path.isdir(target):
            # an existing (or empty) database directory: replace its data file in one rename;
            # its lock file only coordinates readers and stays
            os.replace(os.path.join(self.staging_path, DATA_FILE),
                       os.path.join(target, DATA_FILE))
            staging.discard(self.staging_path)
        else:
            os.rename(self.staging_path, target)
            staging.release(self.staging_path)
        staging.sync_directory(target)
        staging.sync_directory(os.path.dirname(target))

    def abort(self):
        if self.env is not None:
            if self._txn is not None:
                self._txn.abort()
            self.env.close()
            self.env = None
