"""The deadlines read from the environment (POSEIDON_SYNC_TIMEOUT, POSEIDON_JOIN_TIMEOUT): a
value that is not a positive number of seconds stops the job with one line naming the variable."""
import os
import subprocess
import sys

import pytest

from poseidon_caffe.launch import join
from poseidon_caffe.launch.timeouts import TimeoutSettingError, seconds_from_env
from tests.jobs import TINY_NET

PY = sys.executable
MPIEXEC = os.path.join(os.path.dirname(PY), "mpiexec")


def test_unset_or_blank_gives_the_default():
    assert seconds_from_env("POSEIDON_SYNC_TIMEOUT", 300, environ={}) == 300.0
    assert seconds_from_env("POSEIDON_SYNC_TIMEOUT", 300,
                            environ={"POSEIDON_SYNC_TIMEOUT": "  "}) == 300.0
    assert seconds_from_env("POSEIDON_SYNC_TIMEOUT", 300,
                            environ={"POSEIDON_SYNC_TIMEOUT": "2.5"}) == 2.5


@pytest.mark.parametrize("text", ["abc", "0", "-1", "nan", "inf", "30s"])
def test_a_value_that_is_not_positive_seconds_names_the_variable(text):
    with pytest.raises(TimeoutSettingError, match="POSEIDON_SYNC_TIMEOUT=%r" % text):
        seconds_from_env("POSEIDON_SYNC_TIMEOUT", 300, environ={"POSEIDON_SYNC_TIMEOUT": text})


def test_join_timeout_names_its_variable(monkeypatch):
    monkeypatch.setenv("POSEIDON_JOIN_TIMEOUT", "two minutes")
    with pytest.raises(ValueError, match="POSEIDON_JOIN_TIMEOUT='two minutes'"):
        join._timeout()
    monkeypatch.setenv("POSEIDON_JOIN_TIMEOUT", "7")
    assert join._timeout() == 7.0


@pytest.mark.mpi
def test_a_two_rank_job_with_a_bad_sync_timeout_stops_with_one_line(tmp_path):
    (tmp_path / "net.prototxt").write_text(TINY_NET)
    solver = tmp_path / "solver.prototxt"
    solver.write_text('net: "%s"\nbase_lr: 0.01 lr_policy: "fixed" max_iter: 2\n'
                      % (tmp_path / "net.prototxt"))
    env = dict(os.environ, POSEIDON_NO_PROGRESS="1", POSEIDON_SYNC_TIMEOUT="abc")
    proc = subprocess.run([MPIEXEC, "-n", "2", PY, "-m", "poseidon_caffe.cli", "train",
                           "-solver", str(solver)], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Traceback" not in out
    errors = [line for line in out.splitlines() if line.startswith("E")]
    assert errors and all("POSEIDON_SYNC_TIMEOUT='abc' is not a number of seconds" in line
                          for line in errors), out
