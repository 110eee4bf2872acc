"""Caffe's glog line shape, so existing log parsers and plotters keep working.

Every line looks like ``I1121 10:00:00.000000  1234 solver.py:218] message``: severity letter,
month and day, wall time with microseconds, process id padded to five places, the source file
and line of the call, then the message.
"""
import logging
import os
import sys
import time
import types

_LETTERS = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W",
            logging.ERROR: "E", logging.CRITICAL: "F"}


class GlogFormatter(logging.Formatter):
    def format(self, record):
        t = record.created
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(t))
        micros = int((t - int(t)) * 1e6)
        head = "%s%s.%06d %5d %s:%d] " % (_LETTERS.get(record.levelno, "I"), stamp, micros,
                                           os.getpid(), os.path.basename(record.pathname),
                                           record.lineno)
        return head + record.getMessage()


logger = logging.getLogger("poseidon_caffe")
if not logger.handlers:
    _console = logging.StreamHandler(sys.stderr)
    _console.setFormatter(GlogFormatter())
    logger.addHandler(_console)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def add_file(path):
    """Also write the log to ``path`` (one file per rank in distributed runs)."""
    handler = logging.FileHandler(path)
    handler.setFormatter(GlogFormatter())
    logger.addHandler(handler)
    return handler


def set_console_level(level):
    for h in logger.handlers:
        if type(h) is logging.StreamHandler:
            h.setLevel(level)


# stacklevel=2 makes the file:line in the prefix point at the caller, as glog's LOG(INFO) does.
def debug(msg, *args):
    logger.debug(msg, *args, stacklevel=2)


def info(msg, *args):
    logger.info(msg, *args, stacklevel=2)


def warning(msg, *args):
    logger.warning(msg, *args, stacklevel=2)


def error(msg, *args):
    logger.error(msg, *args, stacklevel=2)


class _CallableLogModule(types.ModuleType):
    """pycaffe's ``caffe.log(message)`` is a function while this package's ``log`` is this
    module: calling the module writes one INFO line, so both spellings work."""

    def __call__(self, message):
        logger.info("%s", message, stacklevel=2)


sys.modules[__name__].__class__ = _CallableLogModule
