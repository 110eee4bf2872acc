"""LevelDB stores of records, as Caffe's ``backend: LEVELDB`` keeps them, through plyvel (the
optional ``leveldb`` extra).

LevelDB lets one process at a time open a database (its LOCK file), where LMDB lets many read.
Ranks of one job on one host all read the same source, so a reader that finds the lock held
opens a private view instead: a directory beside the database whose table files are hard links
to the database's own (LevelDB never changes a table file once written) and whose small
bookkeeping files (CURRENT, MANIFEST, log) are copies, since opening a LevelDB writes to them.
The view is removed when its reader closes, and by the next reader when a killed one left it.
"""
import os
import shutil
import time

from .. import staging
from .errors import DataError, key_text
from .shared_handles import SharedHandles

KIND = "LevelDB"
# Caffe's db_leveldb.cpp opens its databases with these
BLOCK_SIZE = 65536
WRITE_BUFFER_SIZE = 268435456
MAX_OPEN_FILES = 100
# A holder opening the database as the view is copied rewrites its log and MANIFEST: a file
# listed is gone when copied, or CURRENT names one not copied. Such a torn view is made again.
VIEW_ATTEMPTS = 5
VIEW_RETRY_S = 0.05

INSTALL_HINT = ("reading and writing LevelDB needs plyvel: pip install 'poseidon-caffe[leveldb]' "
                "(or convert the database with convert_imageset -backend lmdb)")


def holds_database(path):
    return os.path.isfile(os.path.join(path, "CURRENT"))


def _plyvel():
    try:
        import plyvel
    except ImportError:
        raise DataError(INSTALL_HINT) from None
    return plyvel


def _reason(exc):
    text = exc.args[0] if exc.args else exc
    return text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)


def _varint(data, at):
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def _file_changes(edit):
    """One version edit's table changes in order, [(number, added)]; raises IndexError where
    the edit is cut short."""
    changes, i = [], 0
    while i < len(edit):
        tag, i = _varint(edit, i)
        if tag == 1:                                # comparator name
            n, i = _varint(edit, i)
            i += n
        elif tag in (2, 3, 4, 9):                   # log, next file, sequence, prev log
            _, i = _varint(edit, i)
        elif tag == 5:                              # compaction pointer: level, key
            _, i = _varint(edit, i)
            n, i = _varint(edit, i)
            i += n
        elif tag in (6, 7):                         # deleted / new file: level, number
            _, i = _varint(edit, i)
            number, i = _varint(edit, i)
            if tag == 7:
                _, i = _varint(edit, i)             # size, smallest and largest keys
                for _ in range(2):
                    n, i = _varint(edit, i)
                    i += n
                if i > len(edit):
                    raise IndexError("a new file's keys run past the edit")
            changes.append((number, tag == 7))
        else:
            break
    return changes


def _live_tables(manifest):
    """The table numbers a MANIFEST lists (its version edits' new files less deleted ones).
    Records are LevelDB's log format: 32 KB blocks of (checksum 4, length 2, type 1) headers.
    A copy taken while the holder appends may end inside a record: that record is left out
    (the tables it would add are being written, and are not the view's to link)."""
    with open(manifest, "rb") as f:
        data = f.read()
    payload, at, live = b"", 0, set()
    while at + 7 <= len(data):
        if 32768 - at % 32768 < 7:                  # a block's zero-filled tail
            at += 32768 - at % 32768
            continue
        length, kind = int.from_bytes(data[at + 4:at + 6], "little"), data[at + 6]
        if at + 7 + length > len(data):             # cut short by the copy
            break
        payload += data[at + 7:at + 7 + length]
        at += 7 + length
        if kind not in (1, 4):                      # FIRST or MIDDLE: the record goes on
            continue
        edit, payload = payload, b""
        try:
            changes = _file_changes(edit)
        except IndexError:                          # an edit cut short: the last one
            break
        for number, added in changes:
            if added:
                live.add(number)
            else:
                live.discard(number)
    return live


def _link_view(path, view):
    """Fill ``view`` with copies of the bookkeeping files of ``path`` and links to the table
    files its MANIFEST lists. A table it does not list is one the database's holder is
    writing (recovering its log): the view's own recovery may create a table of that number,
    and through a link would truncate the holder's."""
    os.mkdir(view)
    names = [n for n in os.listdir(path) if n not in ("LOCK", "LOG", "LOG.old") and
             os.path.isfile(os.path.join(path, n)) and not n.endswith((".ldb", ".sst"))]
    for name in names:
        shutil.copy2(os.path.join(path, name), os.path.join(view, name))
    with open(os.path.join(view, "CURRENT")) as f:
        manifest = os.path.join(view, f.read().strip())
    for number in _live_tables(manifest):
        for suffix in (".ldb", ".sst"):
            source = os.path.join(path, "%06d%s" % (number, suffix))
            if os.path.isfile(source):
                os.link(source, os.path.join(view, os.path.basename(source)))


def _open_readable(path):
    """(database, the private view read instead, or None)."""
    plyvel = _plyvel()
    staging.remove_stale(path)              # views killed readers left
    try:
        return plyvel.DB(path, create_if_missing=False, max_open_files=MAX_OPEN_FILES), None
    except plyvel.IOError as exc:
        if "lock" not in _reason(exc).lower():
            raise DataError("cannot open LevelDB database %r: %s" % (path, _reason(exc))) \
                from None
        held = _reason(exc)
    except plyvel.Error as exc:
        raise DataError("cannot open LevelDB database %r: %s" % (path, _reason(exc))) from None
    # another process holds the database: read a private view of it
    for attempt in range(VIEW_ATTEMPTS):
        view = staging.temp_path(path)
        try:
            _link_view(path, view)
            return plyvel.DB(view, create_if_missing=False, max_open_files=MAX_OPEN_FILES), view
        except (OSError, plyvel.Error) as exc:
            staging.discard(view)
            torn = isinstance(exc, (FileNotFoundError, plyvel.Error))
            if torn and attempt + 1 < VIEW_ATTEMPTS:
                time.sleep(VIEW_RETRY_S)
                continue
            raise DataError("LevelDB database %r is open in another process (%s), and a "
                            "private view of it beside it could not be made (%s); LevelDB lets "
                            "one process open a database: use LMDB for several readers "
                            "(convert_imageset -backend lmdb)" % (path, held, _reason(exc))) \
                from None


def _close_opened(opened):
    db, view = opened
    db.close()
    if view is not None:
        staging.discard(view)


# LevelDB refuses a second open of one database even within a process
_shared = SharedHandles(_open_readable, _close_opened)


class Store:
    """A LevelDB opened for reading (shared with the process's other readers of it)."""
    kind = KIND

    def __init__(self, path):
        self.path = str(path)
        self._opened = _shared.acquire(self.path)
        self.db = self._opened[0]

    def __len__(self):
        """LevelDB keeps no count: the keys are walked."""
        with self.db.iterator(include_value=False) as keys:
            return sum(1 for _ in keys)

    def check(self):
        """Nothing to check between reads: LevelDB reads files, it maps none."""

    def cursor(self):
        return Cursor(self)

    def close(self):
        if self.db is not None:
            _shared.release(self.path, self._opened)
            self.db = None


class Cursor:
    """A position in one snapshot of the database, moved as lmdb_store's Cursor is."""

    def __init__(self, store):
        self.store = store
        self._snapshot = store.db.snapshot()
        self._it = self._snapshot.raw_iterator()

    def _guard(self, step, *args):
        try:
            step(*args)
            return self._it.valid()
        except _plyvel().Error as exc:
            raise DataError("LevelDB database %r is damaged: %s (rebuild it or copy it again)"
                            % (self.store.path, _reason(exc))) from None

    def first(self):
        return self._guard(self._it.seek_to_first)

    def next(self):
        return self._guard(self._it.next)

    def seek(self, key):
        return self._guard(self._it.seek, key) and self._it.key() == key

    def key(self):
        return self._it.key()

    def value(self):
        try:
            return self._it.value()
        except _plyvel().Error as exc:
            raise DataError("LevelDB database %r is damaged at record %r: %s"
                            % (self.store.path, key_text(self._it.key()), _reason(exc))) \
                from None

    def close(self):
        if self._it is not None:
            self._it.close()
            self._it = None
            self._snapshot.close()
            self._snapshot = None


class Writer:
    """A new LevelDB in a staging directory, renamed to ``path`` by ``finish``. Replacing an
    existing database moves it aside first: two renames, the old one removed after."""

    def __init__(self, path, staging_path):
        plyvel = _plyvel()
        self.path = path
        self.staging_path = staging_path
        try:
            self.db = plyvel.DB(staging_path, create_if_missing=True, error_if_exists=True,
                                block_size=BLOCK_SIZE, write_buffer_size=WRITE_BUFFER_SIZE,
                                max_open_files=MAX_OPEN_FILES)
        except plyvel.Error as exc:
            raise DataError("cannot write LevelDB database %r: %s" % (path, _reason(exc))) \
                from None
        self._batch = self.db.write_batch()

    def put(self, key, value):
        self._batch.put(key, value)

    def commit(self):
        self._batch.write()
        self._batch = self.db.write_batch()

    def finish(self):
        self._batch.write()
        self._batch = None
        self.db.close()
        self.db = None
        target = os.path.abspath(self.path)
        old = None
        if os.path.lexists(target):
            old = staging.temp_path(target)
            os.rename(target, old)
        os.rename(self.staging_path, target)
        staging.release(self.staging_path)
        if old is not None:
            staging.discard(old)
        staging.sync_directory(os.path.dirname(target))

    def abort(self):
        if self.db is not None:
            self._batch = None
            self.db.close()
            self.db = None
