"""One open handle per database and process, shared by its readers and closed with the last.

LMDB allows one environment per database per process, and LevelDB one open per database
(its LOCK): the readers of one database in a process (a train and a test net on one source,
two nets in one script) share a handle, found by the database's real path."""
import os
import threading


class SharedHandles:
    def __init__(self, open_handle, close_handle):
        self._open = open_handle          # path -> a handle (raises when it cannot)
        self._close = close_handle        # handle -> None
        self._handles = {}                # real path -> [handle, readers]
        self._lock = threading.Lock()

    def acquire(self, path):
        """The handle of the database at ``path``, opened by the first reader."""
        key = os.path.realpath(path)
        with self._lock:
            entry = self._handles.get(key)
            if entry is None:
                entry = self._handles[key] = [self._open(path), 0]
            entry[1] += 1
            return entry[0]

    def release(self, path, handle):
        """One reader of ``path`` is done with ``handle``; the last one closes it."""
        key = os.path.realpath(path)
        with self._lock:
            entry = self._handles.get(key)
            if entry is None or entry[0] is not handle:
                return
            entry[1] -= 1
            if entry[1] == 0:
                del self._handles[key]
                self._close(handle)
