"""Training logs parse with the regular expressions of Caffe's tools/extra/parse_log.py
(rewritten here), and give the iterations, losses, learning rates and test outputs of a run
that the test computes independently. Also: the progress bar never breaks a log line."""
import datetime
import io
import logging
import math
import re
from collections import OrderedDict

import numpy as np
import pytest

from poseidon_caffe import io as pio
from poseidon_caffe import log
from poseidon_caffe.progress import ProgressBar
from poseidon_caffe.solver import get_solver

# -- Caffe's parse_log, as its regular expressions and row logic define it ----------------------
REGEX_ITERATION = re.compile(r"Iteration (\d+)")
REGEX_TRAIN_OUTPUT = re.compile(r"Train net output #(\d+): (\S+) = ([\.\deE+-]+)")
REGEX_TEST_OUTPUT = re.compile(r"Test net output #(\d+): (\S+) = ([\.\deE+-]+)")
REGEX_LEARNING_RATE = re.compile(r"lr = ([-+]?[0-9]*\.?[0-9]+([eE]?[-+]?[0-9]+)?)")


def datetime_from_line(line, year):
    fields = line.strip().split()
    month, day = int(fields[0][1:3]), int(fields[0][3:5])
    stamp = fields[1]
    pos = stamp.rfind(".")
    hour, minute, second = [int(x) for x in stamp[:pos].split(":")]
    return datetime.datetime(year, month, day, hour, minute, second, int(stamp[pos + 1:]))


def _net_output(regex, row, rows, line, iteration, seconds, lr):
    match = regex.search(line)
    if match:
        if not row or row["NumIters"] != iteration:
            if row:
                rows.append(row)
            row = OrderedDict([("NumIters", iteration), ("Seconds", seconds), ("LearningRate", lr)])
        row[match.group(2)] = float(match.group(3))
    if row and len(rows) >= 1 and len(row) == len(rows[0]):
        rows.append(row)
        row = None
    return rows, row


def parse_log(lines, year=2020):
    start = next(datetime_from_line(l, year) for l in lines if "Solving" in l)
    iteration, lr = -1, float("nan")
    train, test, train_row, test_row = [], [], None, None
    for line in lines:
        match = REGEX_ITERATION.search(line)
        if match:
            iteration = float(match.group(1))
        if iteration == -1:
            continue
        try:
            seconds = (datetime_from_line(line, year) - start).total_seconds()
        except (ValueError, IndexError):
            continue
        match = REGEX_LEARNING_RATE.search(line)
        if match:
            lr = float(match.group(1))
        train, train_row = _net_output(REGEX_TRAIN_OUTPUT, train_row, train, line, iteration,
                                       seconds, lr)
        test, test_row = _net_output(REGEX_TEST_OUTPUT, test_row, test, line, iteration,
                                     seconds, lr)
    for rows in (train, test):
        if len(rows) > 1:
            rows[0]["LearningRate"] = rows[1]["LearningRate"]
    return train, test


# -- the run and its independent simulation -----------------------------------------------------
NET = """
name: "constant"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 }
    data_filler { type: "constant" value: 1 } data_filler { type: "constant" value: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "constant" value: 0 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def simulate(iters, base_lr=0.05, gamma=0.5, stepsize=4, momentum=0.9):
    """Every row is x = (1, 1, 1) with label 2: softmax regression by SGD with momentum,
    written out in numpy. Returns the loss before each update and the rate used there."""
    W, b = np.zeros((3, 3)), np.zeros(3)
    hW, hb = np.zeros_like(W), np.zeros_like(b)
    x, target = np.ones(3), np.eye(3)[2]
    losses, rates = [], []
    for it in range(iters + 1):
        z = W @ x + b
        p = np.exp(z - z.max())
        p /= p.sum()
        losses.append(-math.log(p[2]))
        rate = base_lr * gamma ** (it // stepsize)
        rates.append(rate)
        hW = momentum * hW + rate * np.outer(p - target, x)
        hb = momentum * hb + rate * (p - target)
        W, b = W - hW, b - hb
    return losses, rates


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.setFormatter(log.GlogFormatter())
        self.lines = []

    def emit(self, record):
        self.lines.extend(self.format(record).split("\n"))


def train_and_capture(extra):
    text = """net_param { %s } base_lr: 0.05 momentum: 0.9 lr_policy: "step" gamma: 0.5
      stepsize: 4 display: 2 max_iter: 8 test_iter: 1 test_interval: 4
      snapshot_after_train: false %s""" % (NET, extra)
    param = pio.parse_solver_text(text, "log solver")
    param.test_net_param.add().CopyFrom(pio.parse_net_text(NET))
    handler = _Lines()
    log.logger.addHandler(handler)
    try:
        get_solver(param).solve()
    finally:
        log.logger.removeHandler(handler)
    return handler.lines


def test_parse_log_reads_iterations_losses_rates_and_test_outputs():
    lines = train_and_capture("")
    losses, rates = simulate(8)
    train, test = parse_log(lines)
    # the final "Iteration 8, loss = L" line after training carries no per-output lines
    assert [r["NumIters"] for r in train] == [0, 2, 4, 6]
    np.testing.assert_allclose([r["loss"] for r in train], [losses[i] for i in (0, 2, 4, 6)],
                               rtol=1e-4)
    final = [l for l in lines if re.search(r"\] Iteration 8, loss = ", l)]
    assert float(final[0].split()[-1]) == pytest.approx(losses[8], rel=1e-4)
    # parse_log attaches the last rate seen before each row (Caffe logs lr after the outputs)
    np.testing.assert_allclose([r["LearningRate"] for r in train],
                               [rates[0], rates[0], rates[2], rates[4]], rtol=1e-6)
    assert [r["NumIters"] for r in test] == [0, 4, 8]
    np.testing.assert_allclose([r["loss"] for r in test], [losses[0], losses[4], losses[8]],
                               rtol=1e-4)
    assert all(r["Seconds"] >= 0 for r in train)
    assert sum(bool(re.search(r"\] Iteration \d+, lr = ", l)) for l in lines) == 4
    assert any(l.endswith("] Optimization Done.") for l in lines)
    assert any(re.search(r"\] Solving constant$", l) for l in lines)
    assert any(re.search(r"\] Learning Rate Policy: step$", l) for l in lines)
    display = [l for l in lines if re.search(r"\] Iteration 2 \(", l)]
    assert re.search(r"\] Iteration 2 \(\S+ iter/s, \S+s/2 iters\), loss = \S+$", display[0])
    out = [l for l in lines if "Train net output #0" in l][0]
    assert re.search(r"\]     Train net output #0: loss = \S+ \(\* 1 = \S+ loss\)$", out)
    out = [l for l in lines if "Test net output #0" in l][0]
    assert re.search(r"\]     Test net output #0: loss = \S+ \(\* 1 = \S+ loss\)$", out)
    assert re.match(r"I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ solver\.py:\d+\] ", out)


def test_average_loss_smooths_the_displayed_loss():
    lines = train_and_capture("average_loss: 3")
    losses, _ = simulate(8)
    shown = {int(m.group(1)): float(m.group(2)) for m in
             (re.search(r"\] Iteration (\d+) \(.*loss = (\S+)$", l) for l in lines) if m}
    for it in (0, 2, 4, 6):
        window = losses[max(0, it - 2): it + 1]
        assert shown[it] == pytest.approx(np.mean(window), rel=1e-4)


# -- progress bar ----------------------------------------------------------------------------
class _TTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_never_breaks_log_lines():
    stream = _TTY()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(log.GlogFormatter())
    log.logger.addHandler(handler)
    try:
        with ProgressBar(5, "Testing", stream=stream) as bar:
            for i in range(5):
                bar._last_draw = 0.0            # draw every time in the test
                bar.update(i + 1)
                log.info("line %d", i)
    finally:
        log.logger.removeHandler(handler)
    text = stream.getvalue()
    assert "Testing [" in text
    lines = text.split("\n")
    logged = [l for l in lines if "line " in l]
    assert len(logged) == 5
    for i, l in enumerate(logged):
        visible = l.split("\r\x1b[K")[-1]     # what the terminal shows after the last wipe
        assert re.fullmatch(r"I\d{4} \S+ +\d+ \S+:\d+\] line %d" % i, visible), repr(l)
    assert lines[-1].split("\r\x1b[K")[-1] == ""   # the bar is wiped at the end


def test_no_progress_bar_off_a_terminal():
    stream = io.StringIO()
    with ProgressBar(5, "Testing", stream=stream) as bar:
        bar.update(3)
    assert stream.getvalue() == ""


def test_debug_info_logs_on_display_iterations_only():
    lines = train_and_capture("debug_info: true")
    summaries = [l for l in lines if "[Backward] All net params (data, diff)" in l]
    assert len(summaries) == 4                      # iterations 0, 2, 4 and 6 of 8
    assert any("[Forward] Layer ip, top blob ip data:" in l for l in lines)


# -- byte sizes: one way everywhere -----------------------------------------------------------
# a number formatted straight into a decimal-looking unit, a unit ladder of its own, or a
# column named in MB: each writes sizes some other way than memory.format_bytes's MiB/KiB
# a rate (GB/s, MB/s) keeps its decimal unit, as tc and bandwidth figures do
_OWN_SIZE_FORMAT = re.compile(r"%[-+ #0-9.]*[dfgi] ?[KMG]B\b(?!/s)|^[KMG]B$|\b[KMG]B/host\b")


def _size_formats(path):
    import tokenize
    found = []
    with open(path, "rb") as f:
        for token in tokenize.tokenize(f.readline):
            if token.type == tokenize.STRING:
                text = token.string.strip("rRbBuUfF").strip("\"'")
                if _OWN_SIZE_FORMAT.search(text):
                    found.append("%s:%d: %s" % (path, token.start[0], token.string))
    return found


def test_byte_sizes_are_formatted_one_way_in_the_package_and_scripts():
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = []
    for top in ("poseidon_caffe", "scripts"):
        for folder, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = [d for d in dirs if d != "proto"]
            found += [hit for name in sorted(files) if name.endswith(".py")
                      for hit in _size_formats(os.path.join(folder, name))]
    assert not found, "byte sizes written without memory.format_bytes:\n" + "\n".join(found)


def test_format_bytes_names_binary_units_so():
    from poseidon_caffe.memory import format_bytes
    # 3 x 2**20 + 2**19 bytes is 3.5 MiB (3.67 MB in decimal units)
    assert format_bytes(3 * (1 << 20) + (1 << 19)) == "3.5 MiB"
    assert format_bytes(13824) == "13.5 KiB" and format_bytes(1023) == "1023 B"
