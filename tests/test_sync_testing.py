"""Distributed testing: each worker runs its share of test_iter, and the outputs averaged over
the job equal those one worker gets over all test_iter batches; they are logged once."""
import os
import re
import subprocess
import sys

import pytest

from poseidon_caffe.data.mnist_embedded import ensure_mnist_lmdbs

pytestmark = pytest.mark.mpi          # every test here runs mpiexec

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_test_outputs(stderr):
    return [(int(k), name, float(v)) for k, name, v in
            re.findall(r"Test net output #(\d+): (\S+) = ([-\d.eE+]+)", stderr)]


def test_two_workers_report_the_one_worker_test_outputs_once(tmp_path):
    train_db, test_db = ensure_mnist_lmdbs(str(tmp_path / "digits"))
    net = (open(os.path.join(ROOT, "examples", "mnist", "lenet_train_test.prototxt")).read()
           .replace("examples/mnist/mnist_train_lmdb", train_db)
           .replace("examples/mnist/mnist_test_lmdb", test_db))
    (tmp_path / "net.prototxt").write_text(net)
    # only the initial test runs: 6 batches of 100 held-out digits, weights from random_seed
    solver = tmp_path / "solver.prototxt"
    solver.write_text('net: "%s"\ntest_iter: 6 test_interval: 1000 base_lr: 0.01\n'
                      'lr_policy: "fixed" display: 0 max_iter: 1 random_seed: 5 snapshot: 0\n'
                      'snapshot_after_train: false\n' % (tmp_path / "net.prototxt"))
    cli = [PY, "-m", "poseidon_caffe.cli", "train", "-solver=%s" % solver]
    env = dict(os.environ, POSEIDON_NO_PROGRESS="1")
    one = subprocess.run(cli, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert one.returncode == 0, one.stderr[-2000:]
    mpiexec = os.path.join(os.path.dirname(PY), "mpiexec")
    two = subprocess.run([mpiexec, "-n", "2"] + cli + ["-sync=allreduce"], capture_output=True,
                         text=True, timeout=120, env=env, cwd=tmp_path)
    assert two.returncode == 0, two.stderr[-2000:]
    single, joint = parse_test_outputs(one.stderr), parse_test_outputs(two.stderr)
    # one test (iteration 0; the last iteration is not a multiple of test_interval)
    assert [o[:2] for o in single] == [(0, "accuracy"), (1, "loss")]
    assert [o[:2] for o in joint] == [o[:2] for o in single]
    for (_, name, a), (_, _, b) in zip(single, joint):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(a)), (name, a, b)
    assert "Testing net (#0)" in two.stderr
    assert two.stderr.count("Iteration 0, Testing net (#0)") == 1     # logged once
