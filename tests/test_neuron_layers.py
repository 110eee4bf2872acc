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
    rng.set_random_seed(3)


def layer_of(type_name, params="", phase=""):
    return make_layer('name: "n" type: "%s" %s %s' % (type_name, params, phase))


def random_bottom(shape=SHAPE, low=-1.0, high=1.0, seed=0):
    return blob_from(np.random.RandomState(seed).uniform(low, high, shape))


def forward(layer, values):
    bottom, top = [blob_from(values)], [Blob()]
    layer.setup(bottom, top)
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    return top[0].data.astype(np.float64)


# -- forward values worked by hand ----------------------------------------------------------

def test_relu_forward_with_and_without_slope():
    x = [-2.0, -0.5, 0.0, 1.5]
    np.testing.assert_allclose(forward(layer_of("ReLU"), x), [0, 0, 0, 1.5])
    np.testing.assert_allclose(forward(layer_of("ReLU", "relu_param { negative_slope: 0.1 }"), x),
                               [-0.2, -0.05, 0, 1.5], rtol=1e-6)


def test_prelu_default_slope_is_a_quarter_per_channel():
    layer = layer_of("PReLU")
    y = forward(layer, [[[-4.0, 2.0]], [[-8.0, -1.0]]])       # shape (2, 1, 2): one channel
    assert layer.blobs[0].shape == (1,)
    np.testing.assert_allclose(y, [[[-1.0, 2.0]], [[-2.0, -0.25]]])


def test_prelu_slopes_per_channel_and_shared():
    x = -np.ones((1, 3, 2))
    layer = layer_of("PReLU")
    layer_blobs_y = forward(layer, x)
    assert layer.blobs[0].shape == (3,)
    layer.blobs[0].data[...] = [0.1, 0.2, 0.3]
    layer.forward([blob_from(x)], [Blob((1, 3, 2))])
    bottom, top = [blob_from(x)], [Blob((1, 3, 2))]
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, [[[-0.1, -0.1], [-0.2, -0.2], [-0.3, -0.3]]],
                               rtol=1e-6)
    np.testing.assert_allclose(layer_blobs_y, -0.25)
    shared = layer_of("PReLU", "prelu_param { channel_shared: true }")
    forward(shared, x)
    assert shared.blobs[0].count == 1


def test_elu_values():
    y = forward(layer_of("ELU", "elu_param { alpha: 0.5 }"), [-1.0, 0.0, 2.0, -10.0])
    np.testing.assert_allclose(y, [0.5 * (math.exp(-1) - 1), 0.0, 2.0, 0.5 * (math.exp(-10) - 1)],
                               rtol=1e-6)


def test_sigmoid_tanh_absval_bnll_values():
    x = [-100.0, -1.0, 0.0, 2.0, 100.0]
    np.testing.assert_allclose(forward(layer_of("Sigmoid"), x),
                               [0, 1 / (1 + math.e), 0.5, 1 / (1 + math.exp(-2)), 1], atol=1e-7)
    np.testing.assert_allclose(forward(layer_of("TanH"), x),
                               [-1, math.tanh(-1), 0, math.tanh(2), 1], atol=1e-7)
    np.testing.assert_allclose(forward(layer_of("AbsVal"), x), [100, 1, 0, 2, 100])
    np.testing.assert_allclose(forward(layer_of("BNLL"), x),
                               [0, math.log(1 + math.exp(-1)), math.log(2),
                                math.log(1 + math.exp(2)), 100], rtol=1e-6, atol=1e-7)


def test_power_values():
    y = forward(layer_of("Power", "power_param { power: 2 scale: 3 shift: 1 }"), [0.0, 1.0, -1.0])
    np.testing.assert_allclose(y, [1.0, 16.0, 4.0])
    y = forward(layer_of("Power", "power_param { power: 0.5 scale: 2 }"), [2.0, 8.0])
    np.testing.assert_allclose(y, [2.0, 4.0], rtol=1e-6)
    # defaults make the identity
    np.testing.assert_allclose(forward(layer_of("Power"), [-3.0, 5.0]), [-3.0, 5.0])


def test_exp_base_2_and_default_base_e():
    y = forward(layer_of("Exp", "exp_param { base: 2 scale: 1 shift: 1 }"), [0.0, 1.0, -2.0])
    np.testing.assert_allclose(y, [2.0, 4.0, 0.5], rtol=1e-6)
    y = forward(layer_of("Exp", "exp_param { scale: 2 }"), [0.0, 0.5])
    np.testing.assert_allclose(y, [1.0, math.e], rtol=1e-6)


def test_log_base_10_and_default_base_e():
    y = forward(layer_of("Log", "log_param { base: 10 scale: 2 }"), [0.5, 5.0, 50.0])
    np.testing.assert_allclose(y, [0.0, 1.0, 2.0], atol=1e-6)
    y = forward(layer_of("Log", "log_param { shift: 1 }"), [math.e - 1])
    np.testing.assert_allclose(y, [1.0], rtol=1e-6)


@pytest.mark.parametrize("type_name,params", [("Exp", "exp_param { base: -2 }"),
                                              ("Log", "log_param { base: 0 }")])
def test_non_positive_base_is_rejected(type_name, params):
    with pytest.raises(LayerError, match="'n'.*base"):
        forward(layer_of(type_name, params), [1.0])


def test_threshold_values_and_no_backward():
    layer = layer_of("Threshold", "threshold_param { threshold: 0.5 }")
    np.testing.assert_array_equal(forward(layer, [0.4, 0.5, 0.6, -3.0]), [0, 0, 1, 0])
    assert not layer.has_backward()
    assert layer_of("ReLU").has_backward()


def test_clip_values_and_bad_range():
    y = forward(layer_of("Clip", "clip_param { min: -1 max: 2 }"), [-3.0, 0.5, 5.0, 2.0])
    np.testing.assert_allclose(y, [-1.0, 0.5, 2.0, 2.0])
    with pytest.raises(LayerError, match="'n'.*min"):
        forward(layer_of("Clip", "clip_param { min: 3 max: 2 }"), [0.0])


def test_swish_values():
    y = forward(layer_of("Swish", "swish_param { beta: 2 }"), [0.0, 1.0, -1.0])
    np.testing.assert_allclose(y, [0.0, 1 / (1 + math.exp(-2)), -1 / (1 + math.exp(2))],
                               rtol=1e-6)


def test_absval_refuses_in_place():
    layer = layer_of("AbsVal")
    blob = random_bottom()
    with pytest.raises(LayerError, match="in-place"):
        layer.reshape([blob], [blob])


# -- Dropout ------------------------------------------------------------------------------------

def test_dropout_train_scales_kept_values():
    x = np.ones((100, 100))
    layer = layer_of("Dropout", "dropout_param { dropout_ratio: 0.25 }")
    y = forward(layer, x)
    kept = y != 0
    np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)
    assert abs(kept.mean() - 0.75) < 0.02
    # backward uses the same mask and scale
    bottom, top = [blob_from(x)], [Blob(x.shape)]
    rng.set_random_seed(11)
    layer.forward(bottom, top)
    top[0].diff[...] = 2.0
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(bottom[0].diff, top[0].data * 2.0)


def test_dropout_default_ratio_is_half():
    y = forward(layer_of("Dropout"), np.ones((50, 50)))
    assert set(np.unique(y)) == {0.0, 2.0}


def test_dropout_is_identity_at_test():
    x = np.random.RandomState(1).randn(4, 5)
    layer = layer_of("Dropout", "dropout_param { dropout_ratio: 0.7 }", "phase: TEST")
    np.testing.assert_allclose(forward(layer, x), x.astype(np.float32))
    bottom, top = [blob_from(x)], [Blob(x.shape)]
    layer.forward(bottom, top)
    top[0].diff[...] = 3.0
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(bottom[0].diff, 3.0)


def test_dropout_mask_follows_the_seed():
    layer = layer_of("Dropout")
    rng.set_random_seed(42)
    a = forward(layer, np.ones((8, 8)))
    rng.set_random_seed(42)
    b = forward(layer, np.ones((8, 8)))
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("parts", [1, 2, 3, 64])
@pytest.mark.parametrize("ratio", [0.0, 0.3, 0.5, 0.95])
def test_dropout_map_is_the_hash_references_by_every_path(ratio, parts, monkeypatch):
    """The compiled map (in parts on the library's threads, in place too) and numpy's
    fallback keep exactly what dropout_bits.kept keeps, and a NaN stays NaN where dropped
    (Caffe multiplies by 0)."""
    from poseidon_caffe.backend import dropout_bits
    from poseidon_caffe.backend.cpu import dropout, native
    # parts of 64-value steps and a short tail, at an odd count
    x = np.random.RandomState(3).randn(3, 701, 299).astype(np.float32)
    x[0, 0, :4] = np.nan
    key = (0xFFFFFFFF, 0x9E3779B9)
    want = x * dropout_bits.kept(key, x.size, ratio).reshape(x.shape) * np.float32(2.0)
    assert np.isnan(want[0, 0, :4]).all()
    if native.lib is not None:
        y = dropout.apply(x, np.empty_like(x), key, ratio, 2.0, parts)
        np.testing.assert_array_equal(y, want)
        inplace = x.copy()
        assert dropout.apply(inplace, inplace, key, ratio, 2.0, parts) is inplace
        np.testing.assert_array_equal(inplace, want)
    monkeypatch.setattr(native, "lib", None)
    np.testing.assert_array_equal(dropout.apply(x, np.empty_like(x), key, ratio, 2.0), want)


def test_dropout_draws_look_independent():
    """Kept with probability 1 - ratio, neighbours and successive keys independent: each
    frequency within 5 standard errors over a million values."""
    from poseidon_caffe.backend import dropout_bits
    n, ratio = 1 << 20, 0.3
    stream = np.random.default_rng(8)
    a = dropout_bits.kept(dropout_bits.draw_key(stream), n, ratio)
    b = dropout_bits.kept(dropout_bits.draw_key(stream), n, ratio)
    p = 1 - ratio

    def near(frequency, expected, count):
        return abs(frequency - expected) < 5 * math.sqrt(expected * (1 - expected) / count)
    assert near(a.mean(), p, n)
    assert near((a[1:] & a[:-1]).mean(), p * p, n)        # neighbours
    assert near((a[256:] & a[:-256]).mean(), p * p, n)    # a row apart
    assert near((a & b).mean(), p * p, n)                 # two forwards
    assert near((a[::2] & a[1::2]).mean(), p * p, n // 2)
    assert dropout_bits.threshold(0.0) == 0 and dropout_bits.kept((5, 6), 1000, 0.0).all()


def test_dropout_ratio_out_of_range():
    with pytest.raises(LayerError, match="dropout_ratio"):
        forward(layer_of("Dropout", "dropout_param { dropout_ratio: 1 }"), [1.0])


# -- gradients ----------------------------------------------------------------------------------

def away_from(values, points, margin=0.05):
    """Move values that lie within ``margin`` of a kink to a safe distance from it."""
    values = np.array(values, dtype=np.float64)
    for p in points:
        near = np.abs(values - p) < margin
        values[near] = p + np.where(values[near] >= p, margin, -margin)
    return values


GRADIENT_CASES = [
    ("ReLU", "", dict(kink=0.0, kink_range=0.02)),
    ("ReLU", "relu_param { negative_slope: 0.3 }", dict(kink=0.0, kink_range=0.02)),
    ("PReLU", "", dict(kink=0.0, kink_range=0.02)),
    ("PReLU", 'prelu_param { filler { type: "uniform" min: -0.5 max: 0.8 } }',
     dict(kink=0.0, kink_range=0.02)),
    ("PReLU", "prelu_param { channel_shared: true }", dict(kink=0.0, kink_range=0.02)),
    ("ELU", "elu_param { alpha: 0.5 }", dict(kink=0.0, kink_range=0.02)),
    ("ELU", "", dict(kink=0.0, kink_range=0.02)),
    ("Sigmoid", "", {}),
    ("TanH", "", {}),
    ("AbsVal", "", dict(kink=0.0, kink_range=0.02)),
    ("BNLL", "", {}),
    ("Power", "power_param { power: 2 scale: 0.5 shift: 1.5 }", {}),
    ("Power", "power_param { power: 0.37 scale: 0.83 shift: 2 }", {}),
    ("Power", "power_param { power: 1 scale: -2 shift: 1 }", {}),
    ("Power", "power_param { power: 0 scale: 2 shift: 1 }", {}),
    ("Power", "power_param { power: -1.5 scale: 0.5 shift: 2 }", {}),
    ("Exp", "", {}),
    ("Exp", "exp_param { base: 2 scale: 0.5 shift: 1 }", {}),
    ("Log", "log_param { shift: 2 }", {}),
    ("Log", "log_param { base: 10 scale: 0.5 shift: 1.5 }", {}),
    ("Swish", "", {}),
    ("Swish", "swish_param { beta: 1.5 }", {}),
    ("Clip", "clip_param { min: -0.5 max: 0.5 }", {}),
    ("Dropout", "dropout_param { dropout_ratio: 0.3 }", {}),
]


@pytest.mark.parametrize("type_name,params,options", GRADIENT_CASES)
def test_gradient(type_name, params, options):
    values = np.random.RandomState(0).uniform(-1, 1, SHAPE)
    if type_name == "Clip":
        values = away_from(values, [-0.5, 0.5])
    check_gradient(layer_of(type_name, params), [blob_from(values)], [Blob()], **options)


def test_relu_gradient_by_hand():
    layer = layer_of("ReLU", "relu_param { negative_slope: 0.1 }")
    bottom, top = [blob_from([-1.0, 0.0, 2.0])], [Blob()]
    layer.setup(bottom, top)
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = [10.0, 10.0, 10.0]
    layer.backward(top, [True], bottom)
    # Caffe counts 0 with the negative side
    np.testing.assert_allclose(bottom[0].diff, [1.0, 1.0, 10.0], rtol=1e-6)


# -- in place: same numbers as with separate blobs ----------------------------------------------

IN_PLACE_CASES = [(t, p) for t, p, _ in GRADIENT_CASES if t != "AbsVal"] + [
    ("Threshold", "threshold_param { threshold: 0.1 }"),
    ("Dropout", 'phase: TEST')]


@pytest.mark.parametrize("type_name,params", IN_PLACE_CASES)
def test_in_place_matches_separate_blobs(type_name, params):
    values = np.random.RandomState(2).uniform(-1, 1, SHAPE)
    values = away_from(values, [-0.5, 0.0, 0.5])
    top_diff = np.random.RandomState(3).uniform(-1, 1, SHAPE)
    results = []
    for in_place in (False, True):
        rng.set_random_seed(9)          # same filled parameters and dropout mask both times
        layer = layer_of(type_name, params)
        bottom = blob_from(values)
        top = bottom if in_place else Blob()
        layer.setup([bottom], [top])
        layer.reshape([bottom], [top])
        layer.forward([bottom], [top])
        y = top.data.copy()
        diff = None
        if layer.has_backward():
            top.diff[...] = top_diff
            layer.backward([top], [True], [bottom])
            diff = bottom.diff.copy()
        params_diff = [p.diff.copy() for p in layer.blobs]
        results.append((y, diff, params_diff))
    (y0, d0, p0), (y1, d1, p1) = results
    np.testing.assert_allclose(y1, y0, rtol=1e-6)
    if d0 is not None:
        np.testing.assert_allclose(d1, d0, rtol=1e-5, atol=1e-7)
    for a, b in zip(p0, p1):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


def test_prelu_needs_two_axes():
    with pytest.raises(LayerError, match="'n'.*2 axes"):
        forward(layer_of("PReLU"), [1.0, 2.0])
