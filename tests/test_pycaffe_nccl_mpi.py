"""Two solvers under a real ``mpiexec``, driven from Python the way Caffe's python/train.py
drives its GPUs (``import caffe`` through the alias, set_solver_count/rank, NCCL, bcast,
callbacks), each reading its share of a real LMDB: they end with the weights of one solver of
twice the batch trained by the command line."""
import os
import subprocess
import sys

import numpy as np
import pytest

from poseidon_caffe import caffe_alias
from poseidon_caffe.data.mnist_embedded import ensure_mnist_lmdbs
from poseidon_caffe.io import read_net_weights

from jobs import write_lenet_job

pytestmark = pytest.mark.mpi          # every test here runs mpiexec

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TRAIN_SCRIPT = """
import sys
from mpi4py import MPI
import caffe

comm = MPI.COMM_WORLD
caffe.set_solver_count(comm.size)
caffe.set_solver_rank(comm.rank)
caffe.set_multiprocess(True)
uid = caffe.NCCL.new_uid()
solver = caffe.SGDSolver(sys.argv[1])
nccl = caffe.NCCL(solver, uid)
nccl.bcast()
solver.add_callback(nccl)
if solver.param.layer_wise_reduce:
    solver.net.after_backward(nccl)
solver.step(solver.param.max_iter)
if caffe.solver_rank() == 0:
    solver.net.save(sys.argv[2])
"""


@pytest.mark.parametrize("extra", ["", "layer_wise_reduce: false\n"],
                         ids=["layer_wise", "whole_net"])
def test_two_nccl_solvers_equal_one_solver_of_twice_the_batch(tmp_path, extra):
    train_db, test_db = ensure_mnist_lmdbs(str(tmp_path / "digits"))
    env = dict(os.environ, POSEIDON_NO_PROGRESS="1")
    one = write_lenet_job(tmp_path, "one", 16, train_db, test_db, extra)
    proc = subprocess.run([PY, "-m", "poseidon_caffe.cli", "train", "-solver=%s" % one],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]

    alias_dir = tmp_path / "alias"
    alias_dir.mkdir()
    caffe_alias.install(str(alias_dir), search_path=[])
    script = tmp_path / "train_nccl.py"
    script.write_text(TRAIN_SCRIPT)
    two = write_lenet_job(tmp_path, "two", 8, train_db, test_db, extra)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, str(alias_dir)])
    mpiexec = os.path.join(os.path.dirname(PY), "mpiexec")
    proc = subprocess.run([mpiexec, "-n", "2", PY, str(script), two,
                           str(tmp_path / "two.caffemodel")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "NCCL over MPI: 2 solvers" in proc.stderr

    _, single = read_net_weights(str(tmp_path / "one_iter_4.caffemodel"))
    _, joint = read_net_weights(str(tmp_path / "two.caffemodel"))
    for layer in ("conv1", "conv2", "ip1", "ip2"):
        for a, b in zip(single[layer], joint[layer]):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=2e-6, err_msg=layer)
