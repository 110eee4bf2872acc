"""Bytes each worker really sent and received, per iteration and per parameter blob.

Off-host bytes (between host leaders, or to parameter-server shards on another host) are what
the planner predicts; on-host bytes (between the devices of one host, over shared memory) are
kept apart so that the report shows one off-host exchange per host.
"""
import collections
import threading


class ByteCounters:
    KINDS = ("sent", "received", "local_sent", "local_received")

    def __init__(self):
        self._lock = threading.Lock()
        self._window = collections.defaultdict(lambda: dict.fromkeys(self.KINDS, 0))
        self._total = collections.defaultdict(lambda: dict.fromkeys(self.KINDS, 0))
        self._iterations = 0
        self._window_iterations = 0

    def add(self, key, sent=0, received=0, local=False):
        kinds = ("local_sent", "local_received") if local else ("sent", "received")
        with self._lock:
            for table in (self._window, self._total):
                row = table[key]
                row[kinds[0]] += int(sent)
                row[kinds[1]] += int(received)

    def end_iteration(self, count=1):
        with self._lock:
            self._iterations += count
            self._window_iterations += count

    def per_iteration(self, window=True):
        """{key: {kind: bytes per iteration}} over the display window (or the whole run)."""
        with self._lock:
            table = self._window if window else self._total
            n = max(self._window_iterations if window else self._iterations, 1)
            return {k: {kind: v / n for kind, v in row.items()} for k, row in table.items()}

    def reset_window(self):
        with self._lock:
            self._window.clear()
            self._window_iterations = 0

    @property
    def iterations(self):
        return self._iterations
