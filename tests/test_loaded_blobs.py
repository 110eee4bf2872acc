"""Parameter blobs that come with a LayerParameter (a net built from a model) are checked
against the shapes setup computes: legacy 4-d storage of the same values is taken, anything
else is refused with an error naming the layer and the blob."""
import numpy as np
import pytest
from google.protobuf import text_format

from poseidon_caffe.blob import Blob
from poseidon_caffe.io import array_to_blobproto
from poseidon_caffe.layers.base import LayerError
from poseidon_caffe.layers.registry import create_layer
from poseidon_caffe.proto import caffe_pb2


def setup_with(text, bottom_shapes, arrays):
    param = text_format.Parse(text, caffe_pb2.LayerParameter())
    for array in arrays:
        param.blobs.add().CopyFrom(array_to_blobproto(np.asarray(array, np.float32)))
    layer = create_layer(param, caffe_pb2.TRAIN)
    bottom = [Blob(shape) for shape in bottom_shapes]
    layer.setup(bottom, [Blob()])
    return layer


IP = 'name: "ip" type: "InnerProduct" inner_product_param { num_output: 3 }'
CONV = 'name: "cv" type: "Convolution" convolution_param { num_output: 3 kernel_size: 1 }'


def test_legacy_4d_storage_takes_the_computed_shape_with_its_values():
    weights = np.arange(12).reshape(1, 1, 3, 4)
    layer = setup_with(IP, [(2, 4)], [weights, [[[[7, 8, 9]]]]])
    assert [b.shape for b in layer.blobs] == [(3, 4), (3,)]
    assert layer.blobs[0].data[2, 3] == 11 and list(layer.blobs[1].data) == [7, 8, 9]


def test_wrong_count_and_shape_are_refused_naming_layer_and_blob():
    with pytest.raises(LayerError, match=r"InnerProduct layer 'ip': expected 2 parameter "
                                         r"blob\(s\), the model gives 1$"):
        setup_with(IP, [(2, 4)], [np.zeros((3, 4))])
    with pytest.raises(LayerError, match=r"'ip': parameter blob 0 has shape \(3, 5\), "
                                         r"expected \(3, 4\)$"):
        setup_with(IP, [(2, 4)], [np.zeros((3, 5)), np.zeros(3)])
    with pytest.raises(LayerError, match=r"RNN layer 'r': parameter blob W_xh has shape "
                                         r"\(3, 5\), expected \(3, 4\)$"):
        setup_with('name: "r" type: "RNN" recurrent_param { num_output: 3 }', [(2, 2, 4), (2, 2)],
                   [np.zeros(s) for s in [(3, 5), (3,), (3, 3), (3, 3), (3,)]])


def test_convolution_takes_only_leading_ones_with_caffe_texts():
    layer = setup_with(CONV, [(2, 4, 5, 5)], [np.ones((3, 4, 1, 1)), [[[[1, 2, 3]]]]])
    assert layer.blobs[1].shape == (3,)
    # same count, but not the weight shape padded with 1s: refused, unlike InnerProduct
    with pytest.raises(LayerError, match=r"incorrect weight shape: expected shape "
                                         r"\(3, 4, 1, 1\); instead, shape was \(12,\)$"):
        setup_with(CONV, [(2, 4, 5, 5)], [np.ones(12), np.ones(3)])
    with pytest.raises(LayerError, match=r"incorrect number of weight blobs: expected 2, got 1"):
        setup_with(CONV, [(2, 4, 5, 5)], [np.ones((3, 4, 1, 1))])
