"""Neuron, loss, reduction/indexing and recurrent layers on the emulated device: through the
harness of test_cuda_layers (the CPU's tops, rel 1e-5, and gradients, rel 1e-4; the
finite-difference gradient check in GPU mode), and here also in place and over repeated
passes (parameter gradients accumulate); nets of them build and run in GPU mode."""
import numpy as np
import pytest
from google.protobuf import text_format

import test_cuda_layers as harness
from emulated_device import needs_compiler, use_test_driver
from gradcheck import make_layer
from test_cuda_layers import gpu_mode, labels, uniform  # noqa: F401  (gpu_mode: a fixture)
from poseidon_caffe import backend, rng
from poseidon_caffe.blob import Blob
from poseidon_caffe.layers.base import LayerError
from poseidon_caffe.proto import caffe_pb2

pytestmark = needs_compiler


@pytest.fixture
def gpu_env(monkeypatch):
    use_test_driver(monkeypatch)
    yield
    backend.set_mode_cpu()


def rand(shape, seed, lo=-1.0, hi=1.0):
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)


def run_layer(prototxt, bottoms, ntops=1, propagate=None, in_place=False, seed=3,
              diff_seed=7, passes=1):
    """(tops, bottom diffs, param diffs, param data) of one layer on the current backend:
    setup, reshape, forward, then backward from fixed random top diffs (``passes`` times,
    so that parameter gradients accumulate)."""
    rng.set_random_seed(seed)                  # fillers draw the same parameters
    layer = make_layer(prototxt)
    bottom = []
    for array in bottoms:
        b = Blob(array.shape)
        b.data[...] = array
        bottom.append(b)
    top = bottom[:1] if in_place else [Blob(()) for _ in range(ntops)]
    layer.check_blob_counts(bottom, top)
    layer.setup(bottom, top)
    layer.reshape(bottom, top)
    diffs = [p.diff.copy() * 0 for p in layer.blobs]
    for i, p in enumerate(layer.blobs):
        p.diff[...] = diffs[i]
    for _ in range(passes):
        rng.set_random_seed(seed + 1)
        layer.forward(bottom, top)
        tops = [t.data.copy() for t in top]
        if propagate is False:
            continue
        for i, t in enumerate(top):
            t.diff[...] = rand(t.shape, diff_seed + i)
        layer.backward(top, propagate or [True] * len(bottom), bottom)
    bottom_diffs = [b.diff.copy() for b in bottom] if propagate is not False else []
    return (tops, bottom_diffs, [p.diff.copy() for p in layer.blobs],
            [p.data.copy() for p in layer.blobs])


def both(prototxt, bottoms, **kw):
    """run_layer on the CPU, then on the emulated device (after gpu_env)."""
    backend.set_mode_cpu()
    cpu = run_layer(prototxt, bottoms, **kw)
    backend.set_mode_gpu()
    assert backend.get_backend().on_device
    gpu = run_layer(prototxt, bottoms, **kw)
    backend.set_mode_cpu()
    return cpu, gpu


def compare(prototxt, bottoms, fwd_rtol=1e-5, bwd_rtol=1e-4, atol=1e-6, propagate=None,
            **kw):
    cpu, gpu = both(prototxt, bottoms, propagate=propagate, **kw)
    for what, rtol, c, g in zip(("top", "bottom diff", "param diff", "param"),
                                (fwd_rtol, bwd_rtol, bwd_rtol, fwd_rtol), cpu, gpu):
        assert len(c) == len(g), what
        for i, (a, b) in enumerate(zip(c, g)):
            if propagate and what == "bottom diff" and not propagate[i]:
                continue
            np.testing.assert_allclose(b, a, rtol=rtol, atol=atol,
                                       err_msg="%s %d of %s" % (what, i, prototxt))
    return cpu, gpu


# (id, layer text, bottoms, tops, gradient check: None (none) or dict of its arguments), as
# test_cuda_layers.CASES
KINK = {"kink": 0.0, "kink_range": 0.02}
RECURRENT = 'name: "r" type: "%s" recurrent_param { num_output: 5 weight_filler { ' \
            'type: "uniform" min: -0.5 max: 0.5 } bias_filler { type: "uniform" } %s }'
CONT = lambda: np.float32([[0, 0], [1, 1], [1, 0]])  # noqa: E731
CASES = [
    ("PReLU", 'name: "p" type: "PReLU" prelu_param { filler { type: "uniform" } }',
     [uniform((2, 3, 4), 1)], 1, KINK),
    ("PReLU-shared", 'name: "p" type: "PReLU" prelu_param { channel_shared: true }',
     [uniform((2, 3, 2, 2), 2)], 1, KINK),
    # losses (bottom 0 checked; labels and H get no gradient)
    ("EuclideanLoss", 'name: "l" type: "EuclideanLoss"',
     [uniform((3, 4), 20), uniform((3, 2, 2), 21)], 1, {"check_bottom": [0, 1]}),
    ("HingeLoss-L1", 'name: "l" type: "HingeLoss"', [uniform((4, 5), 22, -2, 2),
                                                      labels((4,), 5, 23)], 1,
     {"check_bottom": [0], "kink": 1.0, "kink_range": 0.05}),
    ("HingeLoss-L2", 'name: "l" type: "HingeLoss" hinge_loss_param { norm: L2 }',
     [uniform((4, 5), 24, -2, 2), labels((4, 1, 1, 1), 5, 25)], 1, {"check_bottom": [0]}),
    ("ContrastiveLoss", 'name: "l" type: "ContrastiveLoss" contrastive_loss_param { '
     'margin: 3 }', [uniform((6, 3, 1, 1), 26), uniform((6, 3, 1, 1), 27), labels((6,), 2, 28)], 1,
     {"check_bottom": [0, 1]}),
    ("ContrastiveLoss-legacy", 'name: "l" type: "ContrastiveLoss" contrastive_loss_param { '
     'margin: 1.5 legacy_version: true }',
     [uniform((6, 3), 29), uniform((6, 3), 30), labels((6, 1, 1, 1), 2, 31)], 1, None),
    ("InfogainLoss", 'name: "l" type: "InfogainLoss" loss_param { ignore_label: 2 }',
     [uniform((3, 4, 2), 32), labels((3, 2), 4, 33), uniform((4, 4), 34, 0, 1)], 2,
     {"check_bottom": [0], "top_indices": [0]}),
    ("InfogainLoss-axis", 'name: "l" type: "InfogainLoss" infogain_loss_param { axis: 2 }',
     [uniform((2, 3, 4), 35), labels((2, 3), 4, 36), uniform((1, 1, 4, 4), 37, 0, 1)], 1,
     {"check_bottom": [0]}),
    ("MultinomialLogisticLoss", 'name: "l" type: "MultinomialLogisticLoss"',
     [uniform((4, 5), 38, 0.1, 1.0), labels((4, 1, 1, 1), 5, 39)], 1, {"check_bottom": [0]}),
    ("SigmoidCrossEntropyLoss", 'name: "l" type: "SigmoidCrossEntropyLoss"',
     [uniform((4, 3), 40, -4, 4), uniform((4, 3), 41, 0, 1)], 1, {"check_bottom": [0]}),
    ("SigmoidCrossEntropyLoss-ignore", 'name: "l" type: "SigmoidCrossEntropyLoss" '
     'loss_param { ignore_label: 1 normalization: VALID }',
     [uniform((4, 3), 42, -4, 4), labels((4, 3), 3, 43)], 1, {"check_bottom": [0]}),
    # reductions and row picks
    ("Reduction-SUM", 'name: "r" type: "Reduction" reduction_param { axis: 1 coeff: 0.5 }',
     [uniform((2, 3, 4), 50)], 1, {}),
    ("Reduction-ASUM", 'name: "r" type: "Reduction" reduction_param { operation: ASUM }',
     [uniform((2, 3, 4), 51)], 1, KINK),
    ("Reduction-SUMSQ", 'name: "r" type: "Reduction" reduction_param { operation: SUMSQ '
     'axis: -1 }', [uniform((2, 3, 4), 52)], 1, {}),
    ("Reduction-MEAN", 'name: "r" type: "Reduction" reduction_param { operation: MEAN '
     'axis: 2 coeff: -2 }', [uniform((2, 3, 4), 53)], 1, {}),
    ("ArgMax", 'name: "a" type: "ArgMax" argmax_param { top_k: 3 }',
     [lambda: np.round(uniform((3, 2, 4), 54)() * 2)], 1, None),             # ties
    ("ArgMax-values", 'name: "a" type: "ArgMax" argmax_param { top_k: 2 out_max_val: true }',
     [lambda: np.round(uniform((3, 5), 55)() * 2)], 1, None),
    ("ArgMax-axis", 'name: "a" type: "ArgMax" argmax_param { top_k: 2 axis: 1 }',
     [lambda: np.round(uniform((2, 4, 3), 56)() * 2)], 1, None),
    ("ArgMax-axis-values", 'name: "a" type: "ArgMax" argmax_param { top_k: 3 axis: -1 '
     'out_max_val: true }', [uniform((2, 3, 4), 57)], 1, None),
    ("Silence", 'name: "s" type: "Silence"', [uniform((2, 3), 58), uniform((4,), 59)], 0,
     None),
    ("Parameter", 'name: "p" type: "Parameter" parameter_param { shape { dim: 2 dim: 3 } }',
     [], 1, {}),
    ("Filter", 'name: "f" type: "Filter" bottom: "a" bottom: "b" bottom: "s"',
     [uniform((4, 3, 2), 60), uniform((4, 2), 61), lambda: np.float32([1, 0, 2, 1])], 2,
     None),                    # (its top shrinks at the first forward: the gradient check
                               # sizes its weights before)
    ("BatchReindex", 'name: "b" type: "BatchReindex"',
     [uniform((4, 3, 2), 62), lambda: np.float32([3, 0, 3, 1, 3])], 1, {"check_bottom": [0]}),
    ("Tile", 'name: "t" type: "Tile" tile_param { axis: 1 tiles: 3 }',
     [uniform((2, 3, 4), 63)], 1, {}),
    # MVN: per (num, channel) plane or per item across channels, with and without the
    # variance (a 2-axis bottom normalises each (num, channel) row of one value: all zeros)
    ("MVN", 'name: "m" type: "MVN"', [uniform((2, 3, 4, 5), 64, -2, 2)], 1, {}),
    ("MVN-mean", 'name: "m" type: "MVN" mvn_param { normalize_variance: false }',
     [uniform((2, 3, 4, 5), 65, -2, 2)], 1, {}),
    ("MVN-across", 'name: "m" type: "MVN" mvn_param { across_channels: true }',
     [uniform((3, 2, 3, 2), 66, -2, 2)], 1, {}),
    ("MVN-across-mean", 'name: "m" type: "MVN" mvn_param { across_channels: true '
     'normalize_variance: false }', [uniform((3, 2, 3, 2), 67, -2, 2)], 1, {}),
    ("MVN-eps", 'name: "m" type: "MVN" mvn_param { eps: 0.5 }', [uniform((2, 3, 6), 68)],
     1, None),                       # (Caffe's backward leaves eps out: no gradient check)
    ("MVN-rows", 'name: "m" type: "MVN" mvn_param { across_channels: true }',
     [uniform((4, 7), 69, -2, 2)], 1, {}),
    # recurrent (cont: 0 starts a sequence)
    ("RNN", RECURRENT % ("RNN", ""), [uniform((3, 2, 4), 70), CONT, uniform((2, 3), 71)], 1,
     {"check_bottom": [0, 2]}),
    ("RNN-exposed", RECURRENT % ("RNN", "expose_hidden: true"),
     [uniform((3, 2, 4), 72), CONT, uniform((1, 2, 5), 73)], 2, {"check_bottom": [0, 2]}),
    ("LSTM", RECURRENT % ("LSTM", ""), [uniform((3, 2, 4), 74), CONT, uniform((2, 3), 75)], 1,
     {"check_bottom": [0, 2]}),
    ("LSTM-exposed", RECURRENT % ("LSTM", "expose_hidden: true"),
     [uniform((3, 2, 2, 2), 76), CONT, uniform((1, 2, 5), 77), uniform((1, 2, 5), 78)], 3,
     {"check_bottom": [0, 2, 3]}),
    ("LSTMUnit", 'name: "u" type: "LSTMUnit"', [uniform((1, 2, 3), 79),
                                                uniform((1, 2, 12), 80, -2, 2),
                                                lambda: np.float32([[1, 0]])], 2,
     {"check_bottom": [0, 1]}),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_layer_on_the_device_matches_the_cpu(gpu_mode, case):  # noqa: F811
    harness.test_layer_on_the_device_matches_the_cpu(gpu_mode, case)


@pytest.mark.parametrize("case", [c for c in CASES if c[4] is not None],
                         ids=[c[0] for c in CASES if c[4] is not None])
def test_layer_gradient_on_the_device(gpu_mode, case):  # noqa: F811
    harness.test_layer_gradient_on_the_device(gpu_mode, case)


X = rand((2, 3, 4, 5), 12, -2.0, 2.0)

# (test_cuda_layers has the other neuron maps out of place)
NEURONS = [
    'type: "PReLU"',
    'type: "PReLU" prelu_param { channel_shared: true filler { type: "uniform" } }',
    'type: "BNLL"',
    'type: "Power" power_param { power: 2 scale: 0.5 shift: 3 }',
    'type: "Power" power_param { power: 3 scale: 0 shift: 1 }',
    'type: "Exp" exp_param { base: 2 scale: 0.5 shift: 1.5 }',
    'type: "Clip" clip_param { min: -0.5 max: 0.8 }',
    'type: "Swish" swish_param { beta: 1.5 }',
]


@pytest.mark.parametrize("proto", NEURONS)
def test_neuron_layers_in_place_over_two_passes(gpu_env, proto):
    compare('name: "n" ' + proto, [X], in_place=True, passes=2)
    if "PReLU" in proto:
        compare('name: "n" ' + proto, [X], passes=2)
        compare('name: "n" ' + proto, [X], propagate=[False])   # the slopes' gradient only


@pytest.mark.parametrize("params", ["", "normalize_variance: false",
                                    "across_channels: true",
                                    "across_channels: true normalize_variance: false"])
def test_mvn_in_place_over_two_passes(gpu_env, params):
    proto = 'name: "m" type: "MVN" mvn_param { %s }' % params
    compare(proto, [X], in_place=True, passes=2)
    cpu, gpu = compare(proto, [X])
    # independent truth: each row centred (and of unit deviation)
    axes = (1, 2, 3) if "across" in params else (2, 3)
    want = X - X.mean(axis=axes, keepdims=True, dtype=np.float64)
    if "false" not in params:
        want = want / (want.std(axis=axes, keepdims=True) + 1e-9)
    np.testing.assert_allclose(gpu[0][0], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_recurrent_state_carried_across_forwards(gpu_env, kind):
    x, cont = rand((3, 2, 4), 5), CONT()
    cont[0] = 1                                          # the carried state enters step 0
    compare(RECURRENT % (kind, ""), [x, cont], passes=3, propagate=[True, False])


def test_log_in_place(gpu_env):
    compare('name: "l" type: "Log" log_param { base: 2 scale: 0.5 shift: 1.5 }', [X + 2.5],
            in_place=True)


# -- nets in GPU mode ------------------------------------------------------------------------
def _net(layers):
    text = 'name: "g" layer { name: "x" type: "Input" top: "x" top: "y" input_param { ' \
           'shape { dim: 2 dim: 3 dim: 4 } shape { dim: 2 dim: 3 dim: 4 } } }' + layers
    return text_format.Parse(text, caffe_pb2.NetParameter())


def test_a_net_of_moved_layers_builds_and_runs_in_gpu_mode(gpu_env):
    from poseidon_caffe.net import Net
    layers = ''.join('layer { name: "l%d" type: "%s" bottom: "x" top: "x%d" }' % (i, t, i)
                     for i, t in enumerate(["PReLU", "Sigmoid", "Tile", "Reduction", "ArgMax"]))
    layers = layers.replace('"Tile" bottom: "x"', '"Tile" tile_param { tiles: 2 } bottom: "x"')
    layers += 'layer { name: "e" type: "EuclideanLoss" bottom: "x0" bottom: "y" top: "e" } ' \
              'layer { name: "s" type: "Silence" bottom: "x2" bottom: "x3" bottom: "x4" }'
    backend.set_mode_gpu()
    net = Net(_net(layers), caffe_pb2.TRAIN)
    x, y = rand((2, 3, 4), 1), rand((2, 3, 4), 2)
    net.blobs["x"].data[...] = x
    net.blobs["y"].data[...] = y
    net.forward()
    net.backward()
    prelu = np.where(x > 0, x, 0.25 * x)
    np.testing.assert_allclose(net.blobs["x1"].data, 1 / (1 + np.exp(-x)), rtol=1e-5)
    np.testing.assert_allclose(net.blobs["e"].data, ((prelu - y) ** 2).sum() / 4, rtol=1e-5)
    np.testing.assert_allclose(net.blobs["x3"].data, x.sum(), rtol=1e-5)
    np.testing.assert_allclose(net.blobs["x0"].diff, (prelu - y) / 2, rtol=1e-5)


SEQUENCE_NET = """name: "seq"
layer { name: "in" type: "Input" top: "x" top: "cont" top: "label" top: "target"
  input_param { shape { dim: 3 dim: 2 dim: 4 } shape { dim: 3 dim: 2 } shape { dim: 6 }
                shape { dim: 6 dim: 5 } } }
layer { name: "lstm" type: "LSTM" bottom: "x" bottom: "cont" top: "h"
  recurrent_param { num_output: 5 weight_filler { type: "uniform" min: -0.5 max: 0.5 }
                    bias_filler { type: "uniform" } } }
layer { name: "rnn" type: "RNN" bottom: "h" bottom: "cont" top: "o"
  recurrent_param { num_output: 5 weight_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layer { name: "flat" type: "Reshape" bottom: "o" top: "scores"
  reshape_param { shape { dim: 6 dim: 5 } } }
layer { name: "split" type: "Split" bottom: "scores" top: "s1" top: "s2" top: "s3" }
layer { name: "hinge" type: "HingeLoss" bottom: "s1" bottom: "label" top: "hinge" }
layer { name: "sce" type: "SigmoidCrossEntropyLoss" bottom: "s2" bottom: "target" top: "sce"
  loss_weight: 0.5 }
layer { name: "red" type: "Reduction" bottom: "s3" top: "red" loss_weight: 0.1
  reduction_param { operation: SUMSQ } }
"""


def _sequence_net_run():
    from poseidon_caffe.net import Net
    rng.set_random_seed(9)
    net = Net(text_format.Parse(SEQUENCE_NET, caffe_pb2.NetParameter()), caffe_pb2.TRAIN)
    net.blobs["x"].data[...] = rand((3, 2, 4), 1)
    net.blobs["cont"].data[...] = CONT()
    net.blobs["label"].data[...] = np.float32([0, 4, 2, 1, 3, 0])
    net.blobs["target"].data[...] = rand((6, 5), 2, 0, 1)
    loss = net.forward()
    net.backward()
    return ({k: float(v) for k, v in loss.items()},
            [b.diff.copy() for layer in ("lstm", "rnn") for b in net.params[layer]])


def test_a_sequence_net_of_moved_layers_trains_alike_in_gpu_mode(gpu_env):
    cpu_loss, cpu_grads = _sequence_net_run()
    backend.set_mode_gpu()
    gpu_loss, gpu_grads = _sequence_net_run()
    assert gpu_loss == pytest.approx(cpu_loss, rel=1e-5)
    for c, g in zip(cpu_grads, gpu_grads):
        np.testing.assert_allclose(g, c, rtol=1e-4, atol=1e-6)


def _hdf5_output_run(path):
    from poseidon_caffe.net import Net
    net = Net(_net('layer { name: "s" type: "Sigmoid" bottom: "x" top: "s" } '
                   'layer { name: "o" type: "HDF5Output" bottom: "s" bottom: "y" '
                   'hdf5_output_param { file_name: "%s" } }' % path), caffe_pb2.TEST)
    for seed in (1, 2):                        # two batches, appended
        net.blobs["x"].data[...] = rand((2, 3, 4), seed, -3, 3)
        net.blobs["y"].data[...] = rand((2, 3, 4), seed + 10)
        net.forward()
    net.layers[-1].close()


def test_hdf5_output_in_gpu_mode_writes_the_cpu_file(gpu_env, tmp_path):
    h5py = pytest.importorskip("h5py", reason="h5py (the hdf5 extra) is not installed")
    _hdf5_output_run(tmp_path / "cpu.h5")
    backend.set_mode_gpu()
    _hdf5_output_run(tmp_path / "gpu.h5")
    backend.set_mode_cpu()
    x = np.concatenate([rand((2, 3, 4), s, -3, 3) for s in (1, 2)])
    y = np.concatenate([rand((2, 3, 4), s + 10) for s in (1, 2)])
    with h5py.File(tmp_path / "cpu.h5", "r") as cpu, h5py.File(tmp_path / "gpu.h5", "r") as gpu:
        assert sorted(gpu) == sorted(cpu) == ["data", "label"]
        assert gpu["data"].shape == cpu["data"].shape == (4, 3, 4, 1)
        np.testing.assert_array_equal(gpu["label"][...], cpu["label"][...])
        np.testing.assert_array_equal(gpu["label"][..., 0], y)
        np.testing.assert_allclose(gpu["data"][...], cpu["data"][...], rtol=1e-6)
        np.testing.assert_allclose(gpu["data"][..., 0], 1 / (1 + np.exp(-x)), rtol=1e-6)


def test_a_layer_without_a_device_path_is_refused_by_name(gpu_env, monkeypatch):
    # a layer that does not declare a device path (as a new layer type would not)
    from poseidon_caffe.layers.neuron import SigmoidLayer
    from poseidon_caffe.net import Net
    monkeypatch.setattr(SigmoidLayer, "device_ready", False)
    backend.set_mode_gpu()
    with pytest.raises(LayerError, match="'s' .type Sigmoid. has no GPU implementation"):
        Net(_net('layer { name: "s" type: "Sigmoid" bottom: "x" top: "z" }'), caffe_pb2.TRAIN)
