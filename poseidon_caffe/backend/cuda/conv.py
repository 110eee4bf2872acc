"""The CUDA backend's convolution plan (the call contract of backend/ops.py's conv_plan).

The plan lays the batch's columns out as one matrix, (C*taps, N*out): row r holds tap r of
every image's outputs, image after image, so that each product is one sgemm per group whatever
the batch (a GEMM per image launched from Python costs more than the product on a GPU):
- filter gradient: dy turned into (M, N*out), then dW += dy_t col^T;
- forward: (M, N*out) = W col, then turned into y (N, M, out) with the bias added on the way;
- backward-data: the columns (C*taps, N*out) = W^T dy_t, then col2im.
From PER_IMAGE_FROM outputs an image, forward and backward-data are instead strided-batched
sgemms over the images' blocks of the same matrices, straight from col and dy.
A 1x1 kernel at stride 1 without padding (GoogLeNet's many) has its columns in each image
already: its forward and backward-data are strided-batched sgemms on x and dx themselves, with
no columns made but the filter gradient's. The bias and its gradient otherwise go through the
backend's add_bias / add_bias_grad (GEMMs against a vector of ones). The columns of the last
forward are kept for the backward that follows on the same input.
"""
import numpy as np

from . import kernels

I32 = np.int32
# From this many outputs an image, a batch of per-image GEMMs runs as fast as one wide product
# and needs no turning of y or dy (on an H100: AlexNet's conv1, 3025 outputs, per image;
# its 13x13 layers 10-15% faster as one product)
PER_IMAGE_FROM = 1024


def _geometry_array(backend, geom):
    values = (geom.in_shape + geom.out_shape + geom.kernel + geom.pad + geom.stride +
              geom.dilation)
    return backend.to_device(np.asarray(values, np.int32), dtype=np.int32)


def _pitches(geom, n, batch_layout):
    """(row_pitch, image_pitch) of the columns: Caffe's per-image (N, C*taps, out), or the
    batch layout (C*taps, N*out)."""
    if batch_layout:
        return n * geom.out_count, geom.out_count
    return geom.out_count, geom.col_rows * geom.out_count


def im2col(backend, x, geom, col, geometry=None, batch_layout=False):
    """col <- x (N, C, *in): per image (N, C*taps, *out), or (C*taps, N*out) in the batch
    layout."""
    n = x.shape[0]
    count = n * geom.channels * geom.out_count
    if not count:
        return col
    pitches = _pitches(geom, n, batch_layout)
    if geom.nd == 2:
        (h, w), (kh, kw), (ph, pw), (sh, sw), (dh, dw), (oh, ow) = (
            geom.in_shape, geom.kernel, geom.pad, geom.stride, geom.dilation, geom.out_shape)
        backend.launcher.run(kernels.im2col.im2col_2d, count, x.ptr, geom.channels, h, w, kh,
                             kw, ph, pw, sh, sw, dh, dw, oh, ow, *pitches, col.ptr)
    else:
        geometry = geometry or _geometry_array(backend, geom)
        backend.launcher.run(kernels.im2col.im2col_nd, count, x.ptr, geom.channels, geom.nd,
                             geometry.ptr, *pitches, col.ptr)
    return col


def col2im(backend, col, geom, x, geometry=None, batch_layout=False):
    """x (N, C, *in) <- the adjoint of im2col (overlapping taps summed), from columns in
    either layout."""
    n = x.shape[0]
    count = n * geom.channels * geom.in_count
    if not count:
        return x
    pitches = _pitches(geom, n, batch_layout)
    if geom.nd == 2:
        (h, w), (kh, kw), (ph, pw), (sh, sw), (dh, dw), (oh, ow) = (
            geom.in_shape, geom.kernel, geom.pad, geom.stride, geom.dilation, geom.out_shape)
        backend.launcher.run(kernels.im2col.col2im_2d, count, col.ptr, geom.channels, h, w, kh,
                             kw, ph, pw, sh, sw, dh, dw, oh, ow, *pitches, x.ptr)
    else:
        geometry = geometry or _geometry_array(backend, geom)
        backend.launcher.run(kernels.im2col.col2im_nd, count, col.ptr, geom.channels, geom.nd,
                             geometry.ptr, *pitches, x.ptr)
    return x


class ConvPlan:
    def __init__(self, backend, geom):
        self.backend = backend
        self.geom = geom
        self._geometry = None if geom.nd == 2 else _geometry_array(backend, geom)
        self._col = None            # columns of the last forward's input, batch layout
        self._col_of = None         # (pointer, batch) they were made from
        self._work = None           # columns for backward-data
        self._rows = None           # (M, N*out): forward's product, backward's dy
        # a 1x1 kernel at stride 1 without padding reads each image as its own columns
        self.pointwise = (geom.col_rows == geom.channels and geom.out_shape == geom.in_shape
                          and not any(geom.pad))

    def workspace_bytes(self, batch):
        g = self.geom
        return (2 * g.col_rows + g.num_output) * batch * g.out_count * 4

    def _buffer(self, name, shape):
        if getattr(self, name) is None or getattr(self, name).shape != shape:
            setattr(self, name, self.backend.empty(shape))
        return getattr(self, name)

    def _columns(self, x):
        n = x.shape[0]
        col = self._buffer("_col", (self.geom.col_rows, n * self.geom.out_count))
        im2col(self.backend, x, self.geom, col, self._geometry, batch_layout=True)
        self._col_of = (x.ptr, n)
        return col

    def prepare(self, x):
        if not self.pointwise:
            self._columns(x)

    def forward(self, x, w, bias, y):
        g, be = self.geom, self.backend
        n = x.shape[0]
        m, groups = g.num_output, g.group
        mg, kg, out = m // groups, g.col_rows // groups, g.out_count
        if not n * out:
            return y
        per_image = self.pointwise or out >= PER_IMAGE_FROM
        if per_image:
            # per image: y_i[group] (mg, out) = W[group] (mg, kg) columns_i[group] (kg, out),
            # the columns being x_i itself or image i's block of the batch's columns
            col = x if self.pointwise else self._columns(x)
            pitch, image = _pitches(g, n, batch_layout=not self.pointwise)
            for gi in range(groups):
                be.blas.sgemm_strided_batched(
                    "N", "N", out, mg, kg, 1.0, col.ptr + 4 * gi * kg * pitch, pitch, image,
                    w.ptr + 4 * gi * mg * kg, kg, 0, 0.0,
                    y.ptr + 4 * gi * mg * out, out, m * out, n)
            if bias is not None:
                be.add_bias(y.reshape(n, m, out), bias)
            return y
        col = self._columns(x)
        wide = n * out
        rows = self._buffer("_rows", (m, wide))
        for gi in range(groups):
            # rows[group] (mg, N*out) = W[group] (mg, kg) col[group] (kg, N*out)
            be.blas.sgemm("N", "N", wide, mg, kg, 1.0, col.ptr + 4 * gi * kg * wide, wide,
                          w.ptr + 4 * gi * mg * kg, kg, 0.0, rows.ptr + 4 * gi * mg * wide, wide)
        # y (N, M, out) = rows (M, N, out) + the bias per output channel
        be.launcher.run(kernels.copy.swap_outer_axes, y.size, rows.ptr, m, n, out,
                        None if bias is None else bias.ptr, y.ptr)
        return y

    def backward(self, x, dy, w, dx=None, dw=None, dbias=None):
        g, be = self.geom, self.backend
        n = dy.shape[0]
        m, groups = g.num_output, g.group
        mg, kg, out = m // groups, g.col_rows // groups, g.out_count
        wide = n * out
        if dbias is not None:
            be.add_bias_grad(dy.reshape(n, m, out), dbias)
        if not wide:                  # an empty batch
            return
        dy_t = None
        if dw is not None:
            dy_t = self._buffer("_rows", (m, wide))
            be.launcher.run(kernels.copy.swap_outer_axes, dy_t.size, dy.ptr, n, m, out, None,
                            dy_t.ptr)
            col = self._col if self._col_of == (x.ptr, n) else self._columns(x)
            for gi in range(groups):
                # dW[group] (mg, kg) += dy_t[group] (mg, N*out) col[group]^T (N*out, kg)
                be.blas.sgemm("T", "N", kg, mg, wide, 1.0,
                              col.ptr + 4 * gi * kg * wide, wide,
                              dy_t.ptr + 4 * gi * mg * wide, wide, 1.0,
                              dw.ptr + 4 * gi * mg * kg, kg)
        if dx is None:
            return
        work = dx if self.pointwise else self._buffer("_work", (g.col_rows, wide))
        if dy_t is None or self.pointwise or out >= PER_IMAGE_FROM:
            # per image, from dy as it is: columns_i[group] (kg, out) = W[group]^T (kg, mg)
            # dy_i[group] (mg, out), into dx itself where the columns are the image
            pitch, image = _pitches(g, n, batch_layout=not self.pointwise)
            for gi in range(groups):
                be.blas.sgemm_strided_batched(
                    "N", "T", out, kg, mg, 1.0, dy.ptr + 4 * gi * mg * out, out, m * out,
                    w.ptr + 4 * gi * mg * kg, kg, 0, 0.0,
                    work.ptr + 4 * gi * kg * pitch, pitch, image, n)
        else:
            for gi in range(groups):
                # work[group] (kg, N*out) = W[group]^T (kg, mg) dy_t[group] (mg, N*out)
                be.blas.sgemm("N", "T", wide, kg, mg, 1.0,
                              dy_t.ptr + 4 * gi * mg * wide, wide,
                              w.ptr + 4 * gi * mg * kg, kg, 0.0,
                              work.ptr + 4 * gi * kg * wide, wide)
        if not self.pointwise:
            col2im(be, work, g, dx, self._geometry, batch_layout=True)
