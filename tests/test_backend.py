"""The CPU backend's op set, called directly: geometry, im2col/col2im, conv plans, pool plans,
LRN and GEMM, against loops and identities written here."""
import ctypes
import itertools
import time

import numpy as np
import pytest

from poseidon_caffe.backend import get_backend
from poseidon_caffe.backend.geometry import ConvGeometry, PoolGeometry

B = get_backend()
# the compiled kernels are optional: an install without a C compiler runs the numpy paths
NOT_BUILT = "the compiled kernels are not built (no C compiler at install)"


def _rand(shape, seed):
    return np.random.RandomState(seed).uniform(-1, 1, shape).astype(np.float32)


GEOMS = [
    ConvGeometry(2, 4, (7,), (3,), (2,), (1,), (2,), 2),                       # 1-D
    ConvGeometry(3, 2, (5, 6), (3, 2), (2, 1), (1, 0), (1, 2), 1),             # 2-D, mixed
    ConvGeometry(2, 2, (4, 3, 5), (2, 2, 3), (1, 2, 1), (1, 0, 1), (1, 1, 2), 2),  # 3-D
    ConvGeometry(4, 6, (3, 3), (1, 1), (1, 1), (0, 0), (1, 1), 2),             # pointwise
    ConvGeometry(4, 6, (7, 6), (3, 2), (1, 1), (1, 0), (2, 1), 2),             # stride 1, dilated
    ConvGeometry(3, 2, (4, 5, 3), (3, 2, 2), (1, 1, 1), (1, 1, 0), (1, 2, 1)),  # 3-D, stride 1
    ConvGeometry(6, 3, (5, 5), (3, 3), (1, 1), (2, 2), (1, 1), 3),             # pad > kernel/2
]
STRIDE_ONE = [g for g in GEOMS if all(s == 1 for s in g.stride)]
# and for the columns alone: strides 2 and 3 along rows, padding on one side of a stride
COLUMN_GEOMS = GEOMS + [
    ConvGeometry(3, 4, (9, 10), (3, 3), (2, 2), (1, 1), (1, 1)),
    ConvGeometry(2, 3, (11, 8), (2, 3), (3, 3), (0, 2), (1, 1)),
]


def _plans(geom):
    """Every plan for the geometry: im2col with channel-major columns, im2col image by image
    (one group), FFT (stride 1), Winograd (3x3 stride 1) and pointwise (1x1)."""
    from poseidon_caffe.backend.cpu import pointwise, winograd
    from poseidon_caffe.backend.cpu.conv import ConvPlan
    from poseidon_caffe.backend.cpu.fftconv import FFTConvPlan
    plans = [ConvPlan(geom)]
    plans[0].by_image = False
    if geom.group == 1 and not geom.is_pointwise:
        plans.append(ConvPlan(geom))
        plans[-1].by_image = True
    if all(s == 1 for s in geom.stride):
        plans.append(FFTConvPlan(geom))
    if winograd.serves(geom):
        plans.append(winograd.WinogradConvPlan(geom))
    if pointwise.serves(geom):
        plans.append(pointwise.PointwiseConvPlan(geom))
    return plans


def test_freed_temporaries_come_back_without_page_faults():
    """After keep_freed_memory, a freed block of several MB is reused by the next allocation
    of its size, not returned to the system and faulted in again page by page."""
    import resource
    from poseidon_caffe.backend.cpu import backend as cpu
    if not cpu.keep_freed_memory():
        pytest.skip("the C library is not glibc, or MALLOC_* thresholds are set in the "
                    "environment")

    def temporaries():
        for size in (3 << 20, 12 << 20, 5 << 20):          # bytes, as an iteration's mix
            np.ones(size // 4, np.float32)
    temporaries()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        temporaries()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < 200, faults          # glibc by default: several hundred here


# Winograd's tiles: maps a multiple of the 4x4 tile or not, every pad it takes, groups,
# non-square maps and a map smaller than one tile
WINOGRAD_GEOMS = [
    ConvGeometry(3, 5, (8, 8), (3, 3), (1, 1), (1, 1), (1, 1)),
    ConvGeometry(4, 6, (7, 9), (3, 3), (1, 1), (1, 1), (1, 1), 2),
    ConvGeometry(2, 3, (6, 5), (3, 3), (1, 1), (0, 0), (1, 1)),
    ConvGeometry(3, 2, (5, 7), (3, 3), (1, 1), (2, 2), (1, 1)),
    ConvGeometry(2, 4, (3, 3), (3, 3), (1, 1), (1, 1), (1, 1)),
    # more tiles than the compiled transforms take at once (16), with a remainder: 17 tiles a
    # row of tiles, and 18 x 3 an image
    ConvGeometry(2, 3, (6, 66), (3, 3), (1, 1), (1, 1), (1, 1)),
    ConvGeometry(3, 2, (70, 9), (3, 3), (1, 1), (0, 1), (1, 1)),
    # rows of tiles side by side in a vector (the compiled input transform without gathers):
    # rows of 3 (above), 4 (a last tile part outside the map), 8, 14 and 16 tiles
    ConvGeometry(2, 3, (13, 13), (3, 3), (1, 1), (1, 1), (1, 1)),
    ConvGeometry(2, 2, (10, 30), (3, 3), (1, 1), (1, 1), (1, 1)),
    ConvGeometry(2, 3, (9, 54), (3, 3), (1, 1), (1, 1), (1, 1)),
    ConvGeometry(3, 2, (5, 64), (3, 3), (1, 1), (1, 1), (1, 1)),
]
# pointwise: per-image GEMMs, transposed chunks and the compiled kernels, with groups; maps of
# one position, of fewer and more positions than a strip of the kernels' columns (48), and
# of more than a block of their depth (128); channels on either side of a panel (8, 16) and
# of a strip (48)
POINTWISE_GEOMS = [
    ConvGeometry(4, 6, (3, 3), (1, 1), (1, 1), (0, 0), (1, 1), 2),
    ConvGeometry(5, 3, (4, 6), (1, 1), (1, 1), (0, 0), (1, 1)),
    ConvGeometry(17, 9, (1, 1), (1, 1), (1, 1), (0, 0), (1, 1)),
    ConvGeometry(50, 24, (7, 7), (1, 1), (1, 1), (0, 0), (1, 1), 2),
    ConvGeometry(49, 33, (13, 11), (1, 1), (1, 1), (0, 0), (1, 1)),
]


def test_conv_geometry_output_size_rule():
    g = ConvGeometry(3, 8, (227, 227), (11, 11), (4, 4), (0, 0), (1, 1))
    assert g.out_shape == (55, 55)
    g = ConvGeometry(3, 8, (32, 32), (5, 5), (1, 1), (2, 2), (1, 1))
    assert g.out_shape == (32, 32)
    g = ConvGeometry(3, 8, (10, 9), (3, 3), (2, 3), (1, 0), (3, 1))   # dilated kernel 7
    assert g.out_shape == ((10 + 2 - 7) // 2 + 1, (9 - 3) // 3 + 1)
    with pytest.raises(ValueError):
        ConvGeometry(3, 8, (5, 5), (3, 3), (1, 1), (0, 0), (1, 1), group=2)


def _columns_by(way, monkeypatch):
    """im2col and col2im by the compiled kernels (kernels/columns.c, 2-D) or by numpy."""
    from poseidon_caffe.backend.cpu import native
    if way == "numpy":
        monkeypatch.setattr(native, "lib", None)
    elif native.lib is None:
        pytest.skip(NOT_BUILT)


@pytest.mark.parametrize("way", ["compiled", "numpy"])
@pytest.mark.parametrize("geom", COLUMN_GEOMS, ids=str)
def test_im2col_matches_direct_indexing(geom, way, monkeypatch):
    _columns_by(way, monkeypatch)
    x = _rand((2, geom.channels) + geom.in_shape, 1)
    col = B.im2col(x, geom)
    assert col.shape == (2, geom.col_rows) + geom.out_shape
    taps = list(itertools.product(*(range(k) for k in geom.kernel)))
    for c, (t, tap) in itertools.product(range(geom.channels), enumerate(taps)):
        for o in itertools.product(*(range(v) for v in geom.out_shape)):
            pos = [oo * s - p + tt * d for oo, s, p, tt, d in
                   zip(o, geom.stride, geom.pad, tap, geom.dilation)]
            inside = all(0 <= q < n for q, n in zip(pos, geom.in_shape))
            want = x[(slice(None), c) + tuple(pos)] if inside else 0
            np.testing.assert_array_equal(col[(slice(None), c * len(taps) + t) + o], want)


@pytest.mark.parametrize("way", ["compiled", "numpy"])
@pytest.mark.parametrize("geom", COLUMN_GEOMS, ids=str)
def test_col2im_is_the_adjoint_of_im2col(geom, way, monkeypatch):
    _columns_by(way, monkeypatch)
    x = _rand((3, geom.channels) + geom.in_shape, 2).astype(np.float64)
    c = _rand((3, geom.col_rows) + geom.out_shape, 3).astype(np.float64)
    lhs = np.vdot(B.im2col(x.astype(np.float32), geom), c)
    rhs = np.vdot(x, B.col2im(c.astype(np.float32), geom))
    assert abs(lhs - rhs) <= 1e-4 * max(1.0, abs(lhs))


@pytest.mark.parametrize("geom", [g for g in COLUMN_GEOMS if g.nd == 2], ids=str)
def test_compiled_col2im_adds_the_taps_in_numpys_order(geom, monkeypatch):
    """The same float32 sums as numpy's strided adds, bit for bit: each cell gets its taps
    in (row tap, column tap) order, starting from 0."""
    from poseidon_caffe.backend.cpu import native
    if native.lib is None:
        pytest.skip(NOT_BUILT)
    from poseidon_caffe.backend.cpu.conv import col2im
    col = _rand((geom.col_rows, 3 * geom.out_count), 36) * 7
    compiled = col2im(col, geom, 3)
    monkeypatch.setattr(native, "lib", None)
    np.testing.assert_array_equal(compiled, col2im(col, geom, 3))


@pytest.mark.parametrize("way", ["compiled", "numpy", "compiled, products across images"])
@pytest.mark.parametrize("geom", GEOMS, ids=str)
def test_conv_plan_forward_and_backward_match_im2col_matrix_products(geom, way, monkeypatch):
    """Independent of the plan's layout: per-image, per-group products of the Im2col matrix;
    the columns of both layouts made and scattered back by the compiled kernels and by
    numpy; and the image-by-image layout's products by kernels/image_gemm.c whatever their
    rows (a first layer's only, otherwise), with and without a bias."""
    from poseidon_caffe.backend.cpu import conv, native
    _columns_by(way.split(",")[0], monkeypatch)
    if way.endswith("across images"):
        if not native.image_gemm:
            pytest.skip("the GEMMs across images need AVX-512")
        monkeypatch.setattr(conv, "KERNELS_MIN_ROWS", 1)
    n = 3
    x = _rand((n, geom.channels) + geom.in_shape, 4)
    w = _rand(geom.weight_shape, 5)
    bias = _rand((geom.num_output,), 6)
    dy = _rand((n, geom.num_output) + geom.out_shape, 7)
    col = B.im2col(x, geom).reshape(n, geom.group, -1, geom.out_count).astype(np.float64)
    wg = w.reshape(geom.group, geom.num_output // geom.group, -1).astype(np.float64)
    want = np.einsum("gmk,ngkp->ngmp", wg, col).reshape(
        (n, geom.num_output) + geom.out_shape) + bias.reshape((1, -1) + (1,) * geom.nd)
    for plan in _plans(geom):
        _check_plan(plan, geom, x, w, bias, dy, col, wg, want)
        y = np.empty(want.shape, np.float32)
        plan.forward(x, w, None, y)
        np.testing.assert_allclose(y, want - bias.reshape((1, -1) + (1,) * geom.nd),
                                   rtol=1e-4, atol=1e-5)


def _check_plan(plan, geom, x, w, bias, dy, col, wg, want):
    n = x.shape[0]
    y = np.empty(want.shape, np.float32)
    plan.forward(x, w, bias, y)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)

    dyg = dy.reshape(n, geom.group, -1, geom.out_count).astype(np.float64)
    dw_want = np.einsum("ngmp,ngkp->gmk", dyg, col).reshape(geom.weight_shape)
    dcol = np.einsum("gmk,ngmp->ngkp", wg, dyg).reshape((n, geom.col_rows) + geom.out_shape)
    dx_want = B.col2im(dcol.astype(np.float32), geom)
    dw = np.full(geom.weight_shape, 0.5, np.float32)         # backward adds into it
    db = np.full((geom.num_output,), 0.25, np.float32)
    dx = np.empty_like(x)
    plan.backward(x, dy, w, dx=dx, dw=dw, dbias=db)
    np.testing.assert_allclose(dw, dw_want + 0.5, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, dy.sum(axis=(0,) + tuple(range(2, dy.ndim))) + 0.25,
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, dx_want, rtol=1e-4, atol=1e-4)


# 2-D stride 1, one group: output channels below, at and past a block of 32 lanes, rows not a
# multiple of the 8 outputs computed together, kernels not square, pads of 0 and kernel - 1
DIRECT_GEOMS = [
    ConvGeometry(3, 5, (9, 11), (3, 5), (1, 1), (1, 2), (1, 1), 1),
    ConvGeometry(33, 40, (6, 13), (5, 5), (1, 1), (2, 0), (1, 1), 1),
    ConvGeometry(4, 64, (5, 5), (2, 2), (1, 1), (0, 1), (1, 1), 1),
    ConvGeometry(2, 3, (12, 14), (3, 9), (1, 1), (2, 4), (1, 1), 1),     # two groups of taps
]


@pytest.mark.parametrize("data_by_gemm", [False, True], ids=["data direct", "data by GEMM"])
@pytest.mark.parametrize("geom", DIRECT_GEOMS, ids=str)
def test_direct_plan_matches_im2col_matrix_products(geom, data_by_gemm):
    from poseidon_caffe.backend.cpu import direct
    if not direct.serves(geom):
        pytest.skip("no compiled kernels or no AVX-512 here")
    n = 3
    x, w, bias = _rand((n, geom.channels) + geom.in_shape, 4), _rand(geom.weight_shape, 5), \
        _rand((geom.num_output,), 6)
    dy = _rand((n, geom.num_output) + geom.out_shape, 7)
    col = B.im2col(x, geom).reshape(n, 1, -1, geom.out_count).astype(np.float64)
    wg = w.reshape(1, geom.num_output, -1).astype(np.float64)
    want = np.einsum("gmk,ngkp->ngmp", wg, col).reshape(
        (n, geom.num_output) + geom.out_shape) + bias.reshape(1, -1, 1, 1)
    plan = direct.DirectConvPlan(geom, data_by_gemm=data_by_gemm)
    _check_plan(plan, geom, x, w, bias, dy, col, wg, want)
    assert plan.workspace_bytes(n) > 0              # the net's memory estimate asks every plan


@pytest.mark.parametrize("transforms", ["compiled", "compiled portable", "numpy"])
@pytest.mark.parametrize("chunk_bytes", [1, 1 << 30], ids=["image by image", "one chunk"])
@pytest.mark.parametrize("geom", WINOGRAD_GEOMS + POINTWISE_GEOMS, ids=str)
def test_winograd_and_pointwise_plans_match_im2col_matrix_products(geom, chunk_bytes,
                                                                     transforms, monkeypatch):
    """The same independent truth as above, with the batch worked in chunks of one image
    and in one chunk, Winograd's tile transforms compiled (kernels/winograd.c) and by numpy,
    and the pointwise plan in both of its layouts."""
    from poseidon_caffe.backend.cpu import native, pointwise, winograd
    if transforms != "numpy" and not winograd.compiled():
        pytest.skip(NOT_BUILT)
    if transforms == "numpy":
        monkeypatch.setattr(native, "lib", None)
    monkeypatch.setattr(native, "PORTABLE_WINOGRAD", transforms == "compiled portable")
    monkeypatch.setattr(winograd, "CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(winograd, "MIN_TILES", 1)
    monkeypatch.setattr(pointwise, "CHUNK_BYTES", chunk_bytes)
    n = 3
    x = _rand((n, geom.channels) + geom.in_shape, 14)
    w = _rand(geom.weight_shape, 15)
    bias = _rand((geom.num_output,), 16)
    dy = _rand((n, geom.num_output) + geom.out_shape, 17)
    col = B.im2col(x, geom).reshape(n, geom.group, -1, geom.out_count).astype(np.float64)
    wg = w.reshape(geom.group, geom.num_output // geom.group, -1).astype(np.float64)
    want = np.einsum("gmk,ngkp->ngmp", wg, col).reshape(
        (n, geom.num_output) + geom.out_shape) + bias.reshape((1, -1) + (1,) * geom.nd)
    if winograd.serves(geom):
        plans = [winograd.WinogradConvPlan(geom)]
    else:
        plans = []
        for layout in ("images", "columns", "kernels"):
            plan = pointwise.PointwiseConvPlan(geom)
            plan.kernels = layout == "kernels"
            if plan.kernels and not (native.image_gemm and native.lib):
                continue          # no AVX-512, or the numpy paths under test
            plan.layout = "columns" if plan.kernels else layout
            plans.append(plan)
    for plan in plans:
        _check_plan(plan, geom, x, w, bias, dy, col, wg, want)


def test_winograd_matrices_compute_a_correlation_exactly():
    """F(4, 3) in exact arithmetic: y[i] = sum_k d[i + k] g[k] for random d and g."""
    from poseidon_caffe.backend.cpu.winograd import winograd_matrices
    at, g, bt = winograd_matrices()
    assert at.shape == (4, 6) and g.shape == (6, 3) and bt.shape == (6, 6)
    rng = np.random.RandomState(18)
    d, k = rng.randn(6), rng.randn(3)
    want = [d[i:i + 3] @ k for i in range(4)]
    np.testing.assert_allclose(at @ ((g @ k) * (bt @ d)), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["im2col", "by_image", "fft"])
def test_conv_plan_does_not_reuse_columns_of_an_older_forward(kind):
    geom = STRIDE_ONE[2] if kind == "by_image" else STRIDE_ONE[1]     # by image: one group
    plan = {"fft" if type(p).__name__ == "FFTConvPlan" else
            "by_image" if p.by_image else "im2col": p for p in _plans(geom)}[kind]
    x = _rand((2, geom.channels) + geom.in_shape, 8)
    w = _rand(geom.weight_shape, 9)
    y = np.empty((2, geom.num_output) + geom.out_shape, np.float32)
    plan.forward(x, w, None, y)
    first = y.copy()
    x *= -2                                                   # same array, new values
    plan.forward(x, w, None, y)
    np.testing.assert_allclose(y, -2 * first, rtol=1e-5, atol=1e-5)


def test_conv_algorithm_choice_follows_the_cost_model():
    from poseidon_caffe.backend.cpu import direct
    from poseidon_caffe.backend.cpu.backend import conv_algorithm, direct_data_by_gemm
    cifar_conv2 = ConvGeometry(32, 32, (16, 16), (5, 5), (1, 1), (2, 2), (1, 1))
    cifar_conv1 = ConvGeometry(3, 32, (32, 32), (5, 5), (1, 1), (2, 2), (1, 1))
    alexnet_conv1 = ConvGeometry(3, 96, (227, 227), (11, 11), (4, 4), (0, 0), (1, 1))
    inception_1x1 = ConvGeometry(192, 64, (28, 28), (1, 1), (1, 1), (0, 0), (1, 1))
    # tens of channels: FFT, or the direct kernels where they run
    assert conv_algorithm(cifar_conv2, 100) == ("direct" if direct.serves(cifar_conv2) else
                                                "fft")
    # three input channels: the images, whose gradient nobody asks for; 75 products an output
    assert conv_algorithm(cifar_conv1, 100) == ("direct" if direct.serves(cifar_conv1) else
                                                "im2col")
    # no padding: the direct kernels' backward-data would multiply mostly zeros (8x8 -> 12x12)
    # and runs as a GEMM and col2im instead
    lenet_conv2 = ConvGeometry(20, 50, (12, 12), (5, 5), (1, 1), (0, 0), (1, 1))
    assert conv_algorithm(lenet_conv2, 64) == ("direct" if direct.serves(lenet_conv2) else
                                               "fft")
    assert direct_data_by_gemm(lenet_conv2, 64) and not direct_data_by_gemm(cifar_conv2, 100)
    lenet_conv1 = ConvGeometry(1, 20, (28, 28), (5, 5), (1, 1), (0, 0), (1, 1))
    vgg_conv1 = ConvGeometry(3, 64, (64, 64), (3, 3), (1, 1), (1, 1), (1, 1))
    assert conv_algorithm(lenet_conv1, 64) == "im2col"            # 25 products an output
    assert conv_algorithm(vgg_conv1, 32) == "im2col"              # 27
    assert conv_algorithm(inception_1x1, 32) == "pointwise"       # a plain GEMM
    googlenet_conv2 = ConvGeometry(64, 192, (56, 56), (3, 3), (1, 1), (1, 1), (1, 1))
    vgg_conv3 = ConvGeometry(256, 256, (16, 16), (3, 3), (1, 1), (1, 1), (1, 1))
    assert conv_algorithm(googlenet_conv2, 32) == "winograd"      # a quarter of the products
    assert conv_algorithm(vgg_conv3, 32) == "winograd"
    assert conv_algorithm(alexnet_conv1, 32) == "im2col"          # strided: never FFT
    # a 4x4 map of 512 channels: one tile an image, and Winograd's transformed weights (38 MB,
    # fresh three times an iteration) cost more than its products save; im2col on shared
    # columns keeps nothing either
    vgg_conv5 = ConvGeometry(512, 512, (4, 4), (3, 3), (1, 1), (1, 1), (1, 1))
    assert conv_algorithm(vgg_conv5, 32) == "im2col"
    assert conv_algorithm(vgg_conv5, 32, parts=2) == "im2col"      # each part pays them all
    vgg_conv4 = ConvGeometry(512, 512, (8, 8), (3, 3), (1, 1), (1, 1), (1, 1))
    assert conv_algorithm(vgg_conv4, 32) == "winograd"
    plan_name = "DirectConvPlan" if direct.serves(cifar_conv2) else "FFTConvPlan"
    whole = type(B)()
    whole.split_threads = 1
    assert type(whole.conv_plan(cifar_conv2, 100)).__name__ == plan_name
    assert type(whole.conv_plan(cifar_conv2)).__name__ == "ConvPlan"
    split = type(B)()
    split.split_threads = 2
    plan = split.conv_plan(cifar_conv2, 100)
    assert type(plan).__name__ == "SplitConvPlan"
    assert type(plan._make_plan(50)).__name__ == plan_name
    assert type(split.conv_plan(cifar_conv2)).__name__ == "ConvPlan"      # batch unknown


def test_pool_geometry_window_sizes_count_padding_but_not_overhang():
    g = PoolGeometry((5,), (3,), (2,), (1,), (3,))
    # windows [-1, 2), [1, 4), [3, 6): the last is clipped to input + pad = 6
    np.testing.assert_array_equal(g.window_sizes(), [3, 3, 3])
    g = PoolGeometry((6,), (3,), (2,), (0,), (3,))
    # windows [0, 3), [2, 5), [4, 7) -> clipped at 6
    np.testing.assert_array_equal(g.window_sizes(), [3, 3, 2])


def test_pool_plan_max_mask_and_routed_backward():
    g = PoolGeometry((4, 4), (2, 2), (2, 2), (0, 0), (2, 2))
    plan = B.pool_plan(g)
    x = np.arange(32, dtype=np.float32).reshape(2, 1, 4, 4)[:, :, ::-1, :].copy()
    y = np.empty((2, 1, 2, 2), np.float32)
    plan.max_forward(x, y)
    # the max of each 2x2 block is its top-right element after the row flip
    np.testing.assert_array_equal(plan.mask()[0, 0], [[1, 3], [9, 11]])
    dy = np.arange(1, 9, dtype=np.float32).reshape(2, 1, 2, 2)
    dx = np.empty_like(x)
    plan.routed_backward(dy, dx)
    assert dx.sum() == dy.sum() and dx[1, 0, 2, 3] == dy[1, 0, 1, 1]


def test_lrn_window_sum_and_ops():
    from poseidon_caffe.backend.cpu.lrn import window_sum
    a = np.arange(5, dtype=np.float32).reshape(1, 5, 1, 1)
    np.testing.assert_array_equal(window_sum(a, 3, (1,)).ravel(), [1, 3, 6, 9, 7])
    x = _rand((1, 3, 2, 2), 10)
    y, _ = B.lrn_forward(x, 3, 3.0, 0.5, 2.0, True)   # the state is the backward's business
    s0 = 2.0 + 1.0 * (x[0, 0] ** 2 + x[0, 1] ** 2)
    np.testing.assert_allclose(y[0, 0], x[0, 0] / np.sqrt(s0), rtol=1e-6)


@pytest.mark.parametrize("accumulating", [False, True])
def test_gemm_transposes_and_accumulation(accumulating, monkeypatch):
    from poseidon_caffe.backend.cpu import backend as cpu
    if accumulating:
        pytest.importorskip("scipy")
    monkeypatch.setattr(cpu, "_ACCUMULATING_GEMM", cpu._sgemm if accumulating else None)
    a, b = _rand((3, 4), 11), _rand((5, 4), 12)
    out = np.ones((3, 5), np.float32)
    B.gemm(a, b, trans_b=True, alpha=2.0, beta=0.5, out=out)
    np.testing.assert_allclose(out, 2 * a @ b.T + 0.5, rtol=1e-6)
    dy = _rand((3, 5), 13)
    acc = np.ones((4, 5), np.float32)
    B.gemm(a, dy, trans_a=True, beta=1.0, out=acc)                  # dW += x^T dy
    np.testing.assert_allclose(acc, a.T @ dy + 1, rtol=1e-6)
    np.testing.assert_allclose(B.gemm(a.T.copy(), b, trans_a=True, trans_b=True), a @ b.T,
                               rtol=1e-6)


def test_gemm_of_few_rows_against_a_transposed_operand_is_made_as_its_transpose():
    """InnerProduct's forward, a batch's rows times the weights read transposed: the product
    is made as (w x^T)^T, with alpha, into a given output or a new one, and with beta 0 only
    (6 rows, at most FEW_ROWS, against 50 >= 2 x 6)."""
    from poseidon_caffe.backend.cpu import backend as cpu
    assert 6 <= cpu.FEW_ROWS
    x, w = _rand((6, 20), 70), _rand((50, 20), 71)
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    out = np.full((6, 50), np.nan, np.float32)
    B.gemm(x, w, trans_b=True, alpha=3.0, out=out)
    np.testing.assert_allclose(out, 3 * want, rtol=1e-5, atol=1e-5)
    fresh = B.gemm(x, w, trans_b=True)
    assert fresh.flags.c_contiguous
    np.testing.assert_allclose(fresh, want, rtol=1e-5, atol=1e-5)
    acc = np.ones((6, 50), np.float32)
    B.gemm(x, w, trans_b=True, beta=1.0, out=acc)                       # accumulating
    np.testing.assert_allclose(acc, want + 1, rtol=1e-5, atol=1e-5)


def test_fft_plan_never_uses_a_stale_weight_spectrum():
    from poseidon_caffe.backend.cpu.conv import ConvPlan
    from poseidon_caffe.backend.cpu.fftconv import FFTConvPlan
    geom = ConvGeometry(3, 4, (6, 5), (3, 3), (1, 1), (1, 1), (1, 1))
    plan, reference = FFTConvPlan(geom), ConvPlan(geom)
    x = _rand((2, 3, 6, 5), 13)
    w = _rand(geom.weight_shape, 14)
    dy = _rand((2, 4, 6, 5), 15)
    y = np.empty_like(dy)
    dx, want = np.empty_like(x), np.empty_like(x)

    plan.forward(x, w, None, y)
    other = w * 2                                   # a different weight array
    plan.backward(x, dy, other, dx=dx)
    reference.backward(x, dy, other, dx=want)
    np.testing.assert_allclose(dx, want, rtol=1e-4, atol=1e-4)

    plan.forward(x, w, None, y)
    plan.backward(x, dy, w, dw=np.zeros_like(w))    # the backward after the forward
    w *= 3                                          # same array, new values (a solver step)
    plan.backward(None, dy, w, dx=dx)               # Deconvolution's forward
    reference.backward(None, dy, w, dx=want)
    np.testing.assert_allclose(dx, want, rtol=1e-4, atol=1e-4)


# -- batch slicing, the thread pool, and the paths that use them ---------------------------
@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def small_slices(request, monkeypatch):
    """Slices of a few hundred bytes (so a small batch splits into many), on 1 or 2 threads."""
    from poseidon_caffe.backend.cpu import threads
    monkeypatch.setattr(threads, "SLICE_BYTES", 300)
    monkeypatch.setattr(threads, "thread_count", lambda: request.param)
    return request.param


def test_slices_cover_the_range_once_with_a_slice_per_thread():
    from poseidon_caffe.backend.cpu.threads import slices
    for n, per_item, threads in [(10, 100, 1), (10, 10 ** 9, 2), (7, 1, 3), (1, 5, 4), (32, 50, 2)]:
        parts = slices(n, per_item, threads, slice_bytes=400)
        covered = [i for lo, hi in parts for i in range(lo, hi)]
        assert covered == list(range(n))
        assert len(parts) >= min(n, threads)
        assert all(hi - lo >= 1 for lo, hi in parts)
    assert len(slices(100, 100, 1, slice_bytes=1000)) == 10


def test_over_batch_runs_slices_on_the_pool_threads():
    import threading
    from poseidon_caffe.backend.cpu.threads import over_batch
    seen = {}

    def work(lo, hi):
        seen[(lo, hi)] = threading.current_thread().name
    over_batch(work, 8, 1, threads=2)
    assert sorted(seen) == [(0, 4), (4, 8)]
    assert all(name.startswith("Backend-") for name in seen.values())
    seen.clear()
    over_batch(work, 8, 1, threads=1)
    assert list(seen.values()) == [threading.current_thread().name]


def _naive_max_pool(x, g):
    """Caffe's loops: window clipped to the input, first strict maximum in row-major order."""
    n, c = x.shape[:2]
    y = np.empty((n, c) + g.out_shape, np.float32)
    mask = np.empty(y.shape, np.int64)
    dy_route = []
    for a, b, i, j in itertools.product(range(n), range(c), *map(range, g.out_shape)):
        hs, ws = i * g.stride[0] - g.pad[0], j * g.stride[1] - g.pad[1]
        best, where = -np.finfo(np.float32).max, -1       # an empty window keeps these
        for u in range(max(hs, 0), min(hs + g.kernel[0], g.in_shape[0])):
            for v in range(max(ws, 0), min(ws + g.kernel[1], g.in_shape[1])):
                if x[a, b, u, v] > best:
                    best, where = x[a, b, u, v], u * g.in_shape[1] + v
        y[a, b, i, j], mask[a, b, i, j] = best, where
        if where >= 0:
            dy_route.append(((a, b, i, j), (a, b) + divmod(where, g.in_shape[1])))
    return y, mask, dy_route


POOL_GEOMS = [   # (in, kernel, stride, pad, out): overlap, overhang, padding, k == s, k < s
    ((9, 11), (3, 3), (2, 2), (0, 0), (4, 5)),
    ((8, 8), (3, 3), (2, 2), (0, 0), (4, 4)),        # rounded up: the last window overhangs
    ((7, 6), (3, 2), (2, 1), (1, 1), (4, 7)),
    ((6, 6), (2, 2), (2, 2), (0, 0), (3, 3)),
    ((7, 7), (2, 2), (3, 3), (0, 0), (2, 2)),
]


# kernel shorter than stride, no padding: Caffe's rounded-up count puts a last window wholly
# past the input (MAX: -FLT_MAX, mask -1, no gradient)
EMPTY_WINDOW_GEOMS = [
    ((8, 8), (1, 1), (2, 2), (0, 0), (5, 5)),
    ((10, 7), (1, 2), (4, 3), (0, 0), (4, 3)),
]


# the compiled MAX keeps each winner's place in its window in one byte up to 255 cells
# (255 = no winner), in int32 past that: 15x17 = 255 and 16x17 = 272 cells, with padding and
# a last window overhanging the input on both axes
BIG_WINDOW_GEOMS = [
    ((17, 19), (15, 17), (2, 3), (1, 2), (3, 3)),
    ((20, 21), (16, 17), (3, 2), (2, 3), (4, 6)),
]


# stride 1, the output the input's size: shifted loads over the flat batch (pool_same.c,
# AVX-512), whose 16 lanes hold parts of several rows (of 7, 5 and 3 cells) and planes; a
# plane shorter than the window; a 1x1 window; windows of 5x3 and 15x17 (255 cells)
SAME_GEOMS = [
    ((7, 7), (3, 3), (1, 1), (1, 1), (7, 7)),
    ((14, 5), (3, 3), (1, 1), (1, 1), (14, 5)),
    ((2, 3), (3, 3), (1, 1), (1, 1), (2, 3)),
    ((4, 4), (1, 1), (1, 1), (0, 0), (4, 4)),
    ((9, 20), (5, 3), (1, 1), (2, 1), (9, 20)),
    ((16, 18), (15, 17), (1, 1), (7, 8), (16, 18)),
]


# columns stepping by 2 with rows of 12 outputs or more: MAX forward 16 outputs a vector
# (pool_stride2.c, AVX-512): AlexNet's 13x13 pool2 (one short vector a row), two vectors and
# an overhanging last window, padding, 2x2, a 3x4 window with rows stepping by 3, 16x17
# (int32 winners)
STRIDE2_GEOMS = [
    ((27, 27), (3, 3), (2, 2), (0, 0), (13, 13)),
    ((35, 40), (3, 3), (2, 2), (0, 0), (17, 20)),
    ((30, 33), (3, 3), (2, 2), (1, 1), (16, 17)),
    ((24, 50), (2, 2), (2, 2), (0, 0), (12, 25)),
    ((20, 40), (3, 4), (3, 2), (1, 2), (7, 21)),
    ((40, 60), (16, 17), (2, 2), (2, 3), (15, 26)),
]
# rows of 5 to 8 outputs: MAX forward two planes a vector (pool_packed.c, AVX-512): AlexNet's
# 13x13 pool5, GoogLeNet's 14x14 pool4 (an overhanging last window), VGG's 2x2 pool3 at
# 64x64, padding with rows stepping by 3, stride 1 with a 4x5 window and padding
PACKED_GEOMS = [
    ((13, 13), (3, 3), (2, 2), (0, 0), (6, 6)),
    ((14, 14), (3, 3), (2, 2), (0, 0), (7, 7)),
    ((16, 16), (2, 2), (2, 2), (0, 0), (8, 8)),
    ((11, 14), (3, 2), (3, 2), (1, 1), (4, 8)),
    ((9, 7), (4, 5), (1, 1), (1, 2), (8, 7)),
]
# the compiled passes: 16 planes a vector (pool_lanes.c, AVX-512) or shifted loads
# (pool_same.c, AVX-512), or where there is no AVX-512 a window's rows then its columns (MAX
# forward, pool_rows.c, AVX2; column strides 1 and 2), 8 planes a vector (MAX and AVE
# forward, pool_lanes8.c, AVX2) and 8 cells a vector (AVE backward, pool_ave_vectors.c); the
# phased layout; the AVX2 passes even on AVX-512, and MAX's forward by 8 planes a vector alone
NATIVE_POOL_PATHS = ["native", "native phased", "native avx2", "native avx2 planes"]
POOL_PATHS = ["stages", "taps"] + NATIVE_POOL_PATHS


# columns stepping by 2 over rows of one cell (the phased layout's pairs of columns, which
# lost such a cell once); a window's rows then its columns (pool_rows.c, AVX2, rows of 6
# outputs or more): rows stepping past the window (input rows no window reads), rows of 8 and
# 9 outputs (a whole vector; one lane of a second), 7 and an overhanging last window with
# padding on both axes; planes of over 2048 cells (AlexNet's and VGG's first pools' size);
# columns 2 apart whose first 3 windows are clipped (their vectors' lanes in another order);
# a plane of more rows than a band of strips, padded (the first and last rows' windows taken
# from the inside rows' maxima)
ROWS_GEOMS = [
    ((20, 1), (1, 2), (1, 2), (0, 0), (20, 1)),
    ((21, 1), (3, 2), (1, 2), (0, 1), (19, 1)),
    ((13, 10), (2, 3), (3, 1), (0, 1), (5, 10)),
    ((6, 15), (3, 3), (1, 2), (1, 1), (6, 8)),
    ((5, 16), (2, 3), (2, 2), (1, 1), (3, 9)),
    ((10, 12), (4, 3), (3, 2), (2, 1), (4, 7)),
    ((47, 50), (3, 3), (2, 2), (1, 0), (24, 25)),     # a large plane, padded rows
    ((9, 30), (3, 7), (2, 2), (1, 6), (5, 18)),
    ((300, 8), (3, 3), (1, 1), (1, 1), (300, 8)),     # rows in bands, padded top and bottom
]


@pytest.fixture(autouse=True)
def _lanes_pooling_back_on():
    """A test that took the phased pooling passes leaves the default behind."""
    yield
    from poseidon_caffe.backend.cpu import native
    native.PORTABLE_POOLING = False
    if native.lib is not None:
        native.avx2_pooling_first(False)


def _native_paths_here():
    """NATIVE_POOL_PATHS, less the AVX2 ones on a CPU without AVX2."""
    from poseidon_caffe.backend.cpu import native
    if native.lib is None:
        pytest.skip(NOT_BUILT)
    avx2 = native.avx2_pooling_first(True)
    native.avx2_pooling_first(False)
    return [path for path in NATIVE_POOL_PATHS if not path.startswith("native avx2") or avx2]


def _take_pool_path(plan, path):
    """Set ``plan`` (a PoolPlan or SplitPoolPlan) on one of its paths: the numpy stages, the
    numpy tap loop, or the compiled kernels, their widest vectors, the phased layout, or MAX's
    forward by the AVX2 passes, or by their 8 planes a vector alone (skipped where they were
    not built, or no AVX2)."""
    from poseidon_caffe.backend.cpu import native
    if path.startswith("native") and native.lib is None:
        pytest.skip("the compiled kernels are not built (no C compiler at install, or "
                    "POSEIDON_NATIVE=0)")
    if (path.startswith("native avx2") and
            not native.avx2_pooling_first(True, rows=path == "native avx2",
                                          tiles=path == "native avx2")):
        pytest.skip("this CPU has no AVX2")
    plan.native = path.startswith("native")
    plan.separable = path == "stages"
    native.PORTABLE_POOLING = path == "native phased"


@pytest.mark.parametrize("path", POOL_PATHS)
@pytest.mark.parametrize("spec", POOL_GEOMS + EMPTY_WINDOW_GEOMS + BIG_WINDOW_GEOMS +
                         SAME_GEOMS + STRIDE2_GEOMS + PACKED_GEOMS + ROWS_GEOMS, ids=str)
def test_max_pool_paths_match_caffe_loops(spec, path, small_slices):
    g = PoolGeometry(*spec)
    plan = B.pool_plan(g)
    _take_pool_path(plan, path)
    x = np.round(_rand((3, 2) + g.in_shape, 20) * 4)          # many ties
    y = np.empty((3, 2) + g.out_shape, np.float32)
    plan.max_forward(x, y)
    want, mask, routes = _naive_max_pool(x, g)
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(plan.mask(), mask)
    dy = _rand(y.shape, 21)
    dx = np.full(x.shape, np.nan, np.float32)
    plan.routed_backward(dy, dx)
    dx_want = np.zeros(x.shape)
    for out_index, in_index in routes:
        dx_want[in_index] += dy[out_index]
    np.testing.assert_allclose(dx, dx_want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("path", POOL_PATHS)
@pytest.mark.parametrize("spec", POOL_GEOMS, ids=str)
def test_ave_pool_paths_match_window_sums_and_their_adjoint(spec, path, small_slices):
    g = PoolGeometry(*spec)
    plan = B.pool_plan(g)
    _take_pool_path(plan, path)
    x = _rand((3, 2) + g.in_shape, 22)
    y = np.empty((3, 2) + g.out_shape, np.float32)
    plan.ave_forward(x, y)
    want = np.empty(y.shape)
    for i, j in itertools.product(*map(range, g.out_shape)):
        hs, ws = i * g.stride[0] - g.pad[0], j * g.stride[1] - g.pad[1]
        size = ((min(hs + g.kernel[0], g.in_shape[0] + g.pad[0]) - hs) *
                (min(ws + g.kernel[1], g.in_shape[1] + g.pad[1]) - ws))
        win = x[:, :, max(hs, 0):hs + g.kernel[0], max(ws, 0):ws + g.kernel[1]]
        want[:, :, i, j] = win.sum(axis=(2, 3)) / size
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    dy = _rand(y.shape, 23)
    dx = np.full(x.shape, np.nan, np.float32)
    plan.ave_backward(dy, dx)
    lhs, rhs = np.vdot(y.astype(np.float64), dy), np.vdot(x.astype(np.float64), dx)
    assert abs(lhs - rhs) <= 1e-5 * max(1.0, abs(lhs))


# a window holding the whole plane: GoogLeNet's 7x7 pool5; padding, Caffe's divisor counting
# it; a kernel past the plane
GLOBAL_AVE_GEOMS = [
    ((7, 7), (7, 7), (1, 1), (0, 0), (1, 1)),
    ((5, 6), (7, 8), (1, 1), (1, 1), (1, 1)),
    ((3, 4), (5, 5), (1, 1), (0, 0), (1, 1)),
]


@pytest.mark.parametrize("spec", GLOBAL_AVE_GEOMS, ids=str)
def test_native_global_ave_backward_is_caffes_zeroed_diff_plus_each_share(spec):
    """AVE's backward where the one window holds the plane is a fill: every cell gets
    float32(dy / size) added to Caffe's zeroed diff (so -0.0 comes out +0.0), and the adding
    form adds the same share to each cell's value."""
    from poseidon_caffe.backend.cpu import native
    if native.lib is None:
        pytest.skip(NOT_BUILT)
    g = PoolGeometry(*spec)
    size = np.float32(g.window_sizes()[0, 0])
    dy = _rand((2, 5, 1, 1), 51) * 10
    dy.reshape(-1)[::4] = -0.0
    dx = np.full((2, 5) + g.in_shape, np.nan, np.float32)
    native.ave_pool_backward(dy, dx, g)
    want = np.float32(0) + np.broadcast_to(dy / size, dx.shape)
    assert dx.tobytes() == want.astype(np.float32).tobytes()
    assert not np.signbit(dx[0, 0]).any()
    before = _rand(dx.shape, 52)
    added = before.copy()
    if native.ave_pool_backward_add(dy, added, g):
        assert added.tobytes() == (before + dy / size).astype(np.float32).tobytes()


@pytest.mark.parametrize("path", NATIVE_POOL_PATHS)
def test_native_ave_pooling_is_caffes_float32_arithmetic(path):
    """The compiled AVE adds a window's cells in Caffe's row-major order in float32 and
    divides by Caffe's window size, and its backward adds a cell's shares in the order of
    Caffe's loop over the outputs: both equal Caffe's loops bit for bit."""
    g = PoolGeometry(*POOL_GEOMS[2])            # padding, overlap and a clipped last window
    plan = B.pool_plan(g)
    _take_pool_path(plan, path)
    x, dy = _rand((2, 2) + g.in_shape, 25), _rand((2, 2) + g.out_shape, 26)
    y = plan.ave_forward(x, np.empty(dy.shape, np.float32))
    dx = plan.ave_backward(dy, np.full(x.shape, np.nan, np.float32))
    want_y, want_dx = np.empty_like(y), np.zeros_like(x)
    (h, w), (kh, kw), (sh, sw), (ph, pw) = g.in_shape, g.kernel, g.stride, g.pad
    for a, b, i, j in itertools.product(range(2), range(2), *map(range, g.out_shape)):
        hs, ws = i * sh - ph, j * sw - pw
        he, we = min(hs + kh, h + ph), min(ws + kw, w + pw)
        size = (he - hs) * (we - ws)
        cells = list(itertools.product(range(max(hs, 0), min(he, h)),
                                       range(max(ws, 0), min(we, w))))
        total = np.float32(0)
        for u, v in cells:
            total = np.float32(total + x[a, b, u, v])
        want_y[a, b, i, j] = total / np.float32(size)
        share = dy[a, b, i, j] / np.float32(size)
        for u, v in cells:
            want_dx[a, b, u, v] = np.float32(want_dx[a, b, u, v] + share)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(dx, want_dx)


@pytest.mark.parametrize("spec", [((14, 14), (5, 5), (3, 3), (0, 0), (4, 4)),
                                  EMPTY_WINDOW_GEOMS[0]], ids=str)
def test_native_ave_backward_adds_in_caffes_order_and_keeps_uncovered_cells_bit_for_bit(spec):
    """Adding into dx (a folded Split's input), the compiled AVE backward adds each cell's
    shares to its value in the order of Caffe's loop over the outputs, and the cells no window
    covers (stride 2 over a 1x1 window), -0.0 among them, keep their bits."""
    from poseidon_caffe.backend.cpu import native
    if native.lib is None:
        pytest.skip(NOT_BUILT)
    g = PoolGeometry(*spec)
    dy = _rand((2, 3) + g.out_shape, 44)
    start = _rand((2, 3) + g.in_shape, 45)
    start[..., 1::3] = -0.0
    dx = start.copy()
    if not native.ave_pool_backward_add(dy, dx, g):
        pytest.skip("the compiled pass does not serve on this CPU (neither AVX-512 nor AVX2)")
    want, covered = start.copy(), np.zeros(start.shape, bool)
    (h, w), (kh, kw), (sh, sw), (ph, pw) = g.in_shape, g.kernel, g.stride, g.pad
    for a, b, i, j in itertools.product(range(2), range(3), *map(range, g.out_shape)):
        hs, ws = i * sh - ph, j * sw - pw
        cells = list(itertools.product(range(max(hs, 0), min(hs + kh, h)),
                                       range(max(ws, 0), min(ws + kw, w))))
        if not cells:                   # a window wholly past the input
            continue
        size = (min(hs + kh, h + ph) - hs) * (min(ws + kw, w + pw) - ws)
        share = dy[a, b, i, j] / np.float32(size)
        for u, v in cells:
            want[a, b, u, v] = np.float32(want[a, b, u, v] + share)
            covered[a, b, u, v] = True
    assert dx.tobytes() == want.tobytes()
    if not covered.all():
        assert (np.signbit(dx) & (dx == 0) & ~covered).any()


# the compiled passes lay a plane out by stride phase when it has 16 outputs or more, and
# visit each window directly below that: both, with strides 1-3, padding and overhang; rows of
# 1, 2 and 5 vectors of cells
NATIVE_LAYOUT_GEOMS = [
    ((32, 32), (3, 3), (2, 2), (0, 0), (16, 16)),     # CIFAR-10 quick's pool1
    ((16, 16), (3, 3), (2, 2), (0, 0), (8, 8)),        # its pool2
    ((11, 10), (3, 3), (3, 2), (1, 1), (4, 6)),
    ((9, 9), (3, 3), (1, 1), (1, 1), (9, 9)),          # an inception branch's pooling
    ((7, 7), (7, 7), (1, 1), (0, 0), (1, 1)),          # a global pooling: one output
    ((14, 14), (5, 5), (3, 3), (0, 0), (4, 4)),        # GoogLeNet's auxiliary heads
    ((6, 70), (3, 3), (2, 2), (1, 1), (4, 36)),        # AVE backward's rows over 4 vectors
    ((5, 9), (2, 3), (2, 2), (1, 1), (3, 5)),          # 15 outputs: 8, 4 and 3 side by side
]


def test_native_address_is_numpys_data_pointer_for_every_kind_of_array():
    """The address the kernels are given is numpy's own data pointer: for a writable
    C-contiguous array and views into one at an offset (ctypes' buffer view), and for a
    read-only array, a strided view, an empty one and a 0-d one (numpy's interface)."""
    from poseidon_caffe.backend.cpu import native
    base = np.arange(64, dtype=np.float32).reshape(8, 8)
    frozen = base.copy()
    frozen.flags.writeable = False
    for a in (base, base[3:], base[2, 5:], frozen, base[:, ::2], base[:0],
              np.zeros((), np.float32), np.zeros(5, np.uint8)[1:]):
        assert native.address(a) == a.__array_interface__["data"][0]


@pytest.mark.parametrize("path", NATIVE_POOL_PATHS)
@pytest.mark.parametrize("spec", NATIVE_LAYOUT_GEOMS, ids=str)
def test_native_pooling_equals_caffes_loops_bit_for_bit(spec, path):
    """MAX: the value and winner of Caffe's first strict maximum; AVE: Caffe's float32 sum in
    row-major order over its window size, and the backward's shares added in the order of
    Caffe's loop over the outputs."""
    from poseidon_caffe.backend.cpu.pool import PoolPlan
    g = PoolGeometry(*spec)
    plan = PoolPlan(g)
    _take_pool_path(plan, path)
    x = np.round(_rand((2, 2) + g.in_shape, 30) * 3)          # ties: the first one wins
    y = plan.max_forward(x, np.empty((2, 2) + g.out_shape, np.float32))
    want, mask, _ = _naive_max_pool(x, g)
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(plan.mask(), mask)
    x, dy = _rand((2, 2) + g.in_shape, 31), _rand((2, 2) + g.out_shape, 32)
    y = plan.ave_forward(x, np.empty(dy.shape, np.float32))
    room = np.full(x.size + 16, np.nan, np.float32)       # dx, then cells left alone
    dx = plan.ave_backward(dy, room[:x.size].reshape(x.shape))
    assert np.isnan(room[x.size:]).all()
    want_y, want_dx = np.empty_like(y), np.zeros_like(x)
    (h, w), (kh, kw), (sh, sw), (ph, pw) = g.in_shape, g.kernel, g.stride, g.pad
    for a, b, i, j in itertools.product(range(2), range(2), *map(range, g.out_shape)):
        hs, ws = i * sh - ph, j * sw - pw
        he, we = min(hs + kh, h + ph), min(ws + kw, w + pw)
        size = np.float32((he - hs) * (we - ws))
        cells = list(itertools.product(range(max(hs, 0), min(he, h)),
                                       range(max(ws, 0), min(we, w))))
        total = np.float32(0)
        for u, v in cells:
            total = np.float32(total + x[a, b, u, v])
        want_y[a, b, i, j] = total / size
        share = dy[a, b, i, j] / size
        for u, v in cells:
            want_dx[a, b, u, v] = np.float32(want_dx[a, b, u, v] + share)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(dx, want_dx)


# (not SAME_GEOMS' 1x1 window: a window of one -inf cell is where the reference's -FLT_MAX
# start, Caffe's, differs from the kernels' first cell)
@pytest.mark.parametrize("spec", STRIDE2_GEOMS + PACKED_GEOMS + SAME_GEOMS[:3] + SAME_GEOMS[4:] +
                         NATIVE_LAYOUT_GEOMS[:1], ids=str)
def test_native_max_pool_backward_is_caffes_scatter_bit_for_bit(spec):
    """Caffe's MAX backward adds each dy at its winner in the outputs' row-major order, in
    float32: the same sums to the bit (a cell two windows share gets its two in that order),
    with ties, NaN inputs (the maximum, the winner staying), -inf, and -0.0 in dy; the
    compiled paths (16 outputs a vector where they serve, the phased layout; where 2x2
    windows tile the plane, a dense pass: (24, 50) and (16, 16) here; where stride 1 keeps
    the plane's size, each cell gathering its windows' dy, 8 or 16 cells a vector: SAME_GEOMS)
    find the same winners."""
    from poseidon_caffe.backend.cpu.pool import PoolPlan
    g = PoolGeometry(*spec)
    x = np.round(_rand((2, 3) + g.in_shape, 36) * 3)          # ties: the first one wins
    x.reshape(-1)[::37] = np.nan
    x.reshape(-1)[5::41] = -np.inf
    dy = _rand((2, 3) + g.out_shape, 37) * 100 - 50
    dy.reshape(-1)[3::7] = -0.0                 # Caffe's dx: 0 + -0, which is +0
    results = []
    for path in _native_paths_here():
        plan = PoolPlan(g)
        _take_pool_path(plan, path)
        y = plan.max_forward(x, np.empty(dy.shape, np.float32))
        dx = plan.routed_backward(dy, np.full(x.shape, np.nan, np.float32))
        results.append((y, plan.mask(), dx))
    (y, at, dx) = results[0]
    for other in results[1:]:
        assert y.tobytes() == other[0].tobytes() and dx.tobytes() == other[2].tobytes()
        np.testing.assert_array_equal(at, other[1])
    want, _, _ = _naive_max_pool(np.nan_to_num(x, nan=np.inf), g)
    assert np.isnan(y).any()
    np.testing.assert_array_equal(np.isnan(y), want == np.inf)
    np.testing.assert_array_equal(y[~np.isnan(y)], want[~np.isnan(y)])
    dx_want = np.zeros(x.shape, np.float32)
    for out_index in itertools.product(*map(range, y.shape)):
        if at[out_index] >= 0:
            where = out_index[:2] + divmod(int(at[out_index]), g.in_shape[1])
            dx_want[where] = np.float32(dx_want[where] + dy[out_index])
    assert dx.tobytes() == dx_want.tobytes()


@pytest.mark.parametrize("spec, winner_bytes",
                         [(POOL_GEOMS[2], 1), (EMPTY_WINDOW_GEOMS[1], 1),
                          (BIG_WINDOW_GEOMS[0], 1), (BIG_WINDOW_GEOMS[1], 4),
                          (((30, 24), (16, 17), (3, 2), (2, 3), (7, 8)), 4)], ids=str)
@pytest.mark.parametrize("path", NATIVE_POOL_PATHS)
def test_native_max_pool_keeps_small_winners_and_equals_the_numpy_path(spec, winner_bytes,
                                                                       path):
    """The compiled MAX keeps one byte per output where a window has at most 255 cells, gives
    the numpy tap loop's outputs and mask (flat input index, -1 for an empty window) exactly,
    and its gradient is Caffe's: each output's diff added in float32 at its mask, in the
    outputs' order."""
    from poseidon_caffe.backend.cpu.pool import PoolPlan
    g = PoolGeometry(*spec)
    native_plan, numpy_plan = PoolPlan(g), PoolPlan(g)
    _take_pool_path(native_plan, path)
    _take_pool_path(numpy_plan, "taps")
    x = np.round(_rand((2, 3) + g.in_shape, 28) * 3)           # ties: the first one wins
    y = native_plan.max_forward(x, np.empty((2, 3) + g.out_shape, np.float32))
    assert native_plan._arg.itemsize == winner_bytes and native_plan._arg.shape == y.shape
    np.testing.assert_array_equal(y, numpy_plan.max_forward(x, np.empty_like(y)))
    np.testing.assert_array_equal(native_plan.mask(), numpy_plan.mask())
    dy = _rand(y.shape, 29)
    dx = native_plan.routed_backward(dy, np.full(x.shape, np.nan, np.float32))
    mask = numpy_plan.mask().reshape(6, -1)
    flat = mask + np.arange(6)[:, None] * g.in_count
    want = np.zeros(x.size, np.float32)
    np.add.at(want, flat[mask >= 0], dy.reshape(6, -1)[mask >= 0])   # in order, in float32
    np.testing.assert_array_equal(dx.reshape(-1), want)


@pytest.mark.parametrize("spec", PACKED_GEOMS[:1] + PACKED_GEOMS[3:4], ids=str)
def test_native_max_pool_two_planes_a_vector_keeps_nans_rule_only_where_a_nan_is(spec):
    """Two planes a vector look for a NaN in blocks of 32 planes and keep NaN's rule (the
    maximum, the winner staying) in those that hold one: 69 planes (two whole blocks and an
    odd last plane), a NaN in the second block only, a plane of -inf in the first; outputs
    and winners equal the phased layout's to the bit."""
    from poseidon_caffe.backend.cpu.pool import PoolPlan
    g = PoolGeometry(*spec)
    x = np.round(_rand((3, 23) + g.in_shape, 38) * 3)          # ties: the first one wins
    x[1, 20, 2, 3] = np.nan                                    # plane 43
    x[0, 6] = -np.inf
    results = []
    for path in _native_paths_here():
        plan = PoolPlan(g)
        _take_pool_path(plan, path)
        y = plan.max_forward(x, np.empty((3, 23) + g.out_shape, np.float32))
        results.append((y, plan.mask()))
    (y, at) = results[0]
    for want, want_at in results[1:]:
        assert y.tobytes() == want.tobytes()
        np.testing.assert_array_equal(at, want_at)
    assert np.isnan(y[1, 20]).any() and np.isnan(y).sum() == np.isnan(y[1, 20]).sum()
    assert (y[0, 6] == -np.inf).all()


@pytest.mark.parametrize("path", POOL_PATHS)
def test_max_pooling_of_a_window_holding_nan_is_nan_on_every_path(path):
    g = PoolGeometry(*POOL_GEOMS[1])
    plan = B.pool_plan(g)
    _take_pool_path(plan, path)
    x = _rand((1, 2) + g.in_shape, 27)
    x[0, 1, 3, 4] = np.nan                       # in the windows of outputs (1, 1) and (1, 2)
    y = plan.max_forward(x, np.empty((1, 2) + g.out_shape, np.float32))
    want = np.zeros(y.shape, bool)
    want[0, 1, 1, 1:3] = True
    np.testing.assert_array_equal(np.isnan(y), want)



# planes of few outputs, 8 planes a vector (pool_lanes8.c): VGG's 4x4 pool5 (4 outputs a
# plane), GoogLeNet's 7x7 pool5 (1), AlexNet's 13x13 pool5 (36: a short last vector), empty
# windows (no winner)
FEW_OUTPUT_GEOMS = [
    ((4, 4), (2, 2), (2, 2), (0, 0), (2, 2)),
    ((7, 7), (7, 7), (1, 1), (0, 0), (1, 1)),
    ((13, 13), (3, 3), (2, 2), (0, 0), (6, 6)),
    ((8, 8), (1, 1), (2, 2), (0, 0), (5, 5)),
]


@pytest.mark.parametrize("planes", [1, 3, 8, 11])
@pytest.mark.parametrize("spec", FEW_OUTPUT_GEOMS, ids=str)
def test_native_pooling_of_planes_side_by_side_writes_nothing_past_its_outputs(spec, planes):
    """8 planes a vector (pool_lanes8.c, AVX2) store a plane's short last vector whole, over
    the next plane's first outputs, which are stored again after: the outputs equal Caffe's
    loops (MAX's values and 1-byte winners, 255 for none; AVE's float32 sums in Caffe's order,
    bit for bit, planes of few outputs going several groups of 8 at once), and the memory right
    after the call's last output keeps what it held, for 1, 3, 8 and 11 planes."""
    from poseidon_caffe.backend.cpu import native
    if native.lib is None:
        pytest.skip(NOT_BUILT)
    if not native.avx2_pooling_first(True, rows=False, tiles=False):
        pytest.skip("this CPU has no AVX2")
    try:
        g = PoolGeometry(*spec)
        x = np.round(_rand((1, planes) + g.in_shape, 41) * 4)          # ties
        outputs = planes * g.out_shape[0] * g.out_shape[1]
        room = np.full(outputs + 16, 7.5, np.float32)
        y = room[:outputs].reshape((1, planes) + g.out_shape)
        places = np.full(outputs + 16, 77, np.uint8)
        native.max_pool_forward(x, y, places[:outputs].reshape(y.shape), g)
        want, mask, _ = _naive_max_pool(x, g)
        np.testing.assert_array_equal(y, want)
        want_places = np.full(y.shape, 255, np.uint8)
        for index in itertools.product(*map(range, y.shape)):
            if mask[index] >= 0:
                u, v = divmod(int(mask[index]), g.in_shape[1])
                want_places[index] = ((u - index[2] * g.stride[0] + g.pad[0]) * g.kernel[1] +
                                      v - index[3] * g.stride[1] + g.pad[1])
        np.testing.assert_array_equal(places[:outputs].reshape(y.shape), want_places)
        assert (room[outputs:] == 7.5).all() and (places[outputs:] == 77).all()
        if g.empty_windows() is None:
            room[:] = 7.5
            native.ave_pool_forward(x, y, g)
            sums = np.zeros(y.shape, np.float32)
            for index in itertools.product(*map(range, y.shape)):
                i, j = index[2] * g.stride[0] - g.pad[0], index[3] * g.stride[1] - g.pad[1]
                for u, v in itertools.product(range(max(i, 0), min(i + g.kernel[0],
                                                                   g.in_shape[0])),
                                              range(max(j, 0), min(j + g.kernel[1],
                                                                   g.in_shape[1]))):
                    sums[index] = np.float32(sums[index] + x[index[:2] + (u, v)])
            np.testing.assert_array_equal(y, sums / g.window_sizes().astype(np.float32))
            assert (room[outputs:] == 7.5).all()
    finally:
        native.avx2_pooling_first(False)


@pytest.mark.parametrize("pad", [1, 0], ids=["same size: shifted loads", "lanes"])
@pytest.mark.parametrize("path", NATIVE_POOL_PATHS)
def test_native_max_pool_of_wide_rows_with_ties_and_nan_equals_the_numpy_path(path, pad):
    """Rows wide enough that the lanes take interior outputs four at a time (and the rest one
    by one), or (padded to the input's size) shifted loads: ties go to the first cell, a NaN
    makes its windows' outputs NaN and leaves their winners where they were, as the numpy tap
    loop does."""
    from poseidon_caffe.backend.cpu.pool import PoolPlan
    g = PoolGeometry((13, 14), (3, 3), (1, 1), (pad, pad), (11 + 2 * pad, 12 + 2 * pad))
    native_plan, numpy_plan = PoolPlan(g), PoolPlan(g)
    _take_pool_path(native_plan, path)
    _take_pool_path(numpy_plan, "taps")
    x = np.round(_rand((2, 17) + g.in_shape, 31) * 2)      # ties; 34 planes: a partial group
    x[0, 3, 5, 6] = np.nan
    x[1, 16, 6, 7:9] = np.nan
    y = native_plan.max_forward(x, np.empty((2, 17) + g.out_shape, np.float32))
    want = numpy_plan.max_forward(x, np.empty_like(y))
    np.testing.assert_array_equal(y, want)
    assert np.isnan(y[0, 3, 3 + pad:6 + pad, 4 + pad:7 + pad]).all()
    assert np.isnan(y).sum() == 9 + 12
    np.testing.assert_array_equal(native_plan.mask(), numpy_plan.mask())


# 3x3 windows, on AVX-512 a window's rows first (in, stride, pad, out, planes): padded by 1
# over planes of the input's size (GoogLeNet's inception pools; pool_same.c), batches past a
# chunk of 2048 cells (the rows' results before and after a chunk made again) of 28x28, 14x14
# and 7x7 planes, rows longer than a vector (40) and than a chunk's eighth (300: a longer
# chunk), planes of one cell; stepping by 2 (pool_stride2.c): GoogLeNet's pool1 (the last
# window overhangs), AlexNet's pool1 and pool2 (rows of 27 and 13 outputs), padding of 1 on
# rows of one and two blocks of 16 outputs, odd and even planes; rows of 5 to 8 outputs, two
# planes a vector (pool_packed.c): AlexNet's pool5, GoogLeNet's pool4, CIFAR-10 quick's pool2,
# padding of 1 (rows of 8 reach past 16 cells: pool_lanes.c; of 7), an odd last plane alone
ROWS_FIRST_GEOMS = [
    ((28, 28), (1, 1), (1, 1), (28, 28), 3),
    ((14, 14), (1, 1), (1, 1), (14, 14), 11),
    ((7, 7), (1, 1), (1, 1), (7, 7), 43),
    ((5, 40), (1, 1), (1, 1), (5, 40), 11),
    ((3, 300), (1, 1), (1, 1), (3, 300), 4),
    ((1, 1), (1, 1), (1, 1), (1, 1), 37),
    ((112, 112), (2, 2), (0, 0), (56, 56), 2),
    ((55, 55), (2, 2), (0, 0), (27, 27), 3),
    ((27, 27), (2, 2), (0, 0), (13, 13), 5),
    ((30, 33), (2, 2), (1, 1), (16, 17), 4),
    ((9, 40), (2, 2), (1, 1), (5, 21), 6),
    ((13, 13), (2, 2), (0, 0), (6, 6), 5),
    ((14, 14), (2, 2), (0, 0), (7, 7), 4),
    ((16, 16), (2, 2), (0, 0), (8, 8), 3),
    ((13, 14), (2, 2), (1, 1), (7, 8), 5),
    ((13, 13), (2, 2), (1, 1), (7, 7), 5),
]


@pytest.mark.parametrize("shape, stride, pad, out, planes", ROWS_FIRST_GEOMS, ids=str)
def test_native_3x3_max_pool_forward_is_caffes_loop_bit_for_bit(shape, stride, pad, out, planes):
    """Ties, among equal values and between -0 and +0, go to the window's first cell (row-major),
    whose own value, its sign too, is the output: Caffe's loop (a later cell takes over only
    where strictly greater), compared by bits. A window of -inf cells (the first plane's top
    left corner) is -inf, its winner its first cell inside the input (Caffe's loop, starting
    from -FLT_MAX, would find none)."""
    from poseidon_caffe.backend.cpu.pool import PoolPlan
    g = PoolGeometry(shape, (3, 3), stride, pad, out)
    plan = PoolPlan(g)
    _take_pool_path(plan, "native")
    rng = np.random.default_rng(52)
    x = np.round(_rand((1, planes) + shape, 51) * 2)
    zeros = rng.random(x.shape) < 0.3
    x[zeros] = np.where(rng.random(x.shape) < 0.5, np.float32(-0.0), np.float32(0.0))[zeros]
    x[0, 0, :3, :3] = -np.inf
    y = plan.max_forward(x, np.empty((1, planes) + out, np.float32))
    want, mask, _ = _naive_max_pool(x, g)
    none = mask < 0
    rows, columns = np.indices(out)
    first = (np.maximum(rows * stride[0] - pad[0], 0) * shape[1] +
             np.maximum(columns * stride[1] - pad[1], 0))
    want[none], mask[none] = -np.inf, np.broadcast_to(first, mask.shape)[none]
    assert none[0, 0, 0, 0] and (np.signbit(want) & (want == 0)).any()
    np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(plan.mask(), mask)


@pytest.mark.parametrize("path", NATIVE_POOL_PATHS)
def test_native_max_pool_stepping_by_two_finds_nan_in_any_plane_strip_and_column(path):
    """Columns stepping by 2 with no padding: the AVX2 rows (pool_rows.c) read every plane but
    a call's last from the input itself, clipping the overhanging last window's taps past the
    row (not the next row's cells) and testing each cell read for NaN as the copy did: a NaN
    in the first, a middle and the last column, in the first, a middle and the last plane,
    gives the numpy tap loop's values and winners."""
    from poseidon_caffe.backend.cpu.pool import PoolPlan
    g = PoolGeometry((27, 40), (3, 3), (2, 2), (0, 0), (13, 20))     # the last window overhangs
    native_plan, numpy_plan = PoolPlan(g), PoolPlan(g)
    _take_pool_path(native_plan, path)
    _take_pool_path(numpy_plan, "taps")
    x = np.round(_rand((2, 9) + g.in_shape, 33) * 2)      # ties
    x[:, :, :, 0] = 9.0                                   # the next row's first cell the largest
    x[0, 0, 4, 0] = np.nan
    x[0, 5, 10, 17] = np.nan
    x[1, 8, 26, 39] = np.nan
    y = native_plan.max_forward(x, np.empty((2, 9) + g.out_shape, np.float32))
    want = numpy_plan.max_forward(x, np.empty_like(y))
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(native_plan.mask(), numpy_plan.mask())
    assert np.isnan(y[0, 0, 1:3, 0]).all() and np.isnan(y[0, 5, 4:6, 8]).all()
    assert np.isnan(y[1, 8, 12, 19]) and np.isnan(y).sum() == 5


@pytest.mark.parametrize("side", [4, 8, 16, 24, 40])
def test_native_max_pool_of_tiling_2x2_windows_equals_the_numpy_path(side):
    """2x2 windows of stride 2 that tile the planes (pool_tiles.c, AVX2: one pass over the
    planes end to end, 8 outputs a vector taking 4, 2 or 1 rows of them): ties go to the
    first cell in row-major order, a NaN in any of the four places makes its output NaN and
    leaves the winner where it was, a window of -inf keeps its first cell; values and 1-byte
    winners as the numpy tap loop's, int32 winners too, and the backward's dx (written once,
    densely) as its; 3 and 5 planes leave 4 outputs of 2x2 planes past the last whole vector,
    and nothing past the outputs is written."""
    from poseidon_caffe.backend.cpu import native
    from poseidon_caffe.backend.cpu.pool import PoolPlan
    half = side // 2
    g = PoolGeometry((side, side), (2, 2), (2, 2), (0, 0), (half, half))
    native_plan, numpy_plan = PoolPlan(g), PoolPlan(g)
    _take_pool_path(native_plan, "native avx2")
    _take_pool_path(numpy_plan, "taps")
    for planes in (3, 5):
        x = np.round(_rand((1, planes) + g.in_shape, 46) * 2)     # ties
        for tap, (u, v) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
            x[0, tap % planes, u, 2 + v] = np.nan                   # output (0, 1)'s window
        x[0, planes - 1, side - 2:, side - 2:] = -np.inf            # the last output
        y = native_plan.max_forward(x, np.empty((1, planes) + g.out_shape, np.float32))
        want = numpy_plan.max_forward(x, np.empty_like(y))
        np.testing.assert_array_equal(y, want)
        np.testing.assert_array_equal(native_plan.mask(), numpy_plan.mask())
        assert np.isnan(y[0, :4, 0, 1]).all() and y[0, planes - 1, -1, -1] == -np.inf
        dy = _rand(y.shape, 47)
        dy[0, 0, 0, 0] = dy[0, -1, -1, -1] = -0.0   # the first and last: 0 + -0 is +0
        dx = native_plan.routed_backward(dy, np.full(x.shape, np.nan, np.float32))
        np.testing.assert_array_equal(dx, numpy_plan.routed_backward(dy, np.empty_like(x)))
        assert not (np.signbit(dx) & (dx == 0)).any()
        outputs = y.size
        room = np.full(outputs + 16, 7.5, np.float32)
        wide = np.full(outputs + 16, 77, np.int32)
        native.max_pool_forward(x, room[:outputs].reshape(y.shape),
                                wide[:outputs].reshape(y.shape), g)
        np.testing.assert_array_equal(room[:outputs].reshape(y.shape), want)
        np.testing.assert_array_equal(wide[:outputs].reshape(y.shape),
                                      native_plan._arg.astype(np.int32))
        assert (room[outputs:] == 7.5).all() and (wide[outputs:] == 77).all()


# 3x3 windows of stride 2 over rows of 16 cells or more: MAX's and AVE's backward gather
# (pool_gather.c, AVX2). AlexNet's pool1 and pool2 (the row's last cell one past a pair),
# CIFAR-10 quick's pool1 (a first and a last block only) and pool2 (one block a row),
# GoogLeNet's pool1 (blocks between); padding of 1 and 2 (the first pair before the row, the
# first band's upper row above the plane); floor rounding (cells no window covers); fewer
# windows than the row's pairs
GATHER_GEOMS = [
    ((16, 16), (3, 3), (2, 2), (0, 0), (8, 8)),
    ((55, 55), (3, 3), (2, 2), (0, 0), (27, 27)),
    ((27, 27), (3, 3), (2, 2), (0, 0), (13, 13)),
    ((32, 32), (3, 3), (2, 2), (0, 0), (16, 16)),
    ((112, 112), (3, 3), (2, 2), (0, 0), (56, 56)),
    ((30, 33), (3, 3), (2, 2), (1, 1), (16, 17)),
    ((5, 40), (3, 3), (2, 2), (1, 2), (3, 21)),
    ((7, 70), (3, 3), (2, 2), (2, 1), (5, 36)),
    ((28, 29), (3, 3), (2, 2), (0, 0), (13, 14)),
    ((20, 40), (3, 3), (2, 2), (0, 0), (5, 6)),
]


def _pool_gather(native, kind="max"):
    """pool_gather.c's MAX or AVE backward, straight (0 where it served, -2 where not)."""
    gather = getattr(native.lib, "pool_gather_%s_backward" % kind)
    gather.argtypes = ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                        ctypes.c_int64] if kind == "max" else
                       [ctypes.c_void_p] * 3 + [ctypes.c_int64]) + [ctypes.c_int] * 10
    return gather


def _caffes_routed_backward(dy, arg, g):
    """Caffe's MAX backward: dx zeroed, then each output's dy added at its winner in the
    outputs' order, in float32."""
    (h, w), (kh, kw), (sh, sw), (ph, pw) = g.in_shape, g.kernel, g.stride, g.pad
    planes = dy.shape[0] * dy.shape[1]
    dx = np.zeros(planes * h * w, np.float32)
    base = np.arange(planes) * (h * w)
    for i, j in itertools.product(*map(range, g.out_shape)):
        place = arg[:, :, i, j].reshape(-1).astype(np.int64)
        won = place != 255
        at = base + (i * sh - ph + place // kw) * w + (j * sw - pw + place % kw)
        dx[at[won]] += dy[:, :, i, j].reshape(-1)[won]
    return dx.reshape(dy.shape[:2] + g.in_shape)


@pytest.mark.parametrize("spec", GATHER_GEOMS, ids=str)
def test_native_max_backward_gather_of_3x3_stride_2_is_caffes_scatter_bit_for_bit(spec):
    """Each cell gathers the dy of the windows whose winner it is (pool_gather.c, AVX2): the
    sums equal Caffe's zeroed diff with each dy added at its winner in the outputs' order bit
    for bit (ties make cells the winners of up to four windows; a dy of -0 gives +0), every
    cell is written (dx starts as NaN), the cells no window chose are 0."""
    from poseidon_caffe.backend.cpu import native
    if native.lib is None:
        pytest.skip(NOT_BUILT)
    g = PoolGeometry(*spec)
    x = np.round(_rand((2, 3) + g.in_shape, 60) * 1.5)          # ties: shared winners
    y = np.empty((2, 3) + g.out_shape, np.float32)
    arg = np.empty(y.shape, np.uint8)
    native.max_pool_forward(x, y, arg, g)
    dy = _rand(y.shape, 61)
    dy.reshape(-1)[::7] = -0.0
    dx = np.full(x.shape, np.nan, np.float32)
    if _pool_gather(native)(dy.ctypes.data, arg.ctypes.data, 1, dx.ctypes.data, 6,
                            *native._pool_window(g)) != 0:
        pytest.skip("the gather does not serve on this CPU (no AVX2)")
    want = _caffes_routed_backward(dy, arg, g)
    assert dx.tobytes() == want.tobytes()
    assert not (np.signbit(dx) & (dx == 0)).any()
    (h, w), (sh, sw), (ph, pw) = g.in_shape, g.stride, g.pad
    i, j = np.indices(g.out_shape)
    won = arg != 255
    cell = (np.arange(6).reshape(2, 3, 1, 1) * (h * w) + (i * sh - ph + arg // 3) * w +
            (j * sw - pw + arg % 3))
    assert np.unique(cell[won]).size < won.sum()        # some cells won several windows


@pytest.mark.parametrize("spec", GATHER_GEOMS, ids=str)
def test_native_ave_backward_gather_of_3x3_stride_2_is_caffes_loop_bit_for_bit(spec):
    """Each cell gathers the shares of the windows that hold it (pool_gather.c, AVX2): dx
    equals Caffe's loop bit for bit, its zeroed diff getting each window's dy / pool_size (the
    window clipped to the padded input, then to the input) over the window's cells in the
    outputs' order (a share of -0 gives +0); every cell is written."""
    from poseidon_caffe.backend.cpu import native
    if native.lib is None:
        pytest.skip(NOT_BUILT)
    g = PoolGeometry(*spec)
    (h, w), (kh, kw), (sh, sw), (ph, pw) = g.in_shape, g.kernel, g.stride, g.pad
    size = np.empty(g.out_shape, np.float32)
    want = np.zeros((2, 3) + g.in_shape, np.float32)
    dy = _rand((2, 3) + g.out_shape, 63)
    dy.reshape(-1)[::5] = -0.0
    for i, j in itertools.product(*map(range, g.out_shape)):
        hs, ws = i * sh - ph, j * sw - pw
        he, we = min(hs + kh, h + ph), min(ws + kw, w + pw)
        size[i, j] = (he - hs) * (we - ws)
        share = dy[:, :, i, j] / size[i, j]
        want[:, :, max(hs, 0):min(he, h), max(ws, 0):min(we, w)] += share[:, :, None, None]
    dx = np.full(want.shape, np.nan, np.float32)
    if _pool_gather(native, "ave")(dy.ctypes.data, dx.ctypes.data, size.ctypes.data, 6,
                                   *native._pool_window(g)) != 0:
        pytest.skip("the gather does not serve on this CPU (no AVX2)")
    assert dx.tobytes() == want.tobytes()


# In a fresh process: pool_gather.c's backward with dy and the winners each ending where a
# page no one may read begins (a read past either end is a SIGSEGV); "same" where dx equals
# the gather's over arrays with room after them
_GATHER_AT_PAGE_ENDS = r"""
import ctypes, mmap, sys
import numpy as np
from poseidon_caffe.backend.cpu import native
from poseidon_caffe.backend.geometry import PoolGeometry
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
kept = []

def before_a_closed_page(count, dtype):
    page, size = mmap.PAGESIZE, count * np.dtype(dtype).itemsize
    pages = -(-size // page) + 1
    m = mmap.mmap(-1, pages * page)
    kept.append(m)
    start = ctypes.addressof(ctypes.c_char.from_buffer(m))
    assert libc.mprotect(start + (pages - 1) * page, page, 0) == 0     # PROT_NONE
    return np.frombuffer(m, dtype, count, (pages - 1) * page - size)

gather = native.lib.pool_gather_max_backward
gather.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64] + [
    ctypes.c_int] * 10
for spec in ([(27, 27), (3, 3), (2, 2), (0, 0), (13, 13)],
             [(20, 40), (3, 3), (2, 2), (0, 0), (5, 6)],
             [(30, 33), (3, 3), (2, 2), (1, 1), (16, 17)]):
    g = PoolGeometry(*spec)
    outputs = 3 * g.out_shape[0] * g.out_shape[1]
    x = np.round(np.random.RandomState(62).uniform(-2, 2, (1, 3) + g.in_shape)).astype(
        np.float32)
    dy_room = np.random.RandomState(63).uniform(-1, 1, outputs + 64).astype(np.float32)
    arg_room = np.zeros(outputs + 64, np.uint8)
    y = np.empty((1, 3) + g.out_shape, np.float32)
    native.max_pool_forward(x, y, arg_room[:outputs].reshape(y.shape), g)
    dy, arg = before_a_closed_page(outputs, np.float32), before_a_closed_page(outputs, np.uint8)
    dy[:], arg[:] = dy_room[:outputs], arg_room[:outputs]
    dx, want = (np.full(x.shape, np.nan, np.float32) for _ in range(2))
    window = native._pool_window(g)
    if gather(dy.ctypes.data, arg.ctypes.data, 1, dx.ctypes.data, 3, *window) != 0:
        print("not served")
        sys.exit(0)
    gather(dy_room.ctypes.data, arg_room.ctypes.data, 1, want.ctypes.data, 3, *window)
    print("same" if dx.tobytes() == want.tobytes() else "differs")
"""


def test_native_max_backward_gather_reads_nothing_past_dy_or_the_winners():
    """The gather's loads of 8 windows never pass the arrays' ends (its rows near them are
    copied first): with dy and the winners each ending at a page that may not be read, it
    runs (no SIGSEGV) and gives what it gives with room after them."""
    import subprocess
    import sys
    from poseidon_caffe.backend.cpu import native
    if native.lib is None:
        pytest.skip(NOT_BUILT)
    out = subprocess.run([sys.executable, "-c", _GATHER_AT_PAGE_ENDS], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, (out.returncode, out.stderr)
    if out.stdout.split() == ["not served"]:
        pytest.skip("the gather does not serve on this CPU (no AVX2)")
    assert out.stdout.split() == ["same"] * 3, out.stdout


# MAX forward with the input starting right after, or ending right before, a page that may not
# be read: the inception pools' rows (7x7, 28x28), strided rows (27x27, padded 30x33) and two
# planes a vector (13x13, padded and not; an odd last plane alone)
_FORWARD_AT_PAGE_ENDS = r"""
import ctypes, mmap
import numpy as np
from poseidon_caffe.backend.cpu import native
from poseidon_caffe.backend.geometry import PoolGeometry
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
kept = []

def beside_a_closed_page(x, after):
    page, size = mmap.PAGESIZE, x.nbytes
    pages = -(-size // page) + 1
    m = mmap.mmap(-1, pages * page)
    kept.append(m)
    start = ctypes.addressof(ctypes.c_char.from_buffer(m))
    closed = 0 if after else pages - 1
    assert libc.mprotect(start + closed * page, page, 0) == 0     # PROT_NONE
    at = page if after else (pages - 1) * page - size
    fenced = np.frombuffer(m, np.float32, x.size, at).reshape(x.shape)
    fenced[...] = x
    return fenced

for spec, planes in (([(7, 7), (3, 3), (1, 1), (1, 1), (7, 7)], 5),
                     ([(28, 28), (3, 3), (1, 1), (1, 1), (28, 28)], 3),
                     ([(27, 27), (3, 3), (2, 2), (0, 0), (13, 13)], 3),
                     ([(30, 33), (3, 3), (2, 2), (1, 1), (16, 17)], 3),
                     ([(13, 13), (3, 3), (2, 2), (0, 0), (6, 6)], 3),
                     ([(13, 13), (3, 3), (2, 2), (1, 1), (7, 7)], 3)):
    g = PoolGeometry(*spec)
    x = np.round(np.random.RandomState(64).uniform(-2, 2, (1, planes) + g.in_shape)).astype(
        np.float32)
    y, arg = np.empty((1, planes) + g.out_shape, np.float32), np.empty((1, planes) + g.out_shape,
                                                                      np.uint8)
    native.max_pool_forward(x, y, arg, g)
    for after in (True, False):
        fenced_y, fenced_arg = np.empty_like(y), np.empty_like(arg)
        native.max_pool_forward(beside_a_closed_page(x, after), fenced_y, fenced_arg, g)
        same = fenced_y.tobytes() == y.tobytes() and fenced_arg.tobytes() == arg.tobytes()
        print("same" if same else "differs")
"""


def test_native_max_forward_reads_nothing_before_or_past_the_input():
    """MAX forward's loads (a row's cells either side, a plane's rows after, the second
    plane of a vector) never leave the input: with it beside a page that may not be read,
    before it or after it, the forward runs (no SIGSEGV) and gives the same outputs and
    winners as with room around it."""
    import subprocess
    import sys
    from poseidon_caffe.backend.cpu import native
    if native.lib is None:
        pytest.skip(NOT_BUILT)
    out = subprocess.run([sys.executable, "-c", _FORWARD_AT_PAGE_ENDS], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, (out.returncode, out.stderr)
    assert out.stdout.split() == ["same"] * 12, out.stdout


# the compiled passes lay out a group of planes side by side (as many as fill a few cache
# lines' worth of blocks): 750 planes are several whole groups and a last, partial one
MANY_PLANE_GEOMS = [
    ((8, 8), (3, 3), (2, 2), (0, 0), (4, 4)),          # CIFAR-10 quick's pool3
    ((8, 8), (2, 2), (2, 2), (0, 0), (4, 4)),          # LeNet's pool2
    ((9, 9), (3, 3), (2, 2), (1, 1), (5, 5)),          # odd padding: a row's pairs shifted
    ((12, 12), (3, 3), (3, 3), (1, 1), (5, 5)),        # stride 3
    ((6, 7), (3, 2), (1, 1), (1, 0), (6, 6)),          # stride 1
]


@pytest.mark.parametrize("path", NATIVE_POOL_PATHS)
@pytest.mark.parametrize("spec", MANY_PLANE_GEOMS, ids=str)
def test_native_pooling_over_many_planes_equals_the_numpy_tap_loop(spec, path):
    from poseidon_caffe.backend.cpu.pool import PoolPlan
    g = PoolGeometry(*spec)
    native_plan, numpy_plan = PoolPlan(g), PoolPlan(g)
    _take_pool_path(native_plan, path)
    _take_pool_path(numpy_plan, "taps")
    x = np.round(_rand((3, 250) + g.in_shape, 33) * 3)        # ties: the first one wins
    y = native_plan.max_forward(x, np.empty((3, 250) + g.out_shape, np.float32))
    np.testing.assert_array_equal(y, numpy_plan.max_forward(x, np.empty_like(y)))
    np.testing.assert_array_equal(native_plan.mask(), numpy_plan.mask())
    dy = _rand(y.shape, 34)
    dx = native_plan.routed_backward(dy, np.full(x.shape, np.nan, np.float32))
    np.testing.assert_allclose(dx, numpy_plan.routed_backward(dy, np.empty_like(x)),
                               rtol=1e-6, atol=1e-7)       # float32 sums against float64
    x = _rand(x.shape, 35)
    y = native_plan.ave_forward(x, np.empty_like(y))
    np.testing.assert_allclose(y, numpy_plan.ave_forward(x, np.empty_like(y)), rtol=1e-6)
    dx = native_plan.ave_backward(dy, np.full(x.shape, np.nan, np.float32))
    np.testing.assert_allclose(dx, numpy_plan.ave_backward(dy, np.empty_like(x)), rtol=1e-5,
                               atol=1e-7)

def _by_fast_roots_and_exact(run):
    """[run() with LRN's fast roots, run() with square roots and a division]"""
    from poseidon_caffe.backend.cpu import lrn
    try:
        runs = []
        for fast in (True, False):
            lrn.fast_roots(fast)
            runs.append(run())
        return runs
    finally:
        lrn.fast_roots(True)


@pytest.mark.parametrize("beta", [0.75, 0.5])
def test_compiled_lrn_reciprocal_roots_are_within_a_few_ulp_of_the_square_roots(beta):
    """Beta 0.75 and 0.5 by reciprocal-root estimates (the default: refined once, or on AVX2
    for 0.75 corrected by a series) against square roots and a division: within 4 ulp
    (AVX-512's 14-bit estimates: beta 0.75's scales here 3.2 off at worst on a Xeon) or 5
    (AVX2's 12-bit ones) over scales from 1e-30 to 1e30, and the scales outside their range
    (infinite, NaN) exactly as the exact forms give them."""
    from poseidon_caffe.backend.cpu import lrn
    if lrn._compiled() is None:
        pytest.skip(NOT_BUILT)
    lanes = lrn.fast_root_lanes()
    if lanes == 0:
        pytest.skip("this CPU has neither AVX-512 nor AVX2: the exact forms serve")
    ulp = np.float32(2.0 ** -23)
    rng = np.random.default_rng(40)
    shape = (2, 7, 13, 21)           # 273 positions: AVX2's pieces of 128, and a last few
    x = (rng.uniform(0.5, 2.0, shape) * 10.0 ** rng.integers(-15, 15, shape)).astype(np.float32)
    x[0, 3, 2, :4] = [1e25, -1e25, np.nan, 0.0]     # an infinite scale, a NaN, a zero cell
    x[1, 4, 10, 5:9] = [1e25, -1e25, np.nan, 0.0]   # the same in a later piece
    dy = _rand(x.shape, 41)
    def run():
        top, state = lrn.lrn_forward(x, 5, 1.0, beta, 1e-30, True)
        return top, lrn.lrn_backward(x, top, state, dy, 5, 1.0, beta, True)
    (fast_top, fast_dx), (exact_top, exact_dx) = _by_fast_roots_and_exact(run)
    np.testing.assert_array_equal(np.isnan(fast_top), np.isnan(exact_top))
    finite = np.isfinite(exact_top) & (exact_top != 0)
    np.testing.assert_array_equal(fast_top[~finite], exact_top[~finite])
    np.testing.assert_allclose(fast_top[finite], exact_top[finite],
                               rtol=(4 if lanes == 16 else 5) * ulp, atol=0)
    assert np.isnan(fast_top).any() and (fast_top == 0).any()
    # dx = dy p - (the window's term): the two nearly cancel in places, so the bound is
    # relative to the terms, p being the power the exact forward used
    keep = finite & np.isfinite(exact_dx)
    with np.errstate(all="ignore"):
        first = dy * (exact_top / x)
        terms = np.abs(first) + np.abs(first - exact_dx)
    assert (np.abs(fast_dx - exact_dx)[keep] <= 1e-6 * terms[keep]).all()
    np.testing.assert_array_equal(np.isnan(fast_dx), np.isnan(exact_dx))


def test_compiled_lrn_three_quarter_power_on_avx2_is_within_2_ulp_of_the_true_value():
    """AVX2's scale^-0.75 (two reciprocal-root estimates, then the series of the remaining
    factor to its square) against float64's power of the same float32 scale: within 2 ulp
    with top's rounding, over scales from 1e-30 to 1e30 (two estimates each refined by a
    Newton step were 3 to 4 ulp off)."""
    from poseidon_caffe.backend.cpu import lrn
    if lrn._compiled() is None:
        pytest.skip(NOT_BUILT)
    if lrn.fast_root_lanes() != 8:
        pytest.skip("AVX2's roots serve only on a CPU with AVX2 and FMA but not AVX-512")
    rng = np.random.default_rng(42)
    shape = (3, 7, 13, 21)
    x = (rng.uniform(0.5, 2.0, shape) * 10.0 ** rng.integers(-15, 15, shape)).astype(np.float32)
    squares = np.pad(x * x, ((0, 0), (2, 2), (0, 0), (0, 0)))
    window = squares[:, 0:7]
    for q in range(1, 5):                 # the kernel's order: left to right, float32
        window = window + squares[:, q:q + 7]
    scale = window * np.float32(1.0 / 5) + np.float32(1e-30)
    top, _ = lrn.lrn_forward(x, 5, 1.0, 0.75, 1e-30, True)
    truth = x.astype(np.float64) * scale.astype(np.float64) ** -0.75
    assert np.isfinite(truth).all() and (truth != 0).all()
    np.testing.assert_allclose(top, truth, rtol=2 * 2.0 ** -23, atol=0)


def test_compiled_lrn_subnormal_and_zero_scales_take_the_exact_forms():
    """With k = 0 a window of tiny cells has a subnormal scale (the estimates would make it
    infinite) and a window of zeros a zero one: the pieces holding them take the exact forms,
    so top is what square roots and a division give."""
    from poseidon_caffe.backend.cpu import lrn
    if lrn._compiled() is None:
        pytest.skip(NOT_BUILT)
    x = _rand((2, 6, 9, 30), 43)                 # 270 positions: pieces of 128 and a tail
    x[0, :, 2, :] = 1e-21                        # squares 1e-42: subnormal scales
    x[1, :, 5, 3:20] = 0.0                       # zero scales: top 0 * inf, NaN
    fast_top, exact_top = _by_fast_roots_and_exact(
        lambda: lrn.lrn_forward(x, 5, 1.0, 0.75, 0.0, True)[0])
    assert np.isfinite(exact_top[0, :, 2]).all() and (exact_top[0, :, 2] > 1e9).all()
    assert np.isnan(exact_top[1, :, 5, 3:20]).all()
    np.testing.assert_array_equal(np.isnan(fast_top), np.isnan(exact_top))
    np.testing.assert_allclose(fast_top[0, :, 2], exact_top[0, :, 2], rtol=1e-6)


@pytest.mark.parametrize("across", [True, False], ids=["across", "within"])
def test_lrn_in_slices_and_row_blocks_matches_one_whole_pass(across, small_slices, monkeypatch):
    """Slices of the batch (and, across channels, blocks of rows of one image; the compiled
    pass: a part of the batch per thread) on 1 or 2 threads give the same numbers as one pass
    over the whole batch, into given buffers."""
    from poseidon_caffe.backend.cpu import lrn, threads
    x = _rand((3, 6, 5, 4), 24) * 3
    dy = _rand(x.shape, 25)
    top, dx = np.empty_like(x), np.empty_like(x)
    _, state = B.lrn_forward(x, 5, 0.5, 0.75, 2.0, across, out=top)
    B.lrn_backward(x, top, state, dy, 5, 0.5, 0.75, across, out=dx)
    top_again, _ = B.lrn_forward(x, 5, 0.5, 0.75, 2.0, across, state=state)   # reused state
    np.testing.assert_array_equal(top_again, top)
    monkeypatch.setattr(threads, "SLICE_BYTES", 10 ** 9)
    monkeypatch.setattr(threads, "thread_count", lambda: 1)
    whole, whole_state = lrn.lrn_forward(x, 5, 0.5, 0.75, 2.0, across)
    np.testing.assert_allclose(top, whole, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dx, lrn.lrn_backward(x, whole, whole_state, dy, 5, 0.5, 0.75,
                                                    across), rtol=1e-6, atol=1e-7)
    # and against the definition, computed here in float64
    half = 2
    sq = np.pad(x.astype(np.float64) ** 2, ((0, 0), (half, half), (0, 0), (0, 0)) if across
                else ((0, 0), (0, 0), (half, half), (half, half)))
    if across:
        scale = 2.0 + 0.5 / 5 * sum(sq[:, i:i + 6] for i in range(5))
    else:
        scale = 1.0 + 0.5 / 25 * sum(sq[:, :, i:i + 5, j:j + 4]
                                     for i in range(5) for j in range(5))
    np.testing.assert_allclose(top, x * scale ** -0.75, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("size,beta,channels,plane", [
    (5, 0.75, 7, (5, 6)), (3, 0.5, 4, (5, 6)), (5, 1.0, 2, (5, 6)), (7, 0.75, 9, (5, 6)),
    (5, 0.5, 3, (5, 6)), (5, 0.75, 9, (13, 21))])   # AVX2's pieces of 128 positions and more
def test_compiled_lrn_matches_the_numpy_passes(size, beta, channels, plane, monkeypatch):
    """The compiled across-channels kernels (lrn.c) give the numpy path's top and bottom
    gradient (remaking the scale the numpy path keeps), window wider than the channels
    included; a numpy backward after a compiled forward remakes the scale too."""
    from poseidon_caffe.backend.cpu import lrn
    if lrn._compiled() is None:
        pytest.skip(NOT_BUILT)
    x = _rand((3, channels) + plane, 28) * 3
    dy = _rand(x.shape, 29)
    got = lrn.lrn_forward(x, size, 0.5, beta, 2.0, True)
    got_dx = lrn.lrn_backward(x, got[0], got[1], dy, size, 0.5, beta, True)
    compiled = lrn._compiled()
    monkeypatch.setitem(lrn._COMPILED, "lib", None)
    want = lrn.lrn_forward(x, size, 0.5, beta, 2.0, True)
    want_dx = lrn.lrn_backward(x, want[0], want[1], dy, size, 0.5, beta, True)
    np.testing.assert_allclose(lrn.lrn_backward(x, got[0], got[1], dy, size, 0.5, beta, True),
                               want_dx, rtol=1e-5, atol=1e-6)
    monkeypatch.setitem(lrn._COMPILED, "lib", compiled)      # a compiled backward reading
    np.testing.assert_allclose(lrn.lrn_backward(x, want[0], want[1], dy, size, 0.5, beta,
                                                True),       # the scale numpy kept
                               want_dx, rtol=1e-5, atol=1e-6)
    assert got[1][0] is None and want[1][0].shape == x.shape    # the scale is not kept
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_dx, want_dx, rtol=1e-5, atol=1e-6)


# -- batch parts over threads: each thread runs a whole convolution / pooling chain ----------
def test_over_parts_covers_the_range_once_on_two_threads():
    import threading
    from poseidon_caffe.backend.cpu.threads import over_parts
    seen = {}
    second = threading.Event()

    def work(i, lo, hi):
        seen[i] = (lo, hi, threading.current_thread().name)
        if i == 1:
            second.set()
        else:               # the first waits for the second to start, or the caller takes it
            second.wait(60)
    bounds = over_parts(work, 7, threads=2)
    assert bounds == [(0, 4), (4, 7)]
    assert [seen[i][:2] for i in range(2)] == bounds
    assert len({seen[i][2] for i in range(2)}) == 2           # two threads did the work
    seen.clear()
    assert over_parts(work, 1, threads=2) == [(0, 1)] and len(seen) == 1


def test_over_parts_runs_each_part_on_the_same_thread_every_call():
    """A part's scratch (work arrays sized for the part) then lives in one thread per part,
    not in whichever pool thread took the part last."""
    import threading
    from poseidon_caffe.backend.cpu import threads
    names, stores = set(), {}

    def work(i, lo, hi, second):
        names.add((i, threading.current_thread().name))
        threads.scratch("test_part", (hi - lo, 1000))
        stores[threading.current_thread().name] = threads._local.__dict__["scratch"]
        if i == 1:
            second.set()
        else:               # the first waits for the second to start, or the caller takes it
            second.wait(60)
    for _ in range(20):
        second = threading.Event()
        threads.over_parts(lambda i, lo, hi: work(i, lo, hi, second), 6, threads=2)
        threads.over_batch(lambda lo, hi: time.sleep(0.001), 8, 10 ** 9, threads=2)
    assert len(names) == 2 and {i for i, _ in names} == {0, 1}
    assert len([s for s in stores.values() if "test_part" in s]) == 2


def test_over_parts_caller_takes_a_part_its_thread_has_not_started():
    """A part thread busy (or not yet awake) when the caller is done with its own part: the
    caller does that part itself, not waiting for the thread; the thread then skips it."""
    import threading
    from poseidon_caffe.backend.cpu import threads
    threads.over_parts(lambda i, lo, hi: None, 2, threads=2)         # Part-1 exists
    release = threading.Event()
    busy = threads._part_executor(1).submit(release.wait, 60)
    done = []
    try:
        threads.over_parts(lambda i, lo, hi: done.append(
            (i, lo, hi, threading.current_thread().name)), 10, threads=2)
    finally:
        release.set()
    busy.result()
    caller = threading.current_thread().name
    assert sorted(done) == [(0, 0, 5, caller), (1, 5, 10, caller)]


def test_a_compiled_pass_never_waits_for_a_worker_that_takes_no_piece():
    """The compiled passes' pieces (kernels/parts.c) are taken by whichever thread comes
    first: with the workers taking none (as when woken too late), the caller does every
    piece and returns, the values those of one pass."""
    import ctypes
    import subprocess
    import sys
    from poseidon_caffe.backend.cpu import native
    if native.lib is None:
        pytest.skip(NOT_BUILT)
    code = """
import ctypes, numpy as np
from poseidon_caffe.backend.cpu import native
ctypes.c_int.in_dll(native.lib, "parts_workers_take").value = 0
x = np.arange(-300007, 300000, dtype=np.float32)
for parts in (2, 3, 8):
    y = np.full_like(x, np.nan)
    native.relu_forward(x, y, 0.0, parts)
    assert y.tobytes() == np.maximum(x, 0).tobytes(), parts
print("whole")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["whole"], out.stderr
    assert ctypes.c_int.in_dll(native.lib, "parts_workers_take").value == 1


# In a fresh process: the threads of a parted pass (Python's part threads, or the compiled
# kernels' own), and the caller's CPU just before and after the call; "same" where it did
# not move, which it rarely does in a call of a few ms
_KEPT_OFF = r"""
import ctypes, json, os, sys
import numpy as np
from poseidon_caffe.backend.cpu import native, threads
getcpu = ctypes.CDLL(None).sched_getcpu
if sys.argv[1] == "one":
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
before = {int(t) for t in os.listdir("/proc/self/task")}
x = np.arange(-500000, 500000, dtype=np.float32)
y = np.empty_like(x)
for _ in range(20):
    cpu = getcpu()
    if sys.argv[2] == "native":
        native.relu_forward(x, y, 0.0, 2)
    else:
        threads.over_parts(lambda i, lo, hi: np.maximum(x[lo:hi], 0, out=y[lo:hi]), x.size, 2)
    if getcpu() == cpu:
        break
new = sorted({int(t) for t in os.listdir("/proc/self/task")} - before)
print(json.dumps({"cpu": cpu, "same": getcpu() == cpu,
                  "right": bool((y == np.maximum(x, 0)).all()),
                  "allowed": sorted(os.sched_getaffinity(0)),
                  "workers": [sorted(os.sched_getaffinity(t)) for t in new]}))
"""


@pytest.mark.parametrize("way", ["native", "python"])
def test_a_parted_pass_keeps_its_other_threads_off_the_callers_cpu(way):
    """Woken after a pause, a part thread is put on the CPU of the thread that woke it, which
    then runs its own part first: the parts ran one after the other. Each part thread is now
    kept off the caller's CPU (sched_setaffinity: the CPUs the process may use, less the
    caller's); in a process allowed one CPU, nothing changes and the pass is whole."""
    import json
    import os
    import subprocess
    import sys
    from poseidon_caffe.backend.cpu import native
    if way == "native" and native.lib is None:
        pytest.skip(NOT_BUILT)
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("this process may use one CPU only")
    for cpus in ("all", "one"):
        out = subprocess.run([sys.executable, "-c", _KEPT_OFF, cpus, way], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout.splitlines()[-1])
        assert got["right"] and got["same"] and len(got["workers"]) == 1
        if cpus == "one":
            assert got["workers"] == [got["allowed"]]
        else:
            assert got["workers"] == [[c for c in got["allowed"] if c != got["cpu"]]]


SPLIT_CONV = [   # (geometry, algorithm)
    (ConvGeometry(4, 6, (7, 6), (3, 3), (1, 1), (1, 1), (1, 1), 2), "im2col"),   # groups
    (ConvGeometry(4, 6, (7, 6), (3, 3), (1, 1), (1, 1), (1, 1), 2), "fft"),      # groups
    (ConvGeometry(6, 3, (8, 7), (3, 2), (2, 1), (1, 0), (1, 1), 1), "im2col"),   # col2im
    (ConvGeometry(4, 4, (5, 5), (1, 1), (1, 1), (0, 0), (1, 1), 2), "im2col"),   # pointwise
    (ConvGeometry(4, 6, (7, 6), (3, 3), (1, 1), (1, 1), (1, 1), 2), "winograd"),
    (ConvGeometry(4, 4, (5, 5), (1, 1), (1, 1), (0, 0), (1, 1), 2), "pointwise"),
]


def _split_and_whole_conv(geom, algorithm):
    from poseidon_caffe.backend.cpu.split import SplitConvPlan
    whole = type(B)()
    whole.split_threads = 1
    split = SplitConvPlan(geom, lambda n: whole._conv_plan(geom, algorithm, 1), 2)
    return split, whole._conv_plan(geom, algorithm)


@pytest.mark.parametrize("geom,algorithm", SPLIT_CONV, ids=str)
def test_split_conv_plan_gives_the_whole_batch_values(geom, algorithm):
    """Forward, bottom diff, and weight / bias diffs added into given values, over a batch of
    5 cut in 3 + 2 on two threads, against one plan over the whole batch."""
    split, whole = _split_and_whole_conv(geom, algorithm)
    x = _rand((5, geom.channels) + geom.in_shape, 30)
    w = _rand(geom.weight_shape, 31)
    bias = _rand((geom.num_output,), 32)
    dy = _rand((5, geom.num_output) + geom.out_shape, 33)
    results = []
    for plan in (split, whole):
        y = np.full(dy.shape, np.nan, np.float32)
        plan.forward(x, w, bias, y)
        dx = np.full(x.shape, np.nan, np.float32)
        dw, db = np.ones_like(w), np.ones_like(bias)
        plan.backward(x, dy, w, dx=dx, dw=dw, dbias=db)
        results.append((y, dx, dw, db))
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # the filter gradient reduces over the images: both parts contribute
    half = np.ones_like(w)
    whole.forward(x[:3], w, None, np.empty_like(dy[:3]))
    whole.backward(x[:3], dy[:3], w, dw=half)
    assert not np.allclose(half, results[0][2], atol=1e-3)


@pytest.mark.parametrize("geom", [SPLIT_CONV[0][0], SPLIT_CONV[2][0],
                                  ConvGeometry(3, 4, (34, 34), (3, 3), (2, 2), (1, 1), (1, 1))],
                         ids=str)      # the last: 289 outputs an image, columns image by image
def test_chunked_conv_plan_gives_the_whole_batch_values(geom):
    """im2col two images at a time over a batch of 5 (chunks 2, 2, 1), against one plan over
    the whole batch: forward, backward with gradients added into given values, and a second
    backward on other data whose columns must be remade, not taken from the last chunk."""
    from poseidon_caffe.backend.cpu.conv import ConvPlan
    from poseidon_caffe.backend.cpu.split import ChunkedConvPlan
    made = []
    chunked = ChunkedConvPlan(
        geom, lambda k, columns: made.append(k) or ConvPlan(geom, columns=columns), 2)
    whole = ConvPlan(geom)
    x = _rand((5, geom.channels) + geom.in_shape, 60)
    w = _rand(geom.weight_shape, 61)
    bias = _rand((geom.num_output,), 62)
    dy = _rand((5, geom.num_output) + geom.out_shape, 63)
    results = []
    for plan in (chunked, whole):
        y = np.full(dy.shape, np.nan, np.float32)
        plan.forward(x, w, bias, y)
        dx = np.full(x.shape, np.nan, np.float32)
        dw, db = np.ones_like(w), np.ones_like(bias)
        plan.backward(x, dy, w, dx=dx, dw=dw, dbias=db)
        other = np.zeros_like(w)
        plan.backward(x * 3, dy, w, dw=other)
        results.append((y, dx, dw, db, other))
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert sorted(made) == [1, 2]                 # one plan per chunk size
    # the two plans' columns are one storage, the larger chunk's
    assert np.shares_memory(chunked._plans[1]._col, chunked._plans[2]._col)
    assert chunked.workspace_bytes(5) == \
        whole.workspace_bytes(2) + whole.workspace_bytes(1) - whole.column_bytes(1)


def test_shared_im2col_plans_remake_columns_another_layer_overwrote():
    """Two layers' shared plans (columns and padded input in the thread's scratch, one chunk
    of 2 images at a time over 5): forward A, forward B, backward B, backward A. A's backward
    remakes the columns B's forward overwrote, and both match the matrix products of im2col;
    backward-data scatters the columns back (col2im), and nothing of the batch is kept."""
    from poseidon_caffe.backend.cpu.conv import ConvPlan
    from poseidon_caffe.backend.cpu.split import ChunkedConvPlan
    geoms = [ConvGeometry(3, 4, (5, 6), (3, 3), (1, 1), (1, 1), (1, 1)),
             ConvGeometry(4, 6, (6, 4), (3, 3), (1, 1), (2, 0), (1, 1), 2)]
    n = 5
    plans = [ChunkedConvPlan(g, lambda k, columns, g=g: ConvPlan(g, shared=True), 2)
             for g in geoms]
    data = []
    for i, g in enumerate(geoms):
        x = _rand((n, g.channels) + g.in_shape, 80 + i)
        w, bias = _rand(g.weight_shape, 82 + i), _rand((g.num_output,), 84 + i)
        dy = _rand((n, g.num_output) + g.out_shape, 86 + i)
        data.append((x, w, bias, dy))
    ys = [np.empty(d[3].shape, np.float32) for d in data]
    grads = [(np.empty_like(d[0]), np.zeros_like(d[1]), np.zeros_like(d[2])) for d in data]
    for i in (0, 1):
        plans[i].forward(data[i][0], data[i][1], data[i][2], ys[i])
    for i in (1, 0):
        x, w, bias, dy = data[i]
        plans[i].backward(x, dy, w, dx=grads[i][0], dw=grads[i][1], dbias=grads[i][2])
    for g, (x, w, bias, dy), y, (dx, dw, db), plan in zip(geoms, data, ys, grads, plans):
        col = B.im2col(x, g).reshape(n, g.group, -1, g.out_count).astype(np.float64)
        wg = w.reshape(g.group, g.num_output // g.group, -1).astype(np.float64)
        want = np.einsum("gmk,ngkp->ngmp", wg, col).reshape(y.shape) + \
            bias.reshape(1, -1, 1, 1)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
        dyg = dy.reshape(n, g.group, -1, g.out_count).astype(np.float64)
        np.testing.assert_allclose(dw, np.einsum("ngmp,ngkp->gmk", dyg, col).reshape(
            g.weight_shape), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(db, dy.sum(axis=(0, 2, 3)), rtol=1e-5, atol=1e-5)
        dcol = np.einsum("gmk,ngmp->ngkp", wg, dyg).reshape((n, g.col_rows) + g.out_shape)
        np.testing.assert_allclose(dx, B.col2im(dcol.astype(np.float32), g), rtol=1e-4,
                                   atol=1e-4)
        assert [hi - lo for lo, hi in plan._bounds(n)] == [2, 2, 1]
        assert plan.workspace_bytes(n) == 0            # nothing of its own
        chunk = ConvPlan(g, shared=True)
        assert plan.shared_workspace_bytes(n) == chunk.shared_workspace_bytes(2) > 0
        assert chunk._flipped_geometry() is None     # col2im, no flipped weights
    # chunks of near-equal size: 5 images at most 4 a chunk run as 3 and 2
    near = ChunkedConvPlan(geoms[0], lambda k, columns: ConvPlan(geoms[0], shared=True), 4)
    assert near._bounds(5) == [(0, 3), (3, 5)]


def test_large_im2col_layers_run_in_chunks(monkeypatch):
    from poseidon_caffe.backend.cpu import backend as cpu
    googlenet_conv1 = ConvGeometry(3, 64, (224, 224), (7, 7), (2, 2), (3, 3), (1, 1))
    whole = type(B)()
    whole.split_threads = 1
    plan = whole.conv_plan(googlenet_conv1, 32)
    assert type(plan).__name__ == "ChunkedConvPlan"
    # 147 rows x 112*112 columns of float32 per image (7.4 MB), at most IM2COL_CHUNK_BYTES a
    # chunk, at least an image
    assert plan.chunk == max(1, cpu.IM2COL_CHUNK_BYTES // (147 * 112 * 112 * 4)) == 1
    lenet_conv1 = ConvGeometry(1, 20, (28, 28), (5, 5), (1, 1), (0, 0), (1, 1))
    assert type(whole.conv_plan(lenet_conv1, 64)).__name__ == "ConvPlan"     # 3.7 MB of columns


@pytest.mark.parametrize("geom,algorithm", SPLIT_CONV[:2] + SPLIT_CONV[4:], ids=str)
def test_split_conv_plan_serves_deconvolution_calls(geom, algorithm):
    """Deconvolution's pattern: backward without x as its forward, then forward of the top
    diff followed by a filter gradient that reuses it, or prepare and filter gradient."""
    split, whole = _split_and_whole_conv(geom, algorithm)
    bottom = _rand((4, geom.num_output) + geom.out_shape, 34)
    dtop = _rand((4, geom.channels) + geom.in_shape, 35)
    w = _rand(geom.weight_shape, 36)
    results = []
    for plan in (split, whole):
        top = np.empty(dtop.shape, np.float32)
        plan.backward(None, bottom, w, dx=top)
        dbottom = np.empty(bottom.shape, np.float32)
        plan.forward(dtop, w, None, dbottom)
        dw = np.zeros_like(w)
        plan.backward(dtop, bottom, w, dw=dw)
        dw2 = np.zeros_like(w)
        plan.prepare(dtop * 2)
        plan.backward(dtop * 2, bottom, w, dw=dw2)
        results.append((top, dbottom, dw, dw2))
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(results[0][3], 2 * results[0][2], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("path", POOL_PATHS)
@pytest.mark.parametrize("spec", POOL_GEOMS[:3], ids=str)
def test_split_pool_plan_gives_the_whole_batch_values(spec, path):
    from poseidon_caffe.backend.cpu.pool import PoolPlan
    from poseidon_caffe.backend.cpu.split import SplitPoolPlan
    g = PoolGeometry(*spec)
    split, whole = SplitPoolPlan(g, lambda: PoolPlan(g), 2, min_work=0), PoolPlan(g)
    _take_pool_path(split, path)
    _take_pool_path(whole, path)
    assert split.separable == (path == "stages") and split.native == path.startswith("native")
    x = np.round(_rand((5, 2) + g.in_shape, 40) * 4)
    y_shape = (5, 2) + g.out_shape
    dy = _rand(y_shape, 41)
    uniform = np.random.RandomState(42).random_sample(y_shape).astype(np.float32)
    positive = np.abs(x) + 0.5
    results = []
    for plan in (split, whole):
        out = {}
        for name, run in [("max", lambda y: plan.max_forward(x, y)),
                          ("ave", lambda y: plan.ave_forward(x, y)),
                          ("stochastic", lambda y: plan.stochastic_forward_train(
                              positive, y, uniform)),
                          ("stochastic_test", lambda y: plan.stochastic_forward_test(
                              positive, y))]:
            y = np.full(y_shape, np.nan, np.float32)
            run(y)
            dx = np.full(x.shape, np.nan, np.float32)
            if name == "ave":
                plan.ave_backward(dy, dx)
            elif name == "stochastic_test":
                plan.stochastic_backward_test(positive, dy, dx)
            else:
                out[name + "_mask"] = plan.mask()
                plan.routed_backward(dy, dx)
            out[name], out[name + "_dx"] = y, dx
        results.append(out)
    for key in results[1]:
        np.testing.assert_allclose(results[0][key], results[1][key], rtol=1e-5, atol=1e-5,
                                   err_msg=key)


def test_split_pool_plan_keeps_a_small_pooling_whole_and_cuts_its_backward_alike():
    """Below min_work (outputs x window taps + input cells over the batch) the forward runs
    in one part on the calling thread, and so does its backward, whose winners are that
    part's; from min_work on, one part a thread."""
    from poseidon_caffe.backend.cpu.pool import PoolPlan
    from poseidon_caffe.backend.cpu.split import SplitPoolPlan
    g = PoolGeometry((8, 8), (3, 3), (2, 2), (0, 0), (4, 4))
    per_image = 3 * (4 * 4 * 9 + 8 * 8)               # 3 channels: 624
    plan = SplitPoolPlan(g, lambda: PoolPlan(g), 2, min_work=6 * per_image)
    whole = PoolPlan(g)
    for images, parts in ((5, 1), (6, 2)):
        x = _rand((images, 3, 8, 8), 44)
        dy = _rand((images, 3, 4, 4), 45)
        y = plan.max_forward(x, np.empty_like(dy))
        assert len(plan._bounds) == parts
        np.testing.assert_array_equal(y, whole.max_forward(x, np.empty_like(dy)))
        np.testing.assert_array_equal(
            plan.routed_backward(dy, np.full(x.shape, np.nan, np.float32)),
            whole.routed_backward(dy, np.empty_like(x)))


def test_gemm_adds_into_its_output_a_block_of_rows_at_a_time(monkeypatch):
    """Without an accumulating BLAS call the product is made a few rows at a time (no
    temporary the size of the output); every row is still added once."""
    from poseidon_caffe.backend.cpu import backend as cpu
    monkeypatch.setattr(cpu, "_ACCUMULATING_GEMM", None)
    monkeypatch.setattr(cpu, "ACCUMULATE_BLOCK_BYTES", 2 * 5 * 4)      # two rows of 5
    a, dy = _rand((9, 7), 53), _rand((9, 5), 54)
    acc = np.full((7, 5), 3, np.float32)
    B.gemm(a, dy, trans_a=True, alpha=0.5, beta=2.0, out=acc)
    np.testing.assert_allclose(acc, 0.5 * a.T @ dy + 6, rtol=1e-5)
    monkeypatch.setattr(B, "split_threads", 2)
    monkeypatch.setattr(cpu, "SPLIT_GEMM_FLOPS", 1.0)
    acc = np.ones((7, 5), np.float32)
    B.gemm(a, dy, trans_a=True, beta=1.0, out=acc)                   # columns cut, then rows
    np.testing.assert_allclose(acc, a.T @ dy + 1, rtol=1e-5)


def test_fft_batch_parts_share_one_weight_spectrum_and_never_a_stale_one(monkeypatch):
    from poseidon_caffe.backend.cpu import backend as cpu
    from poseidon_caffe.backend.cpu.conv import ConvPlan
    from poseidon_caffe.backend.cpu.fftconv import FFTConvPlan
    monkeypatch.setattr(cpu, "conv_algorithm", lambda geom, batch, parts=1: "fft")
    made = []
    spectrum = FFTConvPlan._conj_weight_spectrum
    monkeypatch.setattr(FFTConvPlan, "_conj_weight_spectrum",
                        lambda self, w, buffer=None: made.append(1) or spectrum(self, w, buffer))
    split = type(B)()
    split.split_threads = 2
    geom = ConvGeometry(4, 6, (7, 6), (3, 3), (1, 1), (1, 1), (1, 1), 2)
    plan, reference = split.conv_plan(geom, 5), ConvPlan(geom)
    x, w, dy = _rand((5, 4, 7, 6), 55), _rand(geom.weight_shape, 56), _rand((5, 6, 7, 6), 57)
    y, want_y = np.empty_like(dy), np.empty_like(dy)
    plan.forward(x, w, None, y)
    parts = [part for _, part in plan._plans]
    assert len(parts) == 2 and parts[0].weights is parts[1].weights and len(made) == 1
    dx, want = np.empty_like(x), np.empty_like(x)
    dw, want_dw = np.zeros_like(w), np.zeros_like(w)
    plan.backward(x, dy, w, dx=dx, dw=dw)               # the forward's spectrum, not remade
    assert len(made) == 1
    reference.forward(x, w, None, want_y)
    reference.backward(x, dy, w, dx=want, dw=want_dw)
    for got, expected in ((y, want_y), (dx, want), (dw, want_dw)):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    w *= 3                                              # same array, new values
    plan.backward(None, dy, w, dx=dx)                   # remade once, for both parts
    assert len(made) == 2
    reference.backward(None, dy, w, dx=want)
    np.testing.assert_allclose(dx, want, rtol=1e-4, atol=1e-4)


def test_fft_plan_workspace_is_what_it_keeps():
    """workspace_bytes (the net's memory estimate) against the arrays the plan holds after a
    forward and backward: input spectrum, padded real buffers, weight spectrum."""
    from poseidon_caffe.backend.cpu.fftconv import FFTConvPlan
    geom = ConvGeometry(4, 6, (7, 6), (3, 3), (1, 1), (1, 1), (1, 1), 2)
    plan = FFTConvPlan(geom)
    x, w, dy = _rand((3, 4, 7, 6), 58), _rand(geom.weight_shape, 59), _rand((3, 6, 7, 6), 60)
    plan.forward(x, w, None, np.empty_like(dy))
    plan.backward(x, dy, w, dx=np.empty_like(x), dw=np.zeros_like(w))
    kept = [plan._spectrum, plan.weights.buffer] + list(plan._buffers.values())
    assert plan.workspace_bytes(3) == sum(a.nbytes for a in kept)


def test_gemm_cut_over_threads_matches_one_product(monkeypatch):
    """GEMMs large enough to be cut over two threads, along rows and along columns."""
    from poseidon_caffe.backend.cpu import backend as cpu
    monkeypatch.setattr(B, "split_threads", 2)
    monkeypatch.setattr(cpu, "SPLIT_GEMM_FLOPS", 1.0)
    a, b = _rand((9, 4), 50), _rand((5, 4), 51)
    out = np.ones((9, 5), np.float32)
    B.gemm(a, b, trans_b=True, alpha=2.0, beta=0.5, out=out)          # rows cut
    np.testing.assert_allclose(out, 2 * a @ b.T + 0.5, rtol=1e-5)
    acc = np.ones((4, 5), np.float32)
    dy = _rand((9, 5), 52)
    B.gemm(a, dy, trans_a=True, beta=1.0, out=acc)                    # columns cut
    np.testing.assert_allclose(acc, a.T @ dy + 1, rtol=1e-5)
    np.testing.assert_allclose(B.gemm(a.T.copy(), b, trans_a=True, trans_b=True), a @ b.T,
                               rtol=1e-5)


def _two_thread_backend(monkeypatch):
    """A CPU backend of two threads whose elementwise passes split from 1000 values, and the
    list of the part bounds each ``over_parts`` call used."""
    from poseidon_caffe.backend.cpu import backend as cpu
    be = type(B)()
    be.split_threads = 2
    monkeypatch.setattr(cpu, "ELEMENTWISE_SPLIT", 1000)
    parts = []
    real = cpu.over_parts
    monkeypatch.setattr(cpu, "over_parts", lambda fn, n, threads: parts.append(
        real(fn, n, threads)))
    return be, parts


def test_relu_over_thread_parts_equals_one_pass(monkeypatch):
    """Large ReLU passes by numpy run a flat part per thread: the same values as one pass,
    leaky and in place included."""
    from poseidon_caffe.backend.cpu import native
    monkeypatch.setattr(native, "lib", None)
    be, parts = _two_thread_backend(monkeypatch)
    x = _rand((3, 5, 17, 19), 40)
    dy = _rand(x.shape, 41)
    for slope in (0.0, 0.1):
        y, dx = np.empty_like(x), np.empty_like(x)
        be.relu_forward(x, y, slope)
        np.testing.assert_array_equal(y, np.where(x > 0, x, np.float32(slope) * x))
        be.relu_backward(x, dy, dx, slope)
        np.testing.assert_array_equal(dx, np.where(x > 0, dy, np.float32(slope) * dy))
    inplace = x.copy()
    be.relu_forward(inplace, inplace, 0.0)
    np.testing.assert_array_equal(inplace, np.maximum(x, 0))
    assert len(parts) == 5 and all(len(bounds) == 2 for bounds in parts)


def test_copy_and_add_of_whole_blobs_run_a_part_per_thread(monkeypatch):
    """The net's fold of split gradients copies and adds whole blobs: over thread parts where
    large, the same values as numpy's one pass (a reshaping copy and strided arrays too)."""
    be, parts = _two_thread_backend(monkeypatch)
    x, y = _rand((4, 9, 31), 70), _rand((4, 9, 31), 71)
    out = np.empty((36, 31), np.float32)
    assert be.copy(x, out) is out and out.tobytes() == x.reshape(36, 31).tobytes()
    acc = y.copy()
    assert be.axpby(1.0, x, 1.0, acc) is acc
    assert acc.tobytes() == (y + x).tobytes()
    assert len(parts) == 2 and all(len(bounds) == 2 for bounds in parts)
    strided = np.empty((4, 9, 62), np.float32)[..., ::2]
    be.copy(x, strided)                                    # not contiguous: one pass
    np.testing.assert_array_equal(strided, x)
    scaled = y.copy()
    be.axpby(2.0, x, 0.5, scaled)
    np.testing.assert_allclose(scaled, 2 * x + 0.5 * y, rtol=1e-6)
    assert len(parts) == 2


@pytest.mark.parametrize("parts", [2, 3, 7, 64, 1000])
def test_compiled_relu_in_parts_is_one_pass_bit_for_bit(parts):
    """The compiled ReLU's parts on the library's own threads (kernels/parts.c) cover the
    pass once: the same bytes as one part, at sizes off the 16-value blocks the parts are cut
    on, with more parts than blocks, in place and leaky."""
    from poseidon_caffe.backend.cpu import native
    if native.lib is None:
        pytest.skip(NOT_BUILT)
    for size in (5, 16, 33, 1000, 65537):
        x = _rand((size,), size) - 0.5
        dy = _rand((size,), size + 1) - 0.5
        for slope in (0.0, 0.25, -0.5):
            one, many = np.empty_like(x), np.full_like(x, np.nan)
            native.relu_forward(x, one, slope)
            native.relu_forward(x, many, slope, parts)
            assert one.tobytes() == many.tobytes()
            inplace = x.copy()
            native.relu_forward(inplace, inplace, slope, parts)
            assert inplace.tobytes() == one.tobytes()
            native.relu_backward(x, dy, one, slope)
            native.relu_backward(x, dy, many, slope, parts)
            assert one.tobytes() == many.tobytes()
            inplace = dy.copy()
            native.relu_backward(x, inplace, inplace, slope, parts)
            assert inplace.tobytes() == one.tobytes()


def test_compiled_parts_run_in_a_forked_child_and_beside_other_threads():
    """A child forked after the library's threads started has none of them: its parted
    passes start their own and finish (not wait forever on threads that did not come along);
    calls from several Python threads at once each cover their pass."""
    import multiprocessing
    import threading
    from poseidon_caffe.backend.cpu import native
    if native.lib is None:
        pytest.skip(NOT_BUILT)
    x = _rand((100003,), 60) - 0.5
    want = np.maximum(x, 0)
    native.relu_forward(x, np.empty_like(x), 0.0, 2)            # the threads exist now
    child = multiprocessing.get_context("fork").Process(target=_relu_in_parts_or_fail,
                                                        args=(x, want))
    child.start()
    child.join(60)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive and child.exitcode == 0
    outs = [np.empty_like(x) for _ in range(4)]
    threads = [threading.Thread(target=lambda y=y: [native.relu_forward(x, y, 0.0, 2)
                                                    for _ in range(50)]) for y in outs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(y.tobytes() == want.tobytes() for y in outs)


def _relu_in_parts_or_fail(x, want):
    from poseidon_caffe.backend.cpu import native
    y = np.empty_like(x)
    native.relu_forward(x, y, 0.0, 2)
    if y.tobytes() != want.tobytes():
        raise SystemExit(3)


@pytest.mark.parametrize("way", ["compiled", "numpy"])
@pytest.mark.parametrize("slope", [0.0, 0.25, -0.5])
def test_relu_is_caffes_cpu_arithmetic_at_nan_zeros_infinities_and_subnormals(slope, way,
                                                                              monkeypatch):
    """relu_layer.cpp: y = max(x, 0) + slope min(x, 0) with std::max / std::min (a NaN x
    passes through, -inf gives NaN as 0 * -inf does), dx = dy ((x > 0) + slope (x <= 0)); in
    float32, bit for bit on the compiled pass (kernels/relu.c), in place too. The numpy path
    matches its values."""
    from poseidon_caffe.backend.cpu import native
    if way == "numpy":
        monkeypatch.setattr(native, "lib", None)
    elif native.lib is None:
        pytest.skip(NOT_BUILT)
    special = np.array([np.nan, 0.0, -0.0, np.inf, -np.inf, 1e-40, -1e-40, 3.0, -2.0],
                       np.float32)
    x = np.concatenate([special, _rand((1000,), 43) - 0.5]).astype(np.float32)
    dy = _rand(x.shape, 44) - 0.5
    s = np.float32(slope)
    with np.errstate(invalid="ignore"):
        want = np.where(x < 0, np.float32(0), x) + s * np.where(0 < x, np.float32(0), x)
        dx_want = dy * ((x > 0).astype(np.float32) + s * (x <= 0).astype(np.float32))
    y = np.empty_like(x)
    B.relu_forward(x, y, slope)
    dx = np.empty_like(x)
    B.relu_backward(x, dy, dx, slope)
    if way == "compiled":
        assert y.tobytes() == want.tobytes() and dx.tobytes() == dx_want.tobytes()
        inplace = x.copy()
        B.relu_forward(inplace, inplace, slope)
        assert inplace.tobytes() == want.tobytes()
    else:
        np.testing.assert_array_equal(y, want)
        finite = ~np.isnan(x)                  # numpy's where(x > 0, 1, slope) at a NaN x
        np.testing.assert_array_equal(dx[finite], dx_want[finite])


def _softmax_ways(way, monkeypatch):
    from poseidon_caffe.backend.cpu import native
    if way == "numpy":
        monkeypatch.setattr(native, "softmax", False)
    elif not native.softmax:
        pytest.skip("the compiled softmax needs the kernels built and a CPU with AVX-512, or "
                    "AVX2 and FMA")


@pytest.mark.parametrize("way", ["compiled", "numpy"])
def test_softmax_exp_within_three_ulp_to_the_denormals_with_infinities_and_nan(way,
                                                                               monkeypatch):
    """softmax of (t, 0) over channels is e^t / (e^t + 1) and 1 / (e^t + 1), worked in float64
    here: within 3 ulp of the float results down to the denormals (an exp's ulp or two, the
    sum's rounding and the division's; kernels/softmax.c's own exp, numpy's), 0 at -inf and
    past -104, NaN through the whole column of a NaN (numpy's max)."""
    _softmax_ways(way, monkeypatch)
    t = np.concatenate([-np.linspace(0, 103, 200001), [-87.33, -88.72, -95.5, -103.27, -105,
                                                        -np.inf, np.nan]]).astype(np.float32)
    x = np.stack([t, np.zeros_like(t)])[None]                    # (1, 2, positions)
    y = B.softmax_forward(x, np.empty_like(x))
    e = np.exp(t.astype(np.float64))
    ok = np.isfinite(t)
    for got, want in ((y[0, 0], e / (e + 1)), (y[0, 1], 1 / (e + 1))):
        ulp = np.spacing(want.astype(np.float32)).astype(np.float64)
        assert np.all(np.abs(got[ok] - want[ok]) <= 3 * ulp[ok])
    assert y[0, 0, -2] == 0 and y[0, 1, -2] == 1 and y[0, 0, -3] == 0
    assert np.isnan(y[0, :, -1]).all()
    rows = x[0].T.copy()[:, :, None]                             # the rows' way (inner 1)
    np.testing.assert_array_equal(B.softmax_forward(rows, np.empty_like(rows))[:, :, 0],
                                  y[0].T)


@pytest.mark.parametrize("way", ["compiled", "numpy"])
def test_softmax_rows_find_their_maximum_and_nan_in_every_vector(way, monkeypatch):
    """Rows of 37 channels (the compiled row: two vectors a step, then a short last one):
    the row's maximum, or a NaN, in either vector of a step or in the last one; each row is
    e^(x - max) / sum worked in float64 (with values up to 200 a wrong maximum overflows to
    inf or loses the row to 0), and a NaN's row is NaN throughout."""
    _softmax_ways(way, monkeypatch)
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((2 * 37, 37)) * 4).astype(np.float32)
    for place in range(37):
        x[place, place] = 200.0                          # the maximum, at each channel
        x[37 + place, place] = np.nan
    y = B.softmax_forward(x[:, :, None], np.empty_like(x)[:, :, None])[:, :, 0]
    x64 = x[:37].astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y[:37], e / e.sum(axis=1, keepdims=True), rtol=3e-6,
                               atol=1e-30)
    assert np.isnan(y[37:]).all()


@pytest.mark.parametrize("way", ["compiled", "numpy"])
@pytest.mark.parametrize("shape", [(32, 1000, 1), (3, 21, 37), (2, 5, 1), (4, 3, 17)])
def test_softmax_and_its_loss_are_caffes_formulas(shape, way, monkeypatch):
    """softmax_layer.cpp / softmax_loss_layer.cpp worked in float64: y = e^(x - max) / sum,
    loss = -sum log(max(p[label], FLT_MIN)) over the labels not ignored, dx = scale (p -
    onehot) and 0 at an ignored label (a NaN probability stays NaN), a label out of range a
    NaN loss; in place too, and over two threads' slices of the batch."""
    _softmax_ways(way, monkeypatch)
    from poseidon_caffe.backend.cpu import backend as cpu
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(shape) * 8).astype(np.float32)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    y = B.softmax_forward(x, np.empty_like(x))
    np.testing.assert_allclose(y, want, rtol=3e-6, atol=1e-30)
    inplace = x.copy()
    B.softmax_forward(inplace, inplace)
    np.testing.assert_array_equal(inplace, y)
    be = type(B)()
    be.split_threads = 2
    monkeypatch.setattr(cpu, "ELEMENTWISE_SPLIT", 10)
    np.testing.assert_array_equal(be.softmax_forward(x, np.empty_like(x)), y)
    outer, channels, inner = shape
    labels = rng.integers(0, channels, outer * inner).astype(np.float32)
    labels[::3] = 2                                              # some ignored
    y[0, :, 0] = np.nan if outer > 2 else y[0, :, 0]
    p_true = np.take_along_axis(y, labels.reshape(outer, 1, inner).astype(int), axis=1)[:, 0]
    counted = (labels != 2).reshape(outer, inner)
    loss_want = -np.log(np.maximum(p_true[counted], np.finfo(np.float32).tiny)
                        .astype(np.float64)).sum()
    loss, count = B.softmax_loss_forward(y, labels, 2)
    assert count == counted.sum()
    np.testing.assert_allclose(loss, loss_want, rtol=1e-6)
    onehot = np.arange(channels)[None, :, None] == np.where(counted, labels.reshape(
        outer, inner), 0).astype(int)[:, None, :]
    dx_want = (y - onehot) * counted[:, None, :] * np.float32(0.3)
    dx = B.softmax_loss_backward(y, labels, 2, 0.3, np.empty_like(y))
    np.testing.assert_allclose(dx, dx_want, rtol=1e-6, atol=1e-30)
    assert np.isnan(dx[0, :, 0]).all() == (outer > 2)
    same = y.copy()
    B.softmax_loss_backward(same, labels, 2, 0.3, same)
    np.testing.assert_array_equal(same, dx)
    assert B.softmax_loss_forward(y, labels, None)[1] == outer * inner
    o, i = np.argwhere(counted)[0]
    y[o, :, i] = np.nan                                          # counted: a NaN loss
    assert np.isnan(B.softmax_loss_forward(y, labels, 2)[0])
    labels[1] = channels                                         # out of range: NaN
    loss, count = B.softmax_loss_forward(y, labels, 2)
    assert loss != loss and count == (labels != 2).sum()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_axis_copy_of_large_parts_over_threads_is_a_concat_and_its_slices(axis, threads):
    """Concat / Slice's copies, past ELEMENTWISE_SPLIT values a part cut by the batch over
    two threads: the parts land where numpy's concatenate puts them, and come back out."""
    from poseidon_caffe.backend.cpu import backend as cpu
    be = type(B)()
    be.split_threads = threads
    parts = [_rand((4, 6, 150, 120), 80), _rand((4, 2, 150, 120), 81)]
    if axis != 1:
        parts = [p.swapaxes(1, axis).copy() for p in parts]
    assert parts[0].size >= cpu.ELEMENTWISE_SPLIT
    whole = np.full(np.concatenate(parts, axis=axis).shape, np.nan, np.float32)
    offset = 0
    for p in parts:
        be.axis_copy(p, whole, axis, offset, True)
        offset += p.shape[axis]
    np.testing.assert_array_equal(whole, np.concatenate(parts, axis=axis))
    offset = 0
    for p in parts:
        back = np.full(p.shape, np.nan, np.float32)
        be.axis_copy(back, whole, axis, offset, False)
        np.testing.assert_array_equal(back, p)
        offset += p.shape[axis]


def test_winograd_chunks_hold_a_few_mb_or_enough_tiles_for_wide_gemms():
    """A chunk's largest work array (36 positions of the wider side's channels per tile) stays
    within CHUNK_BYTES, unless that would leave its GEMMs fewer than MIN_TILES columns."""
    from poseidon_caffe.backend.cpu import winograd
    inception = winograd.WinogradConvPlan(ConvGeometry(96, 128, (28, 28), (3, 3), (1, 1),
                                                       (1, 1), (1, 1)))
    per_image = 36 * 128 * 49 * 4                      # 7x7 tiles an image: 903 KB
    assert inception.chunk(32) == winograd.CHUNK_BYTES // per_image == 4
    vgg_conv4 = winograd.WinogradConvPlan(ConvGeometry(512, 512, (8, 8), (3, 3), (1, 1),
                                                       (1, 1), (1, 1)))
    # 4 tiles an image: 32 images for 128 tiles, past the 14 of 4 MB; never past the batch
    assert vgg_conv4.chunk(32) == 32 and vgg_conv4.chunk(16) == 16
    assert winograd.CHUNK_BYTES // (36 * 512 * 4 * 4) == 14 < 32
