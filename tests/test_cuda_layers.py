"""Layers on the emulated device: each layer type with a device path gives the CPU's tops
(rel 1e-5) and gradients (rel 1e-4) from the same inputs, weights and random draws, and passes
the finite-difference gradient check in GPU mode; a layer without one refuses GPU mode."""
import numpy as np
import pytest

from poseidon_caffe import backend
from poseidon_caffe import rng as prng
from poseidon_caffe.blob import Blob, SyncedBlob
from poseidon_caffe.layers.base import LayerError

from emulated_device import gpu_mode, needs_compiler  # noqa: F401 (a fixture)
from gradcheck import check_gradient, make_layer

pytestmark = needs_compiler


def labels(shape, classes, seed):
    return lambda: np.random.RandomState(seed).randint(0, classes, shape).astype(np.float32)


def uniform(shape, seed, lo=-1.0, hi=1.0):
    return lambda: np.random.RandomState(seed).uniform(lo, hi, shape).astype(np.float32)


CONV = """name: "c" type: "Convolution" convolution_param { num_output: 4 kernel_size: 3
  stride: 2 pad: 1 group: 2 weight_filler { type: "gaussian" std: 0.3 }
  bias_filler { type: "gaussian" std: 0.3 } }"""
# (id, layer text, bottoms, tops, gradient check: None (none) or dict of its arguments)
CASES = [
    ("Convolution", CONV, [uniform((2, 4, 7, 6), 1)], 1, {}),
    ("Convolution-1x1", CONV.replace("kernel_size: 3", "kernel_size: 1").replace(
        "stride: 2 pad: 1 group: 2", ""), [uniform((2, 3, 4, 4), 2)], 1, {}),
    # 1x1 reads each image as its columns (cuda/conv.py's pointwise plan), by group too
    ("Convolution-1x1-groups", CONV.replace("kernel_size: 3", "kernel_size: 1").replace(
        "stride: 2 pad: 1 ", ""), [uniform((2, 4, 3, 5), 61)], 1, {}),
    ("Convolution-1x1-stride-2", CONV.replace("kernel_size: 3", "kernel_size: 1").replace(
        "pad: 1 ", ""), [uniform((2, 4, 5, 5), 62)], 1, {}),
    ("Pooling-MAX", 'name: "p" type: "Pooling" pooling_param { pool: MAX kernel_size: 3 '
     'stride: 2 pad: 1 }', [uniform((2, 3, 7, 7), 3)], 2, {"top_indices": [0]}),
    ("Pooling-AVE", 'name: "p" type: "Pooling" pooling_param { pool: AVE kernel_size: 3 '
     'stride: 2 }', [uniform((2, 3, 7, 6), 4)], 1, {}),
    ("Pooling-STOCHASTIC", 'name: "p" type: "Pooling" pooling_param { pool: STOCHASTIC '
     'kernel_size: 2 stride: 2 }', [uniform((2, 3, 6, 6), 5, 0.1, 1.0)], 1, None),
    ("Pooling-STOCHASTIC-TEST", 'name: "p" type: "Pooling" phase: TEST pooling_param { '
     'pool: STOCHASTIC kernel_size: 2 stride: 2 }', [uniform((2, 3, 6, 6), 5, 0.1, 1.0)], 1,
     {}),
    ("InnerProduct", 'name: "ip" type: "InnerProduct" inner_product_param { num_output: 5 '
     'weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "gaussian" std: 0.3 } }',
     [uniform((3, 2, 2, 2), 6)], 1, {}),
    ("InnerProduct-transpose", 'name: "ip" type: "InnerProduct" inner_product_param { '
     'num_output: 5 transpose: true weight_filler { type: "gaussian" std: 0.3 } }',
     [uniform((3, 4), 7)], 1, {}),
    ("ReLU", 'name: "r" type: "ReLU"', [uniform((2, 3, 4), 8)], 1,
     {"kink": 0.0, "kink_range": 0.02}),
    ("ReLU-leaky", 'name: "r" type: "ReLU" relu_param { negative_slope: 0.1 }',
     [uniform((2, 3, 4), 9)], 1, {"kink": 0.0, "kink_range": 0.02}),
    ("ELU", 'name: "e" type: "ELU" elu_param { alpha: 0.5 }', [uniform((2, 3, 4), 21)], 1,
     {"kink": 0.0, "kink_range": 0.02}),
    ("Sigmoid", 'name: "s" type: "Sigmoid"', [uniform((2, 3, 4), 22, -3, 3)], 1, {}),
    ("TanH", 'name: "t" type: "TanH"', [uniform((2, 3, 4), 23)], 1, {}),
    ("AbsVal", 'name: "a" type: "AbsVal"', [uniform((2, 3, 4), 24)], 1,
     {"kink": 0.0, "kink_range": 0.02}),
    ("BNLL", 'name: "b" type: "BNLL"', [uniform((2, 3, 4), 25, -3, 3)], 1, {}),
    ("Power", 'name: "p" type: "Power" power_param { power: 2.5 scale: 0.5 shift: 1.5 }',
     [uniform((2, 3, 4), 26)], 1, {}),
    ("Exp", 'name: "e" type: "Exp" exp_param { base: 2 scale: 0.5 shift: 0.3 }',
     [uniform((2, 3, 4), 27)], 1, {}),
    ("Log", 'name: "l" type: "Log" log_param { base: 10 scale: 0.5 shift: 1.5 }',
     [uniform((2, 3, 4), 28)], 1, {}),
    ("Threshold", 'name: "t" type: "Threshold" threshold_param { threshold: 0.2 }',
     [uniform((2, 3, 4), 29)], 1, None),
    ("Clip", 'name: "c" type: "Clip" clip_param { min: -0.5 max: 0.4 }',
     [uniform((2, 3, 4), 30)], 1, {"kink": 0.4, "kink_range": 0.02}),
    ("Swish", 'name: "s" type: "Swish" swish_param { beta: 1.5 }', [uniform((2, 3, 4), 31)],
     1, {}),
    ("Dropout", 'name: "d" type: "Dropout" dropout_param { dropout_ratio: 0.3 }',
     [uniform((4, 5), 10)], 1, {}),
    ("LRN", 'name: "n" type: "LRN" lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 }',
     [uniform((2, 5, 3, 3), 11)], 1, {}),
    ("LRN-within", 'name: "n" type: "LRN" lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 '
     'norm_region: WITHIN_CHANNEL }', [uniform((2, 2, 4, 4), 12)], 1, {}),
    ("Softmax", 'name: "s" type: "Softmax"', [uniform((3, 4, 2), 13)], 1, {}),
    ("SoftmaxWithLoss", 'name: "l" type: "SoftmaxWithLoss" loss_param { ignore_label: 1 }',
     [uniform((4, 5, 2), 14), labels((4, 2), 5, 15)], 2,
     {"check_bottom": [0], "top_indices": [0]}),
    ("Accuracy", 'name: "a" type: "Accuracy" accuracy_param { top_k: 2 }',
     [uniform((6, 4), 16), labels((6,), 4, 17)], 2, None),
    ("Split", 'name: "s" type: "Split"', [uniform((3, 4), 18)], 2, {}),
    ("Eltwise-SUM", 'name: "e" type: "Eltwise" eltwise_param { operation: SUM coeff: 0.5 '
     'coeff: -2 coeff: 1 }', [uniform((2, 3, 2), s) for s in (32, 33, 34)], 1, {}),
    ("Eltwise-PROD", 'name: "e" type: "Eltwise" eltwise_param { operation: PROD }',
     [uniform((2, 3, 2), s) for s in (35, 36, 37)], 1, {}),
    ("Eltwise-PROD-stable", 'name: "e" type: "Eltwise" eltwise_param { operation: PROD '
     'stable_prod_grad: true }', [uniform((2, 5), s) for s in (38, 39)], 1, {}),
    ("Eltwise-MAX", 'name: "e" type: "Eltwise" eltwise_param { operation: MAX }',
     [uniform((2, 3, 2), s) for s in (40, 41, 42)], 1, {}),
    ("Concat", 'name: "c" type: "Concat" concat_param { axis: 1 }',
     [uniform((2, 3, 2), 43), uniform((2, 1, 2), 44)], 1, {}),
    ("Slice", 'name: "s" type: "Slice" slice_param { axis: 2 slice_point: 1 slice_point: 3 }',
     [uniform((2, 3, 5), 45)], 3, {}),
    ("Flatten", 'name: "f" type: "Flatten"', [uniform((2, 3, 2), 19)], 1, {}),
    ("Deconvolution", CONV.replace("Convolution", "Deconvolution"),
     [uniform((2, 4, 3, 4), 46)], 1, {}),
    ("Deconvolution-1x1-groups", CONV.replace("Convolution", "Deconvolution").replace(
        "kernel_size: 3", "kernel_size: 1").replace("stride: 2 pad: 1 ", ""),
     [uniform((2, 4, 3, 4), 63)], 1, {}),
    ("Crop", 'name: "c" type: "Crop" crop_param { axis: 1 offset: 1 offset: 2 offset: 0 }',
     [uniform((2, 3, 5, 4), 47), uniform((2, 2, 2, 3), 48)], 1, {"check_bottom": [0]}),
    ("EuclideanLoss", 'name: "l" type: "EuclideanLoss"',
     [uniform((3, 4), 49), uniform((3, 2, 2), 50)], 1, {}),
    ("Silence", 'name: "s" type: "Silence"', [uniform((3, 4), 51)], 0, None),
    ("BatchNorm", 'name: "b" type: "BatchNorm"', [uniform((3, 4, 2, 2), 53)], 1, {}),
    ("BatchNorm-global", 'name: "b" type: "BatchNorm" batch_norm_param { use_global_stats: '
     'true }', [uniform((3, 4, 2, 2), 54)], 1, {}),
    ("Scale", 'name: "s" type: "Scale" scale_param { axis: 1 num_axes: 2 bias_term: true '
     'filler { type: "gaussian" std: 1 } bias_filler { type: "gaussian" std: 1 } }',
     [uniform((2, 3, 2, 2), 55)], 1, {}),
    ("Scale-bottom", 'name: "s" type: "Scale" scale_param { axis: 1 }',
     [uniform((2, 3, 4), 56), uniform((3,), 57)], 1, {}),
    ("Bias", 'name: "b" type: "Bias" bias_param { filler { type: "gaussian" std: 1 } }',
     [uniform((2, 3, 4), 58)], 1, {}),
    ("Bias-bottom", 'name: "b" type: "Bias" bias_param { axis: 0 }',
     [uniform((2, 3, 4), 59), uniform((2, 3), 60)], 1, {}),
    ("Embed", 'name: "e" type: "Embed" embed_param { num_output: 3 input_dim: 5 bias_term: '
     'true weight_filler { type: "gaussian" std: 1 } bias_filler { type: "gaussian" std: 1 } }',
     [labels((3, 2), 5, 61)], 1, {"check_bottom": []}),
    ("Im2col", 'name: "i" type: "Im2col" convolution_param { kernel_size: 2 stride: 1 pad: 1 }',
     [uniform((2, 2, 3, 3), 62)], 1, {}),
    ("SPP", 'name: "s" type: "SPP" spp_param { pyramid_height: 2 pool: MAX }',
     [uniform((2, 3, 5, 4), 63)], 1, {}),
    ("Tile", 'name: "t" type: "Tile" tile_param { axis: 1 tiles: 3 }',
     [uniform((2, 2, 3), 52)], 1, {}),
    ("Reshape", 'name: "r" type: "Reshape" reshape_param { shape { dim: 0 dim: -1 } }',
     [uniform((2, 3, 2), 20)], 1, {}),
]


def _run(text, bottoms, ntops, params=None, seed=5):
    """Forward and backward of one layer in the current mode: (tops, bottom diffs, params'
    data, params' diffs), host copies."""
    layer = make_layer(text)
    bottom = [Blob(b.shape) for b in bottoms]
    for blob, array in zip(bottom, bottoms):
        blob.data[...] = array
    top = [Blob() for _ in range(ntops)]
    layer.setup(bottom, top)
    layer.reshape(bottom, top)
    if params is not None:
        for blob, array in zip(layer.blobs, params):
            blob.data[...] = array
    prng.set_random_seed(seed)
    layer.forward(bottom, top)
    tops = [t.data.copy() for t in top]
    rs = np.random.RandomState(seed)
    for t in top:
        t.diff[...] = rs.uniform(-1, 1, t.shape)
    for p in layer.blobs:
        p.diff[...] = 0.5
    propagate = [layer.allow_force_backward(i) and text.find("Accuracy") < 0
                 for i in range(len(bottom))]
    layer.backward(top, propagate, bottom)
    return (tops, [b.diff.copy() for b, p in zip(bottom, propagate) if p],
            [p.data.copy() for p in layer.blobs], [p.diff.copy() for p in layer.blobs])


def _rel(got, want):
    scale = max(float(np.abs(want).max()), 1e-30) if want.size else 1.0
    return float(np.abs(got - want).max()) / scale if want.size else 0.0


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_layer_on_the_device_matches_the_cpu(gpu_mode, case):
    name, text, makers, ntops, _ = case
    bottoms = [m() for m in makers]
    backend.set_mode_cpu()
    tops, dbottoms, params, dparams = _run(text, bottoms, ntops)
    backend.set_mode_gpu()
    g_tops, g_dbottoms, _, g_dparams = _run(text, bottoms, ntops, params)
    for want, got in zip(tops, g_tops):
        assert _rel(got, want) <= 1e-5, (name, "top")
    for want, got in zip(dbottoms + dparams, g_dbottoms + g_dparams):
        assert _rel(got, want) <= 1e-4, (name, "gradient")


CONVOLUTIONS = [c for c in CASES if "onvolution" in c[0]]


@pytest.mark.parametrize("case", CONVOLUTIONS, ids=[c[0] for c in CONVOLUTIONS])
def test_convolutions_by_per_image_products_match_the_cpu(gpu_mode, case, monkeypatch):
    """The plan's other way, taken from PER_IMAGE_FROM outputs an image (AlexNet's conv1),
    here for every size: forward and backward-data by GEMMs per image."""
    from poseidon_caffe.backend.cuda import conv
    monkeypatch.setattr(conv, "PER_IMAGE_FROM", 1)
    test_layer_on_the_device_matches_the_cpu(gpu_mode, case)


@pytest.mark.parametrize("case", [c for c in CASES if c[4] is not None],
                         ids=[c[0] for c in CASES if c[4] is not None])
def test_layer_gradient_on_the_device(gpu_mode, case):
    name, text, makers, ntops, options = case
    layer = make_layer(text)
    bottom = []
    for make in makers:
        array = make()
        blob = Blob(array.shape)
        assert isinstance(blob, SyncedBlob)
        blob.data[...] = array
        bottom.append(blob)
    top = [Blob() for _ in range(ntops)]
    check_gradient(layer, bottom, top, max_checks=12, **options)


def test_a_layer_without_a_device_path_refuses_gpu_mode(gpu_mode, monkeypatch):
    # every registered type has one (test_pycaffe_api checks): a type
    # without, as a new one would be, is refused when built
    from poseidon_caffe.layers.normalization import MVNLayer
    monkeypatch.setattr(MVNLayer, "device_ready", False)
    with pytest.raises(LayerError, match="layer 'b' \\(type MVN\\) has no GPU "
                                         "implementation yet"):
        make_layer('name: "b" type: "MVN"')
