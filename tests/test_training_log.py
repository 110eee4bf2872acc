"""`poseidon-caffe parse_log`: the log of a real training run through the command line, and a
log in real Caffe's format written here by hand, become Caffe's LOG.train / LOG.test tables."""
import csv
import datetime
import logging
import os
import re
import subprocess
import sys

import pytest

from jobs import TINY_NET as NET
from poseidon_caffe import log, training_log
from poseidon_caffe.tools.training_log import parse_log_main


SOLVER = ('net: "net.prototxt" base_lr: 0.1 momentum: 0.9 lr_policy: "step" gamma: 0.5 '
          'stepsize: 10 display: 5 max_iter: 30 random_seed: 5 test_iter: 2 test_interval: 10 '
          'snapshot_after_train: false')


def cli(cwd, *args, stderr=subprocess.PIPE):
    return subprocess.run([sys.executable, "-m", "poseidon_caffe.cli"] + list(args),
                          cwd=str(cwd), stderr=stderr, stdout=subprocess.PIPE, text=True,
                          timeout=180)


def train_log(tmp_path, name="train.log"):
    """A real training run's log, as `caffe train ... 2> LOG` leaves it."""
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text(SOLVER)
    with open(tmp_path / name, "w") as err:
        proc = cli(tmp_path, "train", "-solver", "solver.prototxt", stderr=err)
    assert proc.returncode == 0, (tmp_path / name).read_text()[-2000:]
    return tmp_path / name


def read_table(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def stamp(line):
    # glog: I1123 10:33:15.695337 ...; the year does not matter for a difference in one run
    return datetime.datetime.strptime(line[1:21], "%m%d %H:%M:%S.%f")


def logged(lines, kind):
    """{iteration: {output: (value text, line)}} for kind "Train" or "Test", read plainly."""
    rows, iteration = {}, None
    for line in lines:
        found = re.search(r"Iteration (\d+)", line)
        if found:
            iteration = int(found.group(1))
        if "%s net output #" % kind in line:
            name, value = line.split("output #", 1)[1].split(": ", 1)[1].split(" = ", 1)
            rows.setdefault(iteration, {})[name] = (value.split(" ")[0], line)
    return rows


def test_a_real_runs_log_parses_to_what_it_logged(tmp_path):
    log_path = train_log(tmp_path)
    out = tmp_path / "tables"
    out.mkdir()
    proc = cli(tmp_path, "parse_log", str(log_path), str(out))
    assert proc.returncode == 0, proc.stderr
    train = read_table(out / "train.log.train")
    test = read_table(out / "train.log.test")
    assert list(train[0]) == ["NumIters", "Seconds", "LearningRate", "loss"]
    # the test net's outputs come by name (Caffe's std::set): accuracy before loss
    assert list(test[0]) == ["NumIters", "Seconds", "LearningRate", "accuracy", "loss"]
    assert [int(r["NumIters"]) for r in train] == [0, 5, 10, 15, 20, 25]
    assert [int(r["NumIters"]) for r in test] == [0, 10, 20, 30]

    lines = log_path.read_text().splitlines()
    start = stamp(next(line for line in lines if "] Solving " in line))
    for kind, rows in (("Train", train), ("Test", test)):
        expected = logged(lines, kind)
        for row in rows:
            it = int(row["NumIters"])
            for name, (text, line) in expected[it].items():
                assert float(row[name]) == float(text)
            first_line = min((line for _, line in expected[it].values()), key=stamp)
            seconds = (stamp(first_line) - start).total_seconds()
            assert float(row["Seconds"]) == pytest.approx(seconds, abs=1e-6)
            # step policy, by hand: 0.1 * 0.5 ** floor(it / 10); no update runs at iteration 30,
            # so its test row keeps the last rate the log gave (iteration 25's)
            rate_it = it if it < 30 else 25
            assert float(row["LearningRate"]) == pytest.approx(0.1 * 0.5 ** (rate_it // 10))


# A log in Caffe 1.0's own words, over a new year: the net dump between lines is not glog's.
CAFFE_LOG = """\
I1231 23:59:57.900000 25210 caffe.cpp:218] Using GPUs 0
I1231 23:59:57.950000 25210 solver.cpp:44] Initializing solver from parameters:
test_iter: 100
base_lr: 0.01
I1231 23:59:57.990000 25210 net.cpp:283] Network initialization done.
I1231 23:59:58.000000 25210 solver.cpp:279] Solving LeNet
I1231 23:59:58.000010 25210 solver.cpp:280] Learning Rate Policy: inv
I1231 23:59:58.100000 25210 solver.cpp:337] Iteration 0, Testing net (#0)
I1231 23:59:59.500000 25210 solver.cpp:404]     Test net output #0: accuracy = 0.0812
I1231 23:59:59.500100 25210 solver.cpp:404]     Test net output #1: loss = 2.30253 (* 1 = 2.30253 loss)
I1231 23:59:59.600000 25210 solver.cpp:228] Iteration 0, loss = 2.30852
I1231 23:59:59.600100 25210 solver.cpp:244]     Train net output #0: loss = 2.30852 (* 1 = 2.30852 loss)
I1231 23:59:59.600200 25210 sgd_solver.cpp:106] Iteration 0, lr = 0.01
I0101 00:00:01.000000 25210 solver.cpp:228] Iteration 100 (71.4286 iter/s, 1.4s/100 iters), loss = 0.206
I0101 00:00:01.000100 25210 solver.cpp:244]     Train net output #0: loss = 0.206 (* 1 = 0.206 loss)
I0101 00:00:01.000200 25210 sgd_solver.cpp:106] Iteration 100, lr = 0.00992565
I0101 00:00:02.500000 25210 solver.cpp:337] Iteration 200, Testing net (#0)
I0101 00:00:03.000000 25210 solver.cpp:404]     Test net output #0: accuracy = 0.9733
I0101 00:00:03.000100 25210 solver.cpp:404]     Test net output #1: loss = 8.7e-02 (* 1 = 0.087 loss)
I0101 00:00:03.100000 25210 solver.cpp:228] Iteration 200 (66.6667 iter/s, 1.5s/100 iters), loss = 0.154
I0101 00:00:03.100100 25210 solver.cpp:244]     Train net output #0: loss = 0.154 (* 1 = 0.154 loss)
I0101 00:00:03.100200 25210 sgd_solver.cpp:106] Iteration 200, lr = 0.00985258
I0101 00:00:04.000000 25210 solver.cpp:454] Snapshotting to binary proto file lenet_iter_200.caffemodel
I0101 00:00:04.100000 25210 solver.cpp:317] Iteration 200, loss = 0.161
I0101 00:00:04.200000 25210 solver.cpp:322] Optimization Done.
"""

CAFFE_TRAIN = ("NumIters,Seconds,LearningRate,loss\r\n"
               "0,1.6001,0.01,2.30852\r\n"
               "100,3.0001,0.00992565,0.206\r\n"
               "200,5.1001,0.00985258,0.154\r\n")
CAFFE_TEST = ("NumIters,Seconds,LearningRate,accuracy,loss\r\n"
              "0,1.5,0.01,0.0812,2.30253\r\n"
              "200,5.0,0.00985258,0.9733,0.087\r\n")


def caffe_log(tmp_path, name="caffe.INFO"):
    path = tmp_path / name
    path.write_text(CAFFE_LOG)
    # written on the 1st of January 2025: the first lines are from 2024
    when = datetime.datetime(2025, 1, 1, 0, 5).timestamp()
    os.utime(path, (when, when))
    return path


def test_a_caffe_log_across_new_year_gives_caffes_tables(tmp_path):
    path = caffe_log(tmp_path)
    proc = cli(tmp_path, "parse_log", str(path))        # tables beside the log by default
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "caffe.INFO.train").read_bytes().decode() == CAFFE_TRAIN
    assert (tmp_path / "caffe.INFO.test").read_bytes().decode() == CAFFE_TEST


def test_delimiter_and_the_python_api(tmp_path):
    path = caffe_log(tmp_path)
    train, test = training_log.parse_log(str(path))
    assert [row["NumIters"] for row in train] == [0, 100, 200]
    assert test[1]["loss"] == 0.087
    out = tmp_path / "out"
    out.mkdir()
    proc = cli(tmp_path, "parse_log", str(path), str(out), "--delimiter", ";")
    assert proc.returncode == 0, proc.stderr
    assert (out / "caffe.INFO.test").read_text().splitlines()[1] == "0;1.5;0.01;0.0812;2.30253"


def errors_of(function, *args):
    """What ``function(*args)`` returns and the error lines it logs."""
    errors = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = lambda record: errors.append(record.getMessage())
    log.logger.addHandler(handler)
    try:
        return function(*args), errors
    finally:
        log.logger.removeHandler(handler)


def test_not_a_training_log_is_one_clear_line(tmp_path):
    (tmp_path / "notes.txt").write_text("just some text\n")
    (tmp_path / "quiet.log").write_text(
        "I0101 00:00:01.000000 1 solver.cpp:279] Solving LeNet\n")
    for name, message in (("notes.txt", "not a Caffe training log"),
                          ("quiet.log", "holds no 'Train net output'"),
                          ("absent.log", "cannot read training log")):
        code, errors = errors_of(parse_log_main, [str(tmp_path / name)])
        assert code == 1
        assert len(errors) == 1 and "\n" not in errors[0]
        assert message in errors[0] and name in errors[0]
    assert not list(tmp_path.glob("*.train"))


def test_an_output_dir_that_does_not_exist_is_made(tmp_path):
    path = caffe_log(tmp_path)
    out = tmp_path / "plots" / "run1"                   # neither folder exists yet
    proc = cli(tmp_path, "parse_log", str(path), str(out))
    assert proc.returncode == 0, proc.stderr
    assert (out / "caffe.INFO.train").read_bytes().decode() == CAFFE_TRAIN
    assert (out / "caffe.INFO.test").read_bytes().decode() == CAFFE_TEST


def test_an_output_dir_that_is_a_file_is_one_clear_line(tmp_path):
    path = caffe_log(tmp_path)
    (tmp_path / "taken").write_text("keep me\n")
    code, errors = errors_of(parse_log_main, [str(path), str(tmp_path / "taken")])
    assert code == 1
    assert len(errors) == 1 and "\n" not in errors[0]
    assert "taken is not a directory" in errors[0]
    assert (tmp_path / "taken").read_text() == "keep me\n"
