"""A one-line progress bar for long phases, drawn only on an interactive terminal.

The bar lives on the last line of stderr, the stream the log writes to. Before any log record
is written the bar is wiped (carriage return + erase line), so each log line starts at column
0 and stays whole; the bar is redrawn at the next update. When stderr is not a terminal (a
file, a pipe, a test), nothing is drawn at all.
"""
import logging
import os
import sys
import time

from . import log

_WIPE = "\r\x1b[K"


def terminal_wanted(stream):
    if os.environ.get("POSEIDON_NO_PROGRESS"):
        return False
    # several ranks sharing one terminal would draw over each other
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        if os.environ.get(var, "1").isdigit() and int(os.environ.get(var, "1")) > 1:
            return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:              # a closed stream
        return False


class _WipeBeforeLog(logging.Filter):
    def __init__(self, bar):
        super().__init__()
        self.bar = bar

    def filter(self, record):
        self.bar.wipe()
        return True


class ProgressBar:
    """``with ProgressBar(total, "Training") as bar: ... bar.update(i)``."""

    def __init__(self, total, label, stream=None, enabled=None, width=30):
        self.stream = stream or sys.stderr
        self.total = max(int(total), 1)
        self.label = label
        self.width = width
        self.enabled = terminal_wanted(self.stream) if enabled is None else enabled
        self._shown = False
        self._last_draw = 0.0
        self._filter = None
        if self.enabled:
            self._filter = _WipeBeforeLog(self)
            for handler in log.logger.handlers:
                handler.addFilter(self._filter)

    def update(self, done, extra=""):
        if not self.enabled:
            return
        now = time.monotonic()
        if self._shown and now - self._last_draw < 0.1 and done < self.total:
            return                  # redraw at most ten times a second
        self._last_draw = now
        done = min(int(done), self.total)
        filled = self.width * done // self.total
        line = "%s [%s%s] %d/%d %s" % (self.label, "#" * filled, "." * (self.width - filled),
                                       done, self.total, extra)
        self.stream.write(_WIPE + line.rstrip())
        self.stream.flush()
        self._shown = True

    def wipe(self):
        if self._shown:
            self.stream.write(_WIPE)
            self.stream.flush()
            self._shown = False

    def close(self):
        if self._filter is not None:
            for handler in log.logger.handlers:
                handler.removeFilter(self._filter)
            self._filter = None
        self.wipe()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
