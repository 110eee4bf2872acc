"""Vision layers: forward values against naive loops written here, gradients against finite
differences (tests/gradcheck.py), Caffe's output-size rules and errors."""
import itertools
import math

import numpy as np
import pytest

from gradcheck import blob_from, check_gradient, make_layer
from poseidon_caffe import rng as prng
from poseidon_caffe.blob import Blob
from poseidon_caffe.layers import LayerError


def _rand(shape, seed=0, low=-1.0, high=1.0):
    return np.random.RandomState(seed).uniform(low, high, shape).astype(np.float32)


def _distinct(shape, seed=0):
    """Values at least 0.05 apart, so a 1e-2 step never changes which element is the max."""
    n = int(np.prod(shape))
    return (np.random.RandomState(seed).permutation(n) * 0.05 - n * 0.025).reshape(
        shape).astype(np.float32)


def _setup(layer, bottoms, ntops=1):
    top = [Blob(()) for _ in range(ntops)]
    layer.check_blob_counts(bottoms, top)
    layer.setup(bottoms, top)
    layer.reshape(bottoms, top)
    layer.forward(bottoms, top)
    return top


# -- naive references ------------------------------------------------------------------------
def naive_conv(x, w, b, stride, pad, dilation, group):
    """Direct N-d convolution: every output position and kernel tap visited by index."""
    n, c = x.shape[:2]
    m = w.shape[0]
    kernel = w.shape[2:]
    spatial = x.shape[2:]
    out_shape = [(i + 2 * p - (d * (k - 1) + 1)) // s + 1
                 for i, k, s, p, d in zip(spatial, kernel, stride, pad, dilation)]
    y = np.zeros((n, m) + tuple(out_shape), dtype=np.float64)
    cg, mg = c // group, m // group
    for g in range(group):
        for o in itertools.product(*(range(v) for v in out_shape)):
            for tap in itertools.product(*(range(k) for k in kernel)):
                pos = [oo * s - p + t * d for oo, s, p, t, d in
                       zip(o, stride, pad, tap, dilation)]
                if any(q < 0 or q >= size for q, size in zip(pos, spatial)):
                    continue
                xin = x[(slice(None), slice(g * cg, (g + 1) * cg)) + tuple(pos)]   # (n, cg)
                wt = w[(slice(g * mg, (g + 1) * mg), slice(None)) + tap]            # (mg, cg)
                y[(slice(None), slice(g * mg, (g + 1) * mg)) + o] += xin @ wt.T
    if b is not None:
        y += b.reshape((1, -1) + (1,) * len(kernel))
    return y


def naive_deconv(x, w, b, stride, pad, dilation, group):
    """Direct transposed convolution: each input element scatters its weighted kernel."""
    n, c = x.shape[:2]
    mg = w.shape[1]
    kernel = w.shape[2:]
    m = mg * group
    cg = c // group
    out_shape = [s * (i - 1) + d * (k - 1) + 1 - 2 * p for i, k, s, p, d in
                 zip(x.shape[2:], kernel, stride, pad, dilation)]
    y = np.zeros((n, m) + tuple(out_shape))
    for g in range(group):
        for i in itertools.product(*(range(v) for v in x.shape[2:])):
            for tap in itertools.product(*(range(k) for k in kernel)):
                pos = [ii * s - p + t * d for ii, s, p, t, d in zip(i, stride, pad, tap, dilation)]
                if any(q < 0 or q >= size for q, size in zip(pos, out_shape)):
                    continue
                xin = x[(slice(None), slice(g * cg, (g + 1) * cg)) + i]              # (n, cg)
                wt = w[(slice(g * cg, (g + 1) * cg), slice(None)) + tap]             # (cg, mg)
                y[(slice(None), slice(g * mg, (g + 1) * mg)) + tuple(pos)] += xin @ wt
    if b is not None:
        y += b.reshape((1, -1) + (1,) * len(kernel))
    return y


def caffe_pooled(size, k, s, p):
    pooled = int(math.ceil((size + 2 * p - k) / float(s))) + 1
    if p and (pooled - 1) * s >= size + p:
        pooled -= 1
    return pooled


def naive_pool(x, k, s, p, method, out=None):
    """Caffe's pooling loops: returns (top, mask) with mask the flat argmax (MAX only)."""
    n, c, h, w = x.shape
    kh, kw = k
    sh, sw = s
    ph, pw = p
    oh, ow = out or (caffe_pooled(h, kh, sh, ph), caffe_pooled(w, kw, sw, pw))
    y = np.zeros((n, c, oh, ow))
    mask = np.full((n, c, oh, ow), -1)
    for a in range(n):
        for b in range(c):
            for i in range(oh):
                for j in range(ow):
                    hs, ws = i * sh - ph, j * sw - pw
                    he, we = min(hs + kh, h + ph), min(ws + kw, w + pw)
                    size = (he - hs) * (we - ws)
                    hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
                    if method == "max":
                        best = -np.inf
                        for u in range(hs, he):
                            for v in range(ws, we):
                                if x[a, b, u, v] > best:
                                    best = x[a, b, u, v]
                                    mask[a, b, i, j] = u * w + v
                        y[a, b, i, j] = best
                    else:
                        y[a, b, i, j] = x[a, b, hs:he, ws:we].sum() / size
    return y, mask


@pytest.fixture(params=["im2col", "im2col_by_image", "fft", "direct"])
def algorithm(request, monkeypatch):
    """Run a test once per convolution algorithm (FFT where the geometry allows it; im2col
    with columns image by image wherever it takes the geometry, i.e. one group; the direct
    kernels where they serve the geometry on this CPU)."""
    from poseidon_caffe.backend.cpu import backend as cpu, conv, direct
    choice = request.param
    monkeypatch.setattr(conv, "BY_IMAGE_MIN_OUTPUTS", 1 if choice == "im2col_by_image" else 10 ** 9)
    if choice == "im2col_by_image":
        choice = "im2col"

    def chosen(geom, batch, parts=1):
        if choice == "direct":
            return "direct" if direct.serves(geom) else "im2col"
        return choice if all(s == 1 for s in geom.stride) else "im2col"
    monkeypatch.setattr(cpu, "conv_algorithm", chosen)
    return choice


def conv_layer(extra, num_output=4, bias=True, kind="Convolution"):
    return make_layer("""name: "c" type: "%s"
        convolution_param { num_output: %d bias_term: %s %s
          weight_filler { type: "gaussian" std: 0.5 }
          bias_filler { type: "uniform" min: -1 max: 1 } }"""
                      % (kind, num_output, "true" if bias else "false", extra))


CONV_CASES = [
    # (prototxt extra, input shape, num_output, bias)
    ("kernel_size: 3", (2, 3, 5, 5), 4, True),
    ("kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 0", (2, 3, 6, 5), 4, True),
    ("kernel_size: 3 group: 2 pad: 1 stride: 2", (2, 4, 5, 6), 6, False),
    ("kernel_size: 3 dilation: 2 pad: 2", (2, 2, 6, 6), 3, True),
    ("kernel_size: 2 kernel_size: 3 dilation: 2 dilation: 1 stride: 1 stride: 2", (1, 2, 6, 7), 2,
     True),
    ("kernel_size: 1", (2, 5, 3, 4), 3, True),
    ("kernel_size: 2 pad: 1 stride: 2", (2, 2, 3, 4, 4), 3, True),           # 3-D
]


# -- Convolution -----------------------------------------------------------------------------
@pytest.mark.parametrize("extra,shape,m,bias", CONV_CASES)
def test_convolution_forward_matches_naive_loops(extra, shape, m, bias, algorithm):
    layer = conv_layer(extra, m, bias)
    x = blob_from(_rand(shape, 1))
    top = _setup(layer, [x])
    cp = layer.param.convolution_param
    nd = len(shape) - 2
    want = naive_conv(x.data.astype(np.float64), layer.blobs[0].data.astype(np.float64),
                      layer.blobs[1].data if bias else None, layer.stride, layer.pad,
                      layer.dilation, cp.group)
    assert top[0].shape == want.shape
    assert layer.blobs[0].shape == (m, shape[1] // cp.group) + tuple(layer.kernel)
    assert len(layer.blobs) == (2 if bias else 1) and nd == len(layer.kernel)
    from poseidon_caffe.backend.cpu import direct
    fft = algorithm == "fft" and all(s == 1 for s in layer.stride)
    plan = layer._plans[0]
    if type(plan).__name__ == "SplitConvPlan":         # batch parts on two threads
        plan = plan._make_plan(1)
    if type(plan).__name__ == "ChunkedConvPlan":       # columns in the threads' scratch
        plan = plan._make_plan(1, None)
        assert plan.shared and not plan.by_image
    served = algorithm == "direct" and direct.serves(plan.geom)
    assert type(plan).__name__ == ("FFTConvPlan" if fft else
                                   "DirectConvPlan" if served else "ConvPlan")
    np.testing.assert_allclose(top[0].data, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("extra,shape,m,bias", CONV_CASES)
def test_convolution_gradient(extra, shape, m, bias, algorithm):
    layer = conv_layer(extra, m, bias)
    check_gradient(layer, [blob_from(_rand(shape, 2))], [Blob(())], max_checks=60)


def test_convolution_axis_treats_leading_axes_as_samples(algorithm):
    layer = conv_layer("kernel_size: 2 axis: 2", 3)
    x = _rand((2, 2, 3, 4, 4), 3)
    top = _setup(layer, [blob_from(x)])
    assert top[0].shape == (2, 2, 3, 3, 3)
    want = naive_conv(x.reshape(4, 3, 4, 4), layer.blobs[0].data, layer.blobs[1].data,
                      [1, 1], [0, 0], [1, 1], 1)
    np.testing.assert_allclose(top[0].data.reshape(want.shape), want, rtol=1e-4, atol=1e-4)


def test_convolution_two_bottoms_share_weights(algorithm):
    layer = conv_layer("kernel_size: 3 pad: 1", 2)
    bottoms = [blob_from(_rand((1, 2, 4, 4), s)) for s in (4, 5)]
    tops = [Blob(()), Blob(())]
    check_gradient(layer, bottoms, tops, max_checks=40)
    for b, t in zip(bottoms, tops):
        want = naive_conv(b.data, layer.blobs[0].data, layer.blobs[1].data, [1, 1], [1, 1],
                          [1, 1], 1)
        np.testing.assert_allclose(t.data, want, rtol=1e-4, atol=1e-4)


def test_convolution_keeps_given_blobs_and_checks_their_shape():
    layer = conv_layer("kernel_size: 3", 2)
    w = Blob((2, 3, 3, 3))
    w.data[...] = 7
    b = Blob((1, 1, 1, 2))           # a legacy bias shape
    layer.blobs = [w, b]
    _setup(layer, [blob_from(np.ones((1, 3, 3, 3)))])
    assert layer.blobs[0] is w and layer.blobs[1].shape == (2,)
    assert np.all(layer.blobs[0].data == 7)
    bad = conv_layer("kernel_size: 3", 2)
    bad.blobs = [Blob((2, 3, 2, 2)), Blob((2,))]
    with pytest.raises(LayerError, match="incorrect weight shape"):
        _setup(bad, [blob_from(np.ones((1, 3, 3, 3)))])


@pytest.mark.parametrize("extra,message", [
    ("kernel_size: 3 group: 2", "multiple of group"),
    ("kernel_size: 3 kernel_h: 3", "not both"),
    ("kernel_h: 3", "both kernel_h and kernel_w"),
    ("stride: 1", "kernel_size"),
    ("kernel_size: 3 kernel_size: 3 kernel_size: 3", "once per spatial dimension"),
    ("kernel_size: 9", "does not fit"),
])
def test_convolution_errors_name_the_layer(extra, message):
    layer = conv_layer(extra, 4)
    with pytest.raises(LayerError, match=message) as info:
        _setup(layer, [blob_from(np.ones((1, 3, 5, 5)))])
    assert "'c'" in str(info.value) and "Convolution" in str(info.value)


# -- Deconvolution ---------------------------------------------------------------------------
DECONV_CASES = [
    ("kernel_size: 3", (2, 3, 3, 3), 2, True),
    ("kernel_size: 4 stride: 2 pad: 1", (2, 2, 3, 4), 3, True),
    ("kernel_size: 3 stride: 2 group: 2 dilation: 2", (1, 4, 3, 3), 6, False),
    ("kernel_h: 2 kernel_w: 3 stride_h: 1 stride_w: 2 pad_h: 1 pad_w: 0", (1, 2, 3, 3), 2, True),
]


@pytest.mark.parametrize("extra,shape,m,bias", DECONV_CASES)
def test_deconvolution_forward_matches_naive_scatter(extra, shape, m, bias, algorithm):
    layer = conv_layer(extra, m, bias, kind="Deconvolution")
    x = _rand(shape, 6)
    top = _setup(layer, [blob_from(x)])
    group = layer.param.convolution_param.group
    assert layer.blobs[0].shape == (shape[1], m // group) + tuple(layer.kernel)
    want = naive_deconv(x, layer.blobs[0].data, layer.blobs[1].data if bias else None,
                        layer.stride, layer.pad, layer.dilation, group)
    assert top[0].shape == want.shape
    np.testing.assert_allclose(top[0].data, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("extra,shape,m,bias", DECONV_CASES)
def test_deconvolution_gradient(extra, shape, m, bias, algorithm):
    layer = conv_layer(extra, m, bias, kind="Deconvolution")
    check_gradient(layer, [blob_from(_rand(shape, 7))], [Blob(())], max_checks=60)


# -- Pooling ---------------------------------------------------------------------------------
def pool_layer(extra, method="MAX"):
    return make_layer('name: "p" type: "Pooling" pooling_param { pool: %s %s }' % (method, extra))


@pytest.mark.parametrize("shape,k,s,p,out", [
    ((2, 3, 7, 7), 3, 2, 1, 4),        # odd size with padding
    ((1, 2, 5, 5), 2, 2, 1, 3),        # the last window would start in the pad: clipped
    ((1, 2, 6, 6), 3, 2, 0, 3),        # rounded up: the last window overhangs
    ((1, 1, 4, 4), 2, 2, 0, 2),
])
@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_pooling_output_size_and_values(shape, k, s, p, out, method):
    layer = pool_layer("kernel_size: %d stride: %d pad: %d" % (k, s, p), method)
    x = _distinct(shape, 8)
    tops = _setup(layer, [blob_from(x)], 2 if method == "MAX" else 1)
    assert tops[0].shape == shape[:2] + (out, out)
    want, mask = naive_pool(x.astype(np.float64), (k, k), (s, s), (p, p), method.lower())
    np.testing.assert_allclose(tops[0].data, want, rtol=1e-5, atol=1e-6)
    if method == "MAX":
        np.testing.assert_array_equal(tops[1].data, mask)


def test_pooling_rectangular_and_floor_rounding():
    layer = pool_layer("kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 3 pad_h: 1 pad_w: 1 "
                       "round_mode: FLOOR", "AVE")
    x = _rand((2, 2, 6, 7), 9)
    top = _setup(layer, [blob_from(x)])
    oh, ow = (6 + 2 - 3) // 2 + 1, (7 + 2 - 2) // 3 + 1
    assert top[0].shape == (2, 2, oh, ow)
    want, _ = naive_pool(x, (3, 2), (2, 3), (1, 1), "ave", out=(oh, ow))
    np.testing.assert_allclose(top[0].data, want, rtol=1e-5, atol=1e-6)


def test_pooling_max_ties_take_the_first_in_row_major_order():
    x = np.zeros((1, 1, 2, 2), np.float32)
    tops = _setup(pool_layer("kernel_size: 2"), [blob_from(x)], 2)
    assert tops[1].data.ravel().tolist() == [0.0]


@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_global_pooling(method):
    layer = pool_layer("global_pooling: true", method)
    x = _rand((2, 3, 4, 5), 10)
    top = _setup(layer, [blob_from(x)])
    assert top[0].shape == (2, 3, 1, 1)
    want = x.max(axis=(2, 3)) if method == "MAX" else x.mean(axis=(2, 3))
    np.testing.assert_allclose(top[0].data[:, :, 0, 0], want, rtol=1e-5)


@pytest.mark.parametrize("method,extra", [
    ("MAX", "kernel_size: 3 stride: 2 pad: 1"),
    ("MAX", "kernel_h: 2 kernel_w: 3 stride_h: 1 stride_w: 2"),
    ("MAX", "global_pooling: true"),
    ("AVE", "kernel_size: 3 stride: 2 pad: 1"),
    ("AVE", "kernel_size: 2 stride: 2 pad: 1"),
    ("AVE", "global_pooling: true"),
])
def test_pooling_gradient(method, extra):
    layer = pool_layer(extra, method)
    check_gradient(layer, [blob_from(_distinct((2, 2, 5, 6), 11))], [Blob(())], max_checks=80,
                   top_indices=[0])


def test_stochastic_pooling_test_phase_forward_and_gradient():
    layer = make_layer('name: "p" type: "Pooling" phase: TEST '
                       'pooling_param { pool: STOCHASTIC kernel_size: 3 stride: 2 }')
    x = _rand((2, 2, 6, 6), 12, 0.1, 1.0)
    top = _setup(layer, [blob_from(x)])
    assert top[0].shape == (2, 2, 3, 3)
    for i in range(3):
        for j in range(3):
            win = x[:, :, 2 * i:min(2 * i + 3, 6), 2 * j:min(2 * j + 3, 6)]
            want = (win ** 2).sum(axis=(2, 3)) / win.sum(axis=(2, 3))
            np.testing.assert_allclose(top[0].data[:, :, i, j], want, rtol=1e-5)
    check_gradient(layer, [blob_from(x)], [Blob(())], max_checks=60)


def test_stochastic_pooling_train_samples_by_probability_and_routes_the_gradient():
    prng.set_random_seed(3)
    layer = make_layer('name: "p" type: "Pooling" phase: TRAIN '
                       'pooling_param { pool: STOCHASTIC kernel_size: 2 stride: 2 }')
    window = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    x = np.tile(window, (4000, 1, 1, 1))
    bottom = blob_from(x)
    top = _setup(layer, [bottom])
    drawn = top[0].data.ravel()
    freq = np.array([(drawn == v).mean() for v in (1, 2, 3, 4)])
    np.testing.assert_allclose(freq, [0.1, 0.2, 0.3, 0.4], atol=0.03)
    # the gradient goes to exactly the drawn element of each window
    top[0].diff[...] = np.arange(4000, dtype=np.float32).reshape(top[0].shape) + 1
    layer.backward(top, [True], [bottom])
    d = bottom.diff.reshape(4000, 4)
    assert np.all((d != 0).sum(axis=1) == 1)
    picked = d.argmax(axis=1)
    np.testing.assert_array_equal(window.ravel()[picked], drawn)
    np.testing.assert_array_equal(d.max(axis=1), np.arange(4000) + 1)


@pytest.mark.parametrize("extra,message", [
    ("kernel_size: 3 pad: 1", "padding is implemented only"),
    ("global_pooling: true kernel_size: 3", "global_pooling"),
    ("kernel_h: 3", "kernel_h and kernel_w"),
    ("kernel_size: 2 pad: 2", "smaller than the kernel"),
])
def test_pooling_errors(extra, message):
    method = "STOCHASTIC" if "pad: 1" in extra else "MAX"
    with pytest.raises(LayerError, match=message) as info:
        _setup(pool_layer(extra, method), [blob_from(np.ones((1, 1, 5, 5)))])
    assert "Pooling layer 'p'" in str(info.value)


def test_pooling_mask_top_only_for_max():
    with pytest.raises(LayerError):
        _setup(pool_layer("kernel_size: 2", "AVE"), [blob_from(np.ones((1, 1, 4, 4)))], 2)


# -- SPP -------------------------------------------------------------------------------------
def spp_reference(x, height, method):
    n, c, h, w = x.shape
    parts = []
    for level in range(height):
        bins = 2 ** level
        kh, kw = -(-h // bins), -(-w // bins)
        ph, pw = (kh * bins - h + 1) // 2, (kw * bins - w + 1) // 2
        y, _ = naive_pool(x, (kh, kw), (kh, kw), (ph, pw), method)
        assert y.shape[2:] == (bins, bins)
        parts.append(y.reshape(n, -1))
    return np.concatenate(parts, axis=1)


@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_spp_forward_and_gradient(method):
    layer = make_layer('name: "s" type: "SPP" spp_param { pyramid_height: 3 pool: %s }' % method)
    x = _distinct((2, 2, 9, 10), 13)
    top = _setup(layer, [blob_from(x)])
    assert top[0].shape == (2, 2 * (1 + 4 + 16))
    np.testing.assert_allclose(top[0].data, spp_reference(x, 3, method.lower()), rtol=1e-5,
                               atol=1e-6)
    check_gradient(layer, [blob_from(x)], [Blob(())], max_checks=80)


def test_spp_single_level_is_global_pooling():
    layer = make_layer('name: "s" type: "SPP" spp_param { pyramid_height: 1 }')
    x = _rand((2, 3, 4, 4), 14)
    top = _setup(layer, [blob_from(x)])
    assert top[0].shape == (2, 3, 1, 1)
    np.testing.assert_allclose(top[0].data[:, :, 0, 0], x.max(axis=(2, 3)))


# -- LRN -------------------------------------------------------------------------------------
def naive_lrn(x, size, alpha, beta, k, across):
    n, c, h, w = x.shape
    half = (size - 1) // 2
    y = np.zeros_like(x, dtype=np.float64)
    for a, ch, i, j in itertools.product(range(n), range(c), range(h), range(w)):
        if across:
            lo, hi = max(0, ch - half), min(c, ch + half + 1)
            s = k + alpha / size * (x[a, lo:hi, i, j].astype(np.float64) ** 2).sum()
        else:
            win = x[a, ch, max(0, i - half):i + half + 1, max(0, j - half):j + half + 1]
            s = 1.0 + alpha / size ** 2 * (win.astype(np.float64) ** 2).sum()
        y[a, ch, i, j] = x[a, ch, i, j] * s ** -beta
    return y


@pytest.mark.parametrize("region,size,alpha,beta,k", [
    ("ACROSS_CHANNELS", 5, 1.0, 0.75, 1.0),
    ("ACROSS_CHANNELS", 3, 2.0, 0.6, 2.0),
    ("WITHIN_CHANNEL", 3, 1.5, 0.75, 1.0),
    ("WITHIN_CHANNEL", 5, 2.0, 0.5, 3.0),      # k is not used within a channel, as in Caffe
])
def test_lrn_forward_and_gradient(region, size, alpha, beta, k):
    layer = make_layer('name: "n" type: "LRN" lrn_param { local_size: %d alpha: %g beta: %g '
                       'k: %g norm_region: %s }' % (size, alpha, beta, k, region))
    x = _rand((2, 7, 4, 5), 15, -2, 2)
    top = _setup(layer, [blob_from(x)])
    want = naive_lrn(x, size, alpha, beta, k, region == "ACROSS_CHANNELS")
    np.testing.assert_allclose(top[0].data, want, rtol=1e-5, atol=1e-6)
    check_gradient(layer, [blob_from(x)], [Blob(())], max_checks=100)


def test_lrn_even_size_is_refused():
    with pytest.raises(LayerError, match="odd values for local_size"):
        _setup(make_layer('name: "n" type: "LRN" lrn_param { local_size: 4 }'),
               [blob_from(np.ones((1, 4, 2, 2)))])


# -- Im2col ----------------------------------------------------------------------------------
@pytest.mark.parametrize("extra,shape", [
    ("kernel_size: 3 pad: 1 stride: 2", (2, 2, 5, 6)),
    ("kernel_h: 2 kernel_w: 3 dilation: 2", (1, 3, 5, 7)),
])
def test_im2col_forward_and_gradient(extra, shape):
    layer = make_layer('name: "i" type: "Im2col" convolution_param { %s }' % extra)
    x = _rand(shape, 16)
    top = _setup(layer, [blob_from(x)])
    k, s, p, d = layer.kernel, layer.stride, layer.pad, layer.dilation
    c = shape[1]
    assert top[0].shape[:2] == (shape[0], c * k[0] * k[1])
    oh, ow = top[0].shape[2:]
    for ch, i, j, y, xx in itertools.product(range(c), range(k[0]), range(k[1]), range(oh),
                                             range(ow)):
        r, q = y * s[0] - p[0] + i * d[0], xx * s[1] - p[1] + j * d[1]
        inside = 0 <= r < shape[2] and 0 <= q < shape[3]
        want = x[:, ch, r, q] if inside else 0
        np.testing.assert_array_equal(top[0].data[:, (ch * k[0] + i) * k[1] + j, y, xx], want)
    check_gradient(layer, [blob_from(x)], [Blob(())], max_checks=80)


# -- Crop ------------------------------------------------------------------------------------
@pytest.mark.parametrize("params,want", [
    ("axis: 2 offset: 1 offset: 2", (slice(None), slice(None), slice(1, 4), slice(2, 4))),
    ("axis: 1 offset: 1", (slice(None), slice(1, 3), slice(1, 4), slice(1, 3))),
    ("axis: 2", (slice(None), slice(None), slice(0, 3), slice(0, 2))),
])
def test_crop_forward_and_gradient(params, want):
    layer = make_layer('name: "cr" type: "Crop" crop_param { %s }' % params)
    x = _rand((2, 3, 5, 4), 17)
    ref = blob_from(np.zeros((2, 2, 3, 2)))
    top = _setup(layer, [blob_from(x), ref])
    np.testing.assert_array_equal(top[0].data, x[want])
    check_gradient(layer, [blob_from(x), ref], [Blob(())], check_bottom=[0])


def test_crop_errors():
    layer = make_layer('name: "cr" type: "Crop" crop_param { axis: 2 offset: 3 }')
    with pytest.raises(LayerError, match="invalid crop parameters in dimension 2"):
        _setup(layer, [blob_from(np.ones((1, 1, 5, 5))), blob_from(np.ones((1, 1, 3, 3)))])
    layer = make_layer('name: "cr" type: "Crop" crop_param { axis: 1 offset: 0 offset: 0 }')
    with pytest.raises(LayerError, match="number of offset values"):
        _setup(layer, [blob_from(np.ones((1, 1, 5, 5))), blob_from(np.ones((1, 1, 3, 3)))])


# -- batch parts on two threads: the same values as the whole batch ---------------------------
def _run_layer(make, x, seed, split_threads, monkeypatch):
    """forward, bottom diff and parameter diffs (added into ones) of a fresh layer built while
    the backend cuts batches over ``split_threads`` threads."""
    from poseidon_caffe.backend import get_backend
    monkeypatch.setattr(get_backend(), "split_threads", split_threads)
    prng.set_random_seed(seed)
    layer = make()
    bottom = blob_from(x)
    top = _setup(layer, [bottom])
    for p in layer.blobs:
        p.diff[...] = 1
    top[0].diff[...] = _rand(top[0].shape, 61)
    layer.backward(top, [True], [bottom])
    return [top[0].data.copy(), bottom.diff.copy()] + [p.diff.copy() for p in layer.blobs]


@pytest.mark.parametrize("make,shape", [
    (lambda: conv_layer("kernel_size: 3 pad: 1 group: 2", 4), (5, 4, 6, 6)),
    (lambda: conv_layer("kernel_size: 3 stride: 2", 3), (5, 2, 7, 7)),
    (lambda: conv_layer("kernel_size: 3 stride: 2 pad: 1 group: 2", 4, kind="Deconvolution"),
     (5, 2, 4, 4)),
    (lambda: conv_layer("kernel_size: 2 dilation: 2", 3, kind="Deconvolution"), (3, 2, 4, 5)),
], ids=["conv-group", "conv-strided", "deconv-group", "deconv-dilated"])
def test_convolution_in_batch_parts_matches_the_whole_batch(make, shape, algorithm,
                                                            monkeypatch):
    x = _rand(shape, 60)
    split = _run_layer(make, x, 7, 2, monkeypatch)
    whole = _run_layer(make, x, 7, 1, monkeypatch)
    for got, want in zip(split, whole):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method,extra", [
    ("MAX", "kernel_size: 3 stride: 2 pad: 1"), ("AVE", "kernel_size: 3 stride: 2"),
    ("STOCHASTIC", "kernel_size: 2 stride: 2")])
def test_pooling_in_batch_parts_matches_the_whole_batch(method, extra, monkeypatch):
    x = np.abs(_distinct((5, 3, 7, 7), 62)) + 0.1
    split = _run_layer(lambda: pool_layer(extra, method), x, 8, 2, monkeypatch)
    whole = _run_layer(lambda: pool_layer(extra, method), x, 8, 1, monkeypatch)
    for got, want in zip(split, whole):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
