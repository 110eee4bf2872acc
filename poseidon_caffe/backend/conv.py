"""Convolution on the CPU: N-d im2col/col2im and grouped GEMMs, vectorised over the whole batch.

Columns are laid out channel-major over the whole batch: rows (channel, kernel tap...) and
columns (image, output position...), i.e. shape (C*taps, N*outputs). One GEMM per group then
covers every image at once, which is where OpenBLAS is fastest, and a group's rows are a
contiguous block. The copies are the cost that matters on a CPU; the copy into the columns is
one strided numpy copy, the scatter back (col2im) one strided add per kernel tap.
"""
import itertools

import numpy as np
from numpy.lib.stride_tricks import as_strided


class ConvGeometry:
    """Shapes of one convolution: input (N, C, *in_shape) * weights (M, C/group, *kernel).

    ``out_shape`` follows Caffe: (in + 2*pad - (dilation*(kernel-1)+1)) // stride + 1.
    """

    def __init__(self, channels, num_output, in_shape, kernel, stride, pad, dilation, group=1):
        nd = len(in_shape)
        for name, v in (("kernel", kernel), ("stride", stride), ("pad", pad),
                        ("dilation", dilation)):
            if len(v) != nd:
                raise ValueError("convolution %s %s does not match %d spatial axes"
                                 % (name, tuple(v), nd))
        self.channels = int(channels)
        self.num_output = int(num_output)
        self.in_shape = tuple(int(v) for v in in_shape)
        self.kernel = tuple(int(v) for v in kernel)
        self.stride = tuple(int(v) for v in stride)
        self.pad = tuple(int(v) for v in pad)
        self.dilation = tuple(int(v) for v in dilation)
        self.group = int(group)
        if self.channels % self.group or self.num_output % self.group:
            raise ValueError("channels %d and num_output %d must both be multiples of group %d"
                             % (self.channels, self.num_output, self.group))
        self.out_shape = tuple(
            (i + 2 * p - (d * (k - 1) + 1)) // s + 1
            for i, k, s, p, d in zip(self.in_shape, self.kernel, self.stride, self.pad,
                                     self.dilation))
        self.padded_shape = tuple(i + 2 * p for i, p in zip(self.in_shape, self.pad))
        self.taps = int(np.prod(self.kernel))
        self.col_rows = self.channels * self.taps            # K of the forward GEMM
        self.out_count = int(np.prod(self.out_shape))
        self.in_count = int(np.prod(self.in_shape))
        self.weight_shape = (self.num_output, self.channels // self.group) + self.kernel
        self.is_pointwise = (all(k == 1 for k in self.kernel) and all(s == 1 for s in self.stride)
                             and all(p == 0 for p in self.pad))

    @property
    def nd(self):
        return len(self.in_shape)

    def key(self):
        return (self.channels, self.num_output, self.in_shape, self.kernel, self.stride,
                self.pad, self.dilation, self.group)

    def __repr__(self):
        return ("ConvGeometry(C=%d, M=%d, in=%s, k=%s, s=%s, p=%s, d=%s, g=%d -> out=%s)"
                % (self.channels, self.num_output, self.in_shape, self.kernel, self.stride,
                   self.pad, self.dilation, self.group, self.out_shape))


def _tap_slices(geom, tap):
    """Slices of the padded input that kernel tap ``tap`` reads for every output position."""
    return tuple(slice(t * d, t * d + s * (o - 1) + 1, s)
                 for t, d, s, o in zip(tap, geom.dilation, geom.stride, geom.out_shape))


def _padded(x, geom, buf):
    """x with zero padding on every spatial axis (x itself when there is no padding)."""
    if not any(geom.pad):
        return x
    inner = (slice(None), slice(None)) + tuple(slice(p, p + i) for p, i in
                                               zip(geom.pad, geom.in_shape))
    buf[inner] = x
    return buf


def _window_view(xp, geom):
    """A copy-free (N, C, *kernel, *out) view of the padded input."""
    n, c = xp.shape[:2]
    sp = xp.strides[2:]
    shape = (n, c) + geom.kernel + geom.out_shape
    strides = xp.strides[:2] + tuple(d * st for d, st in zip(geom.dilation, sp)) + \
        tuple(s * st for s, st in zip(geom.stride, sp))
    return as_strided(xp, shape=shape, strides=strides, writeable=False)


def im2col(x, geom, out=None, pad_buffer=None):
    """(N, C, *in) -> columns (C*taps, N*outputs), rows ordered (c, k0, k1, ...)."""
    n = x.shape[0]
    nd = geom.nd
    if out is None:
        out = np.empty((geom.col_rows, n * geom.out_count), dtype=x.dtype)
    if pad_buffer is None and any(geom.pad):
        pad_buffer = np.zeros((n, geom.channels) + geom.padded_shape, dtype=x.dtype)
    xp = _padded(x, geom, pad_buffer)
    view = _window_view(xp, geom)
    # (N, C, k..., o...) -> (C, k..., N, o...)
    order = (1,) + tuple(range(2, 2 + nd)) + (0,) + tuple(range(2 + nd, 2 + 2 * nd))
    target = out.reshape((geom.channels,) + geom.kernel + (n,) + geom.out_shape)
    np.copyto(target, view.transpose(order))
    return out


def col2im(col, geom, n, out=None, pad_buffer=None):
    """Columns (C*taps, N*outputs) -> (N, C, *in), summing every tap's contribution."""
    nd = geom.nd
    if pad_buffer is None:
        pad_buffer = np.empty((n, geom.channels) + geom.padded_shape, dtype=col.dtype)
    pad_buffer[...] = 0
    # (C, k..., N, o...) -> per tap (C, N, o...) -> (N, C, o...)
    cols = col.reshape((geom.channels,) + geom.kernel + (n,) + geom.out_shape)
    swap = (1, 0) + tuple(range(2, 2 + nd))
    for tap in itertools.product(*(range(k) for k in geom.kernel)):
        region = pad_buffer[(slice(None), slice(None)) + _tap_slices(geom, tap)]
        region += cols[(slice(None),) + tap].transpose(swap)
    inner = (slice(None), slice(None)) + tuple(slice(p, p + i) for p, i in
                                               zip(geom.pad, geom.in_shape))
    if out is None:
        return pad_buffer[inner].copy()
    out[...] = pad_buffer[inner]
    return out


class ConvPlan:
    """Forward, backward-data and backward-filter of one convolution geometry.

    The plan owns its work buffers (padded input, columns, transposed top diff) and reuses them
    across calls; it keeps the columns of its last forward so that backward-filter needs no
    second im2col (Caffe's backward reads the same bottom data the forward did).
    """

    def __init__(self, geom, dtype=np.float32):
        self.geom = geom
        self.dtype = dtype
        self._n = None
        self._col = None
        self._col_source = None
        self._pad = None
        self._dpad = None

    def _buffers(self, n):
        if self._n != n:
            g = self.geom
            self._n = n
            self._col = None if g.is_pointwise else np.empty((g.col_rows, n * g.out_count),
                                                             self.dtype)
            self._pad = (np.zeros((n, g.channels) + g.padded_shape, self.dtype)
                         if any(g.pad) else None)
            self._dpad = None
            self._col_source = None

    def columns(self, x):
        """The (C*taps, N*outputs) columns of x (computed once per forward)."""
        g = self.geom
        n = x.shape[0]
        self._buffers(n)
        if self._col_source is x:
            return self._col
        if g.is_pointwise:
            col = np.ascontiguousarray(
                x.reshape(n, g.channels, g.out_count).transpose(1, 0, 2)).reshape(
                    g.channels, n * g.out_count)
        else:
            col = im2col(x, g, out=self._col, pad_buffer=self._pad)
        self._col = col
        self._col_source = x
        return col

    def forget(self):
        self._col_source = None

    def _grouped(self, w):
        g = self.geom
        return w.reshape(g.group, g.num_output // g.group, g.col_rows // g.group)

    def forward(self, x, w, bias, y):
        """y (N, M, *out) = conv(x (N, C, *in), w) + bias."""
        g = self.geom
        n = x.shape[0]
        col = self.columns(x)
        cols = col.reshape(g.group, g.col_rows // g.group, n * g.out_count)
        wg = self._grouped(w)
        yt = np.matmul(wg, cols)                  # (G, M/G, N*out)
        yv = y.reshape(n, g.num_output, g.out_count)
        np.copyto(yv, yt.reshape(g.num_output, n, g.out_count).transpose(1, 0, 2))
        if bias is not None:
            yv += bias.reshape(1, -1, 1)
        return y

    def backward(self, x, dy, w, dx=None, dw=None, dbias=None):
        """Gradients of a forward: writes dx, adds into dw and dbias (each when given)."""
        g = self.geom
        n = dy.shape[0]
        self._buffers(n)
        dyv = dy.reshape(n, g.num_output, g.out_count)
        if dbias is not None:
            dbias += dyv.sum(axis=(0, 2), dtype=np.float64).astype(dbias.dtype)
        if dw is None and dx is None:
            return
        # top diff as (G, M/G, N*out): the GEMM operand of both gradients
        dyt = np.ascontiguousarray(dyv.transpose(1, 0, 2)).reshape(
            g.group, g.num_output // g.group, n * g.out_count)
        if dw is not None:
            col = self.columns(x)
            cols = col.reshape(g.group, g.col_rows // g.group, n * g.out_count)
            dwg = dw.reshape(g.group, g.num_output // g.group, g.col_rows // g.group)
            dwg += np.matmul(dyt, cols.transpose(0, 2, 1))
        if dx is not None:
            dcol = np.matmul(self._grouped(w).transpose(0, 2, 1), dyt)   # (G, K/G, N*out)
            dcol = dcol.reshape(g.col_rows, n * g.out_count)
            if g.is_pointwise:
                np.copyto(dx.reshape(n, g.channels, g.out_count),
                          dcol.reshape(g.channels, n, g.out_count).transpose(1, 0, 2))
            else:
                if self._dpad is None:
                    self._dpad = np.empty((n, g.channels) + g.padded_shape, self.dtype)
                col2im(dcol, g, n, out=dx, pad_buffer=self._dpad)

