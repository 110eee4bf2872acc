"""`poseidon-caffe extract_features`: features of a trained net over a real LMDB, stored as
Datum records under Caffe's keys, equal to the blobs worked out here with numpy from the input
records and the weights read straight from the .caffemodel."""
import subprocess
import sys

import lmdb
import numpy as np

from poseidon_caffe import extract_features as ef
from poseidon_caffe.tools.extract_features import extract_features_main
from poseidon_caffe.net import TRAIN, Net
from poseidon_caffe.proto import caffe_pb2
from test_training_log import errors_of

NET = """
name: "features"
layer { name: "data" type: "Data" top: "data" top: "label"
  transform_param { scale: 0.5 }
  data_param { source: "SOURCE" backend: LMDB batch_size: 3 } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 2 kernel_size: 1
    weight_filler { type: "gaussian" std: 1 } bias_filler { type: "gaussian" std: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param { num_output: 3
    weight_filler { type: "gaussian" std: 1 } bias_filler { type: "gaussian" std: 1 } } }
layer { name: "relu" type: "ReLU" bottom: "ip" top: "relu" }
"""

RECORDS = 5


def make_images(path):
    """Five 1x2x2 byte images, labels 10..14, written as Caffe's convert_imageset does."""
    images = np.arange(RECORDS * 4, dtype=np.uint8).reshape(RECORDS, 1, 2, 2) * 7
    env = lmdb.open(str(path), map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i, image in enumerate(images):
            datum = caffe_pb2.Datum(channels=1, height=2, width=2, data=image.tobytes(),
                                    label=10 + i)
            txn.put(b"%08d_img%d" % (i, i), datum.SerializeToString())
    env.close()
    return images


def setup(tmp_path):
    images = make_images(tmp_path / "images_lmdb")
    source = str(tmp_path / "images_lmdb")
    (tmp_path / "net.prototxt").write_text(NET.replace("SOURCE", source))
    Net(str(tmp_path / "net.prototxt"), TRAIN).save(str(tmp_path / "trained.caffemodel"))
    return images


def model_weights(path):
    model = caffe_pb2.NetParameter()
    model.ParseFromString(open(path, "rb").read())
    return {layer.name: [np.array(b.data, np.float64).reshape(tuple(b.shape.dim))
                         for b in layer.blobs] for layer in model.layer if layer.blobs}


def read_db(path):
    env = lmdb.open(str(path), readonly=True, lock=False)
    with env.begin() as txn:
        items = [(key.decode(), value) for key, value in txn.cursor()]
    env.close()
    result = []
    for key, value in items:
        datum = caffe_pb2.Datum()
        datum.ParseFromString(value)
        result.append((key, datum))
    return result


def test_features_of_every_item_under_caffes_keys(tmp_path):
    images = setup(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "poseidon_caffe.cli", "extract_features", "trained.caffemodel",
         "net.prototxt", "relu,conv,label", "relu_db,conv_db,label_db", "2", "lmdb", "CPU"],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "Extracted features of 6 query images for feature blob relu" in proc.stderr

    w = model_weights(str(tmp_path / "trained.caffemodel"))
    conv_w, conv_b = w["conv"][0].reshape(2, 1), w["conv"][1]
    ip_w, ip_b = w["ip"]
    order = [i % RECORDS for i in range(6)]       # two batches of three; the data wraps
    keys = ["%010d" % i for i in range(6)]
    for name, shape in (("relu", (3, 1, 1)), ("conv", (2, 2, 2)), ("label", (1, 1, 1))):
        records = read_db(tmp_path / (name + "_db"))
        assert [key for key, _ in records] == keys
        for (key, datum), record in zip(records, order):
            x = images[record].astype(np.float64) * 0.5                     # 1 x 2 x 2
            conv = np.einsum("ck,khw->chw", conv_w, x) + conv_b[:, None, None]
            relu = np.maximum(ip_w @ conv.ravel() + ip_b, 0)
            expected = {"relu": relu, "conv": conv, "label": [10 + record]}[name]
            assert (datum.channels, datum.height, datum.width) == shape
            assert not datum.data and not datum.encoded
            np.testing.assert_allclose(datum.float_data, np.ravel(expected), rtol=1e-5,
                                       atol=1e-5)


def test_feature_datum_keeps_caffes_legacy_shape():
    datum = ef.feature_datum(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert (datum.channels, datum.height, datum.width) == (2, 3, 1)
    assert list(datum.float_data) == [0, 1, 2, 3, 4, 5]


def test_bad_requests_are_one_clear_line_and_touch_nothing(tmp_path):
    setup(tmp_path)
    (tmp_path / "taken_db").mkdir()
    (tmp_path / "taken_db" / "keep.txt").write_text("mine")
    model, net = str(tmp_path / "trained.caffemodel"), str(tmp_path / "net.prototxt")
    new_db = str(tmp_path / "new_db")
    cases = (
        ([model, net, "relu", str(tmp_path / "taken_db"), "1", "lmdb"], "already exists"),
        ([model, net, "fc7", new_db, "1", "lmdb"], "Unknown feature blob name fc7"),
        ([model, net, "relu,conv", new_db, "1", "lmdb"], "must be equal"),
        ([model, net, "relu", new_db, "1", "rocksdb"],
         "backend 'rocksdb' is not one of lmdb, leveldb"),
        ([model, net, "relu", new_db, "two", "lmdb"], "num_mini_batches"),
        ([model, net, "relu", new_db, "1", "lmdb", "TPU"], "CPU or GPU"),
        ([str(tmp_path / "none.caffemodel"), net, "relu", new_db, "1", "lmdb"],
         "none.caffemodel"),
    )
    for argv, message in cases:
        code, errors = errors_of(extract_features_main, argv)
        assert code == 1 and len(errors) == 1 and message in errors[0], (argv, errors)
    assert (tmp_path / "taken_db" / "keep.txt").read_text() == "mine"
    assert not (tmp_path / "new_db").exists()
