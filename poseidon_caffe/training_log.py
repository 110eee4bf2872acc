"""Training logs as tables, as Caffe's tools/extra/parse_log.py makes them.

A log (this project's or Caffe's: both write glog lines, ``I1121 10:00:00.000000  1234
solver.cpp:218] message``) becomes two tables, one row per iteration that reported outputs:

    LOG.train   NumIters,Seconds,LearningRate,<each "Train net output" name>
    LOG.test    NumIters,Seconds,LearningRate,<each "Test net output" name>

``Seconds`` counts from the "Solving" line (or the first timestamped line) to the row's first
output line.  ``LearningRate`` is the rate in effect at the row's iteration: the one logged for
that iteration ("Iteration N, lr = X"), else the last one logged before it, else the first one
logged after it (Caffe logs no rate before its first update).  glog lines carry no year: it is
taken from the file's modification time, counting back over new years in the log.
"""
import csv
import datetime
import math
import os
import re
from bisect import bisect_right
from collections import OrderedDict

from . import log

__all__ = ["LogParseError", "parse_log", "columns", "save_csv_files", "write_csv"]

_GLOG_HEAD = re.compile(r"(?:^|\s|\])[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6})\s+\d+ "
                        r"[^\]\s]+\] ")
_NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)(?:inity)?)"
_ITERATION = re.compile(r"Iteration (\d+)")
_OUTPUT = re.compile(r"(Train|Test) net output #\d+: (\S+) = " + _NUMBER, re.IGNORECASE)
_LEARNING_RATE = re.compile(r"\blr = " + _NUMBER, re.IGNORECASE)
_SOLVING = "Solving"


class LogParseError(ValueError):
    """A file that is not a training log; the message names it."""


def _stamp(match):
    month, day, hour, minute, second, micro = (int(g) for g in match.groups())
    return month, day, hour, minute, second, micro


class _Clock:
    """glog stamps (no year) -> datetimes: a new year begins when the month goes back."""

    def __init__(self):
        self.stamps = []          # (year offset, stamp) in file order

    def add(self, stamp):
        offset = 0
        if self.stamps:
            last_offset, last = self.stamps[-1]
            offset = last_offset + (1 if stamp[0] < last[0] else 0)
        self.stamps.append((offset, stamp))
        return len(self.stamps) - 1

    def datetimes(self, last_year):
        wraps = self.stamps[-1][0] if self.stamps else 0
        result = []
        for offset, (month, day, hour, minute, second, micro) in self.stamps:
            year = last_year - wraps + offset
            if month == 2 and day == 29 and not _leap(year):
                year += 1 if _leap(year + 1) else -1      # a 29 February needs a leap year
            result.append(datetime.datetime(year, month, day, hour, minute, second, micro))
        return result


def _leap(year):
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def parse_log(path_to_log):
    """(train rows, test rows) of a training log: lists of OrderedDicts with NumIters (int),
    Seconds, LearningRate and each output (floats), in log order."""
    try:
        with open(path_to_log, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
        last_year = datetime.datetime.fromtimestamp(os.path.getmtime(path_to_log)).year
    except OSError as exc:
        raise LogParseError("cannot read training log %s: %s"
                            % (path_to_log, exc.strerror or exc)) from None
    clock = _Clock()
    start_index = None
    iteration = None
    rates = {}                      # iteration -> learning rate logged for it
    rows = {"train": [], "test": []}
    row_times = {"train": [], "test": []}
    for line in lines:
        head = _GLOG_HEAD.search(line)
        if head is None:
            continue                # a continuation of a multi-line message, or not a log line
        when = clock.add(_stamp(head))
        message = line[head.end():]
        if start_index is None and message.startswith(_SOLVING):
            start_index = when
        match = _ITERATION.search(message)
        if match:
            iteration = int(match.group(1))
        if iteration is None:
            continue                # outputs count only once the first iteration is known
        match = _LEARNING_RATE.search(message)
        if match:
            rates[iteration] = float(match.group(1))
        match = _OUTPUT.search(message)
        if match:
            phase = match.group(1).lower()
            table = rows[phase]
            if not table or table[-1]["NumIters"] != iteration:
                table.append(OrderedDict([("NumIters", iteration), ("Seconds", None),
                                          ("LearningRate", math.nan)]))
                row_times[phase].append(when)
            table[-1][match.group(2)] = float(match.group(3))
    if not clock.stamps:
        raise LogParseError("%s is not a Caffe training log: no glog lines "
                            "('I1121 10:00:00.000000  1234 file:line] ...')" % path_to_log)
    times = clock.datetimes(last_year)
    start = times[start_index if start_index is not None else 0]
    for phase in rows:
        for row, when in zip(rows[phase], row_times[phase]):
            row["Seconds"] = (times[when] - start).total_seconds()
            row["LearningRate"] = _rate_at(rates, row["NumIters"])
    return rows["train"], rows["test"]


def _rate_at(rates, iteration):
    if not rates:
        return math.nan
    if iteration in rates:
        return rates[iteration]
    logged = sorted(rates)
    before = bisect_right(logged, iteration)
    return rates[logged[before - 1]] if before else rates[logged[0]]


def columns(rows):
    """The column names of ``rows``, in order of first appearance."""
    names = []
    for row in rows:
        for key in row:
            if key not in names:
                names.append(key)
    return names


def write_csv(output_filename, dict_list, delimiter=",", verbose=False):
    """One table as CSV (Excel dialect, a header line first); nothing is written for no rows."""
    from .io import atomic_write
    if not dict_list:
        if verbose:
            log.info("Not writing %s; no lines to write", output_filename)
        return False
    lines = []

    class _Sink:
        def write(self, text):
            lines.append(text)

    writer = csv.DictWriter(_Sink(), fieldnames=columns(dict_list), dialect=csv.excel,
                            delimiter=delimiter, restval="")
    writer.writeheader()
    writer.writerows(dict_list)
    atomic_write(output_filename, "".join(lines).encode("utf-8"))
    if verbose:
        log.info("Wrote %s", output_filename)
    return True


def save_csv_files(logfile_path, output_dir, train_dict_list, test_dict_list, delimiter=",",
                   verbose=False):
    """Write ``<output_dir>/<log name>.train`` and ``.test`` (caffe.INFO -> caffe.INFO.train);
    ``output_dir`` is made (with its parents) when there is a table to write."""
    name = os.path.basename(logfile_path)
    if (train_dict_list or test_dict_list) and not os.path.isdir(output_dir):
        if os.path.exists(output_dir):
            raise LogParseError("output directory %s is not a directory" % output_dir)
        os.makedirs(output_dir, exist_ok=True)
    write_csv(os.path.join(output_dir, name + ".train"), train_dict_list, delimiter, verbose)
    write_csv(os.path.join(output_dir, name + ".test"), test_dict_list, delimiter, verbose)
