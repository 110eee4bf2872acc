"""End to end through the command line and a real LMDB: two workers of batch B, each reading
its shard of the records (r, r+2, r+4, ...), end with the weights of one worker of batch 2B."""
import os
import subprocess
import sys

import numpy as np
import pytest

from poseidon_caffe.data.mnist_embedded import ensure_mnist_lmdbs
from poseidon_caffe.io import read_net_weights

from jobs import write_lenet_job

pytestmark = pytest.mark.mpi          # every test here runs mpiexec

PY = sys.executable


@pytest.mark.parametrize("mode, extra", [
    ("allreduce", ""), ("ps", ""),
    # gradient accumulation and global-norm clipping see the job's whole gradient
    ("sfb", "iter_size: 2\nclip_gradients: 0.5\n")])
def test_two_workers_on_shards_equal_one_worker_of_twice_the_batch(tmp_path, mode, extra):
    train_db, test_db = ensure_mnist_lmdbs(str(tmp_path / "digits"))
    env = dict(os.environ, POSEIDON_NO_PROGRESS="1")
    one = write_lenet_job(tmp_path, "one", 16, train_db, test_db, extra)
    proc = subprocess.run([PY, "-m", "poseidon_caffe.cli", "train", "-solver=%s" % one],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    two = write_lenet_job(tmp_path, "two", 8, train_db, test_db, extra)
    mpiexec = os.path.join(os.path.dirname(PY), "mpiexec")
    proc = subprocess.run([mpiexec, "-n", "2", PY, "-m", "poseidon_caffe.cli", "train",
                           "-solver=%s" % two, "-sync=%s" % mode], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _, single = read_net_weights(str(tmp_path / "one_iter_4.caffemodel"))
    _, joint = read_net_weights(str(tmp_path / "two_iter_4.caffemodel"))
    for layer in ("conv1", "conv2", "ip1", "ip2"):
        for a, b in zip(single[layer], joint[layer]):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=2e-6, err_msg=layer)
