import math

import numpy as np
import pytest

from gradcheck import blob_from, check_gradient, make_layer
from poseidon_caffe import rng
from poseidon_caffe.blob import Blob
from poseidon_caffe.layers import LayerError

SHAPE = (2, 3, 2, 3)


@pytest.fixture(autouse=True)
def seeded():
    rng.set_random_seed(4)


def random_array(shape=SHAPE, seed=0, low=-1.0, high=1.0):
    return np.random.RandomState(seed).uniform(low, high, shape)


def run(layer, bottoms):
    bottom = [b if isinstance(b, Blob) else blob_from(b) for b in bottoms]
    top = [Blob()]
    layer.setup(bottom, top)
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    return top[0].data.astype(np.float64), bottom, top


# -- BatchNorm ----------------------------------------------------------------------------------

def batch_norm(params="", phase=""):
    return make_layer('name: "bn" type: "BatchNorm" batch_norm_param { %s } %s' % (params, phase))


def test_batch_norm_training_normalises_each_channel_by_loop():
    x = random_array(seed=1) * 3 + 2
    layer = batch_norm()
    y, _, _ = run(layer, [x])
    eps = 1e-5
    for c in range(3):
        values = x[:, c].ravel()
        mean = sum(values) / len(values)
        var = sum((v - mean) ** 2 for v in values) / len(values)
        want = (x[:, c] - mean) / math.sqrt(var + eps)
        np.testing.assert_allclose(y[:, c], want, rtol=1e-4, atol=1e-5)


def test_batch_norm_stores_running_sums_with_unbiased_variance():
    x1, x2 = random_array(seed=1), random_array(seed=2) * 2
    layer = batch_norm("moving_average_fraction: 0.9")
    run(layer, [x1])
    m = 2 * 2 * 3                       # values per channel
    mean1, var1 = x1.mean(axis=(0, 2, 3)), x1.var(axis=(0, 2, 3))
    np.testing.assert_allclose(layer.blobs[0].data, mean1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer.blobs[1].data, var1 * m / (m - 1), rtol=1e-5)
    np.testing.assert_allclose(layer.blobs[2].data, [1.0])
    layer.forward([blob_from(x2)], [Blob(SHAPE)])
    mean2, var2 = x2.mean(axis=(0, 2, 3)), x2.var(axis=(0, 2, 3))
    np.testing.assert_allclose(layer.blobs[0].data, 0.9 * mean1 + mean2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer.blobs[1].data, (0.9 * var1 + var2) * m / (m - 1), rtol=1e-5)
    np.testing.assert_allclose(layer.blobs[2].data, [1.9], rtol=1e-6)
    assert [b.shape for b in layer.blobs] == [(3,), (3,), (1,)]


def test_batch_norm_global_stats_divide_by_the_scale_factor():
    layer = batch_norm("use_global_stats: true eps: 0")
    x = np.array([[3.0, 1.0], [-1.0, 5.0]])             # (N=2, C=2)
    bottom, top = [blob_from(x)], [Blob()]
    layer.setup(bottom, top)
    layer.reshape(bottom, top)
    # stored sums: mean (2, 4), variance (8, 32), factor 2 -> mean (1, 2), variance (4, 16)
    layer.blobs[0].data[...] = [2.0, 4.0]
    layer.blobs[1].data[...] = [8.0, 32.0]
    layer.blobs[2].data[...] = [2.0]
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, [[1.0, -0.25], [-1.0, 0.75]], rtol=1e-6)
    # the stored statistics are not touched
    np.testing.assert_allclose(layer.blobs[2].data, [2.0])
    # backward with global statistics: a fixed affine map
    top[0].diff[...] = 1.0
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(bottom[0].diff, [[0.5, 0.25], [0.5, 0.25]], rtol=1e-6)


def test_batch_norm_zero_scale_factor_means_zero_statistics():
    layer = batch_norm("use_global_stats: true eps: 0.25")
    y, _, _ = run(layer, [[[1.0, -2.0]]])               # (N=1, C=2)
    np.testing.assert_allclose(y, [[2.0, -4.0]], rtol=1e-6)


def test_batch_norm_use_global_stats_defaults_to_test_phase():
    x = random_array(seed=5) + 3
    y_test, _, _ = run(batch_norm(phase="phase: TEST"), [x])
    np.testing.assert_allclose(y_test, x / math.sqrt(1e-5), rtol=1e-5)    # zero statistics
    y_train, _, _ = run(batch_norm(phase="phase: TRAIN"), [x])
    assert abs(y_train.mean()) < 1e-5


@pytest.mark.parametrize("shape", [SHAPE, (5, 3)])
def test_batch_norm_training_gradient(shape):
    layer = batch_norm()
    check_gradient(layer, [blob_from(random_array(shape, seed=7))], [Blob()], check_params=False)
    assert all(not b.has_diff or not b.diff.any() for b in layer.blobs)


def test_batch_norm_global_stats_gradient():
    layer = batch_norm("use_global_stats: true")
    bottom = [blob_from(random_array(seed=8))]
    layer.setup(bottom, [Blob()])
    layer.blobs[0].data[...] = [0.3, -0.2, 0.5]
    layer.blobs[1].data[...] = [0.8, 1.5, 0.4]
    layer.blobs[2].data[...] = [0.7]
    check_gradient(layer, bottom, [Blob()], check_params=False)


BN_NET = """
layer { name: "x" type: "DummyData" top: "x"
  dummy_data_param { shape { dim: 4 dim: 2 } data_filler { type: "constant" value: 2 } } }
layer { name: "y" type: "DummyData" top: "y" dummy_data_param { shape { dim: 4 dim: 1 } } }
layer { name: "bn" type: "BatchNorm" bottom: "x" top: "xn" %s }
layer { name: "ip" type: "InnerProduct" bottom: "xn" top: "out"
  inner_product_param { num_output: 1 weight_filler { type: "constant" value: 0.5 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "out" bottom: "y" top: "loss" }
"""


def test_batch_norm_statistics_are_never_moved_by_the_solver():
    # Caffe gives the three statistics blobs lr_mult 0, so weight decay and momentum leave
    # them exactly as the forward pass stored them: sums of the batch mean 2 and variance 0,
    # with scale factor 1 after one step.
    from poseidon_caffe import io as pio
    from poseidon_caffe.solver import get_solver
    text = ('net_param { %s } base_lr: 0.1 momentum: 0.9 weight_decay: 0.5 lr_policy: "fixed" '
            'max_iter: 1 random_seed: 1' % (BN_NET % ""))
    solver = get_solver(pio.parse_solver_text(text, "bn solver"))
    solver.step(1)
    net = solver.net
    assert net.params_lr[:3] == [0.0, 0.0, 0.0]
    mean, variance, factor = (b.data.astype(np.float64) for b in net.params["bn"])
    np.testing.assert_allclose(factor, [1.0])
    np.testing.assert_allclose(mean, [2.0, 2.0], rtol=1e-6)
    np.testing.assert_allclose(variance, [0.0, 0.0], atol=1e-6)


def test_batch_norm_refuses_learned_statistics():
    from poseidon_caffe import io as pio
    from poseidon_caffe.net import Net
    # two specs (the upgrade drops a full set of three, as Caffe's does)
    text = BN_NET % "param { lr_mult: 0 } param { lr_mult: 1 }"
    with pytest.raises(LayerError, match="bn.*param 1 has lr_mult 1"):
        Net(pio.parse_net_text(text, "bn net"), 0)
    frozen = BN_NET % "param { lr_mult: 0 } param { lr_mult: 0 } param { lr_mult: 0 }"
    assert Net(pio.parse_net_text(frozen, "bn net"), 0).params_lr[:3] == [0.0, 0.0, 0.0]


def run_apart_and_in_place(make_layer):
    """[(top data, bottom diff, param diffs)] of one forward/backward with a separate top,
    then with the top being the bottom (in place); same input, top diff and seed."""
    x, dy = random_array(seed=1), random_array(seed=2)
    results = []
    for in_place in (False, True):
        rng.set_random_seed(4)
        layer = make_layer()
        bottom = blob_from(x)
        top = bottom if in_place else Blob()
        layer.setup([bottom], [top])
        layer.reshape([bottom], [top])
        layer.forward([bottom], [top])
        y = top.data.copy()
        top.diff[...] = dy
        layer.backward([top], [True], [bottom])
        results.append((y, bottom.diff.copy(), [p.diff.copy() for p in layer.blobs]))
    return results


def test_batch_norm_in_place_matches():
    results = run_apart_and_in_place(batch_norm)
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-6)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-5, atol=1e-7)


# -- Scale --------------------------------------------------------------------------------------

def scale(params="", with_filler=True):
    filler = 'filler { type: "uniform" min: 0.5 max: 1.5 } ' if with_filler else ""
    return make_layer('name: "sc" type: "Scale" scale_param { %s %s }' % (filler, params))


def test_scale_default_is_one_per_channel():
    x = random_array()
    layer = scale(with_filler=False)
    y, _, _ = run(layer, [x])
    assert layer.blobs[0].shape == (3,)
    np.testing.assert_allclose(y, x.astype(np.float32))


def test_scale_with_bias_by_loop():
    x = random_array()
    layer = scale('bias_term: true bias_filler { type: "constant" value: 0.5 }')
    y, _, _ = run(layer, [x])
    s, b = layer.blobs[0].data, layer.blobs[1].data
    np.testing.assert_allclose(b, 0.5)
    for n, c, h, w in np.ndindex(*SHAPE):
        assert y[n, c, h, w] == pytest.approx(x[n, c, h, w] * s[c] + 0.5, rel=1e-5)


def test_scale_from_second_bottom_over_two_axes():
    x = random_array()
    factors = random_array((3, 2), seed=3)
    y, _, _ = run(scale(), [x, factors])
    np.testing.assert_allclose(y, x * factors[None, :, :, None], rtol=1e-5)


def test_scale_scalar_second_bottom():
    x = random_array()
    y, _, _ = run(scale(), [x, np.array(2.5)])
    np.testing.assert_allclose(y, 2.5 * x, rtol=1e-6)


def test_scale_learned_shape_from_axis_and_num_axes():
    layer = scale("axis: -2 num_axes: -1")
    run(layer, [random_array()])
    assert layer.blobs[0].shape == (2, 3)
    layer = scale("num_axes: 0")
    run(layer, [random_array()])
    assert layer.blobs[0].shape == ()


def test_scale_shape_mismatch_names_layer():
    with pytest.raises(LayerError, match="'sc'.*does not match"):
        run(scale(), [random_array(), random_array((4,))])
    with pytest.raises(LayerError, match="'sc'.*exceeds"):
        run(scale("axis: 2 num_axes: 3"), [random_array()])


SCALE_GRADIENT_CASES = [
    ("", 1), ("bias_term: true", 1), ("axis: 0 num_axes: -1", 1), ("num_axes: 0", 1),
    ("axis: 2 num_axes: 2 bias_term: true", 1),
    ("", 2), ("bias_term: true bias_filler { type: \"gaussian\" }", 2),
]


@pytest.mark.parametrize("params,bottoms", SCALE_GRADIENT_CASES)
def test_scale_gradient(params, bottoms):
    bottom = [blob_from(random_array(seed=1))]
    if bottoms == 2:
        bottom.append(blob_from(random_array((3, 2), seed=2)))
    check_gradient(scale(params), bottom, [Blob()])


def test_scale_in_place_matches():
    results = run_apart_and_in_place(lambda: scale("bias_term: true"))
    (y0, d0, p0), (y1, d1, p1) = results
    np.testing.assert_allclose(y1, y0, rtol=1e-6)
    np.testing.assert_allclose(d1, d0, rtol=1e-6)
    for a, b in zip(p0, p1):
        np.testing.assert_allclose(b, a, rtol=1e-5)


# -- Bias ---------------------------------------------------------------------------------------

def bias(params=""):
    return make_layer('name: "bi" type: "Bias" bias_param { %s }' % params)


def test_bias_default_filler_is_zero_and_broadcasts():
    x = random_array()
    layer = bias()
    y, _, _ = run(layer, [x])
    assert layer.blobs[0].shape == (3,)
    np.testing.assert_allclose(y, x.astype(np.float32))
    layer.blobs[0].data[...] = [1.0, -2.0, 3.0]
    bottom, top = [blob_from(x)], [Blob(SHAPE)]
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, x + np.array([1, -2, 3])[None, :, None, None],
                               rtol=1e-6)


def test_bias_from_second_bottom():
    x, b = random_array(), random_array((2, 3), seed=5)
    y, _, _ = run(bias("axis: 0"), [x, b])
    np.testing.assert_allclose(y, x + b[:, :, None, None], rtol=1e-6)


@pytest.mark.parametrize("params,bottom_shapes", [
    ('filler { type: "gaussian" }', [SHAPE]),
    ('axis: 2 num_axes: -1 filler { type: "gaussian" }', [SHAPE]),
    ('num_axes: 0 filler { type: "gaussian" }', [SHAPE]),
    ("", [SHAPE, (3, 2)]),
    ("axis: 0", [SHAPE, (2,)]),
])
def test_bias_gradient(params, bottom_shapes):
    bottom = [blob_from(random_array(s, seed=i)) for i, s in enumerate(bottom_shapes)]
    check_gradient(bias(params), bottom, [Blob()])


def test_bias_sums_the_learned_diff():
    layer = bias()
    _, bottom, top = run(layer, [random_array()])
    top[0].diff[...] = 1.0
    layer.backward(top, [True], bottom)
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(layer.blobs[0].diff, [24.0, 24.0, 24.0])   # 2 x (2 * 2 * 3)
    np.testing.assert_allclose(bottom[0].diff, 1.0)


# -- MVN ----------------------------------------------------------------------------------------

def mvn(params=""):
    return make_layer('name: "mvn" type: "MVN" mvn_param { %s }' % params)


def test_mvn_by_hand():
    x = np.array([[[[1.0, 2.0], [3.0, 4.0]], [[0.0, 0.0], [2.0, 2.0]]]])   # (1, 2, 2, 2)
    y, _, _ = run(mvn(), [x])
    s = math.sqrt(1.25)
    np.testing.assert_allclose(y[0, 0].ravel(), [-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s],
                               rtol=1e-5)
    np.testing.assert_allclose(y[0, 1].ravel(), [-1, -1, 1, 1], rtol=1e-5)
    y, _, _ = run(mvn("normalize_variance: false"), [x])
    np.testing.assert_allclose(y[0, 0].ravel(), [-1.5, -0.5, 0.5, 1.5], rtol=1e-6)
    np.testing.assert_allclose(y[0, 1].ravel(), [-1, -1, 1, 1], rtol=1e-6)
    # across channels: one mean (1.75) and one deviation over all eight values
    y, _, _ = run(mvn("across_channels: true"), [x])
    flat = x.ravel()
    np.testing.assert_allclose(y.ravel(), (flat - flat.mean()) / flat.std(), rtol=1e-5)


def test_mvn_adds_eps_to_the_standard_deviation():
    # variance 1, std 1: eps 1 halves the values (it would divide by sqrt(2) on the variance)
    y, _, _ = run(mvn("eps: 1"), [[[[0.0, 2.0]]]])      # (N=1, C=1, 2)
    np.testing.assert_allclose(y, [[[-0.5, 0.5]]], rtol=1e-6)


@pytest.mark.parametrize("params", ["", "normalize_variance: false", "across_channels: true",
                                    "across_channels: true normalize_variance: false"])
def test_mvn_gradient(params):
    check_gradient(mvn(params), [blob_from(random_array(seed=9))], [Blob()])


def test_mvn_in_place_matches():
    results = run_apart_and_in_place(mvn)
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-6)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-5, atol=1e-7)
