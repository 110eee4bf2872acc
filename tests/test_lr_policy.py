"""Learning-rate policies against Caffe's formulas written out here, and through the solver."""
import math

import numpy as np
import pytest

from poseidon_caffe import io as pio
from poseidon_caffe.proto import caffe_pb2
from poseidon_caffe.solver import get_solver
from poseidon_caffe.solver.lr_policy import learning_rate, LearningRatePolicyError


def param(**fields):
    p = caffe_pb2.SolverParameter()
    for key, value in fields.items():
        if key == "stepvalue":
            p.stepvalue.extend(value)
        else:
            setattr(p, key, value)
    return p


def rates(p, n):
    out, step = [], 0
    for it in range(n):
        rate, step = learning_rate(p, it, step)
        out.append(rate)
    return out


def f32(x):
    return float(np.float32(x))


def test_fixed():
    assert rates(param(lr_policy="fixed", base_lr=0.01), 5) == [f32(0.01)] * 5


def test_step():
    got = rates(param(lr_policy="step", base_lr=0.1, gamma=0.1, stepsize=3), 10)
    want = [0.1, 0.1, 0.1, 0.01, 0.01, 0.01, 0.001, 0.001, 0.001, 0.0001]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_exp():
    got = rates(param(lr_policy="exp", base_lr=0.5, gamma=0.9), 6)
    np.testing.assert_allclose(got, [0.5 * 0.9 ** i for i in range(6)], rtol=1e-6)


def test_inv():
    got = rates(param(lr_policy="inv", base_lr=0.01, gamma=1e-4, power=0.75), 2000)
    np.testing.assert_allclose(got, [0.01 * (1 + 1e-4 * i) ** -0.75 for i in range(2000)],
                               rtol=1e-6)


def test_multistep():
    got = rates(param(lr_policy="multistep", base_lr=1.0, gamma=0.5, stepvalue=[2, 5, 6]), 9)
    np.testing.assert_allclose(got, [1, 1, .5, .5, .5, .25, .125, .125, .125])


def test_poly():
    got = rates(param(lr_policy="poly", base_lr=0.2, power=2.0, max_iter=10), 11)
    np.testing.assert_allclose(got, [0.2 * (1 - i / 10) ** 2 for i in range(11)], rtol=1e-6,
                               atol=1e-12)


def test_sigmoid():
    got = rates(param(lr_policy="sigmoid", base_lr=0.1, gamma=-0.5, stepsize=4), 9)
    np.testing.assert_allclose(got, [0.1 / (1 + math.exp(0.5 * (i - 4))) for i in range(9)],
                               rtol=1e-6)


def test_unknown_and_incomplete_policies_are_named():
    with pytest.raises(LearningRatePolicyError, match="Unknown learning rate policy: 'cosine'"):
        learning_rate(param(lr_policy="cosine", base_lr=1), 0)
    with pytest.raises(LearningRatePolicyError, match="stepsize"):
        learning_rate(param(lr_policy="step", base_lr=1, gamma=0.1), 0)


def test_solver_applies_the_policy_and_keeps_the_multistep_position():
    """Plain SGD without momentum on a fixed gradient of ones moves each weight by exactly the
    rate of that iteration, so the weights record the schedule."""
    text = """net_param { name: "lr"
        layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 dim: 1 } } }
        layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
                inner_product_param { num_output: 1 bias_term: false } } }
      base_lr: 1 lr_policy: "multistep" gamma: 0.1 stepvalue: 1 stepvalue: 3 max_iter: 5"""
    solver = get_solver(pio.parse_solver_text(text, "lr solver"))
    blob = solver.net.learnable_params[0]
    seen = []
    for _ in range(5):
        before = float(blob.data.ravel()[0])
        blob.diff[...] = 1.0
        solver.apply_update()
        solver.iter += 1
        seen.append(before - float(blob.data.ravel()[0]))
    np.testing.assert_allclose(seen, [1, 0.1, 0.1, 0.01, 0.01], rtol=1e-5)
    assert solver.current_step == 2


def test_sigmoid_far_before_its_midpoint_is_zero_not_an_overflow():
    # gamma * (stepsize - iter) = 1000 at iter 0: exp(1000) is past double range, and Caffe's
    # 1 / (1 + inf) gives 0; the rate then rises along the same curve.
    p = param(lr_policy="sigmoid", base_lr=0.1, gamma=0.01, stepsize=100000)
    assert learning_rate(p, 0)[0] == 0.0
    mid = learning_rate(p, 100000)[0]
    assert mid == pytest.approx(0.05)
    assert learning_rate(p, 99000)[0] == pytest.approx(0.1 / (1 + math.exp(10)), rel=1e-6)


def test_power_policies_follow_c_pow_at_its_edges():
    # exp with gamma > 1 overflows to inf as C's pow does (training then stops on the NaN check)
    assert learning_rate(param(lr_policy="exp", base_lr=1.0, gamma=2.0), 2000)[0] == math.inf
    # poly past max_iter with a fractional power: pow of a negative base is NaN, not an error
    assert math.isnan(learning_rate(param(lr_policy="poly", base_lr=0.1, power=0.5,
                                          max_iter=10), 11)[0])
