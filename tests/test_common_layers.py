"""Common layers: shapes and values worked by hand or by loops here, gradients by differences."""
import numpy as np
import pytest

from gradcheck import blob_from, check_gradient, make_layer, run_layer
from poseidon_caffe.blob import Blob
from poseidon_caffe.layers import LayerError


def rand(*shape, seed=0):
    return blob_from(np.random.RandomState(seed).randn(*shape))


# -- Concat / Slice ----------------------------------------------------------------------------
@pytest.mark.parametrize("param,axis", [("", 1), ("concat_param { axis: 0 }", 0),
                                        ("concat_param { concat_dim: 0 }", 0),
                                        ("concat_param { axis: -1 }", 2)])
def test_concat_values_and_gradient(param, axis):
    shapes = [[2, 3, 2], [2, 3, 2]]
    shapes[0][axis], shapes[1][axis] = 1, 3
    a, b = rand(*shapes[0], seed=1), rand(*shapes[1], seed=2)
    top = run_layer(make_layer('name: "c" type: "Concat" %s' % param), [a, b])
    np.testing.assert_array_equal(top[0].data, np.concatenate([a.data, b.data], axis=axis))
    check_gradient(make_layer('name: "c" type: "Concat" %s' % param), [a, b], [Blob()])


def test_concat_shape_errors():
    with pytest.raises(LayerError, match="except at concat_axis"):
        run_layer(make_layer('name: "c" type: "Concat"'), [Blob((2, 3)), Blob((3, 3))])
    with pytest.raises(LayerError, match="same #axes"):
        run_layer(make_layer('name: "c" type: "Concat"'), [Blob((2, 3)), Blob((2, 3, 1))])
    with pytest.raises(LayerError, match="not both"):
        run_layer(make_layer('name: "c" type: "Concat" concat_param { axis: 1 concat_dim: 1 }'),
                  [Blob((2, 3)), Blob((2, 3))])


@pytest.mark.parametrize("param,axis,bounds", [
    ("slice_param { axis: 0 slice_point: 1 slice_point: 3 }", 0, [0, 1, 3, 4]),
    ("slice_param { slice_dim: 1 slice_point: 2 slice_point: 5 }", 1, [0, 2, 5, 6]),
    ("slice_param { axis: 1 }", 1, [0, 2, 4, 6]),
])
def test_slice_values_and_gradient(param, axis, bounds):
    x = rand(4, 6, 2, seed=3)
    tops = run_layer(make_layer('name: "s" type: "Slice" %s' % param), [x], 3)
    for t, lo, hi in zip(tops, bounds, bounds[1:]):
        np.testing.assert_array_equal(t.data, np.take(x.data, range(lo, hi), axis=axis))
    check_gradient(make_layer('name: "s" type: "Slice" %s' % param), [x],
                   [Blob(), Blob(), Blob()])


def test_slice_errors():
    with pytest.raises(LayerError, match="evenly divide"):
        run_layer(make_layer('name: "s" type: "Slice"'), [Blob((2, 5))], 2)
    with pytest.raises(LayerError, match="slice_point"):
        run_layer(make_layer('name: "s" type: "Slice" slice_param { slice_point: 1 }'),
                  [Blob((2, 5))], 3)
    with pytest.raises(LayerError, match="increase"):
        run_layer(make_layer('name: "s" type: "Slice" '
                             'slice_param { slice_point: 3 slice_point: 2 }'), [Blob((2, 5))], 3)


# -- Split, Flatten, Reshape -------------------------------------------------------------------
def test_split_shares_data_and_sums_gradients():
    x = rand(2, 3, seed=4)
    layer = make_layer('name: "sp" type: "Split"')
    tops = run_layer(layer, [x], 3)
    for t in tops:
        np.testing.assert_array_equal(t.data, x.data)
    check_gradient(make_layer('name: "sp" type: "Split"'), [x], [Blob(), Blob(), Blob()])


@pytest.mark.parametrize("param,shape", [("", (2, 60)), ("flatten_param { axis: 2 }", (2, 3, 20)),
                                         ("flatten_param { axis: 1 end_axis: 2 }", (2, 12, 5)),
                                         ("flatten_param { end_axis: -2 }", (2, 12, 5))])
def test_flatten_shapes(param, shape):
    x = rand(2, 3, 4, 5, seed=5)
    top = run_layer(make_layer('name: "f" type: "Flatten" %s' % param), [x])
    assert top[0].shape == shape
    np.testing.assert_array_equal(top[0].data, x.data.reshape(shape))
    check_gradient(make_layer('name: "f" type: "Flatten" %s' % param), [x], [Blob()])


def reshape_shape(dims, bottom_shape, extra=""):
    text = " ".join("dim: %d" % d for d in dims)
    layer = make_layer('name: "r" type: "Reshape" reshape_param { shape { %s } %s }'
                       % (text, extra))
    return run_layer(layer, [Blob(bottom_shape)])[0].shape


def test_reshape_inference():
    assert reshape_shape([0, -1], (2, 3, 4)) == (2, 12)
    assert reshape_shape([-1, 0, 2], (3, 2, 4)) == (6, 2, 2)
    assert reshape_shape([6, 4], (2, 3, 4)) == (6, 4)
    assert reshape_shape([0, 0, 0, 1], (2, 3, 4)) == (2, 3, 4, 1)
    # only axes [1, 2) are replaced: (2, [3], 4) -> (2, 3, 1, 4)
    assert reshape_shape([-1, 1], (2, 3, 4), "axis: 1 num_axes: 1") == (2, 3, 1, 4)
    # an empty shape with axis 0 num_axes 0 inserts nothing; axis -1 appends after the last axis
    assert reshape_shape([1], (2, 3), "axis: -1 num_axes: 0") == (2, 3, 1)
    assert reshape_shape([1, 1], (2, 3), "axis: 0 num_axes: 0") == (1, 1, 2, 3)


def test_reshape_values_and_gradient():
    x = rand(2, 3, 4, seed=6)
    top = run_layer(make_layer('name: "r" type: "Reshape" '
                               'reshape_param { shape { dim: 4 dim: -1 } }'), [x])
    np.testing.assert_array_equal(top[0].data, x.data.reshape(4, 6))
    check_gradient(make_layer('name: "r" type: "Reshape" reshape_param { shape { dim: 0 '
                              'dim: -1 } }'), [x], [Blob()])


@pytest.mark.parametrize("dims,bottom,extra,message", [
    ([-1, -1], (2, 3), "", "multiple -1"),
    ([5, -1], (2, 3), "", "divisible"),
    ([7], (2, 3), "", "output count must match"),
    ([0, 0, 0], (2, 3), "", "no corresponding bottom axis"),
    ([2], (2, 3), "axis: 3", "out of range"),
    ([2], (2, 3), "axis: 1 num_axes: 2", "end_axis"),
])
def test_reshape_errors(dims, bottom, extra, message):
    with pytest.raises(LayerError, match=message):
        reshape_shape(dims, bottom, extra)


# -- Eltwise -----------------------------------------------------------------------------------
def elt(op, extra=""):
    return make_layer('name: "e" type: "Eltwise" eltwise_param { operation: %s %s }' % (op, extra))


def three(seed):
    return [rand(2, 3, 2, seed=seed + i) for i in range(3)]


def test_eltwise_forward_values():
    a, b, c = three(10)
    np.testing.assert_allclose(run_layer(elt("PROD"), [a, b, c])[0].data, a.data * b.data * c.data,
                               rtol=1e-6)
    summed = run_layer(elt("SUM", "coeff: 1 coeff: -2 coeff: 0.5"), [a, b, c])[0].data
    np.testing.assert_allclose(summed, a.data - 2 * b.data + 0.5 * c.data, rtol=1e-6)
    np.testing.assert_array_equal(run_layer(elt("MAX"), [a, b, c])[0].data,
                                  np.maximum(np.maximum(a.data, b.data), c.data))


@pytest.mark.parametrize("op,extra", [("PROD", ""), ("PROD", "stable_prod_grad: false"),
                                      ("SUM", ""), ("SUM", "coeff: 1 coeff: -2 coeff: 0.5"),
                                      ("MAX", "")])
def test_eltwise_gradient(op, extra):
    check_gradient(elt(op, extra), three(20), [Blob()])


def test_eltwise_max_gradient_goes_to_the_winner():
    a, b = blob_from([1.0, 5.0, 2.0]), blob_from([3.0, 4.0, 2.0])
    layer = elt("MAX")
    top = run_layer(layer, [a, b])
    top[0].diff[...] = [10, 20, 30]
    layer.backward(top, [True, True], [a, b])
    np.testing.assert_array_equal(a.diff, [0, 20, 0])
    np.testing.assert_array_equal(b.diff, [10, 0, 30])   # a tie goes to the second bottom


def test_eltwise_errors():
    with pytest.raises(LayerError, match="one coefficient per bottom"):
        run_layer(elt("SUM", "coeff: 1"), three(0)[:2])
    with pytest.raises(LayerError, match="only takes coefficients for summation"):
        run_layer(elt("PROD", "coeff: 1 coeff: 1"), three(0)[:2])
    with pytest.raises(LayerError, match="same shape"):
        run_layer(elt("SUM"), [Blob((2, 3)), Blob((3, 2))])


# -- Filter, BatchReindex, Tile ----------------------------------------------------------------
def test_filter_values_and_gradient():
    x, y = rand(4, 3, seed=30), rand(4, 2, seed=31)
    sel = blob_from([[1], [0], [1], [0]])
    layer = make_layer('name: "f" type: "Filter"')
    tops = [Blob(), Blob()]
    layer.setup([x, y, sel], tops)
    layer.reshape([x, y, sel], tops)
    assert tops[0].shape == (4, 3)       # before any forward the selector is not yet known
    layer.forward([x, y, sel], tops)
    np.testing.assert_array_equal(tops[0].data, x.data[[0, 2]])
    np.testing.assert_array_equal(tops[1].data, y.data[[0, 2]])
    layer = make_layer('name: "f" type: "Filter" bottom: "x" bottom: "y" bottom: "sel"')
    assert not layer.allow_force_backward(2) and layer.allow_force_backward(0)
    # at setup the tops are sized for every item; forward shrinks them to the kept ones
    tops = run_layer(layer, [x, y, sel], 2)
    assert tops[0].shape == (2, 3)
    check_gradient(layer, [x, y, sel], tops, check_bottom=[0, 1], setup=False)
    assert (x.diff[[1, 3]] == 0).all()


def test_filter_errors():
    with pytest.raises(LayerError, match="same 0th dimension"):
        run_layer(make_layer('name: "f" type: "Filter"'), [Blob((3, 2)), blob_from([1, 0])])
    with pytest.raises(LayerError, match="one top per data bottom"):
        run_layer(make_layer('name: "f" type: "Filter"'), [Blob((2, 2)), blob_from([1, 0])], 2)


def test_batch_reindex_values_and_gradient():
    x = rand(3, 2, 2, seed=40)
    idx = blob_from([2, 0, 2, 1, 2])
    top = run_layer(make_layer('name: "b" type: "BatchReindex"'), [x, idx])
    np.testing.assert_array_equal(top[0].data, x.data[[2, 0, 2, 1, 2]])
    check_gradient(make_layer('name: "b" type: "BatchReindex"'), [x, idx], [Blob()],
                   check_bottom=[0])
    with pytest.raises(LayerError, match="greater than batch size"):
        run_layer(make_layer('name: "b" type: "BatchReindex"'), [x, blob_from([3])])


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_tile_values_and_gradient(axis):
    x = rand(2, 3, 2, seed=50)
    layer = make_layer('name: "t" type: "Tile" tile_param { axis: %d tiles: 3 }' % axis)
    top = run_layer(layer, [x])
    expected = np.concatenate([x.data.reshape(x.shape[:axis] + (1,) + x.shape[axis:])] * 3,
                              axis=axis).reshape(top[0].shape)
    reps = [1, 1, 1]
    reps[axis] = 3
    np.testing.assert_array_equal(top[0].data, np.tile(x.data, reps))
    assert top[0].shape == expected.shape
    check_gradient(make_layer('name: "t" type: "Tile" tile_param { axis: %d tiles: 3 }' % axis),
                   [x], [Blob()])


def test_tile_needs_tiles():
    with pytest.raises(LayerError, match="tiles"):
        run_layer(make_layer('name: "t" type: "Tile"'), [Blob((2, 3))])


# -- Reduction ---------------------------------------------------------------------------------
X = np.array([[[1, -2], [3, 0.5]], [[-1, 4], [2, -3]]], np.float32)


@pytest.mark.parametrize("op,axis,expected", [
    ("SUM", 0, 4.5), ("ASUM", 0, 16.5), ("SUMSQ", 0, 44.25), ("MEAN", 0, 4.5 / 8),
    ("SUM", 1, [2.5, 2.0]), ("ASUM", 1, [6.5, 10.0]), ("SUMSQ", 1, [14.25, 30.0]),
    ("MEAN", 1, [0.625, 0.5]), ("SUM", 2, [[-1, 3.5], [3, -1]]), ("ASUM", -1, [[3, 3.5], [5, 5]]),
])
def test_reduction_values(op, axis, expected):
    layer = make_layer('name: "r" type: "Reduction" reduction_param { operation: %s axis: %d '
                       'coeff: 2 }' % (op, axis))
    top = run_layer(layer, [blob_from(X)])
    assert top[0].shape == X.shape[:axis if axis >= 0 else X.ndim + axis]
    np.testing.assert_allclose(top[0].data, 2 * np.asarray(expected), rtol=1e-6)


@pytest.mark.parametrize("op", ["SUM", "ASUM", "SUMSQ", "MEAN"])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_reduction_gradient(op, axis):
    x = np.random.RandomState(60).randn(2, 3, 2).astype(np.float32)
    x[np.abs(x) < 0.05] = 0.3                # keep ASUM away from its kink at 0
    layer = make_layer('name: "r" type: "Reduction" reduction_param { operation: %s axis: %d '
                       'coeff: -1.5 }' % (op, axis))
    check_gradient(layer, [blob_from(x)], [Blob()])


# -- ArgMax ------------------------------------------------------------------------------------
A = np.array([[[3, 9, 1, 9]], [[5, 2, 8, 0]]], np.float32)     # shape 2 x 1 x 4


def test_argmax_flattened():
    top = run_layer(make_layer('name: "a" type: "ArgMax"'), [blob_from(A)])
    assert top[0].shape == (2, 1, 1)
    np.testing.assert_array_equal(top[0].data.ravel(), [3, 2])     # tie 9/9: larger index
    top2 = run_layer(make_layer('name: "a" type: "ArgMax" '
                                'argmax_param { top_k: 2 out_max_val: true }'), [blob_from(A)])
    assert top2[0].shape == (2, 2, 2)
    np.testing.assert_array_equal(top2[0].data, [[[3, 1], [9, 9]], [[2, 0], [8, 5]]])


def test_argmax_along_axis():
    x = np.array([[1, 7, 3], [4, 0, 6]], np.float32)
    top = run_layer(make_layer('name: "a" type: "ArgMax" argmax_param { axis: 0 }'), [blob_from(x)])
    assert top[0].shape == (1, 3)
    np.testing.assert_array_equal(top[0].data, [[1, 0, 1]])
    vals = run_layer(make_layer('name: "a" type: "ArgMax" argmax_param { axis: 1 top_k: 2 '
                                'out_max_val: true }'), [blob_from(x)])
    np.testing.assert_array_equal(vals[0].data, [[7, 3], [6, 4]])
    idx = run_layer(make_layer('name: "a" type: "ArgMax" argmax_param { axis: -1 top_k: 3 }'),
                    [blob_from(x)])
    np.testing.assert_array_equal(idx[0].data, [[1, 2, 0], [2, 0, 1]])


def test_argmax_errors_and_no_backward():
    with pytest.raises(LayerError, match="top_k must be less than or equal"):
        run_layer(make_layer('name: "a" type: "ArgMax" argmax_param { top_k: 5 }'), [blob_from(A)])
    with pytest.raises(LayerError, match="dimension of the axis"):
        run_layer(make_layer('name: "a" type: "ArgMax" argmax_param { axis: 1 top_k: 2 }'),
                  [blob_from(A)])
    assert not make_layer('name: "a" type: "ArgMax"').has_backward()


# -- Silence, Parameter ------------------------------------------------------------------------
def test_silence_zeroes_gradients():
    x, y = rand(2, 2, seed=70), rand(3, seed=71)
    x.diff[...] = 5
    layer = make_layer('name: "s" type: "Silence"')
    run_layer(layer, [x, y], 0)
    layer.backward([], [True, False], [x, y])
    assert (x.diff == 0).all()


def test_parameter_layer_offers_its_blob_and_accumulates_gradient():
    layer = make_layer('name: "p" type: "Parameter" parameter_param { shape { dim: 2 dim: 3 } }')
    (top,) = run_layer(layer, [])
    assert len(layer.blobs) == 1 and layer.blobs[0].shape == (2, 3) and top.shape == (2, 3)
    layer.blobs[0].data[...] = np.arange(6).reshape(2, 3)
    layer.forward([], [top])
    np.testing.assert_array_equal(top.data, np.arange(6).reshape(2, 3))
    top.diff[...] = 1
    layer.backward([top], [], [])
    layer.backward([top], [], [])
    assert (layer.blobs[0].diff == 2).all()      # parameter diffs accumulate, as Caffe's do
