"""`poseidon-caffe upgrade_net_proto_binary IN OUT`: a V1 binary model (whatever its file name)
comes out as a current one with the same weights; a current one is copied as it is."""
from poseidon_caffe import cli
from poseidon_caffe.proto import caffe_pb2
from test_training_log import errors_of

V1 = caffe_pb2.V1LayerParameter


def v1_model():
    model = caffe_pb2.NetParameter(name="old")
    conv = model.layers.add(name="conv1", type=V1.CONVOLUTION, bottom=["data"], top=["conv1"])
    conv.convolution_param.num_output = 2
    conv.convolution_param.kernel_size.append(1)
    conv.blobs_lr.extend([1, 2])
    conv.weight_decay.extend([1, 0])
    weights = conv.blobs.add(num=2, channels=1, height=1, width=1)
    weights.data.extend([0.25, -1.5])
    bias = conv.blobs.add(num=1, channels=1, height=1, width=2)
    bias.data.extend([3.0, 4.0])
    model.layers.add(name="relu1", type=V1.RELU, bottom=["conv1"], top=["conv1"])
    return model


def test_v1_binary_model_is_upgraded_with_its_weights(tmp_path):
    src, dst = tmp_path / "old_model.bin", tmp_path / "new.caffemodel"
    src.write_bytes(v1_model().SerializeToString())
    code, errors = errors_of(cli.main, ["upgrade_net_proto_binary", str(src), str(dst)])
    assert code == 0 and errors == []
    new = caffe_pb2.NetParameter()
    new.ParseFromString(dst.read_bytes())
    assert len(new.layers) == 0
    assert [(l.name, l.type) for l in new.layer] == [("conv1", "Convolution"),
                                                      ("relu1", "ReLU")]
    conv = new.layer[0]
    assert [(p.lr_mult, p.decay_mult) for p in conv.param] == [(1, 1), (2, 0)]
    assert list(conv.blobs[0].data) == [0.25, -1.5]
    assert list(conv.blobs[1].data) == [3.0, 4.0]
    assert conv.convolution_param.num_output == 2


def test_current_model_is_copied_and_text_is_refused(tmp_path):
    current = caffe_pb2.NetParameter(name="new")
    current.layer.add(name="relu", type="ReLU", bottom=["x"], top=["x"])
    src, dst = tmp_path / "current.caffemodel", tmp_path / "copy.caffemodel"
    src.write_bytes(current.SerializeToString())
    code, errors = errors_of(cli.main, ["upgrade_net_proto_binary", str(src), str(dst)])
    assert code == 0
    assert errors == ["File already in latest proto format: %s" % src]
    copy = caffe_pb2.NetParameter()
    copy.ParseFromString(dst.read_bytes())
    assert copy == current
    (tmp_path / "net.prototxt").write_text('name: "text" layer { name: "a" type: "ReLU" }\n')
    assert cli.main(["upgrade_net_proto_binary", str(tmp_path / "net.prototxt"),
                     str(tmp_path / "out.caffemodel")]) == 1
    assert not (tmp_path / "out.caffemodel").exists()
