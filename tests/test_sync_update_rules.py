"""The two update rules of a distributed job, each pinned against numpy on real mpiexec runs
(2 ranks, a tiny net, SGD with momentum and weight decay):

* server (the default): one Caffe update of the averaged gradient,
  v = m v + lr (mean_r g_r + d W),  W -= v;
* worker (-ps_update=worker, Poseidon's rule): each worker's solver computes its own update
  with its own history, v_r = m v_r + lr (g_r + d W), and the exchange adds them: W -= sum_r v_r.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from poseidon_caffe.io import read_net_weights

from jobs import write_float_db

PY = sys.executable
MPIEXEC = os.path.join(os.path.dirname(PY), "mpiexec")
X = np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.5], [-1.0, 1.0, 0.5], [0.0, 2.0, 1.0],
              [2.0, -0.5, 0.0], [-0.5, -1.5, 1.5]], dtype=np.float32)
Y = np.array([1, 0, 2, 1, 0, 2], dtype=np.float32)
LR, MOMENTUM, DECAY, ITERS = 0.05, 0.9, 0.01, 4

NET = """name: "tiny"
layer { name: "data" type: "Data" top: "x" top: "y"
        data_param { source: "%s" batch_size: 1 backend: LMDB } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "p"
        inner_product_param { num_output: 1
          weight_filler { type: "constant" value: 0.2 }
          bias_filler { type: "constant" value: -0.1 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }
"""


def gradient(w, b, r, it):
    """Worker r's gradient at iteration it: it reads records r, r+2, r+4, ... (batch 1)."""
    k = (r + 2 * it) % len(X)
    err = float(X[k] @ w + b - Y[k])          # EuclideanLoss: d/dp of (p - y)^2 / 2
    return err * X[k], err


def by_numpy(rule):
    w, b = np.full(3, 0.2), -0.1
    if rule == "server":
        vw, vb = np.zeros(3), 0.0
        for it in range(ITERS):
            grads = [gradient(w, b, r, it) for r in range(2)]
            gw = sum(g[0] for g in grads) / 2
            gb = sum(g[1] for g in grads) / 2
            vw = MOMENTUM * vw + LR * (gw + DECAY * w)
            vb = MOMENTUM * vb + LR * (gb + DECAY * b)
            w, b = w - vw, b - vb
    else:
        vw, vb = [np.zeros(3), np.zeros(3)], [0.0, 0.0]
        for it in range(ITERS):
            grads = [gradient(w, b, r, it) for r in range(2)]
            for r in range(2):
                vw[r] = MOMENTUM * vw[r] + LR * (grads[r][0] + DECAY * w)
                vb[r] = MOMENTUM * vb[r] + LR * (grads[r][1] + DECAY * b)
            w, b = w - vw[0] - vw[1], b - vb[0] - vb[1]
    return w, b


def test_the_two_rules_differ_by_hand():
    # the rules are not one computation written twice: they part after the first iteration
    (ws, bs), (ww, bw) = by_numpy("server"), by_numpy("worker")
    assert np.abs(ws - ww).max() > 1e-2


@pytest.mark.mpi
@pytest.mark.parametrize("rule, sync, servers", [
    ("server", "ps", 0), ("worker", "ps", 0), ("worker", "allreduce", 0),
    ("worker", "ps", 1)])       # a dedicated server rank adds the updates
def test_update_rule_matches_numpy(tmp_path, rule, sync, servers):
    write_float_db(tmp_path / "db", X, Y)
    (tmp_path / "net.prototxt").write_text(NET % (tmp_path / "db"))
    solver = tmp_path / "solver.prototxt"
    solver.write_text('net: "%s"\nbase_lr: %g momentum: %g weight_decay: %g lr_policy: "fixed"\n'
                      'max_iter: %d display: 0 snapshot_prefix: "%s"\nrandom_seed: 1\n'
                      % (tmp_path / "net.prototxt", LR, MOMENTUM, DECAY, ITERS, tmp_path / "m"))
    proc = subprocess.run([MPIEXEC, "-n", str(2 + servers), PY, "-m", "poseidon_caffe.cli",
                           "train", "-solver=%s" % solver, "-sync=%s" % sync,
                           "-ps_update=%s" % rule, "-server_ranks=%d" % servers],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, POSEIDON_NO_PROGRESS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, weights = read_net_weights(str(tmp_path / ("m_iter_%d.caffemodel" % ITERS)))
    w, b = by_numpy(rule)
    np.testing.assert_allclose(weights["ip"][0].ravel(), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(weights["ip"][1].ravel(), [b], rtol=1e-5, atol=1e-6)


@pytest.mark.mpi
def test_worker_rule_resumes_every_workers_own_history(tmp_path):
    """Each worker's momentum is its own under -ps_update=worker: a run resumed from the
    snapshot at iteration 2 ends where the uninterrupted run does."""
    write_float_db(tmp_path / "db", X, Y)
    (tmp_path / "net.prototxt").write_text(NET % (tmp_path / "db"))

    def train(name, extra=()):
        solver = tmp_path / (name + ".prototxt")
        solver.write_text('net: "%s"\nbase_lr: %g momentum: %g weight_decay: %g '
                          'lr_policy: "fixed"\nmax_iter: %d display: 0 snapshot: 2 '
                          'snapshot_prefix: "%s"\nrandom_seed: 1\n'
                          % (tmp_path / "net.prototxt", LR, MOMENTUM, DECAY, ITERS,
                             tmp_path / name))
        proc = subprocess.run([MPIEXEC, "-n", "2", PY, "-m", "poseidon_caffe.cli", "train",
                               "-solver=%s" % solver, "-sync=ps", "-ps_update=worker"]
                              + list(extra), capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, POSEIDON_NO_PROGRESS="1"))
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stderr
    train("whole")
    assert (tmp_path / "whole_iter_2.rank1.history.npz").exists()
    (tmp_path / "whole_iter_4.caffemodel").unlink()
    train("whole", ["-snapshot=%s" % (tmp_path / "whole_iter_2.solverstate")])
    _, resumed = read_net_weights(str(tmp_path / ("whole_iter_%d.caffemodel" % ITERS)))
    w, b = by_numpy("worker")
    np.testing.assert_allclose(resumed["ip"][0].ravel(), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(resumed["ip"][1].ravel(), [b], rtol=1e-5, atol=1e-6)
