"""Legacy nets and solvers upgrade to the same messages as their hand-written current twins."""
import logging

import numpy as np
import pytest
from google.protobuf import text_format

from poseidon_caffe import io, upgrade
from poseidon_caffe.tools import upgrade as upgrade_tools
from poseidon_caffe.proto import caffe_pb2


def net(text):
    return text_format.Parse(text, caffe_pb2.NetParameter())


def upgraded(text):
    n = net(text)
    assert upgrade.upgrade_net(n, "test.prototxt")
    return n


LENET_V1 = """
name: "LeNet"
layers { name: "mnist" type: DATA top: "data" top: "label"
  data_param { source: "mnist_train_lmdb" backend: LMDB batch_size: 64 scale: 0.00390625 }
  include: { phase: TRAIN } }
layers { name: "conv1" type: CONVOLUTION bottom: "data" top: "conv1" blobs_lr: 1 blobs_lr: 2
  convolution_param { num_output: 20 kernel_size: 5 stride: 1
    weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layers { name: "pool1" type: POOLING bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layers { name: "ip1" type: INNER_PRODUCT bottom: "pool1" top: "ip1" blobs_lr: 1 blobs_lr: 2
  inner_product_param { num_output: 500 weight_filler { type: "xavier" } } }
layers { name: "relu1" type: RELU bottom: "ip1" top: "ip1" }
layers { name: "accuracy" type: ACCURACY bottom: "ip1" bottom: "label" top: "accuracy"
  include: { phase: TEST } }
layers { name: "loss" type: SOFTMAX_LOSS bottom: "ip1" bottom: "label" top: "loss" }
"""

LENET = """
name: "LeNet"
layer { name: "mnist" type: "Data" top: "data" top: "label"
  include { phase: TRAIN }
  transform_param { scale: 0.00390625 }
  data_param { source: "mnist_train_lmdb" backend: LMDB batch_size: 64 } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  param { lr_mult: 1 } param { lr_mult: 2 }
  convolution_param { num_output: 20 kernel_size: 5 stride: 1
    weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1"
  param { lr_mult: 1 } param { lr_mult: 2 }
  inner_product_param { num_output: 500 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "accuracy" type: "Accuracy" bottom: "ip1" bottom: "label" top: "accuracy"
  include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip1" bottom: "label" top: "loss" }
"""

CAFFENET_V1 = """
name: "CaffeNet"
input: "data" input_dim: 10 input_dim: 3 input_dim: 227 input_dim: 227
layers { name: "conv2" type: CONVOLUTION bottom: "data" top: "conv2"
  blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0
  convolution_param { num_output: 256 pad: 2 kernel_size: 5 group: 2
    weight_filler { type: "gaussian" std: 0.01 } bias_filler { type: "constant" value: 1 } } }
layers { name: "norm2" type: LRN bottom: "conv2" top: "norm2"
  lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 } }
layers { name: "fc6" type: INNER_PRODUCT bottom: "norm2" top: "fc6"
  blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0
  inner_product_param { num_output: 4096 } }
layers { name: "drop6" type: DROPOUT bottom: "fc6" top: "fc6" dropout_param { dropout_ratio: 0.5 } }
layers { name: "prob" type: SOFTMAX bottom: "fc6" top: "prob" }
"""

CAFFENET = """
name: "CaffeNet"
layer { name: "input" type: "Input" top: "data"
  input_param { shape { dim: 10 dim: 3 dim: 227 dim: 227 } } }
layer { name: "conv2" type: "Convolution" bottom: "data" top: "conv2"
  param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
  convolution_param { num_output: 256 pad: 2 kernel_size: 5 group: 2
    weight_filler { type: "gaussian" std: 0.01 } bias_filler { type: "constant" value: 1 } } }
layer { name: "norm2" type: "LRN" bottom: "conv2" top: "norm2"
  lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 } }
layer { name: "fc6" type: "InnerProduct" bottom: "norm2" top: "fc6"
  param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
  inner_product_param { num_output: 4096 } }
layer { name: "drop6" type: "Dropout" bottom: "fc6" top: "fc6" dropout_param { dropout_ratio: 0.5 } }
layer { name: "prob" type: "Softmax" bottom: "fc6" top: "prob" }
"""

GOOGLENET_V1 = """
name: "GoogLeNet"
layers { name: "3a/1x1" type: CONVOLUTION bottom: "pool2" top: "3a/1x1"
  blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0
  convolution_param { num_output: 64 kernel_size: 1 weight_filler { type: "xavier" std: 0.03 } } }
layers { name: "3a/3x3" type: CONVOLUTION bottom: "pool2" top: "3a/3x3"
  param: "shared_w" blob_share_mode: PERMISSIVE
  convolution_param { num_output: 128 pad: 1 kernel_size: 3 } }
layers { name: "3a/pool" type: POOLING bottom: "pool2" top: "3a/pool"
  pooling_param { pool: MAX kernel_size: 3 stride: 1 pad: 1 } }
layers { name: "3a/output" type: CONCAT bottom: "3a/1x1" bottom: "3a/3x3" bottom: "3a/pool"
  top: "3a/output" concat_param { axis: 1 } }
layers { name: "loss1" type: SOFTMAX_LOSS bottom: "3a/output" bottom: "label" top: "loss1"
  loss_weight: 0.3 exclude { phase: TEST } }
"""

GOOGLENET = """
name: "GoogLeNet"
layer { name: "3a/1x1" type: "Convolution" bottom: "pool2" top: "3a/1x1"
  param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
  convolution_param { num_output: 64 kernel_size: 1 weight_filler { type: "xavier" std: 0.03 } } }
layer { name: "3a/3x3" type: "Convolution" bottom: "pool2" top: "3a/3x3"
  param { name: "shared_w" share_mode: PERMISSIVE }
  convolution_param { num_output: 128 pad: 1 kernel_size: 3 } }
layer { name: "3a/pool" type: "Pooling" bottom: "pool2" top: "3a/pool"
  pooling_param { pool: MAX kernel_size: 3 stride: 1 pad: 1 } }
layer { name: "3a/output" type: "Concat" bottom: "3a/1x1" bottom: "3a/3x3" bottom: "3a/pool"
  top: "3a/output" concat_param { axis: 1 } }
layer { name: "loss1" type: "SoftmaxWithLoss" bottom: "3a/output" bottom: "label" top: "loss1"
  loss_weight: 0.3 exclude { phase: TEST } }
"""


@pytest.mark.parametrize("legacy,current", [(LENET_V1, LENET), (CAFFENET_V1, CAFFENET),
                                            (GOOGLENET_V1, GOOGLENET)])
def test_v1_nets_upgrade_to_their_current_twins(legacy, current):
    assert upgraded(legacy) == net(current)
    twin = net(current)
    assert not upgrade.upgrade_net(twin)  # already current: nothing to do
    assert twin == net(current)


def test_v1_upgrade_logs_as_caffe(caplog):
    logger = logging.getLogger("poseidon_caffe")
    logger.addHandler(caplog.handler)
    try:
        upgrade.upgrade_net(net(LENET_V1), "lenet_v1.prototxt")
    finally:
        logger.removeHandler(caplog.handler)
    text = caplog.text
    assert ("Attempting to upgrade input file specified using deprecated V1LayerParameter: "
            "lenet_v1.prototxt") in text
    assert "Successfully upgraded file specified using deprecated V1LayerParameter" in text
    assert "deprecated transformation parameters: lenet_v1.prototxt" in text


def test_every_v1_layer_type_has_a_current_name():
    names = upgrade._V1_TYPE_NAMES
    for value in caffe_pb2.V1LayerParameter.LayerType.values():
        assert value in names
    assert names[caffe_pb2.V1LayerParameter.SOFTMAX_LOSS] == "SoftmaxWithLoss"
    assert names[caffe_pb2.V1LayerParameter.TANH] == "TanH"


V0_NET = """
name: "v0"
input: "data" input_dim: 1 input_dim: 3 input_dim: 8 input_dim: 8
layers { layer { name: "pad1" type: "padding" pad: 2 } bottom: "data" top: "pad1" }
layers { layer { name: "conv1" type: "conv" num_output: 4 kernelsize: 3 stride: 2 group: 1
                 weight_filler { type: "gaussian" std: 0.01 } blobs_lr: 1 blobs_lr: 2
                 weight_decay: 1 weight_decay: 0 }
         bottom: "pad1" top: "conv1" }
layers { layer { name: "pool1" type: "pool" pool: AVE kernelsize: 2 stride: 2 }
         bottom: "conv1" top: "pool1" }
layers { layer { name: "norm1" type: "lrn" local_size: 3 alpha: 0.001 beta: 0.5 }
         bottom: "pool1" top: "norm1" }
layers { layer { name: "fc" type: "innerproduct" num_output: 10 biasterm: false }
         bottom: "norm1" top: "fc" }
"""

V0_TWIN = """
name: "v0"
layer { name: "input" type: "Input" top: "data"
  input_param { shape { dim: 1 dim: 3 dim: 8 dim: 8 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
  convolution_param { num_output: 4 pad: 2 kernel_size: 3 group: 1 stride: 2
                      weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "norm1" type: "LRN" bottom: "pool1" top: "norm1"
  lrn_param { local_size: 3 alpha: 0.001 beta: 0.5 } }
layer { name: "fc" type: "InnerProduct" bottom: "norm1" top: "fc"
  inner_product_param { num_output: 10 bias_term: false } }
"""


def test_v0_net_with_padding_layer():
    assert upgraded(V0_NET) == net(V0_TWIN)


def test_v0_data_layer_transform_fields():
    n = upgraded('layers { layer { name: "d" type: "data" source: "db" batchsize: 32 '
                 'scale: 0.5 meanfile: "m.binaryproto" cropsize: 20 mirror: true } top: "x" }')
    assert n == net('layer { name: "d" type: "Data" top: "x" transform_param { scale: 0.5 '
                    'mirror: true crop_size: 20 mean_file: "m.binaryproto" } '
                    'data_param { source: "db" batch_size: 32 } }')


def test_input_shape_net_and_input_layer_goes_first():
    n = upgraded('input: "a" input_shape { dim: 2 dim: 5 } input: "b" input_shape { dim: 2 } '
                 'layer { name: "ip" type: "InnerProduct" bottom: "a" top: "c" }')
    assert [l.name for l in n.layer] == ["input", "ip"]
    assert list(n.layer[0].top) == ["a", "b"]
    assert [list(s.dim) for s in n.layer[0].input_param.shape] == [[2, 5], [2]]
    assert not n.input and not n.input_shape and not n.input_dim


@pytest.mark.parametrize("layer_type,param", [("Data", "data_param"),
                                              ("ImageData", "image_data_param"),
                                              ("WindowData", "window_data_param")])
def test_transform_fields_move_in_current_layers(layer_type, param):
    n = upgraded('layer { name: "d" type: "%s" top: "x" %s { source: "s" scale: 0.25 '
                 'mean_file: "m" crop_size: 7 mirror: true } }' % (layer_type, param))
    t = n.layer[0].transform_param
    assert (t.scale, t.mean_file, t.crop_size, t.mirror) == (0.25, "m", 7, True)
    p = getattr(n.layer[0], param)
    assert p.source == "s" and not any(p.HasField(f) for f in
                                       ("scale", "mean_file", "crop_size", "mirror"))


def test_batch_norm_param_specs_removed():
    n = upgraded('layer { name: "bn" type: "BatchNorm" bottom: "x" top: "x" '
                 'param { lr_mult: 0 } param { lr_mult: 0 } param { lr_mult: 0 } }')
    assert len(n.layer[0].param) == 0


def test_both_layer_and_layers_is_refused():
    n = net('layer { name: "a" type: "ReLU" } layers { name: "b" type: RELU }')
    with pytest.raises(upgrade.UpgradeError, match="both 'layer' and 'layers'"):
        upgrade.upgrade_net(n)


@pytest.mark.parametrize("enum,name", [("SGD", "SGD"), ("NESTEROV", "Nesterov"),
                                       ("ADAGRAD", "AdaGrad"), ("RMSPROP", "RMSProp"),
                                       ("ADADELTA", "AdaDelta"), ("ADAM", "Adam")])
def test_solver_type_upgraded(enum, name):
    s = text_format.Parse("base_lr: 0.1 solver_type: %s" % enum, caffe_pb2.SolverParameter())
    assert upgrade.upgrade_solver(s)
    assert s.type == name and not s.HasField("solver_type")
    assert not upgrade.upgrade_solver(s)


def test_solver_with_both_type_fields_is_an_error(tmp_path):
    path = tmp_path / "s.prototxt"
    path.write_text('solver_type: ADAM type: "Adam"\n')
    with pytest.raises(io.ProtoFileError, match=r"s\.prototxt: .*cannot both be given"):
        io.read_solver_param(str(path))


def test_legacy_v1_caffemodel_with_blobs_loads(tmp_path):
    legacy = net(CAFFENET_V1)
    w = np.random.default_rng(1).standard_normal((4, 3, 2, 2)).astype(np.float32)
    b = np.array([0.5, -1.0, 2.0, 3.0], np.float32)
    io.fill_blobproto(legacy.layers[0].blobs.add(), w)
    io.fill_blobproto(legacy.layers[0].blobs.add(), b)
    old = legacy.layers[2].blobs.add()  # legacy 4-axis blob shape
    old.num, old.channels, old.height, old.width = 1, 1, 2, 3
    old.data.extend([1, 2, 3, 4, 5, 6])
    path = tmp_path / "old.caffemodel"
    path.write_bytes(legacy.SerializeToString())
    model = io.read_net_binary(str(path))
    conv = [l for l in model.layer if l.name == "conv2"][0]
    assert conv.type == "Convolution" and not model.layers
    assert io.blobproto_to_array(conv.blobs[0]).tobytes() == w.tobytes()
    assert io.blobproto_to_array(conv.blobs[1]).tolist() == b.tolist()
    fc6 = [l for l in model.layer if l.name == "fc6"][0]
    assert io.blobproto_to_array(fc6.blobs[0]).shape == (1, 1, 2, 3)
    arch, weights = io.read_net_weights(str(path))
    assert [l.type for l in arch.layer][:2] == ["Input", "Convolution"]
    assert weights["conv2"][0].tobytes() == w.tobytes()
    assert weights["fc6"][0].reshape(-1).tolist() == [1, 2, 3, 4, 5, 6]


def test_cli_functions_write_files_that_parse(tmp_path, capsys):
    src = tmp_path / "v1.prototxt"
    src.write_text(LENET_V1)
    dst = tmp_path / "new.prototxt"
    assert upgrade_tools.upgrade_net_main([str(src), str(dst)]) == 0
    assert io.read_net_param(str(dst)) == net(LENET)
    assert "layers" not in dst.read_text()

    model = net(CAFFENET_V1)
    io.fill_blobproto(model.layers[0].blobs.add(), np.ones((2, 2), np.float32))
    src_bin = tmp_path / "v1.caffemodel"
    src_bin.write_bytes(model.SerializeToString())
    dst_bin = tmp_path / "new.caffemodel"
    assert upgrade_tools.upgrade_net_main([str(src_bin), str(dst_bin)]) == 0
    raw = caffe_pb2.NetParameter.FromString(dst_bin.read_bytes())
    assert not raw.layers and raw.layer[1].type == "Convolution" and len(raw.layer[1].blobs) == 1

    solver = tmp_path / "solver.prototxt"
    solver.write_text('net: "n.prototxt" base_lr: 0.01 solver_type: NESTEROV\n')
    out = tmp_path / "solver_new.prototxt"
    assert upgrade_tools.upgrade_solver_main([str(solver), str(out)]) == 0
    assert 'type: "Nesterov"' in out.read_text() and "solver_type" not in out.read_text()
    assert io.read_solver_param(str(out)).type == "Nesterov"

    assert upgrade_tools.upgrade_net_main([str(src)]) == 2
    assert "usage: poseidon-caffe upgrade-net IN OUT" in capsys.readouterr().err
    assert upgrade_tools.upgrade_solver_main([str(tmp_path / "missing"), str(out)]) == 1
    assert "missing: no such file" in capsys.readouterr().err
