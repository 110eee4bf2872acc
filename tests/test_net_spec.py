"""NetSpec writes the same NetParameter as the hand-written prototxt."""
import pytest
from google.protobuf import text_format

from poseidon_caffe.net_spec import L, NetSpec, P, to_proto
from poseidon_caffe.proto import caffe_pb2

LENET = """
layer { name: "data" type: "Data" top: "data" top: "label"
  include { phase: TRAIN }
  transform_param { scale: 0.00390625 }
  data_param { source: "mnist_train_lmdb" batch_size: 64 backend: LMDB } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  param { lr_mult: 1 } param { lr_mult: 2 }
  convolution_param { num_output: 20 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
  convolution_param { num_output: 50 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "fc1" type: "InnerProduct" bottom: "pool2" top: "fc1"
  inner_product_param { num_output: 500 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "fc1" top: "fc1" }
layer { name: "score" type: "InnerProduct" bottom: "fc1" top: "score"
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "accuracy" type: "Accuracy" bottom: "score" bottom: "label" top: "accuracy"
  include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "score" bottom: "label" top: "loss"
  loss_weight: 1 }
"""


def lenet():
    n = NetSpec()
    n.data, n.label = L.Data(batch_size=64, backend=P.Data.LMDB, source="mnist_train_lmdb",
                             transform_param=dict(scale=1. / 256), ntop=2,
                             include=dict(phase=caffe_pb2.TRAIN))
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20,
                            weight_filler=dict(type="xavier"),
                            param=[dict(lr_mult=1), dict(lr_mult=2)])
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(n.pool1, kernel_size=5, num_output=50,
                            weight_filler=dict(type="xavier"))
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.fc1 = L.InnerProduct(n.pool2, num_output=500, weight_filler=dict(type="xavier"))
    n.relu1 = L.ReLU(n.fc1, in_place=True)
    n.score = L.InnerProduct(n.relu1, num_output=10, weight_filler=dict(type="xavier"))
    n.accuracy = L.Accuracy(n.score, n.label, include=dict(phase=caffe_pb2.TEST))
    n.loss = L.SoftmaxWithLoss(n.score, n.label, loss_weight=1)
    return n


def test_lenet_equals_hand_written_prototxt():
    expected = text_format.Parse(LENET, caffe_pb2.NetParameter())
    assert lenet().to_proto() == expected


def test_kwargs_go_to_the_type_param_or_the_layer():
    n = NetSpec()
    n.x = L.Input(shape=dict(dim=[2, 3]))
    n.y = L.Deconvolution(n.x, num_output=4, kernel_size=2, propagate_down=[True],
                          param=dict(lr_mult=0))
    proto = n.to_proto()
    assert list(proto.layer[0].input_param.shape[0].dim) == [2, 3]
    assert proto.layer[1].convolution_param.num_output == 4
    assert list(proto.layer[1].propagate_down) == [True]
    assert proto.layer[1].param[0].lr_mult == 0
    with pytest.raises(AttributeError, match="kernal_size"):
        n.z = L.Convolution(n.x, kernal_size=3)
        n.to_proto()


def test_automatic_names_and_to_proto_of_tops():
    data = L.DummyData(shape=dict(dim=[1, 4]))
    ip = L.InnerProduct(data, num_output=3)
    proto = to_proto(L.ReLU(ip))
    assert [l.name for l in proto.layer] == ["DummyData1", "InnerProduct1", "ReLU1"]
    assert list(proto.layer[1].bottom) == ["DummyData1"]
    assert list(proto.layer[2].top) == ["ReLU1"]
    silence = L.Silence(data, ntop=0)
    assert to_proto(data).layer[0].top == ["DummyData1"]
    assert silence.ntop == 0


def test_enum_values_by_name_and_bad_input():
    pool = L.Pooling(L.DummyData(shape=dict(dim=[1, 1, 4, 4])), pool="AVE", kernel_size=2)
    assert pool.to_proto().layer[1].pooling_param.pool == caffe_pb2.PoolingParameter.AVE
    assert P.Pooling.MAX == caffe_pb2.PoolingParameter.MAX
    with pytest.raises(TypeError, match="input 0 is not a Top"):
        L.ReLU("data")


def test_param_name_dict_is_pycaffes_mapping():
    # pycaffe's table: type name -> field name with "_param" stripped, one entry per
    # LayerParameter *_param field named after its message type (Deconvolution has none)
    from poseidon_caffe.net_spec import param_name_dict
    names = param_name_dict()
    assert names["Convolution"] == "convolution"
    assert names["InnerProduct"] == "inner_product"
    assert names["Python"] == "python"
    assert names["Transformation"] == "transform"
    assert "Deconvolution" not in names
    layer = caffe_pb2.LayerParameter()
    for type_name, name in names.items():
        field = layer.DESCRIPTOR.fields_by_name[name + "_param"]
        assert field.message_type.name == type_name + "Parameter"
    # Deconvolution's keywords still land in convolution_param
    deconv = L.Deconvolution(L.Input(shape=dict(dim=[1, 1, 4, 4])), num_output=2, kernel_size=2)
    assert deconv.to_proto().layer[1].convolution_param.num_output == 2
