"""Resuming a P-worker run from its snapshot continues it exactly: the weights after the resumed
run equal those of the run that never stopped (server-side history, every rank's random state
and data position included)."""
import os
import subprocess
import sys

import pytest

import jobs

pytestmark = pytest.mark.mpi          # every test here runs mpiexec

PY = sys.executable
MPIEXEC = os.path.join(os.path.dirname(PY), "mpiexec")

NET = """name: "resume"
layer { name: "data" type: "DummyData" top: "data" top: "target"
  dummy_data_param { shape { dim: 6 dim: 2 dim: 6 dim: 6 } shape { dim: 6 dim: 3 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "gaussian" std: 1 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "drop" type: "Dropout" bottom: "conv" top: "conv" dropout_param { dropout_ratio: 0.3 } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "loss" }
"""


def train(tmp_path, prefix, max_iter, mode, snapshot=""):
    solver = tmp_path / ("%s_solver.prototxt" % prefix)
    solver.write_text('net: "%s"\nbase_lr: 0.05 momentum: 0.9 weight_decay: 0.001\n'
                      'lr_policy: "step" gamma: 0.5 stepsize: 2 display: 0 random_seed: 11\n'
                      'max_iter: %d snapshot: 3 snapshot_prefix: "%s"\n'
                      % (tmp_path / "net.prototxt", max_iter, tmp_path / prefix))
    args = [MPIEXEC, "-n", "2", PY, "-m", "poseidon_caffe.cli", "train", "-solver=%s" % solver,
            "-sync=%s" % mode, "-ranks_per_host=1"]
    if snapshot:
        args.append("-snapshot=%s" % snapshot)
    proc = subprocess.run(args, capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, POSEIDON_NO_PROGRESS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("mode", ["ps", "sfb", "allreduce"])
def test_resumed_two_worker_run_ends_with_the_uninterrupted_weights(tmp_path, mode):
    (tmp_path / "net.prototxt").write_text(NET)
    train(tmp_path, "straight", 6, mode)
    train(tmp_path, "stopped", 3, mode)
    train(tmp_path, "stopped", 6, mode, snapshot=str(tmp_path / "stopped_iter_3.solverstate"))
    jobs.assert_resumed_equals_straight(str(tmp_path))
