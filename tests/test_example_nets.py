"""The AlexNet and GoogLeNet examples build into nets with Caffe's blob shapes: each Data
layer is replaced by a DummyData of the shape its transform_param / data_param imply (batch 1,
the crop size, 3 colour channels) so no database is needed; TRAIN and TEST phases build, the
key shapes follow Caffe's output-size rules (worked out here by hand), GoogLeNet's three losses
carry their weights, and one TRAIN forward/backward gives a finite loss. The solvers parse and
name their net by its path from the repository root, as Caffe's examples do."""
import importlib.util
import math
import os

import numpy as np
import pytest

from poseidon_caffe.io import read_net_param, read_solver_param, write_text_proto
from poseidon_caffe.net import Net
from poseidon_caffe.proto import caffe_pb2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def conv_out(size, kernel, stride=1, pad=0):
    return (size + 2 * pad - kernel) // stride + 1


def pool_out(size, kernel, stride, pad=0):
    # Caffe's pooling rounds up
    return int(math.ceil((size + 2 * pad - kernel) / float(stride))) + 1


def without_data_layers(path, phase):
    """The net of ``path`` for ``phase`` with its Data layer replaced by a batch-1 DummyData."""
    param = read_net_param(path)
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    replaced = 0
    for layer in param.layer:
        if layer.type != "Data":
            out.layer.add().CopyFrom(layer)
            continue
        phases = [rule.phase for rule in layer.include if rule.HasField("phase")]
        if phases and phase not in phases:
            continue
        crop = layer.transform_param.crop_size
        assert crop in (224, 227), "%s: crop_size %d" % (layer.name, crop)
        assert layer.data_param.batch_size > 0 and layer.data_param.source
        assert list(layer.top) == ["data", "label"]
        dummy = out.layer.add()
        dummy.name, dummy.type = layer.name, "DummyData"
        dummy.top.extend(layer.top)
        dp = dummy.dummy_data_param
        dp.shape.add().dim.extend([1, 3, crop, crop])
        dp.shape.add().dim.extend([1])
        dp.data_filler.add(type="gaussian", std=50.0)
        dp.data_filler.add(type="constant", value=7)
        replaced += 1
    assert replaced == 1, "%s: one Data layer per phase expected, found %d" % (path, replaced)
    return out


def build(example, phase):
    path = os.path.join(ROOT, "examples", example, "train_val.prototxt")
    return Net(without_data_layers(path, phase), phase)


def shape(net, name):
    return tuple(net.blobs[name].shape)


def check_alexnet_shapes(net):
    c1 = conv_out(227, 11, 4)
    p1 = pool_out(c1, 3, 2)
    p2 = pool_out(conv_out(p1, 5, 1, 2), 3, 2)
    p5 = pool_out(conv_out(p2, 3, 1, 1), 3, 2)
    assert (c1, p1, p2, p5) == (55, 27, 13, 6)
    assert shape(net, "conv1") == (1, 96, c1, c1)
    assert shape(net, "pool1") == (1, 96, p1, p1)
    assert shape(net, "conv2") == (1, 256, p1, p1)
    assert shape(net, "pool2") == (1, 256, p2, p2)
    assert shape(net, "conv3") == shape(net, "conv4")[:1] + (384, p2, p2)
    assert shape(net, "conv5") == (1, 256, p2, p2)
    assert shape(net, "pool5") == (1, 256, p5, p5)
    assert shape(net, "fc6") == (1, 4096) and shape(net, "fc7") == (1, 4096)
    assert shape(net, "fc8") == (1, 1000)
    assert tuple(net.params["fc6"][0].shape) == (4096, 256 * p5 * p5)
    # grouped convolutions: conv2, conv4 and conv5 see half of their input channels
    assert tuple(net.params["conv2"][0].shape) == (256, 48, 5, 5)
    assert tuple(net.params["conv4"][0].shape) == (384, 192, 3, 3)


def check_googlenet_shapes(net):
    c1 = conv_out(224, 7, 2, 3)
    p1 = pool_out(c1, 3, 2)
    p2 = pool_out(p1, 3, 2)
    p3 = pool_out(p2, 3, 2)
    p4 = pool_out(p3, 3, 2)
    assert (c1, p1, p2, p3, p4) == (112, 56, 28, 14, 7)
    assert shape(net, "conv1/7x7_s2") == (1, 64, c1, c1)
    assert shape(net, "conv2/3x3") == (1, 192, p1, p1)
    expected = {"inception_3a": 64 + 128 + 32 + 32, "inception_3b": 128 + 192 + 96 + 64,
                "inception_4a": 192 + 208 + 48 + 64, "inception_4b": 160 + 224 + 64 + 64,
                "inception_4c": 128 + 256 + 64 + 64, "inception_4d": 112 + 288 + 64 + 64,
                "inception_4e": 256 + 320 + 128 + 128, "inception_5a": 256 + 320 + 128 + 128,
                "inception_5b": 384 + 384 + 128 + 128}
    sizes = {"3": p2, "4": p3, "5": p4}
    for name, channels in expected.items():
        side = sizes[name[len("inception_")]]
        assert shape(net, name + "/output") == (1, channels, side, side), name
    assert shape(net, "inception_3a/output") == (1, 256, 28, 28)
    assert shape(net, "inception_4a/output") == (1, 512, 14, 14)
    assert shape(net, "inception_5b/output") == (1, 1024, 7, 7)
    aux = pool_out(p3, 5, 3)
    for head in ("loss1", "loss2"):
        assert shape(net, head + "/conv") == (1, 128, aux, aux)
        assert shape(net, head + "/fc") == (1, 1024)
        assert shape(net, head + "/classifier") == (1, 1000)
    assert shape(net, "loss3/classifier") == (1, 1000)


def loss_weights(net):
    return {name: weight for name, weight in net.blob_loss_weights.items() if weight}


@pytest.mark.parametrize("example,check", [("alexnet", check_alexnet_shapes),
                                           ("googlenet", check_googlenet_shapes)])
def test_example_net_builds_with_caffes_shapes_and_trains_one_step(example, check):
    test_net = build(example, caffe_pb2.TEST)
    check(test_net)
    accuracy = [n for n in test_net.blob_names if "top-1" in n or n == "accuracy"]
    assert accuracy, "the TEST net reports no accuracy"
    del test_net
    net = build(example, caffe_pb2.TRAIN)
    check(net)
    assert not any("top-1" in n or n == "accuracy" for n in net.blob_names)
    if example == "googlenet":
        assert loss_weights(net) == pytest.approx({"loss1/loss": 0.3, "loss2/loss": 0.3,
                                                   "loss3/loss": 1.0})
    else:
        assert loss_weights(net) == {"loss": 1.0}
    loss = float(net.forward_backward())
    assert np.isfinite(loss) and loss > 0
    # every learnable blob got a finite gradient
    for blob in net.learnable_params:
        assert np.all(np.isfinite(blob.diff))


@pytest.mark.parametrize("example", ["alexnet", "googlenet"])
def test_example_solver_names_its_net_from_the_repository_root(example):
    solver = read_solver_param(os.path.join(ROOT, "examples", example, "solver.prototxt"))
    assert solver.net == "examples/%s/train_val.prototxt" % example
    assert os.path.isfile(os.path.join(ROOT, solver.net))
    assert os.path.isdir(os.path.dirname(os.path.join(ROOT, solver.snapshot_prefix)))
    assert solver.max_iter > 0 and solver.base_lr > 0 and solver.test_iter


@pytest.mark.parametrize("example", ["alexnet", "googlenet"])
def test_make_prototxt_writes_the_committed_train_val(example, tmp_path):
    """The committed train_val.prototxt is what make_prototxt.py writes, to the byte."""
    spec = importlib.util.spec_from_file_location(
        "make_%s_prototxt" % example, os.path.join(ROOT, "examples", example, "make_prototxt.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    written = tmp_path / "train_val.prototxt"
    write_text_proto(getattr(module, example)(), str(written))
    with open(os.path.join(ROOT, "examples", example, "train_val.prototxt"), "rb") as f:
        assert written.read_bytes() == f.read()
