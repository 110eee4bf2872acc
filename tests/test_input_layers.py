"""Input, DummyData and MemoryData: shapes, filling rules and batch stepping."""
import numpy as np
import pytest

from gradcheck import make_layer
from poseidon_caffe import rng
from poseidon_caffe.blob import Blob
from poseidon_caffe.layers import LayerError


def setup(layer, ntops):
    top = [Blob() for _ in range(ntops)]
    layer.check_blob_counts([], top)
    layer.setup([], top)
    layer.reshape([], top)
    return top


# -- Input -------------------------------------------------------------------------------------
def test_input_one_shape_per_top():
    layer = make_layer('name: "in" type: "Input" top: "a" top: "b" input_param { '
                       'shape { dim: 2 dim: 3 dim: 4 dim: 5 } shape { dim: 2 } }')
    a, b = setup(layer, 2)
    assert a.shape == (2, 3, 4, 5) and b.shape == (2,)
    a.data[...] = 7
    layer.forward([], [a, b])
    assert (a.data == 7).all()          # the caller's data is left alone


def test_input_one_shape_for_all_tops():
    layer = make_layer('name: "in" type: "Input" input_param { shape { dim: 1 dim: 3 } }')
    tops = setup(layer, 3)
    assert [t.shape for t in tops] == [(1, 3)] * 3


def test_input_shape_count_mismatch():
    layer = make_layer('name: "in" type: "Input" input_param { shape { dim: 1 } shape { dim: 2 } }')
    with pytest.raises(LayerError, match="once per top"):
        setup(layer, 3)


def test_input_takes_no_bottoms():
    layer = make_layer('name: "in" type: "Input" input_param { shape { dim: 1 } }')
    with pytest.raises(LayerError, match="bottom"):
        layer.check_blob_counts([Blob((1,))], [Blob()])


# -- DummyData ---------------------------------------------------------------------------------
def test_dummy_data_default_is_zero_constant_filled_once():
    layer = make_layer('name: "d" type: "DummyData" dummy_data_param { shape { dim: 2 dim: 3 } }')
    (top,) = setup(layer, 1)
    assert top.shape == (2, 3) and (top.data == 0).all()
    top.data[...] = 5                  # a constant top is not refilled by forward
    layer.forward([], [top])
    assert (top.data == 5).all()


def test_dummy_data_random_filler_refills_every_forward():
    rng.set_random_seed(3)
    layer = make_layer('name: "d" type: "DummyData" dummy_data_param { '
                       'data_filler { type: "gaussian" std: 1 } shape { dim: 4 dim: 5 } }')
    (top,) = setup(layer, 1)
    layer.forward([], [top])
    first = top.data.copy()
    layer.forward([], [top])
    assert not np.array_equal(first, top.data)
    assert 0.2 < float(top.data.std()) < 3.0


def test_dummy_data_filler_per_top_and_legacy_dims():
    layer = make_layer('name: "d" type: "DummyData" dummy_data_param { '
                       'data_filler { type: "constant" value: 3 } '
                       'data_filler { type: "uniform" min: 1 max: 2 } '
                       'num: 2 channels: 3 channels: 1 height: 4 width: 5 }')
    a, b = setup(layer, 2)
    assert a.shape == (2, 3, 4, 5) and b.shape == (2, 1, 4, 5)
    assert (a.data == 3).all()
    layer.forward([], [a, b])
    assert ((b.data >= 1) & (b.data <= 2)).all() and b.data.std() > 0


def test_dummy_data_errors():
    both = make_layer('name: "d" type: "DummyData" dummy_data_param { num: 1 channels: 1 '
                      'height: 1 width: 1 shape { dim: 1 } }')
    with pytest.raises(LayerError, match="Both shape and legacy"):
        setup(both, 1)
    fillers = make_layer('name: "d" type: "DummyData" dummy_data_param { shape { dim: 1 } '
                         'data_filler { value: 1 } data_filler { value: 2 } }')
    with pytest.raises(LayerError, match="data fillers"):
        setup(fillers, 3)
    shapes = make_layer('name: "d" type: "DummyData" dummy_data_param { shape { dim: 1 } '
                        'shape { dim: 2 } }')
    with pytest.raises(LayerError, match="'shape' once"):
        setup(shapes, 3)
    partial = make_layer('name: "d" type: "DummyData" dummy_data_param { num: 1 channels: 1 }')
    with pytest.raises(LayerError, match="'height'"):
        setup(partial, 1)


# -- MemoryData --------------------------------------------------------------------------------
def memory(extra=""):
    return make_layer('name: "m" type: "MemoryData" memory_data_param { batch_size: 2 '
                      'channels: 1 height: 2 width: 3 } %s' % extra)


def test_memory_data_steps_through_batches_and_wraps():
    layer = memory()
    data, label = setup(layer, 2)
    assert data.shape == (2, 1, 2, 3) and label.shape == (2,)
    arr = np.arange(6 * 6, dtype=np.float32).reshape(6, 1, 2, 3)
    labels = np.arange(6, dtype=np.float32) * 10
    layer.set_input_arrays(arr, labels)
    for batch in [0, 1, 2, 0]:
        layer.forward([], [data, label])
        np.testing.assert_array_equal(data.data, arr[2 * batch:2 * batch + 2])
        assert label.shape == (2, 1, 1, 1)           # Caffe's forward serves N x 1 x 1 x 1
        np.testing.assert_array_equal(label.data.ravel(), labels[2 * batch:2 * batch + 2])


def test_memory_data_does_not_transform_arrays():
    layer = memory("transform_param { scale: 0.5 }")
    data, label = setup(layer, 2)
    arr = np.ones((2, 1, 2, 3), np.float32)
    layer.set_input_arrays(arr, np.zeros((2, 1, 1, 1), np.float32))
    layer.forward([], [data, label])
    assert (data.data == 1).all()


def test_memory_data_checks():
    layer = memory()
    setup(layer, 2)
    good_labels = np.zeros(4, np.float32)
    with pytest.raises(LayerError, match="multiple of batch size"):
        layer.set_input_arrays(np.zeros((3, 1, 2, 3), np.float32), np.zeros(3, np.float32))
    with pytest.raises(LayerError, match="float32"):
        layer.set_input_arrays(np.zeros((4, 1, 2, 3)), good_labels)
    with pytest.raises(LayerError, match="4-d"):
        layer.set_input_arrays(np.zeros((4, 6), np.float32), good_labels)
    with pytest.raises(LayerError, match="number of channels"):
        layer.set_input_arrays(np.zeros((4, 2, 2, 3), np.float32), good_labels)
    with pytest.raises(LayerError, match="same first dimension"):
        layer.set_input_arrays(np.zeros((4, 1, 2, 3), np.float32), np.zeros(2, np.float32))
    with pytest.raises(LayerError, match="C contiguous"):
        layer.set_input_arrays(np.zeros((4, 1, 3, 2), np.float32).transpose(0, 1, 3, 2),
                               good_labels)


def test_memory_data_needs_arrays_before_forward():
    layer = memory()
    tops = setup(layer, 2)
    with pytest.raises(LayerError, match="set_input_arrays"):
        layer.forward([], tops)


def test_memory_data_needs_positive_sizes():
    layer = make_layer('name: "m" type: "MemoryData" memory_data_param { batch_size: 2 }')
    with pytest.raises(LayerError, match="positive"):
        setup(layer, 2)
