"""Split folding (net/split_folding.py): the gradients of the Splits the net inserts are added
into the Split's input as each consumer finishes, and their outputs' diffs share buffers.

The truth is the same net with its Split layers written out in the prototxt (the net's own
insertion, written): the net inserts none then, and written Splits keep Caffe's
one-diff-per-output sum."""
import sys
import textwrap

import numpy as np
import pytest
from google.protobuf import text_format

from emulated_device import needs_compiler, use_test_driver
from poseidon_caffe.net import Net, insert_splits
from poseidon_caffe.proto import caffe_pb2

# x feeds three consumers (two convolutions and a pooling), their concat feeds two (an inner
# product and an Eltwise that also reads a second output of a's Split); "e" is a loss that is
# also read by another layer (its Split's first output carries the loss weight)
BODY = """
name: "folds"
force_backward: true
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } shape { dim: 2 } } }
layer { name: "a" type: "Convolution" bottom: "x" top: "a"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "b" type: "Convolution" bottom: "x" top: "b"
        convolution_param { num_output: 2 kernel_size: 1
                            weight_filler { type: "gaussian" std: 0.3 }
                            bias_filler { type: "constant" value: 0.1 } } }
layer { name: "p" type: "Pooling" bottom: "x" top: "p"
        pooling_param { pool: MAX kernel_size: 3 stride: 1 pad: 1 } }
layer { name: "cat" type: "Concat" bottom: "a" bottom: "b" bottom: "p" top: "cat" }
layer { name: "sum" type: "Eltwise" bottom: "cat" bottom: "cat" top: "sum"
        eltwise_param { operation: SUM coeff: 1 coeff: -0.5 } }
layer { name: "twice" type: "Eltwise" bottom: "a" bottom: "a" top: "twice"
        eltwise_param { operation: PROD } }
layer { name: "ip" type: "InnerProduct" bottom: "sum" top: "side"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "twice" top: "ip2"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "mix" type: "Eltwise" bottom: "side" bottom: "ip2" top: "mix" }
layer { name: "sideloss" type: "EuclideanLoss" bottom: "side" bottom: "ip2" top: "e"
        loss_weight: 0.03 }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "side" bottom: "label" top: "loss" }
layer { name: "mixloss" type: "SoftmaxWithLoss" bottom: "mix" bottom: "label" top: "ml" }
layer { name: "esq" type: "Power" bottom: "e" top: "esq" power_param { power: 2 }
        loss_weight: 0.1 }
"""


def _written(text):
    """The net's own split insertion, written out: a net built from it inserts none."""
    return insert_splits(text_format.Parse(text, caffe_pb2.NetParameter()))


def _net(text):
    param = text if isinstance(text, caffe_pb2.NetParameter) else text_format.Parse(
        text, caffe_pb2.NetParameter())
    return Net(param, caffe_pb2.TRAIN)


def _fill(net, seed=3):
    rs = np.random.RandomState(seed)
    net.blobs["x"].data[...] = rs.randn(*net.blobs["x"].shape)
    net.blobs["label"].data[...] = rs.randint(0, 5, net.blobs["label"].shape)


def _copy_weights(src, dst):
    for name in src.params:
        for a, b in zip(src.params[name], dst.params[name]):
            b.data[...] = a.data


def _gradients(net):
    net.clear_param_diffs()
    loss = net.forward_backward()
    grads = {name: [b.diff.copy() for b in blobs] for name, blobs in net.params.items()}
    return loss, grads, net.blobs["x"].diff.copy()


def _close(folded, written):
    """Equal up to the order of a sum: a few units in the last place of the largest term."""
    scale = float(np.abs(written).max()) or 1.0
    np.testing.assert_allclose(folded, written, rtol=1e-5, atol=1e-6 * scale)


def _same_gradients(folded, written):
    """One pass of each: the weights' and the input's gradients agree."""
    _, grads_f, dx_f = _gradients(folded)
    _, grads_w, dx_w = _gradients(written)
    assert set(grads_f) == set(grads_w)
    for name in grads_f:
        for gf, gw in zip(grads_f[name], grads_w[name]):
            _close(gf, gw)
    _close(dx_f, dx_w)


def _pair(body=BODY):
    folded = _net(body)
    written = _net(_written(body))
    _copy_weights(folded, written)
    _fill(folded)
    _fill(written)
    return folded, written


def test_the_reference_net_has_its_splits_written_out():
    folded, written = _pair()
    assert folded._split_folding is not None
    assert written._split_folding is None
    inserted = [n for n, l in zip(folded.layer_names, folded.layers) if l.type == "Split"]
    assert len(inserted) == 7
    assert sorted(l.type for l in written.layers) == sorted(l.type for l in folded.layers)
    # left as Caffe has it: e's Split (its first output carries the loss weight); label's
    # folds nothing (no consumer sends a gradient there) and ends zero, as Caffe's sum would
    kept = [folded.layer_names[s] for s in folded._split_folding.split_input]
    assert sorted(kept) == ["a_a_0_split", "cat_cat_0_split", "ip2_ip2_0_split",
                            "label_in_1_split", "side_ip_0_split", "x_in_0_split"]


def test_folded_gradients_equal_the_written_splits_sum():
    folded, written = _pair()
    for _ in range(2):          # a second pass starts its folds afresh
        loss_f, grads_f, dx_f = _gradients(folded)
        loss_w, grads_w, dx_w = _gradients(written)
        assert loss_f == pytest.approx(loss_w, rel=1e-6)
        assert set(grads_f) == set(grads_w)
        for name in grads_f:
            for gf, gw in zip(grads_f[name], grads_w[name]):
                _close(gf, gw)
        _close(dx_f, dx_w)
        assert np.abs(dx_w).max() > 1e-3      # the input's gradient is not trivially zero
        assert not folded.blobs["label"].diff.any()


def test_folded_outputs_share_buffers_and_the_estimate_counts_them_once():
    folded, written = _pair()
    _gradients(folded)
    outputs = [folded.blobs[n] for n in folded.blobs if "_split_" in n]
    pooled = [b for b in outputs if b.borrows_diff]
    # the outputs of x's, label's, a's, cat's, side's and ip2's Splits
    assert len(pooled) == 15
    slot0 = [b for b in pooled if np.shares_memory(b.diff, pooled[0].diff)]
    assert len(slot0) > 1
    est_f, est_w = folded.memory_estimate(), written.memory_estimate()
    split_bytes = sum(b.nbytes for b in pooled)
    assert est_w["diff"] - est_f["diff"] == split_bytes - folded._split_folding.pool.nbytes
    assert est_f["data"] == est_w["data"]


def test_a_splits_last_consumer_writes_into_its_input_with_no_copy():
    """The first consumer in backward (the net's last) has the Split input's diff for its
    own, also after diffs are shared (which moves the input's); a consumer reading two
    outputs of one Split does not (x's, side's and ip2's Splits have one; a's and cat's end in
    a two-bottom Eltwise). The gradients stay the written Splits' sum."""
    folded, written = _pair()
    folding = folded._split_folding
    assert sorted(folded.layer_names[s] for s in folding.into_input.values()) == [
        "ip2_ip2_0_split", "side_ip_0_split", "x_in_0_split"]
    assert not folding.adding
    _gradients(folded)                  # the diffs as they are before sharing, in use
    folded.share_diffs()
    for blob, s in folding.into_input.items():
        assert np.shares_memory(blob.diff, folding.split_input[s].diff)
    for _ in range(2):          # a second pass starts its folds afresh
        _same_gradients(folded, written)


# x feeds a convolution, two AVE poolings (windows apart, which the compiled kernel adds into
# a diff; windows overlapping on every cell, which it leaves to a gradient made apart) and a
# last convolution, the first consumer in backward
AVE_CONSUMERS = """
name: "ave_adds"
force_backward: true
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } shape { dim: 2 } } }
layer { name: "a" type: "Convolution" bottom: "x" top: "a"
        convolution_param { num_output: 2 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "p1" type: "Pooling" bottom: "x" top: "p1"
        pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "p2" type: "Pooling" bottom: "x" top: "p2"
        pooling_param { pool: AVE kernel_size: 3 stride: 1 pad: 1 } }
layer { name: "b" type: "Convolution" bottom: "x" top: "b"
        convolution_param { num_output: 2 kernel_size: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "fa" type: "InnerProduct" bottom: "a" top: "fa"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "f1" type: "InnerProduct" bottom: "p1" top: "f1"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "f2" type: "InnerProduct" bottom: "p2" top: "f2"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "fb" type: "InnerProduct" bottom: "b" top: "fb"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "sum" type: "Eltwise" bottom: "fa" bottom: "f1" bottom: "f2" bottom: "fb"
        top: "sum" }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "sum" bottom: "label" top: "loss" }
"""


@pytest.mark.parametrize("compiled", [True, False])
def test_ave_poolings_add_their_gradient_into_the_splits_input(compiled, monkeypatch):
    """AVE pooling adds its gradient straight into the Split input's diff where another
    consumer wrote before it (the compiled kernel adding to each cell's value, or a gradient
    made apart and added), and writes it where none did this pass: the input's gradient is
    the written Splits' sum, pass after pass, whole or from a middle layer down."""
    from poseidon_caffe.backend.cpu import native
    if not compiled:
        monkeypatch.setattr(native, "PORTABLE_POOLING", True)    # the kernel declines
    elif native.lib is None:
        pytest.skip("the compiled kernels are not built (no C compiler at install)")
    folded, written = _pair(AVE_CONSUMERS)
    folding = folded._split_folding
    assert sorted(folded.layer_names[i] for i in folding.adding) == ["p1", "p2"]
    for _ in range(2):          # a second pass starts its folds afresh
        _same_gradients(folded, written)
    # a backward from p2 down: p2 is the first contributor of the pass and writes (Caffe's
    # Split would also add b's gradient of the last pass, left out of this range: zeroed)
    written.blobs["x_in_0_split_3"].diff[...] = 0
    for net in (folded, written):
        net.blobs["p2"].diff[...] = 1.0
        net.blobs["p1"].diff[...] = 0.5
        net.backward_from_to(net.layer_names.index("p2"), 0)
    _close(folded.blobs["x"].diff, written.blobs["x"].diff)
    assert np.abs(written.blobs["x"].diff).max() > 1e-3


USER_MODULE = '''
from poseidon_caffe.layers import Layer


class PassOn(Layer):
    """Forward copies; backward writes no bottom diff at all."""
    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data

    def backward(self, top, propagate_down, bottom):
        pass
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "fold_user_layers.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "fold_user_layers"
    sys.modules.pop("fold_user_layers", None)


def test_a_user_layer_that_writes_no_bottom_diff_contributes_zero(user_module):
    body = BODY.replace(
        'layer { name: "cat"',
        'layer { name: "py" type: "Python" bottom: "a" top: "pa" python_param { '
        'module: "' + user_module + '" layer: "PassOn" } }\n'
        'layer { name: "pl" type: "EuclideanLoss" bottom: "pa" bottom: "a" top: "pl" }\n'
        'layer { name: "cat"')
    folded, written = _pair(body)
    assert folded._split_folding.zero_first
    for _ in range(2):          # a second pass starts its folds afresh
        _same_gradients(folded, written)


# Conv -> Crop(big, conv) and Eltwise(conv, crop) -> EuclideanLoss: the convolution's output
# is both Crop's shape reference and a summand. Caffe's Crop gives its reference no gradient,
# so the weights' gradient is the loss's alone (checked by central differences).
CROP_REFERENCE = """
name: "crop_reference"
layer { name: "in" type: "Input" top: "data" top: "big" top: "target"
        input_param { shape { dim: 2 dim: 1 dim: 5 dim: 5 } shape { dim: 2 dim: 3 dim: 8 dim: 8 }
                      shape { dim: 2 dim: 3 dim: 5 dim: 5 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 3 kernel_size: 1
                            weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "crop" type: "Crop" bottom: "big" bottom: "conv" top: "crop"
        crop_param { axis: 2 offset: 1 } }
layer { name: "sum" type: "Eltwise" bottom: "conv" bottom: "crop" top: "sum" }
layer { name: "loss" type: "EuclideanLoss" bottom: "sum" bottom: "target" top: "loss" }
"""


def _crop_net(seed=0):
    net = _net(CROP_REFERENCE)
    rng = np.random.default_rng(seed)
    for name in ("data", "big", "target"):
        net.blobs[name].data[...] = rng.standard_normal(net.blobs[name].shape)
    return net


def _central_differences(net, blob, eps=1e-2):
    grad = np.zeros(blob.data.shape, np.float64)
    flat = blob.data.reshape(-1)
    for k in range(flat.size):
        keep = float(flat[k])
        flat[k] = keep + eps
        up = float(net.forward()["loss"])
        flat[k] = keep - eps
        down = float(net.forward()["loss"])
        flat[k] = keep
        grad.reshape(-1)[k] = (up - down) / (2 * eps)
    return grad


@pytest.mark.parametrize("shared", [False, True])
def test_a_crop_gives_its_shape_reference_no_gradient(shared):
    net = _crop_net()
    if shared:
        net.share_diffs()
    assert net.bottom_need_backward[net.layer_names.index("crop")] == [False, False]
    weights = net.params["conv"][0]
    want = _central_differences(net, weights)
    net.forward_backward()
    np.testing.assert_allclose(weights.diff, want, rtol=1e-3, atol=1e-4)


@needs_compiler
def test_a_crop_gives_its_shape_reference_no_gradient_on_the_device(monkeypatch):
    from poseidon_caffe import backend
    want = _crop_net()
    want.forward_backward()
    use_test_driver(monkeypatch)
    backend.set_mode_gpu()
    try:
        net = _crop_net()
        net.params["conv"][0].data[...] = want.params["conv"][0].data
        net.forward_backward()
        np.testing.assert_allclose(net.params["conv"][0].diff, want.params["conv"][0].diff,
                                   rtol=1e-5, atol=1e-6)
    finally:
        backend.set_mode_cpu()
