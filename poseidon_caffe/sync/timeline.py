"""A timeline of each iteration in Chrome's trace-event JSON (chrome://tracing, Perfetto).

The compute thread (thread 0) records every layer's forward and backward and its waits for the
communication; the communication thread records each exchange from its start to its end, on
thread 1 + its channel (exchanges in flight together are on different channels), so what was in
flight while backward went on can be seen at a glance.
"""
import json
import os
import threading
import time


class Timeline:
    def __init__(self, path, rank=0):
        self.path = path
        self.rank = rank
        self._events = []
        self._lock = threading.Lock()
        self._origin = time.perf_counter()
        self._threads = {0: "compute", 1: "communication"}

    def name_thread(self, thread, name):
        self._threads[thread] = name

    def now_us(self):
        return (time.perf_counter() - self._origin) * 1e6

    def span_at(self, name, category, start, end, thread, args=None):
        """A span between two time.perf_counter() readings."""
        self.span(name, category, (start - self._origin) * 1e6, (end - self._origin) * 1e6,
                  thread, args)

    def span(self, name, category, start_us, end_us, thread, args=None):
        event = {"name": name, "cat": category, "ph": "X", "ts": round(start_us, 3),
                 "dur": round(max(end_us - start_us, 0.0), 3), "pid": self.rank, "tid": thread}
        if args:
            event["args"] = args
        with self._lock:
            self._events.append(event)

    def write(self):
        meta = [{"name": "process_name", "ph": "M", "pid": self.rank, "tid": 0,
                 "args": {"name": "rank %d" % self.rank}}]
        meta += [{"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid,
                  "args": {"name": name}} for tid, name in sorted(self._threads.items())]
        with self._lock:
            events = meta + list(self._events)
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
        os.replace(tmp, self.path)
