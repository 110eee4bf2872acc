"""Each solver's update against Caffe's rule written out independently here in float64 numpy,
over several steps so that the momentum / history terms matter."""
import logging
import re

import numpy as np
import pytest

from poseidon_caffe import io as pio
from poseidon_caffe import log
from poseidon_caffe.solver import get_solver, SolverError

NET = """
name: "upd"
layer { name: "x" type: "Input" top: "x" top: "y"
  input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "out"
  param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0.5 }
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 }
                        bias_filler { type: "constant" value: 0.3 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "out" bottom: "y" top: "loss" }
"""
LR_MULT = [1.0, 2.0]
DECAY_MULT = [1.0, 0.5]


def make_solver(extra):
    if "base_lr" not in extra:
        extra += " base_lr: 0.1"
    text = 'net_param { %s } lr_policy: "fixed" max_iter: 10 random_seed: 3 %s' % (NET, extra)
    return get_solver(pio.parse_solver_text(text, "test solver"))


def run_updates(solver, steps, seed=0, scale=1.0):
    """Hand the solver fixed gradients for ``steps`` iterations; return them for the reference."""
    gen = np.random.default_rng(seed)
    grads = []
    for _ in range(steps):
        step_grads = []
        for blob in solver.net.learnable_params:
            g = (gen.standard_normal(blob.shape) * scale).astype(np.float32)
            blob.diff[...] = g
            step_grads.append(g.astype(np.float64))
        grads.append(step_grads)
        solver.apply_update()
        solver.iter += 1
    return grads


def reference(kind, w0, grads, base_lr=0.1, momentum=0.0, weight_decay=0.0, reg="L2",
              delta=1e-8, rms_decay=0.99, momentum2=0.999):
    """Caffe's update rules, written from its documented formulas."""
    w = [x.astype(np.float64).copy() for x in w0]
    h = [np.zeros_like(x) for x in w]
    h2 = [np.zeros_like(x) for x in w]
    for t, step in enumerate(grads):
        for i, g in enumerate(step):
            g = g.copy()
            decay = weight_decay * DECAY_MULT[i]
            g += decay * (w[i] if reg == "L2" else np.sign(w[i]))
            lr = base_lr * LR_MULT[i]
            if kind == "SGD":
                h[i] = momentum * h[i] + lr * g
                step_value = h[i]
            elif kind == "Nesterov":
                prev = h[i].copy()
                h[i] = momentum * h[i] + lr * g
                step_value = (1 + momentum) * h[i] - momentum * prev
            elif kind == "AdaGrad":
                h[i] += g * g
                step_value = lr * g / (np.sqrt(h[i]) + delta)
            elif kind == "RMSProp":
                h[i] = rms_decay * h[i] + (1 - rms_decay) * g * g
                step_value = lr * g / (np.sqrt(h[i]) + delta)
            elif kind == "AdaDelta":
                h[i] = momentum * h[i] + (1 - momentum) * g * g
                scaled = g * np.sqrt((h2[i] + delta) / (h[i] + delta))
                h2[i] = momentum * h2[i] + (1 - momentum) * scaled * scaled
                step_value = lr * scaled
            elif kind == "Adam":
                h[i] = momentum * h[i] + (1 - momentum) * g
                h2[i] = momentum2 * h2[i] + (1 - momentum2) * g * g
                k = t + 1
                corr = np.sqrt(1 - momentum2 ** k) / (1 - momentum ** k)
                step_value = lr * corr * h[i] / (np.sqrt(h2[i]) + delta)
            w[i] = w[i] - step_value
    return w, h, h2


CASES = [
    ("SGD", 'type: "SGD" momentum: 0.9 weight_decay: 0.01', dict(momentum=0.9, weight_decay=0.01)),
    ("SGD", 'momentum: 0.8 weight_decay: 0.05 regularization_type: "L1"',
     dict(momentum=0.8, weight_decay=0.05, reg="L1")),
    ("Nesterov", 'type: "Nesterov" momentum: 0.95 weight_decay: 0.002',
     dict(momentum=0.95, weight_decay=0.002)),
    ("AdaGrad", 'type: "AdaGrad" weight_decay: 0.01 delta: 1e-6', dict(weight_decay=0.01, delta=1e-6)),
    ("RMSProp", 'type: "RMSProp" rms_decay: 0.9 delta: 1e-5 weight_decay: 0.003',
     dict(rms_decay=0.9, delta=1e-5, weight_decay=0.003)),
    ("AdaDelta", 'type: "AdaDelta" momentum: 0.95 delta: 1e-6 base_lr: 1.0',
     dict(momentum=0.95, delta=1e-6, base_lr=1.0)),
    ("Adam", 'type: "Adam" momentum: 0.9 momentum2: 0.999 delta: 1e-8 base_lr: 0.01 '
     'weight_decay: 0.001', dict(momentum=0.9, momentum2=0.999, base_lr=0.01, weight_decay=0.001)),
    ("SGD", 'solver_type: NESTEROV momentum: 0.9', None),
]


@pytest.mark.parametrize("kind,fields,ref_args", CASES)
def test_update_rule_matches_reference(kind, fields, ref_args):
    if ref_args is None:                       # the legacy enum picks the rule
        kind, ref_args = "Nesterov", dict(momentum=0.9)
    solver = make_solver(fields)
    assert solver.type == kind
    w0 = [b.data.copy() for b in solver.net.learnable_params]
    grads = run_updates(solver, 5)
    w, h, h2 = reference(kind, w0, grads, **ref_args)
    for blob, expect in zip(solver.net.learnable_params, w):
        np.testing.assert_allclose(blob.data, expect, rtol=2e-5, atol=2e-6)
    n = len(w)
    np.testing.assert_allclose(solver.history[0], h[0], rtol=2e-5, atol=2e-6)
    if kind in ("AdaDelta", "Adam"):
        assert len(solver.history) == 2 * n
        np.testing.assert_allclose(solver.history[n], h2[0], rtol=2e-5, atol=1e-7)
    else:
        assert len(solver.history) == n


def test_lr_mult_zero_freezes_and_decay_mult_zero_skips_decay():
    solver = make_solver("momentum: 0 weight_decay: 0.5")
    solver.net.params_lr[1] = 0.0               # freeze the bias
    solver.net.params_weight_decay[0] = 0.0     # no decay on the weights
    w0 = [b.data.copy() for b in solver.net.learnable_params]
    grads = run_updates(solver, 1)
    np.testing.assert_array_equal(solver.net.learnable_params[1].data, w0[1])
    np.testing.assert_allclose(solver.net.learnable_params[0].data,
                               w0[0] - 0.1 * grads[0][0], rtol=1e-6, atol=1e-7)


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_clip_gradients_scales_by_global_norm_and_logs_like_caffe():
    solver = make_solver("momentum: 0 clip_gradients: 0.5")
    capture = _Capture()
    log.logger.addHandler(capture)
    try:
        w0 = [b.data.copy() for b in solver.net.learnable_params]
        grads = run_updates(solver, 1, scale=3.0)
    finally:
        log.logger.removeHandler(capture)
    norm = np.sqrt(sum((g ** 2).sum() for g in grads[0]))
    scale = 0.5 / norm
    for i, blob in enumerate(solver.net.learnable_params):
        np.testing.assert_allclose(blob.data, w0[i] - 0.1 * LR_MULT[i] * scale * grads[0][i],
                                   rtol=1e-5, atol=1e-6)
    lines = [m for m in capture.messages if m.startswith("Gradient clipping")]
    assert len(lines) == 1
    m = re.fullmatch(r"Gradient clipping: scaling down gradients \(L2 norm (\S+) > 0\.5\) by "
                     r"scale factor (\S+)", lines[0])
    assert m, lines[0]
    assert float(m.group(1)) == pytest.approx(norm, rel=1e-5)
    assert float(m.group(2)) == pytest.approx(scale, rel=1e-5)


def test_clip_leaves_small_gradients_alone():
    solver = make_solver("momentum: 0 clip_gradients: 1000")
    w0 = [b.data.copy() for b in solver.net.learnable_params]
    grads = run_updates(solver, 1)
    for i, blob in enumerate(solver.net.learnable_params):
        np.testing.assert_allclose(blob.data, w0[i] - 0.1 * LR_MULT[i] * grads[0][i], rtol=1e-5)


def test_iter_size_accumulates_and_averages_gradients():
    """Two passes of batch 2 with iter_size 2 equal one pass over the same 4 rows at once:
    EuclideanLoss normalises by the batch, so averaging over iter_size gives the same step."""
    solver = make_solver("momentum: 0.5 iter_size: 2")
    gen = np.random.default_rng(5)
    xs = gen.standard_normal((2, 2, 3)).astype(np.float32)
    ys = gen.standard_normal((2, 2, 2)).astype(np.float32)
    feed = {"i": 0}
    net = solver.net
    original = net.forward_backward

    def forward_backward():
        net.blobs["x"].data[...] = xs[feed["i"] % 2]
        net.blobs["y"].data[...] = ys[feed["i"] % 2]
        feed["i"] += 1
        return original()
    net.forward_backward = forward_backward
    W = net.params["ip"][0].data.astype(np.float64).copy()
    b = net.params["ip"][1].data.astype(np.float64).copy()
    hW, hb = np.zeros_like(W), np.zeros_like(b)
    X, Y = xs.reshape(4, 3).astype(np.float64), ys.reshape(4, 2).astype(np.float64)
    solver.step(3)
    for _ in range(3):
        r = X @ W.T + b - Y                    # loss = sum(r^2) / (2 * 2) per batch of 2
        gW, gb = r.T @ X / 2 / 2, r.sum(0) / 2 / 2      # summed over 2 passes, then / iter_size
        hW = 0.5 * hW + 0.1 * gW
        hb = 0.5 * hb + 0.2 * gb
        W, b = W - hW, b - hb
    np.testing.assert_allclose(net.params["ip"][0].data, W, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.params["ip"][1].data, b, rtol=1e-5, atol=1e-6)
    assert solver.iter == 3


def test_rule_specific_checks():
    with pytest.raises(SolverError, match="Momentum cannot be used with AdaGrad"):
        make_solver('type: "AdaGrad" momentum: 0.9')
    with pytest.raises(SolverError, match="Unknown solver type"):
        make_solver('type: "Adamax"')
    with pytest.raises(SolverError, match="regularization type"):
        make_solver('regularization_type: "L3"')


def test_rmsprop_needs_rms_decay_below_one():
    # Caffe's RMSProp checks 0 <= rms_decay < 1: at 1 the squared-gradient average is frozen
    with pytest.raises(SolverError, match="rms_decay"):
        make_solver('type: "RMSProp" rms_decay: 1.0')
    with pytest.raises(SolverError, match="rms_decay"):
        make_solver('type: "RMSProp" rms_decay: -0.1')
    with pytest.raises(SolverError, match="Momentum cannot be used with RMSProp"):
        make_solver('type: "RMSProp" momentum: 0.9')
    assert make_solver('type: "RMSProp" rms_decay: 0.0').param.rms_decay == 0.0
