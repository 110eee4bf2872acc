"""The CUDA backend's convolution plan (the call contract of backend/ops.py's conv_plan).

Convolution: im2col of the whole batch into per-image columns (N, C*taps, outputs), then one
strided-batched sgemm per group for the forward (the weights' stride 0) and for the columns of
backward-data (then col2im); backward-filter adds one sgemm per image and group into dW; the
bias goes through the backend's add_bias / add_bias_grad (GEMMs against a vector of ones).
The columns of the last forward are kept for the backward that follows on the same input.
"""
import numpy as np

from . import kernels

I32 = np.int32


def _geometry_array(backend, geom):
    values = (geom.in_shape + geom.out_shape + geom.kernel + geom.pad + geom.stride +
              geom.dilation)
    return backend.to_device(np.asarray(values, np.int32), dtype=np.int32)


def im2col(backend, x, geom, col, geometry=None):
    """col (N, C*taps, *out) <- x (N, C, *in)."""
    n = x.shape[0]
    count = n * geom.channels * geom.out_count
    if not count:
        return col
    if geom.nd == 2:
        (h, w), (kh, kw), (ph, pw), (sh, sw), (dh, dw), (oh, ow) = (
            geom.in_shape, geom.kernel, geom.pad, geom.stride, geom.dilation, geom.out_shape)
        backend.launcher.run(kernels.im2col.im2col_2d, count, x.ptr, h, w, kh, kw, ph, pw, sh, sw,
                             dh, dw, oh, ow, col.ptr)
    else:
        geometry = geometry or _geometry_array(backend, geom)
        backend.launcher.run(kernels.im2col.im2col_nd, count, x.ptr, geom.nd, geometry.ptr, col.ptr)
    return col


def col2im(backend, col, geom, x, geometry=None):
    """x (N, C, *in) <- the adjoint of im2col (overlapping taps summed)."""
    n = x.shape[0]
    count = n * geom.channels * geom.in_count
    if not count:
        return x
    if geom.nd == 2:
        (h, w), (kh, kw), (ph, pw), (sh, sw), (dh, dw), (oh, ow) = (
            geom.in_shape, geom.kernel, geom.pad, geom.stride, geom.dilation, geom.out_shape)
        backend.launcher.run(kernels.im2col.col2im_2d, count, col.ptr, h, w, kh, kw, ph, pw, sh,
                             sw, dh, dw, oh, ow, x.ptr)
    else:
        geometry = geometry or _geometry_array(backend, geom)
        backend.launcher.run(kernels.im2col.col2im_nd, count, col.ptr, geom.nd, geometry.ptr, x.ptr)
    return x


class ConvPlan:
    def __init__(self, backend, geom):
        self.backend = backend
        self.geom = geom
        self._geometry = None if geom.nd == 2 else _geometry_array(backend, geom)
        self._col = None            # columns of the last forward's input
        self._col_of = None         # (pointer, batch) they were made from
        self._work = None           # columns for backward-data

    def workspace_bytes(self, batch):
        return 2 * batch * self.geom.col_rows * self.geom.out_count * 4

    def _columns(self, x, keep=True):
        n = x.shape[0]
        shape = (n, self.geom.col_rows, self.geom.out_count)
        if self._col is None or self._col.shape != shape:
            self._col = self.backend.empty(shape)
        im2col(self.backend, x, self.geom, self._col, self._geometry)
        self._col_of = (x.ptr, n)
        return self._col

    def prepare(self, x):
        self._columns(x)

    def forward(self, x, w, bias, y):
        g, be = self.geom, self.backend
        n = x.shape[0]
        col = self._columns(x)
        m, groups = g.num_output, g.group
        mg, kg, out = m // groups, g.col_rows // groups, g.out_count
        for gi in range(groups):
            # per image: y_i[group] (mg, out) = W[group] (mg, kg) col_i[group] (kg, out)
            be.blas.sgemm_strided_batched(
                "N", "N", out, mg, kg, 1.0,
                col.ptr + 4 * gi * kg * out, out, g.col_rows * out,
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
        if dbias is not None:
            be.add_bias_grad(dy.reshape(n, m, out), dbias)
        if dw is not None:
            if self._col_of != (x.ptr, n):
                self._columns(x)
            col = self._col
            for i in range(n):
                for gi in range(groups):
                    # dW[group] (mg, kg) += dy_i[group] (mg, out) col_i[group]^T (out, kg)
                    be.blas.sgemm("T", "N", kg, mg, out, 1.0,
                                  col.ptr + 4 * (i * g.col_rows + gi * kg) * out, out,
                                  dy.ptr + 4 * (i * m + gi * mg) * out, out, 1.0,
                                  dw.ptr + 4 * gi * mg * kg, kg)
        if dx is not None:
            shape = (n, g.col_rows, out)
            if self._work is None or self._work.shape != shape:
                self._work = be.empty(shape)
            work = self._work
            for gi in range(groups):
                # per image: col_i[group] (kg, out) = W[group]^T (kg, mg) dy_i[group] (mg, out)
                be.blas.sgemm_strided_batched(
                    "N", "T", out, kg, mg, 1.0,
                    dy.ptr + 4 * gi * mg * out, out, m * out,
                    w.ptr + 4 * gi * mg * kg, kg, 0, 0.0,
                    work.ptr + 4 * gi * kg * out, out, g.col_rows * out, n)
            col2im(be, work, g, dx, self._geometry)

