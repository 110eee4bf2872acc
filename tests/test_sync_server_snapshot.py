"""A snapshot of a job with a dedicated server, through the command line: the servers send
rank 0 their momentum history, which for LeNet (1.7 MB) is far larger than one small control
message. The .solverstate and .caffemodel equal those of one worker of twice the batch."""
import os
import subprocess
import sys

import numpy as np
import pytest

from poseidon_caffe.data.mnist_embedded import ensure_mnist_lmdbs
from poseidon_caffe.io import read_net_weights, read_solverstate

from jobs import write_lenet_job

pytestmark = pytest.mark.mpi          # every test here runs mpiexec

PY = sys.executable


def test_snapshot_gathers_a_large_history_from_a_dedicated_server(tmp_path):
    train_db, test_db = ensure_mnist_lmdbs(str(tmp_path / "digits"))
    env = dict(os.environ, POSEIDON_NO_PROGRESS="1")
    one = write_lenet_job(tmp_path, "one", 16, train_db, test_db)
    proc = subprocess.run([PY, "-m", "poseidon_caffe.cli", "train", "-solver=%s" % one],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    two = write_lenet_job(tmp_path, "two", 8, train_db, test_db)
    mpiexec = os.path.join(os.path.dirname(PY), "mpiexec")
    proc = subprocess.run([mpiexec, "-n", "3", PY, "-m", "poseidon_caffe.cli", "train",
                           "-solver=%s" % two, "-sync=ps", "-server_ranks=1"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    single = read_solverstate(str(tmp_path / "one_iter_4.solverstate"))
    joint = read_solverstate(str(tmp_path / "two_iter_4.solverstate"))
    assert joint.iter == single.iter == 4
    assert sum(len(h.data) for h in joint.history) == 431080      # LeNet's parameters
    for a, b in zip(single.history, joint.history):
        np.testing.assert_allclose(np.array(b.data), np.array(a.data), rtol=1e-4, atol=2e-6)
    _, w1 = read_net_weights(str(tmp_path / "one_iter_4.caffemodel"))
    _, w2 = read_net_weights(str(tmp_path / "two_iter_4.caffemodel"))
    for layer in ("conv1", "conv2", "ip1", "ip2"):
        for a, b in zip(w1[layer], w2[layer]):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=2e-6, err_msg=layer)
