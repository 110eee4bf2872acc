"""Diff sharing (net/diff_sharing.py): blobs whose gradients are never needed at the same time
keep them in shared buffers.

The truth is the same net without sharing: every parameter gradient must come out the same,
bit for bit, with the shared buffers filled with NaN before each backward (a layer that read a
shared diff before writing all of it would spread the NaN). Sharing rests on one property of
every layer, checked on its own below: a backward writes every value of each bottom diff it
propagates to, whatever the diff held before."""
import os
import subprocess
import sys

import numpy as np
import pytest
from google.protobuf import text_format

import nets
import test_cuda_layers
import test_cuda_layers_more
from gradcheck import make_layer
from poseidon_caffe import rng
from poseidon_caffe.blob import Blob
from poseidon_caffe.net import Net
from poseidon_caffe.proto import caffe_pb2
from poseidon_caffe.solver import get_solver


def _build(text, seed=11):
    rng.set_random_seed(seed)
    return Net(text_format.Parse(text, caffe_pb2.NetParameter()), caffe_pb2.TRAIN)


def _fill_inputs(net, seed=3):
    rs = np.random.RandomState(seed)
    for i in net.input_blob_indices:
        blob = net._blobs[i]
        if net.blob_names[i] == "label":
            blob.data[...] = rs.randint(0, 3, blob.shape)
        else:
            blob.data[...] = rs.uniform(-1, 1, blob.shape)


def _gradients(net, poison):
    """Two passes (the second finds the buffers the first left); with ``poison`` the shared
    buffers hold NaN before each backward."""
    for _ in range(2):
        _fill_inputs(net)
        net.clear_param_diffs()
        rng.set_random_seed(21)             # the same dropout masks on both sides
        net.forward_from_to()
        if poison:
            net._diff_pool.fill(np.nan)
        net.backward_from_to()
    return [b.diff.copy() for b in net.learnable_params]


@pytest.mark.parametrize("name", ["googlenet", "resnet_small", "caffenet", "lenet"])
def test_shared_diffs_give_every_parameter_gradient_of_separate_ones(name):
    text = nets.ALL[name]()[0]
    plain, shared = _build(text), _build(text)
    before = shared.memory_estimate()["diff"]
    shared.share_diffs()
    after = shared.memory_estimate()["diff"]
    assert after < before
    borrowed = [n for n, b in zip(shared.blob_names, shared._blobs) if b.borrows_diff]
    assert borrowed, "nothing was shared"
    want, got = _gradients(plain, False), _gradients(shared, True)
    assert len(want) == len(got)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(b, a)


def test_googlenet_needs_a_small_part_of_its_blob_diffs_at_once():
    net = _build(nets.googlenet(batch=2)[0])
    pool = net.share_diffs()
    separate = sum(b.nbytes for b in net._blobs if b.borrows_diff and b._diff_pool[0] is
                   net._diff_pool)
    assert 0 < pool < 0.35 * separate


# x -> InnerProduct -> Slice -> (a, b): a feeds a loss, b a layer that does not propagate
# down, so the Slice reads a diff of b that no layer writes (zeros, as Caffe leaves it); "py"
# is a Python layer
SLICE_NET = """
name: "spans"
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 2 dim: 5 } shape { dim: 2 } } }
layer { name: "ip0" type: "InnerProduct" bottom: "x" top: "h"
        inner_product_param { num_output: 6 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "slice" type: "Slice" bottom: "h" top: "a" top: "b"
        slice_param { axis: 1 slice_point: 3 } }
layer { name: "ipa" type: "InnerProduct" bottom: "a" top: "ipa"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "ipb" type: "InnerProduct" bottom: "b" top: "ipb" propagate_down: false
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "py" type: "Python" bottom: "ipb" top: "pyb"
        python_param { module: "test_diff_sharing" layer: "Double" } }
layer { name: "sum" type: "Eltwise" bottom: "ipa" bottom: "pyb" top: "sum" }
layer { name: "r" type: "ReLU" bottom: "sum" top: "sum" }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "sum" bottom: "label" top: "loss" }
"""


DOUBLE = """
from poseidon_caffe.layers import Layer


class Double(Layer):
    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = 2 * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = 2 * top[0].diff
"""


def test_a_diff_read_before_any_write_and_python_layers_blobs_are_not_shared(tmp_path,
                                                                             monkeypatch):
    module = "double_layer_%d" % id(tmp_path)
    (tmp_path / (module + ".py")).write_text(DOUBLE)
    monkeypatch.syspath_prepend(str(tmp_path))
    text = SLICE_NET.replace("test_diff_sharing", module)
    plain, shared = _build(text), _build(text)
    shared.share_diffs()
    by_name = dict(zip(shared.blob_names, shared._blobs))
    own = {n for n, b in by_name.items() if not b.borrows_diff}
    # b: the Slice reads it, nobody writes it; ipb, pyb: a Python layer's; x, label: inputs;
    # loss: an output
    assert {"b", "ipb", "pyb", "x", "label", "loss"} <= own
    assert {"h", "a", "ipa", "sum"} <= set(by_name) - own
    want, got = _gradients(plain, False), _gradients(shared, True)
    assert len(want) == 6
    for a, b in zip(want, got):
        np.testing.assert_array_equal(b, a)
    assert not by_name["b"].diff.any()


def test_sharing_is_once_and_a_pycaffe_net_keeps_its_diffs():
    net = _build(nets.lenet()[0])
    assert net._diff_pool is None and not any(b.borrows_diff for b in net._blobs)
    first = net.share_diffs()
    assert first > 0 and net.share_diffs() == first


CASES = test_cuda_layers.CASES + test_cuda_layers_more.CASES


def _bottom_diffs(case, prefill):
    """One layer's forward and backward on the CPU with every bottom diff set to ``prefill``
    first: the diffs it propagates to."""
    _, text, makers, ntops, _ = case
    rng.set_random_seed(5)                  # the same fillers and random draws each time
    layer = make_layer(text)
    bottom = []
    for make in makers:
        array = make()
        blob = Blob(array.shape)
        blob.data[...] = array
        bottom.append(blob)
    top = [Blob() for _ in range(ntops)]
    layer.setup(bottom, top)
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    rs = np.random.RandomState(5)
    for t in top:
        t.diff[...] = rs.uniform(-1, 1, t.shape)
    # as the net plans it: a layer without a gradient is never asked to propagate
    propagate = [layer.has_backward() and layer.allow_force_backward(i)
                 and "Accuracy" not in text for i in range(len(bottom))]
    for b in bottom:
        b.diff[...] = prefill
    layer.backward(top, propagate, bottom)
    return [b.diff.copy() for b, p in zip(bottom, propagate) if p]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_layer_writes_all_of_every_bottom_diff_it_propagates_to(case):
    clean, dirty = _bottom_diffs(case, 0.0), _bottom_diffs(case, np.nan)
    for want, got in zip(clean, dirty):
        np.testing.assert_array_equal(got, want)


TRAIN_NET = """
name: "branches"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 3 dim: 10 dim: 10 } shape { dim: 4 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 } } }
layer { name: "c1" type: "Convolution" bottom: "data" top: "c1"
  convolution_param { num_output: 6 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "r1" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "n1" type: "LRN" bottom: "c1" top: "n1" lrn_param { local_size: 3 } }
layer { name: "b1" type: "Convolution" bottom: "n1" top: "b1"
  convolution_param { num_output: 4 kernel_size: 1 weight_filler { type: "xavier" } } }
layer { name: "b2" type: "Convolution" bottom: "n1" top: "b2"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "p" type: "Pooling" bottom: "n1" top: "p"
  pooling_param { pool: MAX kernel_size: 3 stride: 1 pad: 1 } }
layer { name: "cat" type: "Concat" bottom: "b1" bottom: "b2" bottom: "p" top: "cat" }
layer { name: "drop" type: "Dropout" bottom: "cat" top: "cat" }
layer { name: "ip" type: "InnerProduct" bottom: "cat" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def _caffemodel(path):
    model = caffe_pb2.NetParameter()
    with open(path, "rb") as f:
        model.ParseFromString(f.read())
    return {(l.name, k): np.array(b.data) for l in model.layer for k, b in enumerate(l.blobs)}


def test_train_command_shares_diffs_and_ends_where_a_pycaffe_solver_ends(tmp_path):
    (tmp_path / "net.prototxt").write_text(TRAIN_NET)
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.prototxt" base_lr: 0.05 momentum: 0.9 lr_policy: "fixed" display: 0 '
        'max_iter: 6 snapshot_prefix: "tool" random_seed: 9 weight_decay: 0.001')
    proc = subprocess.run([sys.executable, "-m", "poseidon_caffe.cli", "train",
                           "-solver", "solver.prototxt"], cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Blob diffs shared" in proc.stderr
    cwd = os.getcwd()
    os.chdir(str(tmp_path))
    try:
        param = caffe_pb2.SolverParameter()
        text_format.Parse((tmp_path / "solver.prototxt").read_text(), param)
        param.snapshot_prefix = "pycaffe"
        solver = get_solver(param)
        assert solver.net._diff_pool is None        # pycaffe keeps Caffe's diffs
        solver.solve()
    finally:
        os.chdir(cwd)
    tool = _caffemodel(str(tmp_path / "tool_iter_6.caffemodel"))
    pycaffe = _caffemodel(str(tmp_path / "pycaffe_iter_6.caffemodel"))
    assert tool.keys() == pycaffe.keys() and len(tool) == 8
    for key in tool:
        np.testing.assert_array_equal(tool[key], pycaffe[key], err_msg=str(key))
