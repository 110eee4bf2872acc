"""LMDB databases of Caffe Datum records: opening, reading in key order, writing in batches.

Records are read in LMDB's key order, which is the order Caffe's tools wrote them (zero-padded
keys). A reader cycles through the database forever, wrapping around at the end, and keeps only
the records of its shard (offset % size == rank), as Caffe's DataLayer::Skip does.
"""
import os
import threading

import lmdb
from google.protobuf.message import DecodeError

from .. import log, staging
from ..proto import caffe_pb2

# Large enough for any dataset on a 64-bit machine; LMDB only reserves address space.
MAP_SIZE = 1 << 40


class DataError(ValueError):
    """A dataset file that is missing, of the wrong kind or inconsistent; the message names it."""


def check_backend(backend, layer_desc, source):
    """Only LMDB is supported; LEVELDB gets a clear error rather than a crash."""
    if backend != caffe_pb2.DataParameter.LMDB:
        name = caffe_pb2.DataParameter.DB.Name(backend)
        raise DataError("%s: data_param.backend %s is not supported for source %r; only LMDB "
                        "is (convert the database with convert_imageset -backend=lmdb)"
                        % (layer_desc, name, source))


def open_env(path, write=False):
    """An LMDB environment at ``path``; read-only unless ``write``. Errors name the path."""
    path = str(path)
    if not write:
        if not os.path.exists(path):
            raise DataError("LMDB database %r does not exist" % path)
        if not os.path.isdir(path) or not os.path.exists(os.path.join(path, "data.mdb")):
            raise DataError("%r is not an LMDB database (a directory holding data.mdb)" % path)
    try:
        if write:
            os.makedirs(path, exist_ok=True)
            return lmdb.open(path, map_size=MAP_SIZE, subdir=True, readonly=False,
                             meminit=False, map_async=True)
        return lmdb.open(path, readonly=True, lock=False, readahead=False, subdir=True,
                         max_readers=512)
    except lmdb.Error as exc:
        raise DataError("cannot open LMDB database %r: %s" % (path, exc)) from None


def parse_datum(value, path, key):
    """A Datum from one record's bytes; anything else is an error naming the database and key."""
    datum = caffe_pb2.Datum()
    try:
        datum.ParseFromString(value)
    except DecodeError:
        raise DataError("record %r of LMDB database %r is not a Caffe Datum"
                        % (_key_text(key), path)) from None
    if datum.encoded:
        if not datum.data:
            raise DataError("record %r of LMDB database %r is an encoded Datum with no image "
                            "bytes" % (_key_text(key), path))
        return datum
    size = datum.channels * datum.height * datum.width
    stored = len(datum.data) or len(datum.float_data)
    if min(datum.channels, datum.height, datum.width) <= 0 or stored != size:
        raise DataError("record %r of LMDB database %r is not a Caffe Datum: channels x height "
                        "x width = %d x %d x %d but it holds %d values"
                        % (_key_text(key), path, datum.channels, datum.height, datum.width,
                           stored))
    return datum


def _key_text(key):
    try:
        return key.decode("ascii")
    except UnicodeDecodeError:
        return repr(key)


# LMDB allows one environment per database per process; readers of the same database (a train
# and a test net on one source, two nets in one process) share it, closed with its last reader.
_shared_envs = {}
_shared_lock = threading.Lock()


def _acquire_env(path):
    key = os.path.realpath(path)
    with _shared_lock:
        entry = _shared_envs.get(key)
        if entry is None:
            entry = _shared_envs[key] = [open_env(path), 0]
        entry[1] += 1
        return entry[0]


def _release_env(path, env):
    key = os.path.realpath(path)
    with _shared_lock:
        entry = _shared_envs.get(key)
        if entry is None or entry[0] is not env:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del _shared_envs[key]
            env.close()


class DatumDB:
    """A read-only LMDB of Datum records (its environment shared with other readers)."""

    def __init__(self, path):
        self.path = str(path)
        self.env = _acquire_env(self.path)

    def __len__(self):
        return self.env.stat()["entries"]

    @property
    def closed(self):
        return self.env is None

    def first_datum(self):
        """The first record, for shape inference; its own short transaction."""
        with self.env.begin(write=False) as txn:
            cursor = txn.cursor()
            if not cursor.first():
                raise DataError("LMDB database %r is empty" % self.path)
            return parse_datum(cursor.value(), self.path, cursor.key())

    def iter_items(self):
        """(key, value bytes) of every record in key order, once."""
        with self.env.begin(write=False, buffers=False) as txn:
            for key, value in txn.cursor():
                yield key, value

    def close(self):
        if self.env is not None:
            _release_env(self.path, self.env)
            self.env = None


class ShardedRecordReader:
    """Endless reader of one shard of a DatumDB, wrapping around at its end.

    ``offset`` counts every record passed, as Caffe's DataLayer does; a record is kept when
    offset % size == rank. The transaction lives in whichever thread reads first.
    """

    def __init__(self, db, rank=0, size=1, skip=0):
        self.db = db
        self.rank = rank
        self.size = size
        self.offset = 0
        self._txn = None
        self._cursor = None
        self._initial_skip = skip

    def _start(self):
        self._txn = self.db.env.begin(write=False, buffers=False)
        self._cursor = self._txn.cursor()
        if not self._cursor.first():
            raise DataError("LMDB database %r is empty" % self.db.path)
        if self._initial_skip:
            log.info("Skipping first %d data points.", self._initial_skip)
            for _ in range(self._initial_skip):
                self._advance(count=False)

    def _advance(self, count=True):
        if not self._cursor.next():
            log.info("Restarting data prefetching from start.")
            self._cursor.first()
        if count:
            self.offset += 1

    def next_datum(self):
        """The next Datum of this shard."""
        if self._cursor is None:
            self._start()
        while self.offset % self.size != self.rank:
            self._advance()
        datum = parse_datum(self._cursor.value(), self.db.path, self._cursor.key())
        self._advance()
        return datum

    def state(self):
        """Where the reader stands, as JSON-friendly values: the offset and the next key."""
        key = self._cursor.key() if self._cursor is not None else None
        return {"offset": self.offset,
                "key": key.decode("latin-1") if key is not None else None,
                "skip": self._initial_skip if key is None else 0}

    def restore(self, state):
        """Continue from a position ``state()`` returned (e.g. from a snapshot)."""
        self.close()
        self.offset = int(state["offset"])
        self._initial_skip = int(state.get("skip", 0))
        if state.get("key") is None:
            return
        self._txn = self.db.env.begin(write=False, buffers=False)
        self._cursor = self._txn.cursor()
        if not self._cursor.set_key(state["key"].encode("latin-1")):
            raise DataError("cannot resume reading LMDB database %r: record %r is not in it "
                            "(was the database rebuilt?)" % (self.db.path, state["key"]))

    def close(self):
        self._cursor = None
        if self._txn is not None:
            self._txn.abort()
            self._txn = None


class DatumWriter:
    """Writes Datum records into an LMDB, committing every ``commit_every`` records.

    The records go to a temporary database beside ``path`` (see ``poseidon_caffe.staging``),
    which becomes ``path`` only when the writer closes without error: a failed or interrupted
    run leaves no half-written database behind, and leaves an existing one as it was. An
    existing database is an error unless ``replace``; replacing swaps in the new ``data.mdb``
    in one rename, so the path always holds one whole database, old or new.
    """

    def __init__(self, path, commit_every=1000, replace=False):
        self.path = str(path)
        self.replace = replace
        check_writable(self.path, replace)
        staging.remove_stale(self.path)
        self.staging_path = staging.temp_path(self.path)
        try:
            self.env = open_env(self.staging_path, write=True)
        except OSError as exc:
            staging.discard(self.staging_path)
            raise DataError("cannot write LMDB database %r: %s"
                            % (self.path, exc.strerror or exc)) from None
        except BaseException:
            staging.discard(self.staging_path)
            raise
        self.commit_every = commit_every
        self._txn = self.env.begin(write=True)
        self._pending = 0
        self.count = 0

    def put(self, key, datum):
        if isinstance(key, str):
            key = key.encode("utf-8")
        value = datum if isinstance(datum, bytes) else datum.SerializeToString()
        self._txn.put(key, value)
        self._pending += 1
        self.count += 1
        if self._pending >= self.commit_every:
            self._txn.commit()
            self._txn = self.env.begin(write=True)
            self._pending = 0

    def close(self):
        """Commit and put the database in place at ``path``."""
        if self.env is None:
            return
        try:
            self._txn.commit()
            self.env.sync(True)
            self.env.close()
            self.env = None
            self._swap_in()
        except BaseException:
            self.abort()
            raise

    def abort(self):
        """Drop everything written; ``path`` stays as it was."""
        if self.env is not None:
            self._txn.abort()
            self.env.close()
            self.env = None
        staging.discard(self.staging_path)

    def _swap_in(self):
        check_writable(self.path, self.replace)     # nothing else took the path meanwhile
        target = os.path.abspath(self.path)
        data = os.path.join(target, "data.mdb")
        if os.path.isdir(target):
            # an existing (or empty) database directory: replace its data file in one rename;
            # its lock file only coordinates readers and stays
            os.replace(os.path.join(self.staging_path, "data.mdb"), data)
            staging.discard(self.staging_path)
        else:
            os.rename(self.staging_path, target)
            staging.release(self.staging_path)
        staging.sync_directory(target)
        staging.sync_directory(os.path.dirname(target))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
            return False
        self.close()
        return False


def check_writable(path, replace=False):
    """Refuse, before any work, a database path that a writer must not overwrite: an existing
    database (unless ``replace``), or anything there that is not a database at all."""
    if os.path.isfile(os.path.join(path, "data.mdb")):
        if not replace:
            raise DataError("LMDB database %r already exists; remove it first" % path)
        return
    if os.path.isdir(path):
        if os.listdir(path) and set(os.listdir(path)) != {"lock.mdb"}:
            raise DataError("%r exists and is not an LMDB database; not writing over it" % path)
    elif os.path.lexists(path):
        raise DataError("%r exists and is not an LMDB database; not writing over it" % path)
