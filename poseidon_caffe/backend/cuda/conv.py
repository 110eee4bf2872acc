"""The CUDA backend's convolution plan (the call contract of backend/ops.py's conv_plan).

The plan lays the batch's columns out as one matrix, (C*taps, N*out): row r holds tap r of
every image's outputs, image after image. The forward is one strided-batched sgemm per group
over those columns (each image's block of out columns; the weights' stride 0). Backward turns
dy (N, M, out) into (M, N*out) and then needs one sgemm per group for the filter gradient and
one for backward-data's columns (then col2im), whatever the batch: a GEMM per image launched
from Python costs more than the product on a GPU. The bias goes through the backend's add_bias
/ add_bias_grad (GEMMs against a vector of ones). The columns of the last forward are kept for
the backward that follows on the same input.
"""
import numpy as np

from . import kernels

I32 = np.int32


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
        self._dy_t = None           # dy as (M, N*out)

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
        self._columns(x)

    def forward(self, x, w, bias, y):
        g, be = self.geom, self.backend
        n = x.shape[0]
        col = self._columns(x)
        m, groups = g.num_output, g.group
        mg, kg, out = m // groups, g.col_rows // groups, g.out_count
        wide = n * out
        for gi in range(groups):
            # per image: y_i[group] (mg, out) = W[group] (mg, kg) col[group][:, image i]
            be.blas.sgemm_strided_batched(
                "N", "N", out, mg, kg, 1.0,
                col.ptr + 4 * gi * kg * wide, wide, out,
                w.ptr + 4 * gi * mg * kg, kg, 0, 0.0,
                y.ptr + 4 * gi * mg * out, out, m * out, n)
        if bias is not None:
            be.add_bias(y.reshape(n, m, out), bias)
        return y

    def backward(self, x, dy, w, dx=None, dw=None, dbias=None):
        g, be = self.geom, self.backend
        n = dy.shape[0]
        m, groups = g.num_output, g.group
        mg, kg, out = m // groups, g.col_rows // groups, g.out_count
        wide = n * out
        if dbias is not None:
            be.add_bias_grad(dy.reshape(n, m, out), dbias)
        if dw is None and dx is None:
            return
        dy_t = self._buffer("_dy_t", (m, wide))
        be.launcher.run(kernels.copy.swap_outer_axes, dy_t.size, dy.ptr, n, m, out, dy_t.ptr)
        if dw is not None:
            col = self._col if self._col_of == (x.ptr, n) else self._columns(x)
            for gi in range(groups):
                # dW[group] (mg, kg) += dy_t[group] (mg, N*out) col[group]^T (N*out, kg)
                be.blas.sgemm("T", "N", kg, mg, wide, 1.0,
                              col.ptr + 4 * gi * kg * wide, wide,
                              dy_t.ptr + 4 * gi * mg * wide, wide, 1.0,
                              dw.ptr + 4 * gi * mg * kg, kg)
        if dx is not None:
            work = self._buffer("_work", (g.col_rows, wide))
            for gi in range(groups):
                # work[group] (kg, N*out) = W[group]^T (kg, mg) dy_t[group] (mg, N*out)
                be.blas.sgemm("N", "T", wide, kg, mg, 1.0,
                              dy_t.ptr + 4 * gi * mg * wide, wide,
                              w.ptr + 4 * gi * mg * kg, kg, 0.0,
                              work.ptr + 4 * gi * kg * wide, wide)
            col2im(be, work, g, dx, self._geometry, batch_layout=True)
