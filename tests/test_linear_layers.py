import numpy as np
import pytest

from gradcheck import blob_from, check_gradient, make_layer
from poseidon_caffe import rng
from poseidon_caffe.blob import Blob
from poseidon_caffe.layers import LayerError

GAUSS = 'weight_filler { type: "gaussian" std: 1 } bias_filler { type: "gaussian" std: 1 }'


def ip(extra=""):
    return make_layer('name: "fc" type: "InnerProduct" inner_product_param { num_output: 4 %s %s }'
                      % (GAUSS, extra))


def run(layer, bottom):
    top = [Blob()]
    layer.setup(bottom, top)
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    return top[0]


@pytest.fixture(autouse=True)
def seeded():
    rng.set_random_seed(5)


def random_bottom(shape, seed=0):
    return blob_from(np.random.RandomState(seed).uniform(-1, 1, shape))


# -- InnerProduct ----------------------------------------------------------------------------

def test_inner_product_shapes_and_values_by_loop():
    bottom = random_bottom((2, 3, 2, 2))
    layer = ip()
    top = run(layer, [bottom])
    assert top.shape == (2, 4)
    assert layer.blobs[0].shape == (4, 12) and layer.blobs[1].shape == (4,)
    w, b, x = layer.blobs[0].data, layer.blobs[1].data, bottom.data.reshape(2, 12)
    for n in range(2):
        for o in range(4):
            want = sum(float(x[n, k]) * float(w[o, k]) for k in range(12)) + float(b[o])
            assert top.data[n, o] == pytest.approx(want, abs=1e-5)


def test_inner_product_transpose_stores_k_by_n():
    bottom = random_bottom((3, 5))
    layer = ip("transpose: true")
    top = run(layer, [bottom])
    assert layer.blobs[0].shape == (5, 4)
    want = bottom.data @ layer.blobs[0].data + layer.blobs[1].data
    np.testing.assert_allclose(top.data, want, rtol=1e-5, atol=1e-6)


def test_inner_product_axis_2_keeps_leading_axes():
    bottom = random_bottom((2, 3, 5))
    layer = ip("axis: 2 bias_term: false")
    top = run(layer, [bottom])
    assert top.shape == (2, 3, 4)
    assert len(layer.blobs) == 1 and layer.blobs[0].shape == (4, 5)
    np.testing.assert_allclose(top.data, bottom.data @ layer.blobs[0].data.T, rtol=1e-5,
                               atol=1e-6)


def test_inner_product_default_fillers_are_constant_zero():
    layer = make_layer('name: "fc" type: "InnerProduct" inner_product_param { num_output: 3 }')
    top = run(layer, [random_bottom((2, 4))])
    assert np.all(layer.blobs[0].data == 0) and np.all(top.data == 0)


@pytest.mark.parametrize("extra,shape", [("", (2, 3, 2)), ("bias_term: false", (2, 3, 2)),
                                         ("transpose: true", (2, 6)),
                                         ("axis: 2", (2, 3, 3)),
                                         ("axis: -1 transpose: true bias_term: false",
                                          (3, 2, 3))])
def test_inner_product_gradient(extra, shape):
    check_gradient(ip(extra), [random_bottom(shape)], [Blob()])


def test_inner_product_adds_into_param_diffs():
    bottom = random_bottom((2, 3))
    layer = ip()
    top = run(layer, [bottom])
    top.diff[...] = 1
    layer.backward([top], [False], [bottom])
    once = layer.blobs[0].diff.copy()
    layer.backward([top], [False], [bottom])
    np.testing.assert_allclose(layer.blobs[0].diff, 2 * once)
    np.testing.assert_allclose(layer.blobs[1].diff, [4, 4, 4, 4])


@pytest.mark.parametrize("transpose", [False, True])
def test_inner_product_sufficient_factors_rebuild_the_weight_gradient(transpose):
    bottom = random_bottom((3, 2, 2))
    layer = ip("transpose: true" if transpose else "")
    top = run(layer, [bottom])
    top.diff[...] = np.random.RandomState(1).uniform(-1, 1, top.shape)
    layer.backward([top], [False], [bottom])
    dy, x = layer.sufficient_factors([bottom], [top])
    assert dy.shape == (3, 4) and x.shape == (3, 4)
    rebuilt = x.T @ dy if transpose else dy.T @ x
    np.testing.assert_allclose(rebuilt, layer.blobs[0].diff, rtol=1e-5, atol=1e-6)


def test_inner_product_rejects_a_changed_input_size():
    layer = ip()
    run(layer, [random_bottom((2, 3))])
    with pytest.raises(LayerError, match="'fc'.*incompatible"):
        layer.reshape([random_bottom((2, 5))], [Blob()])


def test_inner_product_needs_num_output():
    layer = make_layer('name: "fc" type: "InnerProduct"')
    with pytest.raises(LayerError, match="'fc'.*num_output"):
        run(layer, [random_bottom((2, 3))])


def test_inner_product_keeps_weights_from_the_model():
    from poseidon_caffe.proto import caffe_pb2
    from poseidon_caffe.layers import create_layer
    from google.protobuf import text_format
    param = text_format.Parse('name: "fc" type: "InnerProduct" inner_product_param '
                              '{ num_output: 2 bias_term: false } '
                              'blobs { shape { dim: 2 dim: 3 } data: [1, 2, 3, 4, 5, 6] }',
                              caffe_pb2.LayerParameter())
    layer = create_layer(param, caffe_pb2.TEST)
    top = run(layer, [blob_from([[1, 0, -1]])])
    np.testing.assert_allclose(top.data, [[-2, -2]])


# -- Embed -----------------------------------------------------------------------------------

def embed(extra=""):
    return make_layer('name: "emb" type: "Embed" embed_param { input_dim: 5 num_output: 3 %s %s }'
                      % (GAUSS, extra))


def test_embed_looks_up_rows():
    bottom = blob_from([[0, 4], [2, 2]])
    layer = embed()
    top = run(layer, [bottom])
    assert top.shape == (2, 2, 3)
    w, b = layer.blobs[0].data, layer.blobs[1].data
    assert layer.blobs[0].shape == (5, 3)
    for (i, j), idx in np.ndenumerate(bottom.data):
        np.testing.assert_allclose(top.data[i, j], w[int(idx)] + b)


@pytest.mark.parametrize("extra", ["", "bias_term: false"])
def test_embed_weight_gradient(extra):
    bottom = blob_from([[0, 3, 3], [1, 4, 0]])
    check_gradient(embed(extra), [bottom], [Blob()], check_bottom=[])


def test_embed_repeated_index_accumulates():
    bottom = blob_from([1, 1, 1])
    layer = embed("bias_term: false")
    top = run(layer, [bottom])
    top.diff[...] = 1
    layer.backward([top], [False], [bottom])
    want = np.zeros((5, 3))
    want[1] = 3
    np.testing.assert_allclose(layer.blobs[0].diff, want)


def test_embed_index_out_of_range_names_layer():
    with pytest.raises(LayerError, match="'emb'.*index 5 out of range"):
        run(embed(), [blob_from([0, 5])])
    with pytest.raises(LayerError, match="'emb'.*out of range"):
        run(embed(), [blob_from([-1])])
    with pytest.raises(LayerError, match="'emb'.*non-integer"):
        run(embed(), [blob_from([1.5])])


def test_embed_refuses_gradient_to_indices():
    bottom = blob_from([1, 2])
    layer = embed()
    top = run(layer, [bottom])
    assert not layer.allow_force_backward(0)
    with pytest.raises(LayerError, match="'emb'"):
        layer.backward([top], [True], [bottom])
