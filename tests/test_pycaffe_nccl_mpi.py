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


def write_job(tmp_path, name, batch, train_db, test_db, extra):
    net = (open(os.path.join(ROOT, "examples", "mnist", "lenet_train_test.prototxt")).read()
           .replace("examples/mnist/mnist_train_lmdb", train_db)
           .replace("examples/mnist/mnist_test_lmdb", test_db)
           .replace("batch_size: 64", "batch_size: %d" % batch))
    (tmp_path / (name + ".prototxt")).write_text(net)
    solver = tmp_path / (name + "_solver.prototxt")
    solver.write_text('net: "%s"\nbase_lr: 0.05 momentum: 0.9 weight_decay: 0.0005\n'
                      'lr_policy: "inv" gamma: 0.0001 power: 0.75 display: 0 max_iter: 4\n'
                      'test_interval: 1000 test_iter: 1 test_initialization: false\n'
                      'random_seed: 7 snapshot: 0 snapshot_prefix: "%s"\n%s'
                      % (tmp_path / (name + ".prototxt"), tmp_path / name, extra))
    return str(solver)


@pytest.mark.parametrize("extra", ["", "layer_wise_reduce: false\n"],
                         ids=["layer_wise", "whole_net"])
def test_two_nccl_solvers_equal_one_solver_of_twice_the_batch(tmp_path, extra):
    train_db, test_db = ensure_mnist_lmdbs(str(tmp_path / "digits"))
    env = dict(os.environ, POSEIDON_NO_PROGRESS="1")
    one = write_job(tmp_path, "one", 16, train_db, test_db, extra)
    proc = subprocess.run([PY, "-m", "poseidon_caffe.cli", "train", "-solver=%s" % one],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]

    alias_dir = tmp_path / "alias"
    alias_dir.mkdir()
    caffe_alias.install(str(alias_dir), search_path=[])
    script = tmp_path / "train_nccl.py"
    script.write_text(TRAIN_SCRIPT)
    two = write_job(tmp_path, "two", 8, train_db, test_db, extra)
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
