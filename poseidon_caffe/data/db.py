"""Databases of Caffe Datum records, LMDB or LevelDB: opening, reading in key order, writing in
batches.

Records are read in key order, which is the order Caffe's tools wrote them (zero-padded keys).
A reader cycles through the database forever, wrapping around at the end, and keeps only the
records of its shard (offset % size == rank), as Caffe's DataLayer::Skip does. The two kinds
of store (``lmdb_store``, ``leveldb_store``) offer the same few calls; which one a path holds
is read from the files there (``data.mdb``, or LevelDB's ``CURRENT``).
"""
import os

from google.protobuf.message import DecodeError

from .. import log, staging
from ..proto import caffe_pb2
from . import leveldb_store, lmdb_store
from .errors import DataError, key_text

__all__ = ["DataError", "DatumDB", "ShardedRecordReader", "DatumWriter", "check_writable",
           "parse_datum", "note_declared_backend"]

# the names Caffe's tools take after -backend (and extract_features' db_type), by store
BACKENDS = {"lmdb": "LMDB", "leveldb": "LevelDB"}


def _store_module(kind):
    return lmdb_store if kind == lmdb_store.KIND else leveldb_store


def backend_kind(name):
    """The store a tool's ``-backend NAME`` asks for; anything else is an error naming it."""
    kind = BACKENDS.get(str(name).lower())
    if kind is None:
        raise DataError("backend %r is not one of %s" % (name, ", ".join(BACKENDS)))
    return kind


def stored_kind(path):
    """"LMDB" or "LevelDB" for a database directory, None where ``path`` holds neither."""
    if lmdb_store.holds_database(path):
        return lmdb_store.KIND
    if leveldb_store.holds_database(path):
        return leveldb_store.KIND
    return None


def note_declared_backend(data_param, database, where):
    """A WARNING when a Data layer's ``backend`` names another kind than its source holds: the
    source is read as what it is (Caffe's default, LEVELDB, is often left above an LMDB)."""
    declared = caffe_pb2.DataParameter.DB.Name(data_param.backend)
    if data_param.HasField("backend") and declared != database.kind.upper():
        log.warning("%s: data_param.backend is %s but %s is an %s database; reading it as %s",
                    where, declared, database.path, database.kind, database.kind)


def parse_datum(value, path, key, kind="LMDB"):
    """A Datum from one record's bytes; anything else is an error naming the database and key."""
    datum = caffe_pb2.Datum()
    try:
        datum.ParseFromString(value)
    except DecodeError:
        raise DataError("record %r of %s database %r is not a Caffe Datum"
                        % (key_text(key), kind, path)) from None
    if datum.encoded:
        if not datum.data:
            raise DataError("record %r of %s database %r is an encoded Datum with no image "
                            "bytes" % (key_text(key), kind, path))
        return datum
    size = datum.channels * datum.height * datum.width
    stored = len(datum.data) or len(datum.float_data)
    if min(datum.channels, datum.height, datum.width) <= 0 or stored != size:
        raise DataError("record %r of %s database %r is not a Caffe Datum: channels x height "
                        "x width = %d x %d x %d but it holds %d values"
                        % (key_text(key), kind, path, datum.channels, datum.height,
                           datum.width, stored))
    return datum


class DatumDB:
    """A read-only database of Datum records, of the kind its files show (or ``kind``)."""

    def __init__(self, path, kind=None):
        self.path = str(path)
        if not os.path.exists(self.path):
            raise DataError("database %r does not exist" % self.path)
        found = stored_kind(self.path)
        if found is None:
            raise DataError("%r is not an LMDB or LevelDB database (a directory holding "
                            "data.mdb, or LevelDB's CURRENT)" % self.path)
        if kind is not None and kind != found:
            raise DataError("%r is an %s database, not %s" % (self.path, found, kind))
        self.kind = found
        self.store = _store_module(found).Store(self.path)

    def __len__(self):
        return len(self.store)

    @property
    def closed(self):
        return self.store is None

    @property
    def env(self):
        """The LMDB environment (LMDB only): tests look at it."""
        return self.store.env

    def parse(self, value, key):
        return parse_datum(value, self.path, key, self.kind)

    def check(self):
        """Refuse a data file that changed under the reader in a way that would crash it."""
        self.store.check()

    def first_datum(self):
        """The first record, for shape inference."""
        cursor = self.store.cursor()
        try:
            if not cursor.first():
                raise DataError("%s database %r is empty" % (self.kind, self.path))
            return self.parse(cursor.value(), cursor.key())
        finally:
            cursor.close()

    def iter_items(self):
        """(key, value bytes) of every record in key order, once."""
        cursor = self.store.cursor()
        try:
            found = cursor.first()
            while found:
                yield cursor.key(), cursor.value()
                found = cursor.next()
        finally:
            cursor.close()

    def close(self):
        if self.store is not None:
            self.store.close()
            self.store = None


class ShardedRecordReader:
    """Endless reader of one shard of a DatumDB, wrapping around at its end.

    ``offset`` counts every record passed, as Caffe's DataLayer does; a record is kept when
    offset % size == rank. The cursor lives in whichever thread reads first.
    """

    def __init__(self, db, rank=0, size=1, skip=0):
        self.db = db
        self.rank = rank
        self.size = size
        self.offset = 0
        self._cursor = None
        self._initial_skip = skip
        self._wrapped = 0

    def _start(self):
        self._cursor = self.db.store.cursor()
        if not self._cursor.first():
            raise DataError("%s database %r is empty" % (self.db.kind, self.db.path))
        if self._initial_skip:
            log.info("Skipping first %d data points.", self._initial_skip)
            for _ in range(self._initial_skip):
                self._advance(count=False)

    def _advance(self, count=True):
        if not self._cursor.next():
            # Caffe's line ends each pass; after the first, at DEBUG only: a small dataset
            # read once a display block or more would fill the log with it
            self._wrapped += 1
            (log.info if self._wrapped == 1 else log.debug)(
                "Restarting data prefetching from start.")
            self._cursor.first()
        if count:
            self.offset += 1

    def check(self):
        self.db.check()

    def next_datum(self):
        """The next Datum of this shard."""
        if self._cursor is None:
            self._start()
        while self.offset % self.size != self.rank:
            self._advance()
        datum = self.db.parse(self._cursor.value(), self._cursor.key())
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
        self._cursor = self.db.store.cursor()
        if not self._cursor.seek(state["key"].encode("latin-1")):
            raise DataError("cannot resume reading %s database %r: record %r is not in it "
                            "(was the database rebuilt?)" % (self.db.kind, self.db.path,
                                                            state["key"]))

    def close(self):
        if self._cursor is not None:
            self._cursor.close()
            self._cursor = None


class DatumWriter:
    """Writes Datum records into a new database, committing every ``commit_every`` records.

    The records go to a temporary database beside ``path`` (see ``poseidon_caffe.staging``),
    which becomes ``path`` only when the writer closes without error: a failed or interrupted
    run leaves no half-written database behind, and leaves an existing one as it was. An
    existing database is an error unless ``replace``. ``backend`` is a tool's -backend name.
    """

    def __init__(self, path, commit_every=1000, replace=False, backend="lmdb"):
        self.path = str(path)
        self.replace = replace
        self.kind = backend_kind(backend)
        module = _store_module(self.kind)
        check_writable(self.path, replace, backend)
        staging.remove_stale(self.path)
        self.staging_path = staging.temp_path(self.path)
        try:
            self._store = module.Writer(self.path, self.staging_path)
        except OSError as exc:
            staging.discard(self.staging_path)
            raise DataError("cannot write %s database %r: %s"
                            % (self.kind, self.path, exc.strerror or exc)) from None
        except BaseException:
            staging.discard(self.staging_path)
            raise
        self.commit_every = commit_every
        self._pending = 0
        self.count = 0

    def put(self, key, datum):
        if isinstance(key, str):
            key = key.encode("utf-8")
        value = datum if isinstance(datum, bytes) else datum.SerializeToString()
        self._store.put(key, value)
        self._pending += 1
        self.count += 1
        if self._pending >= self.commit_every:
            self._store.commit()
            self._pending = 0

    def close(self):
        """Commit and put the database in place at ``path``."""
        if self._store is None:
            return
        try:
            check_writable(self.path, self.replace, self.kind)  # nothing took the path meanwhile
            self._store.finish()
            self._store = None
        except BaseException:
            self.abort()
            raise

    def abort(self):
        """Drop everything written; ``path`` stays as it was."""
        if self._store is not None:
            self._store.abort()
            self._store = None
        staging.discard(self.staging_path)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
            return False
        self.close()
        return False


def check_writable(path, replace=False, backend="lmdb"):
    """Refuse, before any work, a database path that a writer must not overwrite: an existing
    database (unless ``replace``, and then only one of the same kind), or anything there that
    is not a database at all."""
    kind = backend_kind(backend)
    found = stored_kind(path) if os.path.isdir(path) else None
    if found is not None:
        if not replace:
            raise DataError("%s database %r already exists; remove it first" % (found, path))
        if found != kind:
            raise DataError("%r is an %s database; not replacing it with %s" % (path, found,
                                                                               kind))
        return
    if os.path.isdir(path):
        if os.listdir(path) and set(os.listdir(path)) != {"lock.mdb"}:
            raise DataError("%r exists and is not a database; not writing over it" % path)
    elif os.path.lexists(path):
        raise DataError("%r exists and is not a database; not writing over it" % path)
