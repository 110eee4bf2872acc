"""The optional compiled kernels: kernels/*.c (pooling, LRN, the direct convolution, Winograd's
tiles, im2col and col2im, Dropout's hashed draws, GEMMs across a batch's images, ReLU, softmax
and its loss), built at install as the module ``_kernels`` and called through ctypes (which
releases the GIL, so batch parts run side by side).

They exist for passes numpy can only make as many strided passes (2-D pooling over small
windows, the copies in and out of Winograd's tiles, col2im's sums of every tap, a hash per
value). ``lib`` is None where the library was not built (no compiler at install) or when
POSEIDON_NATIVE=0; callers then take their numpy paths, which compute the same values.
"""
import ctypes
import os

import numpy as np

_P = ctypes.c_void_p
_I = ctypes.c_int
_L = ctypes.c_int64
_U = ctypes.c_uint32
_WINDOW = [_I] * 10          # h, w, oh, ow, kh, kw, sh, sw, ph, pw
VERSION = 18                 # kernels_version() of the kernels these calls are written for


def _load():
    if os.environ.get("POSEIDON_NATIVE", "1") == "0":
        return None
    try:
        from . import _kernels
    except ImportError:
        return None
    lib = ctypes.CDLL(_kernels.__file__)
    version = getattr(lib, "kernels_version", None)
    if version is None or version() != VERSION:
        # built from other sources (rebuild: python setup.py build_ext --inplace)
        return None
    lib.pool_max_forward.argtypes = [_P, _P, _P, _I, _L] + _WINDOW + [_I]
    lib.pool_max_forward.restype = _I
    lib.pool_max_backward.argtypes = [_P, _P, _I, _P, _L] + _WINDOW + [_I]
    lib.pool_max_backward.restype = _I
    lib.pool_ave_forward.argtypes = [_P, _P, _L] + _WINDOW + [_I]
    lib.pool_ave_forward.restype = _I
    lib.pool_ave_backward.argtypes = [_P, _P, _L] + _WINDOW + [_I]
    lib.pool_ave_backward.restype = _I
    lib.pool_ave_backward_add.argtypes = [_P, _P, _L] + _WINDOW
    lib.pool_ave_backward_add.restype = _I
    lib.conv_direct_forward.argtypes = [_P, _P, _P, _P, _L] + [_I] * 9
    lib.conv_direct_forward.restype = _I
    lib.conv_direct_filter.argtypes = [_P, _P, _P, _L] + [_I] * 8
    lib.conv_direct_filter.restype = _I
    lib.winograd_in.argtypes = [_P, _P, _P, _L] + [_I] * 11
    lib.winograd_in.restype = _I
    lib.winograd_out.argtypes = [_P, _P, _P, _P, _L] + [_I] * 8
    lib.winograd_out.restype = _I
    for name in ("im2col_2d", "col2im_2d"):
        getattr(lib, name).argtypes = [_P, _P, _L, _L, _L] + [_I] * 13
        getattr(lib, name).restype = _I
    lib.gemm_images.argtypes = [_P, _L, _L, _I, _I, _P, _L, _P, _L, _L, _L, _L, _P, _I]
    lib.gemm_images.restype = _I
    lib.gemm_images_filter.argtypes = [_P, _L, _I, _P, _L, _I, _L, _L, _L, _P, _L]
    lib.gemm_images_filter.restype = _I
    lib.relu_forward.argtypes = [_P, _P, _L, ctypes.c_float, _I]
    lib.relu_forward.restype = _I
    lib.relu_backward.argtypes = [_P, _P, _P, _L, ctypes.c_float, _I]
    lib.relu_backward.restype = _I
    lib.dropout_apply.argtypes = [_P, _P, _I, _I, _U, _U, _U, ctypes.c_float, _I]
    lib.dropout_apply.restype = _I
    lib.softmax_forward.argtypes = [_P, _P, _L, _L, _L]
    lib.softmax_forward.restype = _I
    lib.softmax_loss_forward.argtypes = [_P, _P, _L, _L, _L, _I, _L, _P]
    lib.softmax_loss_forward.restype = _I
    lib.softmax_loss_backward.argtypes = [_P, _P, _L, _L, _L, _I, _L, ctypes.c_float, _P]
    lib.softmax_loss_backward.restype = _I
    return lib


lib = _load()
# Winograd's transforms by their plain loops even on AVX-512 (the tests run both)
PORTABLE_WINOGRAD = False
# pooling by the phased layout (pooling.c) even on AVX-512, not 16 planes a vector
# (pool_lanes.c) nor shifted loads (pool_same.c); the tests run both
PORTABLE_POOLING = False
# the direct convolution (kernels/direct.c) and the GEMMs across images (image_gemm.c) run
# only where the CPU has AVX-512
direct = lib is not None and lib.conv_direct_available() == 1
image_gemm = direct
# Softmax and SoftmaxWithLoss (kernels/softmax.c): AVX-512, or AVX2 with FMA; numpy's passes
# elsewhere
softmax = lib is not None and lib.softmax_available() == 1


def avx2_pooling_first(on, rows=True, tiles=True):
    """Pooling by the AVX2 passes before the AVX-512 ones (True), or only where the CPU has no
    AVX-512 (False: the default): MAX's forward where 2x2 windows of stride 2 tile the planes
    by a pass over them all (kernels/pool_tiles.c; with `tiles` False, not at all), by a
    window's rows then its columns (pool_rows.c; with `rows` False, not at all), then 8
    planes a vector (pool_lanes8.c), as AVE's forward; AVE's backward 8 cells a vector
    (pool_ave_vectors.c). The tests run each. Returns whether they then come first on this
    CPU."""
    ctypes.c_int.in_dll(lib, "pool_lanes8_after_avx512").value = int(not on)
    ctypes.c_int.in_dll(lib, "pool_rows_serve").value = int(rows)
    ctypes.c_int.in_dll(lib, "pool_tiles_serve").value = int(tiles)
    return lib.pool_lanes8_first() == 1


def takes(*arrays):
    """Whether the kernels can work on these arrays in place: C-contiguous float32."""
    return all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)


_BUFFER_AT = ctypes.c_char.from_buffer


def address(a):
    """The address of array a's first element, for the kernels: a writable C-contiguous
    array's (every array they write and most they read) by ctypes' view of its buffer, 0.4
    us; numpy's __array_interface__ builds a dict each time, 2.9 us in numpy 2.4 (four a
    SoftmaxWithLoss forward, 25 of its 60 us alone). Others' (read-only, strided, empty) by
    that dict."""
    try:
        return ctypes.addressof(_BUFFER_AT(a))
    except (TypeError, ValueError):
        return a.__array_interface__["data"][0]


def _pool_window(geom):
    (h, w), (oh, ow) = geom.in_shape, geom.out_shape
    return (h, w, oh, ow) + geom.kernel + geom.stride + geom.pad


def pools(geom):
    """Whether the pooling kernels serve this geometry: 2-D, flat indices within int32."""
    return lib is not None and len(geom.in_shape) == 2 and geom.in_count < 2 ** 31


def winner_type(geom):
    """The element type of MAX's kept winners: one byte where a window has at most 255 cells
    (255 then means no winner), else int32 (-1)."""
    return np.uint8 if int(np.prod(geom.kernel)) <= 255 else np.int32


def no_winner(dtype):
    return 255 if np.dtype(dtype) == np.uint8 else -1


def max_pool_forward(x, y, arg, geom):
    """y = MAX pooling of x (N, C, H, W); arg (y's shape, winner_type) = each winner's place
    in its window, (row tap) * kernel_w + column tap from the window's corner in the padded
    input, no_winner for an empty window."""
    planes = x.shape[0] * x.shape[1]
    if lib.pool_max_forward(address(x), address(y), address(arg), arg.itemsize, planes,
                            *_pool_window(geom), int(not PORTABLE_POOLING)):
        raise MemoryError("MAX pooling: no memory for a row of %d outputs" % geom.out_shape[1])
    return y


def max_pool_backward(dy, arg, dx, geom):
    """dx = zero, then each dy added at its winner (arg from max_pool_forward)."""
    planes = dy.shape[0] * dy.shape[1]
    if lib.pool_max_backward(address(dy), address(arg), arg.itemsize, address(dx), planes,
                             *_pool_window(geom), int(not PORTABLE_POOLING)):
        raise MemoryError("MAX pooling: no memory for a %dx%d window" % geom.kernel)
    return dx


def ave_pool_forward(x, y, geom):
    planes = x.shape[0] * x.shape[1]
    if lib.pool_ave_forward(address(x), address(y), planes, *_pool_window(geom),
                            int(not PORTABLE_POOLING)):
        raise MemoryError("AVE pooling: no memory for a row of %d outputs" % geom.out_shape[1])
    return y


def ave_pool_backward(dy, dx, geom):
    planes = dy.shape[0] * dy.shape[1]
    if lib.pool_ave_backward(address(dy), address(dx), planes, *_pool_window(geom),
                             int(not PORTABLE_POOLING)):
        raise MemoryError("AVE pooling: no memory for a row of %d outputs" % geom.out_shape[1])
    return dx


def ave_pool_backward_add(dy, dx, geom):
    """dx += AVE pooling's gradient of dy, each cell's shares added to its value in Caffe's
    order; False where the kernel does not serve (neither AVX-512 nor AVX2, the phased passes
    asked for, windows overlapping much, AVX2's planes of few outputs): nothing is written
    then."""
    if PORTABLE_POOLING:
        return False
    planes = dy.shape[0] * dy.shape[1]
    status = lib.pool_ave_backward_add(address(dy), address(dx), planes, *_pool_window(geom))
    if status == -1:
        raise MemoryError("AVE pooling: no memory for the lists of a %dx%d plane"
                          % geom.in_shape)
    return status == 0


def winograd_in(x, v, mat, a, m, pad, tiles):
    """v (p*p, C, k*th*tw) = mat X mat' of each a x a window X of x (k, C, h, w) at steps of
    m from -pad, zero outside x; mat is (p, a) (winograd.c)."""
    k, c, h, w = x.shape
    p = mat.shape[0]
    if lib.winograd_in(address(x), address(v), address(mat), k, c, h, w, a, p, m,
                       pad[0], pad[1], *tiles, int(PORTABLE_WINOGRAD)):
        raise MemoryError("Winograd: no memory for a channel's %dx%d tiles" % (a, a))
    return v


def winograd_out(prod, mat, bias, y, m, tiles):
    """y (k, C, oh, ow) = the m x m tiles mat P mat' of prod (p*p, C, k*th*tw) laid side by
    side and clipped to y, plus bias (C,) when given; mat is (m, p) (winograd.c)."""
    k, c, oh, ow = y.shape
    p = mat.shape[1]
    if lib.winograd_out(address(prod), address(mat),
                        None if bias is None else address(bias), address(y), k, c, oh, ow,
                        p, m, *tiles, int(PORTABLE_WINOGRAD)):
        raise MemoryError("Winograd: no memory for a channel's %dx%d tiles" % (m, m))
    return y


def makes_columns(geom, *arrays):
    """Whether im2col_2d and col2im_2d serve this geometry on these arrays: 2-D, built, and
    C-contiguous float32."""
    return lib is not None and len(geom.in_shape) == 2 and takes(*arrays)


def _column_geometry(geom, n):
    return (n, geom.channels) + geom.in_shape + geom.out_shape + geom.kernel + geom.stride + \
        geom.pad + geom.dilation


def _pitches(geom, n, by_image_rows):
    """(row pitch, image pitch) of the columns: channel-major, or image by image with
    ``by_image_rows`` rows an image."""
    if by_image_rows:
        return geom.out_count, by_image_rows * geom.out_count
    return n * geom.out_count, geom.out_count


def im2col_2d(x, col, geom, by_image_rows=0):
    """Caffe's columns of x (N, C, h, w) (columns.c): col (C*kh*kw, N*oh*ow), channel-major,
    or with ``by_image_rows`` its first C*kh*kw rows of (N, by_image_rows, oh*ow)."""
    n = x.shape[0]
    if lib.im2col_2d(address(x), address(col), *_pitches(geom, n, by_image_rows),
                     *_column_geometry(geom, n)):
        raise ValueError("im2col: a geometry out of range: %s" % (geom,))
    return col


def col2im_2d(col, dx, geom, by_image_rows=0):
    """dx (N, C, h, w) = the adjoint of im2col_2d: every tap's column cell summed back."""
    n = dx.shape[0]
    status = lib.col2im_2d(address(col), address(dx), *_pitches(geom, n, by_image_rows),
                           *_column_geometry(geom, n))
    if status == -1:
        raise MemoryError("col2im: no memory for a padded %dx%d plane" % geom.in_shape)
    if status:
        raise ValueError("col2im: a geometry out of range: %s" % (geom,))
    return dx


def dropout_apply(x, y, start, count, key, threshold, scale, parts=1):
    """y[start:start+count] = Dropout's map of x there (kernels/dropout.c; flat indices), in
    ``parts`` parts side by side."""
    lib.dropout_apply(address(x), address(y), start, count, key[0], key[1], threshold,
                      scale, parts)
    return y


def _gemm_status(status, what):
    if status == -1:
        raise MemoryError("%s: no memory for its packed operands" % what)
    if status:
        raise RuntimeError("%s: the kernels are not available on this CPU" % what)


def gemm_images(a, b, b_offset, c, c_offset, bias, positions):
    """c[n][i, p] = sum over k of a[i, k] b[n][k, p] (+ bias[i]) for every image n of b and c
    (N, ..., positions-per-channel), their first rows ``b_offset`` and ``c_offset`` floats
    into an image; a is any 2-D float32 view (its strides are read), bias a float32 run of
    a.shape[0] or None (kernels/image_gemm.c)."""
    item = a.itemsize
    n = b.shape[0]
    _gemm_status(lib.gemm_images(
        address(a), a.strides[0] // item, a.strides[1] // item, a.shape[0], a.shape[1],
        address(b) + 4 * b_offset, b[0].size, address(c) + 4 * c_offset, c[0].size,
        positions, 0, n * positions, None if bias is None else address(bias), 0),
        "a GEMM across images")
    return c


def gemm_images_filter(dy, dy_offset, x, x_offset, dw, positions):
    """dw (M, C) += sum over images n and positions p of dy[n][i, p] x[n][j, p], dy's rows
    from ``dy_offset`` and x's from ``x_offset`` floats into an image; dw C-contiguous rows
    (kernels/image_gemm.c)."""
    n = dy.shape[0]
    _gemm_status(lib.gemm_images_filter(
        address(dy) + 4 * dy_offset, dy[0].size, dw.shape[0], address(x) + 4 * x_offset,
        x[0].size, dw.shape[1], positions, 0, n * positions, address(dw),
        dw.strides[0] // dw.itemsize), "a filter gradient across images")
    return dw


def relu_forward(x, y, slope, parts=1):
    """y = Caffe's CPU ReLU of x (kernels/relu.c) in ``parts`` parts side by side (the
    library's own threads, kernels/parts.c); y may be x."""
    lib.relu_forward(address(x), address(y), x.size, slope, parts)
    return y


def relu_backward(x, dy, dx, slope, parts=1):
    """dx = dy times ReLU's slope at x (kernels/relu.c), in ``parts`` parts; dx may be dy."""
    lib.relu_backward(address(x), address(dy), address(dx), x.size, slope, parts)
    return dx


def softmax_forward(x, y):
    """y = softmax of x (outer, channels, inner) along channels (kernels/softmax.c); y may
    be x."""
    if lib.softmax_forward(address(x), address(y), *x.shape):
        raise MemoryError("softmax: no memory for a %d-position scratch" % x.shape[2])
    return y


def _ignore(ignore_label):
    return (0, 0) if ignore_label is None else (1, int(ignore_label))


def softmax_loss_forward(prob, labels, ignore_label):
    """(summed -log p(label), count not ignored) of prob (outer, channels, inner) and float32
    labels (outer * inner), or (NaN, count) where a label is out of range."""
    out = (ctypes.c_double * 2)()
    bad = lib.softmax_loss_forward(address(prob), address(labels), *prob.shape,
                                   *_ignore(ignore_label), out)
    return (float("nan") if bad else out[0]), out[1]


def softmax_loss_backward(prob, labels, ignore_label, scale, dx):
    """dx = scale (prob - onehot(label)), zero where the label is ignored; dx may be prob."""
    lib.softmax_loss_backward(address(prob), address(labels), *prob.shape,
                              *_ignore(ignore_label), scale, address(dx))
    return dx
