"""Every kernel, on the test driver's device (built for the host on the emulated device),
against the CPU backend's ops or the CPU layers' numbers (small shapes; equal, or within 1e-6
relative where the two sum in different orders or use different libm routines; where a GPU's
fused multiply-adds round once for numpy's twice, within a few units in the last place)."""
import math

import numpy as np
import pytest

from emulated_device import assert_kernel_equal, device, needs_compiler  # noqa: F401
from gradcheck import blob_from, make_layer
from poseidon_caffe.backend.cpu import CPUBackend
from poseidon_caffe.backend.cuda import kernels
from poseidon_caffe.backend.geometry import ConvGeometry, PoolGeometry
from poseidon_caffe.blob import Blob
from poseidon_caffe.solver import updates

pytestmark = needs_compiler
RTOL = 1e-6


def close(actual, expected, rtol=RTOL, atol=1e-6):
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


def rand(shape, seed=0, low=-1.0, high=1.0):
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def cpu_layer(prototxt, bottoms, ntops=1, top_diffs=None, propagate=None):
    """The CPU layer's tops (data) and, when top_diffs are given, bottom diffs."""
    layer = make_layer(prototxt)
    bottom = [blob_from(b) for b in bottoms]
    top = [Blob(()) for _ in range(ntops)]
    layer.check_blob_counts(bottom, top)
    layer.setup(bottom, top)
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    outs = [t.data.copy() for t in top]
    if top_diffs is None:
        return outs, layer
    for t, d in zip(top, top_diffs):
        t.diff[...] = d
    layer.backward(top, propagate or [True] * len(bottom), bottom)
    return outs, [b.diff.copy() for b in bottom], layer


# -- im2col ----------------------------------------------------------------------------------
GEOMETRIES_2D = [
    dict(kernel=(3, 3), stride=(1, 1), pad=(1, 1), dilation=(1, 1)),
    dict(kernel=(3, 2), stride=(2, 1), pad=(0, 1), dilation=(1, 2)),
    dict(kernel=(2, 3), stride=(2, 3), pad=(1, 2), dilation=(2, 1)),
]


def _conv_geometry(in_shape, channels=3, **g):
    return ConvGeometry(channels, 4, in_shape, g["kernel"], g["stride"], g["pad"],
                        g["dilation"])


def _pitches(geom, num, batch_layout):
    """The kernels' (row_pitch, image_pitch) and how numpy lays per-image columns out so."""
    if batch_layout:
        return (num * geom.out_count, geom.out_count), lambda c: np.ascontiguousarray(
            c.reshape(num, geom.col_rows, -1).transpose(1, 0, 2))
    return (geom.out_count, geom.col_rows * geom.out_count), lambda c: c


@pytest.mark.parametrize("batch_layout", [False, True], ids=["per-image", "batch"])
@pytest.mark.parametrize("g", GEOMETRIES_2D)
def test_im2col_and_col2im_2d(device, g, batch_layout):
    geom = _conv_geometry((6, 7), **g)
    x = rand((2, 3, 6, 7))
    ho, wo = geom.out_shape
    pitches, lay_out = _pitches(geom, 2, batch_layout)
    col = device.empty((2, geom.col_rows, ho, wo))
    args = (3, 6, 7) + g["kernel"] + g["pad"] + g["stride"] + g["dilation"] + (ho, wo) + pitches
    device.launcher.run(kernels.im2col.im2col_2d, 2 * 3 * ho * wo, device.put(x), *args, col)
    expected = lay_out(CPUBackend().im2col(x, geom))
    np.testing.assert_array_equal(device.get(col, expected.shape), expected)
    cols = rand((2, geom.col_rows, ho, wo), 1)
    im = device.empty(x.shape)
    device.launcher.run(kernels.im2col.col2im_2d, x.size, device.put(lay_out(cols)), *args, im)
    close(device.get(im, x.shape), CPUBackend().col2im(cols, geom))


@pytest.mark.parametrize("in_shape,g", [
    ((6, 7), GEOMETRIES_2D[1]),
    ((4, 5, 6), dict(kernel=(2, 3, 2), stride=(1, 2, 2), pad=(1, 0, 1), dilation=(2, 1, 1))),
    ((9,), dict(kernel=(3,), stride=(2,), pad=(1,), dilation=(2,))),
])
@pytest.mark.parametrize("batch_layout", [False, True], ids=["per-image", "batch"])
def test_im2col_and_col2im_nd(device, in_shape, g, batch_layout):
    geom = _conv_geometry(in_shape, channels=2, **g)
    x = rand((2, 2) + in_shape, 2)
    nd = len(in_shape)
    pitches, lay_out = _pitches(geom, 2, batch_layout)
    geometry = device.put(np.concatenate([in_shape, geom.out_shape, g["kernel"], g["pad"],
                                          g["stride"], g["dilation"]]), np.int32)
    expected = lay_out(CPUBackend().im2col(x, geom))
    col = device.empty(expected.shape)
    device.launcher.run(kernels.im2col.im2col_nd, 2 * 2 * geom.out_count, device.put(x), 2, nd,
                        geometry, *pitches, col)
    np.testing.assert_array_equal(device.get(col, expected.shape), expected)
    cols = rand(CPUBackend().im2col(x, geom).shape, 3)
    im = device.empty(x.shape)
    device.launcher.run(kernels.im2col.col2im_nd, x.size, device.put(lay_out(cols)), 2, nd,
                        geometry, *pitches, im)
    close(device.get(im, x.shape), CPUBackend().col2im(cols, geom))


# -- pooling ---------------------------------------------------------------------------------
def _pooled(size, k, s, p):
    pooled = int(math.ceil((size + 2 * p - k) / float(s))) + 1
    if p and (pooled - 1) * s >= size + p:
        pooled -= 1
    return pooled


POOLINGS = [
    ((7, 7), (3, 3), (2, 2), (1, 1)),      # padded
    ((6, 5), (3, 2), (2, 2), (0, 0)),      # rounded up: the last windows overhang
    ((5, 5), (1, 1), (3, 3), (0, 0)),      # a last window wholly past the input
    ((28, 28), (3, 3), (2, 2), (0, 0)),    # large enough for the CPU's separable stages
]


def _pool_case(in_hw, k, s, p, seed=0, positive=False):
    out = tuple(_pooled(i, kk, ss, pp) for i, kk, ss, pp in zip(in_hw, k, s, p))
    geom = PoolGeometry(in_hw, k, s, p, out)
    x = rand((2, 3) + in_hw, seed, 0.0 if positive else -1.0, 1.0)
    return geom, x, out, in_hw + out + k + s


@pytest.mark.parametrize("in_hw,k,s,p", POOLINGS)
def test_max_pooling_forward_mask_and_backward(device, in_hw, k, s, p):
    geom, x, out, args = _pool_case(in_hw, k, s, p)
    plan = CPUBackend().pool_plan(geom)
    y_cpu = np.empty((2, 3) + out, np.float32)
    plan.max_forward(x, y_cpu)
    top, mask, top_mask = device.empty(y_cpu.shape), device.empty(y_cpu.shape, np.int32), \
        device.empty(y_cpu.shape)
    device.launcher.run(kernels.pooling.max_pool_forward, y_cpu.size, device.put(x), *args, *p, top,
                       mask, top_mask)
    np.testing.assert_array_equal(device.get(top, y_cpu.shape), y_cpu)
    np.testing.assert_array_equal(device.get(mask, y_cpu.shape, np.int32), plan.mask())
    np.testing.assert_array_equal(device.get(top_mask, y_cpu.shape), plan.mask())
    dy = rand(y_cpu.shape, 5)
    dx_cpu = np.empty_like(x)
    plan.routed_backward(dy, dx_cpu)
    dx = device.empty(x.shape)
    device.launcher.run(kernels.pooling.max_pool_backward, x.size, device.put(dy), mask, *args, *p,
                       dx)
    close(device.get(dx, x.shape), dx_cpu)
    device.launcher.run(kernels.pooling.max_pool_forward, y_cpu.size, device.put(x), *args, *p, top,
                       mask, 0)


@pytest.mark.parametrize("in_hw,k,s,p", POOLINGS)
def test_average_pooling_forward_and_backward(device, in_hw, k, s, p):
    geom, x, out, args = _pool_case(in_hw, k, s, p, 1)
    plan = CPUBackend().pool_plan(geom)
    y_cpu = np.empty((2, 3) + out, np.float32)
    with np.errstate(invalid="ignore"):
        plan.ave_forward(x, y_cpu)
    top = device.empty(y_cpu.shape)
    device.launcher.run(kernels.pooling.ave_pool_forward, y_cpu.size, device.put(x), *args, *p, top)
    close(device.get(top, y_cpu.shape), y_cpu)
    dy = rand(y_cpu.shape, 6)
    dx_cpu = np.empty_like(x)
    plan.ave_backward(dy, dx_cpu)
    dx = device.empty(x.shape)
    device.launcher.run(kernels.pooling.ave_pool_backward, x.size, device.put(dy), *args, *p, dx)
    close(device.get(dx, x.shape), dx_cpu)


# 0 / 0 in the TEST gradient where a window is all zeros, on both sides (the CPU's batch
# parts run on threads, which np.errstate does not reach)
@pytest.mark.filterwarnings("ignore:invalid value encountered in divide")
@pytest.mark.parametrize("in_hw,k,s,p", [c for c in POOLINGS if not any(c[3])])
def test_stochastic_pooling_train_and_test(device, in_hw, k, s, p):
    geom, x, out, args = _pool_case(in_hw, k, s, p, 2, positive=True)
    x[0, 0] = 0                                       # an all-zero map draws its first element
    plan = CPUBackend().pool_plan(geom)
    shape = (2, 3) + out
    uniform = rand(shape, 9, 0.0, 1.0)
    y_cpu = np.empty(shape, np.float32)
    plan.stochastic_forward_train(x, y_cpu, uniform)
    top, mask = device.empty(shape), device.empty(shape, np.int32)
    xd = device.put(x)
    device.launcher.run(kernels.pooling.sto_pool_forward_train, y_cpu.size, xd, *args,
                       device.put(uniform), top, mask)
    np.testing.assert_array_equal(device.get(top, shape), y_cpu)
    np.testing.assert_array_equal(device.get(mask, shape, np.int32), plan.mask())
    dy = rand(shape, 10)
    dx_cpu = np.empty_like(x)
    plan.routed_backward(dy, dx_cpu)
    dx = device.empty(x.shape)
    device.launcher.run(kernels.pooling.max_pool_backward, x.size, device.put(dy), mask, *args, 0,
                       0, dx)
    close(device.get(dx, x.shape), dx_cpu)
    # TEST: sum(x^2) / sum(x) and its exact gradient
    plan.stochastic_forward_test(x, y_cpu)
    num, den = device.empty(shape), device.empty(shape)
    device.launcher.run(kernels.pooling.sto_pool_forward_test, y_cpu.size, xd, *args, top, num, den)
    assert_kernel_equal(device.driver, device.get(top, shape), y_cpu)
    plan.stochastic_backward_test(x, dy, dx_cpu)
    device.launcher.run(kernels.pooling.sto_pool_backward_test, x.size, xd, device.put(dy), num,
                       den, *args, dx)
    close(device.get(dx, x.shape), dx_cpu, rtol=1e-5, atol=1e-5)


# -- LRN -------------------------------------------------------------------------------------
def _lrn_scale(x, size, coef, k, across):
    """Caffe's LRN scale by its definition: k + coef * the sum of squares over the window
    (channels [c - (size-1)/2, c + size/2] across, a size x size square within), in double."""
    x = x.astype(np.float64)
    scale = np.empty_like(x)
    lo, hi = (size - 1) // 2, size // 2
    n, c, h, w = x.shape
    for ch in range(c):
        if across:
            window = x[:, max(0, ch - lo):ch + hi + 1]
            scale[:, ch] = k + coef * (window ** 2).sum(axis=1)
            continue
        for i in range(h):
            for j in range(w):
                window = x[:, ch, max(0, i - lo):i + hi + 1, max(0, j - lo):j + hi + 1]
                scale[:, ch, i, j] = 1.0 + coef * (window ** 2).sum(axis=(1, 2))
    return scale.astype(np.float32)


@pytest.mark.parametrize("across", [True, False])
@pytest.mark.parametrize("size,beta", [(3, 0.75), (5, 0.6), (5, 0.5)])
def test_lrn_forward_and_backward(device, across, size, beta):
    n, c, h, w = 2, 7, 5, 6
    x = rand((n, c, h, w), 3, -2.0, 2.0)
    alpha, k = 0.3, 1.5
    top_cpu, state = CPUBackend().lrn_forward(x, size, alpha, beta, k, across)
    norm = size if across else size * size
    xd, scale, top = device.put(x), device.empty(x.shape), device.empty(x.shape)
    coef = np.float32(alpha / norm)
    if across:
        device.launcher.run(kernels.lrn.lrn_scale_across, x.size, xd, c, h, w, size, coef, k, scale)
    else:
        device.launcher.run(kernels.lrn.lrn_scale_within, x.size, xd, h, w, size, coef, scale)
    device.launcher.run(kernels.lrn.lrn_output, x.size, xd, scale, beta, top)
    close(device.get(scale, x.shape), _lrn_scale(x, size, alpha / norm, k, across))
    close(device.get(top, x.shape), top_cpu)
    dy = rand(x.shape, 4)
    dx_cpu = CPUBackend().lrn_backward(x, top_cpu, state, dy, size, alpha, beta, across)
    dx = device.empty(x.shape)
    coef = np.float32(2.0 * alpha * beta / norm)
    if across:
        device.launcher.run(kernels.lrn.lrn_diff_across, x.size, xd, top, scale, device.put(dy), c,
                           h, w, size, beta, coef, dx)
    else:
        device.launcher.run(kernels.lrn.lrn_diff_within, x.size, xd, top, scale, device.put(dy), h,
                           w, size, beta, coef, dx)
    close(device.get(dx, x.shape), dx_cpu)


# -- softmax and its loss --------------------------------------------------------------------
def _softmax_on_device(device, x, axis):
    outer = int(np.prod(x.shape[:axis]))
    channels = x.shape[axis]
    inner = int(np.prod(x.shape[axis + 1:]))
    k = device.launcher
    data, per = device.put(x), device.empty((outer, inner))
    k.run(kernels.softmax.channel_max, outer * inner, data, channels, inner, per)
    k.run(kernels.softmax.channel_subtract, x.size, channels, inner, per, data)
    k.run(kernels.math.vec_exp, x.size, data, data)
    k.run(kernels.softmax.channel_sum, outer * inner, data, channels, inner, per)
    k.run(kernels.softmax.channel_div, x.size, channels, inner, per, data)
    return data, (outer, channels, inner)


@pytest.mark.parametrize("shape,axis", [((4, 5), 1), ((2, 3, 2, 4), 1), ((2, 3, 4), 2)])
def test_softmax_forward_and_backward(device, shape, axis):
    x = rand(shape, 5, -4.0, 4.0)
    dy = rand(shape, 6)
    (y_cpu,), (dx_cpu,), _ = cpu_layer('type: "Softmax" softmax_param { axis: %d }' % axis,
                                       [x], top_diffs=[dy])
    y, (outer, channels, inner) = _softmax_on_device(device, x, axis)
    close(device.get(y, shape), y_cpu)
    dot, diff = device.empty((outer, inner)), device.put(dy)
    device.launcher.run(kernels.softmax.channel_dot, outer * inner, diff, y, channels, inner, dot)
    device.launcher.run(kernels.softmax.channel_subtract, x.size, channels, inner, dot, diff)
    device.launcher.run(kernels.math.vec_mul, x.size, diff, y, diff)
    close(device.get(diff, shape), dx_cpu)


@pytest.mark.parametrize("extra,ignore", [("", None),
                                          ("loss_param { ignore_label: 2 normalization: VALID }",
                                           2),
                                          ("loss_param { ignore_label: 0 normalization: FULL }",
                                           0)])
def test_softmax_loss_forward_and_backward(device, extra, ignore):
    x = rand((3, 4, 2), 7, -3.0, 3.0)
    labels = np.array([[0, 2], [3, 1], [2, 2]], np.float32)
    (loss_cpu,), (dx_cpu, _), layer = cpu_layer('type: "SoftmaxWithLoss" ' + extra,
                                                [x, labels], top_diffs=[np.float32(1.0)],
                                                propagate=[True, False])
    prob, (outer, channels, inner) = _softmax_on_device(device, x, 1)
    loss, counts = device.empty((outer, inner)), device.empty((outer, inner))
    has_ignore = int(ignore is not None)
    label = device.put(labels)
    device.launcher.run(kernels.softmax.softmax_loss_forward, outer * inner, prob, label, channels,
                       inner, has_ignore, ignore or 0, loss, counts)
    blas = device.blas
    valid = blas.sasum(outer * inner, counts, 1)
    assert valid == (labels != ignore).sum()
    norm = layer.norm                                   # the CPU layer's divisor for this mode
    assert float(loss_cpu) == pytest.approx(blas.sasum(outer * inner, loss, 1) / norm, rel=1e-6)
    device.launcher.run(kernels.softmax.softmax_loss_backward, outer * inner, label, channels,
                       inner, has_ignore, ignore or 0, prob, counts)
    blas.sscal(x.size, np.float32(1.0 / norm), prob, 1)
    close(device.get(prob, x.shape), dx_cpu)


def test_softmax_loss_marks_a_label_out_of_range_with_nan(device):
    prob = device.put(np.full((2, 3), 1 / 3.0))
    loss, counts, diff = device.empty(2), device.empty(2), device.put(np.full((2, 3), 0.5))
    label = device.put([1, 3])
    device.launcher.run(kernels.softmax.softmax_loss_forward, 2, prob, label, 3, 1, 0, 0, loss,
                       counts)
    out = device.get(loss, 2)
    assert out[0] == pytest.approx(math.log(3), rel=1e-6) and np.isnan(out[1])
    device.launcher.run(kernels.softmax.softmax_loss_backward, 2, label, 3, 1, 0, 0, diff, counts)
    got = device.get(diff, (2, 3))
    np.testing.assert_array_equal(got[0], [0.5, -0.5, 0.5])
    assert np.isnan(got[1]).all() and list(device.get(counts, 2)) == [1, 0]


# -- accuracy --------------------------------------------------------------------------------
@pytest.mark.parametrize("extra,top_k,ignore", [("", 1, None), ("top_k: 2", 2, None),
                                                ("top_k: 2 ignore_label: 1", 2, 1)])
def test_accuracy(device, extra, top_k, ignore):
    scores = np.round(rand((6, 4), 8, 0, 3), 0)           # ties among the scores
    labels = np.array([0, 1, 2, 3, 1, 2], np.float32)
    tops, _ = cpu_layer('type: "Accuracy" accuracy_param { %s }' % extra, [scores, labels],
                        ntops=2)
    hits, counts = device.empty(6), device.empty(6)
    class_hits, class_counts = device.put(np.zeros((4, 6))), device.put(np.zeros((4, 6)))
    device.launcher.run(kernels.accuracy.accuracy_forward, 6, device.put(scores),
                       device.put(labels), 4, 1, top_k, int(ignore is not None), ignore or 0, hits,
                       counts, class_hits, class_counts)
    h, c = device.get(hits, 6), device.get(counts, 6)
    assert h.sum() / c.sum() == pytest.approx(float(tops[0]), rel=1e-6)
    ch, cc = device.get(class_hits, (4, 6)).sum(1), device.get(class_counts, (4, 6)).sum(1)
    per_class = np.where(cc > 0, ch / np.maximum(cc, 1), 0)
    close(per_class, tops[1])


# -- neuron layers ---------------------------------------------------------------------------
def _neuron_case(device, prototxt, x, forward, backward=None, seed=11, in_place_ok=True):
    dy = rand(x.shape, seed)
    if backward is None:
        (y_cpu,), _ = cpu_layer(prototxt, [x])
    else:
        (y_cpu,), (dx_cpu,), _ = cpu_layer(prototxt, [x], top_diffs=[dy])
    xd, y = device.put(x), device.empty(x.shape)
    forward(xd, y)
    close(device.get(y, x.shape), y_cpu)
    if backward is not None:
        dx = device.empty(x.shape)
        backward(device.put(dy), xd, y, dx)
        close(device.get(dx, x.shape), dx_cpu)


X = rand((2, 3, 4), 12, -2.0, 2.0)


def test_relu_and_leaky_relu(device):
    k = device.launcher
    for slope in (0.0, 0.1):
        _neuron_case(device, 'type: "ReLU" relu_param { negative_slope: %g }' % slope, X,
                     lambda x, y: k.run(kernels.neuron.relu_forward, X.size, x, y, slope),
                     lambda dy, x, y, dx: k.run(kernels.neuron.relu_backward, X.size, dy, x, dx,
                                                slope))


def test_sigmoid_tanh_abs_bnll(device):
    k, n = device.launcher, X.size
    _neuron_case(device, 'type: "Sigmoid"', X, lambda x, y: k.run(kernels.neuron.sigmoid_forward,
                                                                  n, x, y),
                 lambda dy, x, y, dx: k.run(kernels.neuron.sigmoid_backward, n, dy, y, dx))
    _neuron_case(device, 'type: "TanH"', X, lambda x, y: k.run(kernels.neuron.tanh_forward, n, x,
                                                               y),
                 lambda dy, x, y, dx: k.run(kernels.neuron.tanh_backward, n, dy, y, dx))
    _neuron_case(device, 'type: "AbsVal"', X, lambda x, y: k.run(kernels.neuron.abs_forward, n, x,
                                                                 y),
                 lambda dy, x, y, dx: k.run(kernels.neuron.abs_backward, n, dy, x, dx))
    big = X * 40                                        # past BNLL's exponent limit too
    _neuron_case(device, 'type: "BNLL"', big, lambda x, y: k.run(kernels.neuron.bnll_forward, n, x,
                                                                 y),
                 lambda dy, x, y, dx: k.run(kernels.neuron.bnll_backward, n, dy, x, dx))


def test_elu(device):
    k, n = device.launcher, X.size
    _neuron_case(device, 'type: "ELU" elu_param { alpha: 0.7 }', X,
                 lambda x, y: k.run(kernels.neuron.elu_forward, n, x, y, 0.7),
                 lambda dy, x, y, dx: k.run(kernels.neuron.elu_backward, n, dy, x, y, dx, 0.7))


@pytest.mark.parametrize("power,scale,shift", [(2.0, 0.5, 3.0), (1.0, 2.0, 1.0),
                                               (0.5, 1.0, 2.5), (3.0, 0.0, 1.0)])
def test_power(device, power, scale, shift):
    k, n = device.launcher, X.size
    _neuron_case(device, 'type: "Power" power_param { power: %g scale: %g shift: %g }'
                 % (power, scale, shift), X,
                 lambda x, y: k.run(kernels.neuron.power_forward, n, x, y, power, scale, shift),
                 lambda dy, x, y, dx: k.run(kernels.neuron.power_backward, n, dy, x, dx, power,
                                            scale, shift, np.float32(power * scale)))


@pytest.mark.parametrize("base,scale,shift", [(-1, 1.0, 0.0), (2.0, 0.5, 1.5)])
def test_exp_and_log(device, base, scale, shift):
    k, n = device.launcher, X.size
    log_base = 1.0 if base == -1 else math.log(base)
    inner, outer = log_base * scale, 1.0 if shift == 0 else math.exp(log_base * shift)
    params = "base: %g scale: %g shift: %g" % (base, scale, shift)
    _neuron_case(device, 'type: "Exp" exp_param { %s }' % params, X,
                 lambda x, y: k.run(kernels.neuron.exp_forward, n, x, y, inner, outer),
                 lambda dy, x, y, dx: k.run(kernels.neuron.exp_backward, n, dy, y, dx, inner))
    positive = X + 2.5
    base_scale = 1.0 / log_base
    _neuron_case(device, 'type: "Log" log_param { %s }' % params, positive,
                 lambda x, y: k.run(kernels.neuron.log_forward, n, x, y, scale, shift, base_scale),
                 lambda dy, x, y, dx: k.run(kernels.neuron.log_backward, n, dy, x, dx, scale,
                                            shift, np.float32(scale * base_scale)))


def test_threshold_clip_swish(device):
    k, n = device.launcher, X.size
    _neuron_case(device, 'type: "Threshold" threshold_param { threshold: 0.3 }', X,
                 lambda x, y: k.run(kernels.neuron.threshold_forward, n, x, y, 0.3))
    _neuron_case(device, 'type: "Clip" clip_param { min: -0.5 max: 0.8 }', X,
                 lambda x, y: k.run(kernels.neuron.clip_forward, n, x, y, -0.5, 0.8),
                 lambda dy, x, y, dx: k.run(kernels.neuron.clip_backward, n, dy, x, dx, -0.5, 0.8))
    sig = device.empty(X.shape)
    _neuron_case(device, 'type: "Swish" swish_param { beta: 1.5 }', X,
                 lambda x, y: k.run(kernels.neuron.swish_forward, n, x, y, sig, 0.5 * 1.5),
                 lambda dy, x, y, dx: k.run(kernels.neuron.swish_backward, n, dy, y, sig, dx, 1.5))


def test_dropout_with_the_layers_key(device):
    from poseidon_caffe import rng
    from poseidon_caffe.backend import dropout_bits
    k, n, ratio = device.launcher, X.size, 0.4
    rng.set_random_seed(5)
    key = dropout_bits.draw_key(rng.get_rng())                  # what the layer will draw
    rng.set_random_seed(5)
    scale = np.float32(1.0 / (1.0 - ratio))
    words = [int(np.uint32(w).astype(np.int32)) for w in key]
    t = dropout_bits.threshold(ratio)
    _neuron_case(device, 'type: "Dropout" dropout_param { dropout_ratio: %g }' % ratio, X,
                 lambda x, y: k.run(kernels.neuron.dropout_apply, n, x, *words, t, scale, y),
                 lambda dy, x, y, dx: k.run(kernels.neuron.dropout_apply, n, dy, *words, t,
                                            scale, dx))


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.5, 0.9])
def test_dropout_kernel_draws_numpys_bits(device, ratio):
    """Over many values and keys with the top bit set (negative as the kernel's int words),
    the device keeps exactly the values numpy's reference keeps, and 0 times a NaN is NaN."""
    from poseidon_caffe.backend import dropout_bits
    n = 100003
    x = rand((n,), 21) + 3.0
    x[7] = np.nan
    for key in [(0, 0), (0xFFFFFFFF, 0x80000001), (123456789, 0xDEADBEEF)]:
        words = [int(np.uint32(w).astype(np.int32)) for w in key]
        y = device.empty((n,))
        device.launcher.run(kernels.neuron.dropout_apply, n, device.put(x), *words,
                            dropout_bits.threshold(ratio), np.float32(2.5), y)
        mask = dropout_bits.kept(key, n, ratio)
        want = x * mask * np.float32(2.5)
        np.testing.assert_array_equal(device.get(y, (n,)), want)
        assert np.isnan(want[7])


# -- elementwise -----------------------------------------------------------------------------
def test_eltwise_sum_prod_max(device):
    a, b, c = rand((3, 4), 1), rand((3, 4), 2), rand((3, 4), 3)
    b[0, :2] = a[0, :2]                                   # ties between bottoms 0 and 1
    c[1, :2] = np.maximum(a[1, :2], b[1, :2])             # a later bottom ties the max
    k, n = device.launcher, a.size
    pa, pb, pc = device.put(a), device.put(b), device.put(c)
    (sum_cpu,), _ = cpu_layer('type: "Eltwise" eltwise_param { operation: SUM coeff: 0.5 '
                              'coeff: -2 coeff: 1.5 }', [a, b, c])
    y = device.empty(a.shape)
    k.run(kernels.math.vec_axpby, n, 0.5, pa, 0.0, y)  # y holds NaN bytes: beta 0 skips it
    k.run(kernels.math.vec_axpby, n, -2.0, pb, 1.0, y)
    k.run(kernels.math.vec_axpby, n, 1.5, pc, 1.0, y)
    assert_kernel_equal(device.driver, device.get(y, a.shape), sum_cpu)
    dy = rand(a.shape, 4)
    (prod_cpu,), diffs, _ = cpu_layer('type: "Eltwise" eltwise_param { operation: PROD }',
                                      [a, b, c], top_diffs=[dy])
    k.run(kernels.math.vec_mul, n, pa, pb, y)
    k.run(kernels.math.vec_mul, n, y, pc, y)
    np.testing.assert_array_equal(device.get(y, a.shape), prod_cpu)
    d, pdy = device.empty(a.shape), device.put(dy)
    k.run(kernels.math.vec_mul, n, pa, pc, d)  # stable: the product of the others
    k.run(kernels.math.vec_mul, n, d, pdy, d)
    np.testing.assert_array_equal(device.get(d, a.shape), diffs[1])
    _, diffs, _ = cpu_layer('type: "Eltwise" eltwise_param { operation: PROD '
                            'stable_prod_grad: false }', [a, b, c], top_diffs=[dy])
    k.run(kernels.math.vec_div, n, y, pb, d)  # top / bottom 1, times dy
    k.run(kernels.math.vec_mul, n, d, pdy, d)
    np.testing.assert_array_equal(device.get(d, a.shape), diffs[1])
    (max_cpu,), diffs, _ = cpu_layer('type: "Eltwise" eltwise_param { operation: MAX }',
                                     [a, b, c], top_diffs=[dy])
    mask = device.empty(a.shape, np.int32)
    k.run(kernels.eltwise.eltwise_max_forward, n, pa, pb, 1, y, mask)
    k.run(kernels.eltwise.eltwise_max_forward, n, y, pc, 2, y, mask)
    np.testing.assert_array_equal(device.get(y, a.shape), max_cpu)
    for i in range(3):
        k.run(kernels.eltwise.eltwise_max_backward, n, pdy, mask, i, d)
        np.testing.assert_array_equal(device.get(d, a.shape), diffs[i])


def test_vector_math(device):
    a, b = rand(7, 1, 0.5, 2.0), rand(7, 2, 0.5, 2.0)
    k, pa, pb, y = device.launcher, device.put(a), device.put(b), device.empty(7)
    for name, expected in [("vec_add", a + b), ("vec_sub", a - b), ("vec_mul", a * b),
                           ("vec_div", a / b)]:
        k.run(getattr(kernels.math, name), 7, pa, pb, y)
        np.testing.assert_array_equal(device.get(y, 7), expected)
    for name, expected in [("vec_abs", np.abs(-a)), ("vec_exp", np.exp(-a)),
                           ("vec_sign", np.sign(-a))]:
        k.run(getattr(kernels.math, name), 7, device.put(-a), y)
        close(device.get(y, 7), expected)
    for name, expected in [("vec_log", np.log(a)), ("vec_sqrt", np.sqrt(a))]:
        k.run(getattr(kernels.math, name), 7, pa, y)
        close(device.get(y, 7), expected)
    k.run(kernels.math.vec_powx, 7, pa, y, 1.5)
    close(device.get(y, 7), a ** np.float32(1.5))
    k.run(kernels.math.vec_scale, 7, 3.0, pa, y)
    np.testing.assert_array_equal(device.get(y, 7), 3 * a)
    k.run(kernels.math.vec_set, 7, y, -1.25)
    k.run(kernels.math.vec_add_scalar, 7, y, 0.25)
    np.testing.assert_array_equal(device.get(y, 7), -1.0)


# -- layout copies ---------------------------------------------------------------------------
def test_concat_and_slice(device):
    parts = [rand((2, c, 3), c) for c in (1, 3, 2)]
    (whole_cpu,), _ = cpu_layer('type: "Concat" concat_param { axis: 1 }', parts)
    whole = device.empty(whole_cpu.shape)
    offset = 0
    for part in parts:
        device.launcher.run(kernels.copy.concat, part.size, device.put(part), 1, 3, 6,
                           part.shape[1], offset, whole)
        offset += part.shape[1]
    np.testing.assert_array_equal(device.get(whole, whole_cpu.shape), whole_cpu)
    tops, _ = cpu_layer('type: "Slice" slice_param { axis: 1 slice_point: 1 slice_point: 4 }',
                        [whole_cpu], ntops=3)
    pw, offset = device.put(whole_cpu), 0
    for top in tops:
        out = device.empty(top.shape)
        device.launcher.run(kernels.copy.concat, top.size, pw, 0, 3, 6, top.shape[1], offset, out)
        np.testing.assert_array_equal(device.get(out, top.shape), top)
        offset += top.shape[1]


def test_crop_forward_and_backward(device):
    a, ref = rand((2, 3, 6, 7), 1), np.zeros((2, 2, 3, 4), np.float32)
    dy = rand(ref.shape, 2)
    (top_cpu,), (dx_cpu, _), _ = cpu_layer(
        'type: "Crop" crop_param { axis: 1 offset: 1 offset: 2 offset: 3 }', [a, ref],
        top_diffs=[dy], propagate=[True, False])
    strides = lambda shape: np.cumprod((1,) + shape[::-1])[:-1][::-1]
    geometry = device.put(np.concatenate([strides(a.shape), strides(ref.shape),
                                          [0, 1, 2, 3]]), np.int32)
    top = device.empty(ref.shape)
    device.launcher.run(kernels.copy.crop_copy, ref.size, 4, geometry, device.put(a), top, 1)
    np.testing.assert_array_equal(device.get(top, ref.shape), top_cpu)
    dx = device.put(np.zeros(a.shape))
    device.launcher.run(kernels.copy.crop_copy, ref.size, 4, geometry, device.put(dy), dx, 0)
    np.testing.assert_array_equal(device.get(dx, a.shape), dx_cpu)


def test_tile_forward_and_backward(device):
    x = rand((2, 3, 4), 3)
    top_shape = (2, 9, 4)
    dy = rand(top_shape, 4)
    (top_cpu,), (dx_cpu,), _ = cpu_layer('type: "Tile" tile_param { axis: 1 tiles: 3 }', [x],
                                         top_diffs=[dy])
    top, dx = device.empty(top_shape), device.empty(x.shape)
    device.launcher.run(kernels.copy.tile_forward, top_cpu.size, device.put(x), 12, 3, top)
    np.testing.assert_array_equal(device.get(top, top_shape), top_cpu)
    device.launcher.run(kernels.copy.tile_backward, x.size, device.put(dy), 12, 3, dx)
    np.testing.assert_array_equal(device.get(dx, x.shape), dx_cpu)


# -- BatchNorm, Embed ------------------------------------------------------------------------
def test_batchnorm_statistics_normalisation_and_backward(device):
    x = rand((4, 3, 5), 1, -2.0, 3.0)
    dy = rand(x.shape, 2)
    eps = 1e-5
    (y_cpu,), (dx_cpu,), layer = cpu_layer(
        'type: "BatchNorm" batch_norm_param { use_global_stats: false eps: %g }' % eps, [x],
        top_diffs=[dy])
    k = device.launcher
    xd, mean, var, std = device.put(x), device.empty(3), device.empty(3), device.empty(3)
    k.run(kernels.batchnorm.channel_mean, 3, xd, 0, 4, 5, mean)
    k.run(kernels.batchnorm.channel_variance, 3, xd, mean, 4, 5, eps, var, std)
    np.testing.assert_array_equal(device.get(mean, 3),
                                  x.mean(axis=(0, 2), dtype=np.float64).astype(np.float32))
    np.testing.assert_array_equal(device.get(std, 3), layer._std)
    y = device.empty(x.shape)
    k.run(kernels.batchnorm.batchnorm_normalize, x.size, xd, mean, std, 3, 5, y)
    np.testing.assert_array_equal(device.get(y, x.shape), y_cpu)
    dyd, mean_dy, mean_dy_y, dx = device.put(dy), device.empty(3), device.empty(3), \
        device.empty(x.shape)
    k.run(kernels.batchnorm.channel_mean, 3, dyd, 0, 4, 5, mean_dy)
    k.run(kernels.batchnorm.channel_mean, 3, dyd, y, 4, 5, mean_dy_y)
    k.run(kernels.batchnorm.batchnorm_backward, x.size, dyd, y, mean_dy, mean_dy_y, std, 3, 5, 0,
          dx)
    close(device.get(dx, x.shape), dx_cpu, rtol=1e-5, atol=1e-6)
    # global statistics
    k.run(kernels.batchnorm.batchnorm_backward, x.size, dyd, y, 0, 0, std, 3, 5, 1, dx)
    close(device.get(dx, x.shape), dy / layer._std.reshape(1, 3, 1))


def test_embed_forward_and_backward(device):
    indices = np.array([[1, 3], [1, 0], [4, 1]], np.float32)
    layer_text = ('type: "Embed" embed_param { num_output: 3 input_dim: 5 bias_term: true '
                  'weight_filler { type: "gaussian" } bias_filler { type: "gaussian" } }')
    layer = make_layer(layer_text)
    bottom, top = [blob_from(indices)], [Blob(())]
    layer.setup(bottom, top)
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    dy = rand(top[0].shape, 3)
    top[0].diff[...] = dy
    w_diff0 = rand((5, 3), 4)
    layer.blobs[0].diff[...] = w_diff0
    layer.backward(top, [False], bottom)
    k, pi = device.launcher, device.put(indices)
    w, b, y = device.put(layer.blobs[0].data), device.put(layer.blobs[1].data), \
        device.empty(top[0].shape)
    k.run(kernels.embed.embed_forward, top[0].count, pi, w, 5, 3, b, y)
    np.testing.assert_array_equal(device.get(y, top[0].shape), top[0].data)
    wd = device.put(w_diff0)
    k.run(kernels.embed.embed_backward, 15, pi, device.put(dy), 6, 3, wd)
    np.testing.assert_array_equal(device.get(wd, (5, 3)), layer.blobs[0].diff)
    bad = device.put([1, 2.5, -1, 5])
    k.run(kernels.embed.embed_forward, 12, bad, w, 5, 3, 0, y)
    rows = device.get(y, (4, 3))
    np.testing.assert_array_equal(rows[0], layer.blobs[0].data[1])
    assert np.isnan(rows[1:]).all()                        # non-integer, negative, too large


# -- solver updates --------------------------------------------------------------------------
def _update_case(device, kernel, cpu, n_hist, *args):
    g, hists = rand(9, 1), [rand(9, 2 + i, 0.0, 1.0) for i in range(n_hist)]
    g_cpu, h_cpu = g.copy(), [h.copy() for h in hists]
    cpu(g_cpu, *h_cpu)
    gd, hd = device.put(g), [device.put(h) for h in hists]
    device.launcher.run(kernel, 9, gd, *hd, *args)
    close(device.get(gd, 9), g_cpu)
    for h, expected in zip(hd, h_cpu):
        close(device.get(h, 9), expected)


def test_update_rules(device):
    lr, k = 0.01, kernels.updates
    _update_case(device, k.sgd_update, lambda g, h: updates.sgd(g, h, lr, 0.9), 1, 0.9, lr)
    _update_case(device, k.nesterov_update, lambda g, h: updates.nesterov(g, h, lr, 0.9), 1,
                 0.9, lr)
    _update_case(device, k.adagrad_update, lambda g, h: updates.adagrad(g, h, lr, 1e-8), 1,
                 1e-8, lr)
    _update_case(device, k.rmsprop_update, lambda g, h: updates.rmsprop(g, h, lr, 0.98, 1e-8),
                 1, 0.98, 1e-8, lr)
    _update_case(device, k.adadelta_update,
                 lambda g, h, h2: updates.adadelta(g, h, h2, lr, 0.95, 1e-6), 2, 0.95, 1e-6, lr)
    t, b1, b2 = 3, 0.9, 0.999
    corrected = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    _update_case(device, k.adam_update,
                 lambda g, m, v: updates.adam(g, m, v, lr, b1, b2, 1e-8, t), 2, b1, b2, 1e-8,
                 corrected)
