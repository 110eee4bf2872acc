"""Convolution on the CPU: N-d im2col/col2im and grouped GEMMs, vectorised over the whole batch.

Columns are laid out channel-major over the whole batch: rows (channel, kernel tap...) and
columns (image, output position...), i.e. shape (C*taps, N*outputs). One GEMM per group then
covers every image at once, which is where OpenBLAS is fastest, and a group's rows are a
contiguous block. The copies are the cost that matters on a CPU; the copy into the columns is
one strided numpy copy, the scatter back (col2im) one strided add per kernel tap.

A layer with many output positions per image and one group (a net's first layers) lays its
columns out image by image instead, (N, C*taps + 1, outputs), with a row of ones at the end:
the GEMM per image then writes the output in the blob's own (N, M, outputs) order with the
bias folded in (weights [W | b]), and the weight-gradient GEMM against the same columns gives
the bias gradient as its last column. No transpose of the output or of its gradient, no
separate bias pass. Wide per-image products keep the GEMMs efficient.
"""
import itertools

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..geometry import ConvGeometry
from . import native, threads


def _tap_slices(geom, tap):
    """Slices of the padded input that kernel tap ``tap`` reads for every output position."""
    return tuple(slice(t * d, t * d + s * (o - 1) + 1, s)
                 for t, d, s, o in zip(tap, geom.dilation, geom.stride, geom.out_shape))


def _interior(geom):
    return (slice(None), slice(None)) + tuple(slice(p, p + i) for p, i in
                                              zip(geom.pad, geom.in_shape))


def channel_major_padded(x, geom, buf=None):
    """x (N, C, *in) as (C, N, *padded): channel-major with zero borders.

    Channel-major makes every later copy stream in the columns' own order; ``buf`` (borders
    already zero) is reused across calls.
    """
    n = x.shape[0]
    if buf is None:
        buf = np.zeros((geom.channels, n) + geom.padded_shape, dtype=x.dtype)
    buf[_interior(geom)] = x.swapaxes(0, 1)
    return buf


def zero_borders(buf, geom, spatial_from=2):
    """Zeroes the padding around the interior of ``buf`` (spatial axes from ``spatial_from``
    on): a padded input in shared scratch, whose borders another layer may have written."""
    for axis, (p, size) in enumerate(zip(geom.pad, geom.in_shape)):
        if p:
            index = [slice(None)] * buf.ndim
            index[spatial_from + axis] = slice(0, p)
            buf[tuple(index)] = 0
            index[spatial_from + axis] = slice(p + size, None)
            buf[tuple(index)] = 0


def _window_view(xp, geom):
    """A copy-free (C, *kernel, N, *out) view of the channel-major padded input."""
    c, n = xp.shape[:2]
    sp = xp.strides[2:]
    shape = (c,) + geom.kernel + (n,) + geom.out_shape
    strides = (xp.strides[0],) + tuple(d * st for d, st in zip(geom.dilation, sp)) + \
        (xp.strides[1],) + tuple(s * st for s, st in zip(geom.stride, sp))
    return as_strided(xp, shape=shape, strides=strides, writeable=False)


def im2col(x, geom, out=None, pad_buffer=None):
    """(N, C, *in) -> columns (C*taps, N*outputs), rows ordered (c, k0, k1, ...)."""
    n = x.shape[0]
    if out is None:
        out = np.empty((geom.col_rows, n * geom.out_count), dtype=x.dtype)
    if native.makes_columns(geom, x, out):
        return native.im2col_2d(x, out, geom)
    xp = channel_major_padded(x, geom, pad_buffer)
    target = out.reshape((geom.channels,) + geom.kernel + (n,) + geom.out_shape)
    np.copyto(target, _window_view(xp, geom))
    return out


# column rows (C*taps) from which an image-by-image plan's products go by the GEMMs across
# images (kernels/image_gemm.c): ahead on GoogLeNet's and AlexNet's first layers (147 and 363
# rows), behind OpenBLAS on LeNet's (25 rows: 1.9 against 1.5 ms forward)
KERNELS_MIN_ROWS = 128
# outputs per image from which the image-by-image layout is used (its per-image GEMMs are
# then wide enough; below it, the one wide GEMM of the channel-major layout is faster)
BY_IMAGE_MIN_OUTPUTS = 256


def lays_out_by_image(geom):
    """Whether an im2col plan lays this geometry's columns out image by image (one group,
    maps of BY_IMAGE_MIN_OUTPUTS outputs and more) rather than channel-major."""
    return (geom.group == 1 and not geom.is_pointwise and
            geom.out_count >= BY_IMAGE_MIN_OUTPUTS)


def _by_image_window_view(x, geom, pad_buffer):
    """A copy-free (N, C, *kernel, *out) view of x, zero-padded in ``pad_buffer`` (N, C,
    *padded; borders already zero) when the geometry pads."""
    if any(geom.pad):
        pad_buffer[_interior(geom)] = x
        x = pad_buffer
    n, c = x.shape[:2]
    sp = x.strides[2:]
    shape = (n, c) + geom.kernel + geom.out_shape
    strides = x.strides[:2] + tuple(d * st for d, st in zip(geom.dilation, sp)) + \
        tuple(s * st for s, st in zip(geom.stride, sp))
    return as_strided(x, shape=shape, strides=strides, writeable=False)


def im2col_by_image(x, geom, out, pad_buffer=None):
    """(N, C, *in) -> out[:, :C*taps] of out (N, >= C*taps, outputs), rows (c, k0, k1, ...)."""
    n = x.shape[0]
    if native.makes_columns(geom, x, out):
        return native.im2col_2d(x, out, geom, by_image_rows=out.shape[1])
    target = out[:, :geom.col_rows].reshape((n, geom.channels) + geom.kernel + geom.out_shape)
    np.copyto(target, _by_image_window_view(x, geom, pad_buffer))
    return out


def col2im_by_image(col, geom, out, pad_buffer):
    """Columns (N, C*taps, outputs) -> out (N, C, *in), summing every tap's contribution;
    ``pad_buffer`` is (N, C, *padded)."""
    n = col.shape[0]
    if native.makes_columns(geom, col, out):
        return native.col2im_2d(col, out, geom, by_image_rows=col.shape[1])
    pad_buffer[...] = 0
    cols = col.reshape((n, geom.channels) + geom.kernel + geom.out_shape)
    for tap in itertools.product(*(range(k) for k in geom.kernel)):
        region = pad_buffer[(slice(None), slice(None)) + _tap_slices(geom, tap)]
        region += cols[(slice(None), slice(None)) + tap]
    out[...] = pad_buffer[_interior(geom)]
    return out


def col2im(col, geom, n, out=None, pad_buffer=None):
    """Columns (C*taps, N*outputs) -> (N, C, *in), summing every tap's contribution."""
    if native.makes_columns(geom, col, *(() if out is None else (out,))):
        if out is None:
            out = np.empty((n, geom.channels) + geom.in_shape, col.dtype)
        return native.col2im_2d(col, out, geom)
    if pad_buffer is None:
        pad_buffer = np.empty((geom.channels, n) + geom.padded_shape, dtype=col.dtype)
    pad_buffer[...] = 0
    cols = col.reshape((geom.channels,) + geom.kernel + (n,) + geom.out_shape)
    for tap in itertools.product(*(range(k) for k in geom.kernel)):
        region = pad_buffer[(slice(None), slice(None)) + _tap_slices(geom, tap)]
        region += cols[(slice(None),) + tap]
    inner = pad_buffer[_interior(geom)].swapaxes(0, 1)
    if out is None:
        return inner.copy()
    out[...] = inner
    return out


class ConvPlan:
    """Forward, backward-data and backward-filter of one convolution geometry.

    The plan owns its work buffers (padded input, columns, col2im accumulator) and reuses them
    across calls; it keeps the columns of its last forward so that backward-filter needs no
    second im2col (Caffe's backward reads the same bottom data the forward did). ``by_image``
    picks the image-by-image column layout (see the module's notes). ``columns(shape, dtype)``,
    when given, supplies the columns' storage: plans run one after another may share it.

    ``shared`` plans keep nothing: their columns and padded input are the calling thread's
    scratch (threads.scratch, under the names Winograd's tiles and padded input use), which
    every layer shares, and backward-filter makes the columns again (one copy, against the
    three GEMMs), and backward-data scatters its columns back (col2im). Layers of small maps
    and many channels, whose columns per layer would otherwise be held for the life of the
    net, run this way.
    """

    def __init__(self, geom, dtype=np.float32, columns=None, shared=False):
        self.geom = geom
        self.dtype = dtype
        self._columns = columns
        self.shared = shared and not geom.is_pointwise
        self.by_image = not self.shared and lays_out_by_image(geom)
        self._key = None           # (batch, layout) the buffers were made for
        self._col = None
        self._col_source = None
        self._pad = None
        self._dpad = None
        self._with_bias = None     # [W | b], the by-image forward's weights
        self._flipped = False      # not decided yet; None when backward-data uses col2im

    def workspace_bytes(self, n):
        """Bytes of the work buffers a batch of n needs (columns and padded input), which
        the plan allocates at its first forward."""
        if self.shared:
            return 0
        return self._work_bytes(n)

    def shared_workspace_bytes(self, n):
        """A shared plan's work arrays, in the thread's scratch that every layer shares."""
        return self._work_bytes(n) if self.shared else 0

    def _work_bytes(self, n):
        g = self.geom
        if g.is_pointwise:
            return 0
        itemsize = np.dtype(self.dtype).itemsize
        pad = g.channels * n * int(np.prod(g.padded_shape, dtype=np.int64))
        if self.by_image and not any(g.pad):
            pad = 0
        rows = g.col_rows + 1 if self.by_image else g.col_rows
        return (rows * n * g.out_count + pad) * itemsize

    def column_bytes(self, n):
        """Bytes of the columns of a batch of n (part of ``workspace_bytes``)."""
        g = self.geom
        if g.is_pointwise or self.shared:
            return 0
        rows = g.col_rows + 1 if self.by_image else g.col_rows
        return rows * n * g.out_count * np.dtype(self.dtype).itemsize

    def _column_array(self, shape):
        if self._columns is None:
            return np.empty(shape, self.dtype)
        return self._columns(shape, self.dtype)

    def _buffers(self, n):
        if self._key != (n, self.by_image):
            g = self.geom
            self._key = (n, self.by_image)
            self._dpad = None
            self._col_source = None
            self._col = self._pad = None
            if g.is_pointwise or self.shared:
                return
            if self.by_image:
                self._col = self._column_array((n, g.col_rows + 1, g.out_count))
                self._col[:, g.col_rows] = 1          # the bias row
                if any(g.pad):
                    self._pad = np.zeros((n, g.channels) + g.padded_shape, self.dtype)
            else:
                self._col = self._column_array((g.col_rows, n * g.out_count))
                self._pad = np.zeros((g.channels, n) + g.padded_shape, self.dtype)

    def prepare(self, x, reuse=False):
        """The columns of x: (C*taps, N*outputs), or (N, C*taps + 1, outputs) by image;
        ``reuse`` takes those the last forward made from this same array (a backward right
        after its forward)."""
        g = self.geom
        n = x.shape[0]
        self._buffers(n)
        if reuse and self._col_source is x:
            return self._col
        if self.shared:
            col = threads.scratch("gathered_input", (g.col_rows, n * g.out_count), self.dtype)
            pad = threads.scratch("padded_input", (g.channels, n) + g.padded_shape, self.dtype)
            zero_borders(pad, g)
            return im2col(x, g, out=col, pad_buffer=pad)
        if g.is_pointwise:
            col = np.ascontiguousarray(
                x.reshape(n, g.channels, g.out_count).transpose(1, 0, 2)).reshape(
                    g.channels, n * g.out_count)
        elif self.by_image:
            col = im2col_by_image(x, g, self._col, pad_buffer=self._pad)
        else:
            col = im2col(x, g, out=self._col, pad_buffer=self._pad)
        self._col = col
        self._col_source = x
        return col

    def _grouped(self, w):
        g = self.geom
        return w.reshape(g.group, g.num_output // g.group, g.col_rows // g.group)

    def forward(self, x, w, bias, y):
        """y (N, M, *out) = conv(x (N, C, *in), w) + bias."""
        g = self.geom
        n = x.shape[0]
        col = self.prepare(x)
        yv = y.reshape(n, g.num_output, g.out_count)
        if self.by_image:
            if bias is None:
                weights = w.reshape(g.num_output, g.col_rows)
            else:
                if self._with_bias is None:
                    self._with_bias = np.empty((g.num_output, g.col_rows + 1), self.dtype)
                self._with_bias[:, :g.col_rows] = w.reshape(g.num_output, g.col_rows)
                self._with_bias[:, g.col_rows] = bias
                weights = self._with_bias
            if self._by_kernels(weights, col, yv):
                # one product over every image's columns (kernels/image_gemm.c; without the
                # bias, the columns' first rows): OpenBLAS's per-image products of a first
                # layer's few dozen output channels run slower
                native.gemm_images(weights, col, 0, yv, 0, None, g.out_count)
            else:
                np.matmul(weights, col[:, :weights.shape[1]], out=yv)
            return y
        cols = col.reshape(g.group, g.col_rows // g.group, n * g.out_count)
        wg = self._grouped(w)
        yt = np.matmul(wg, cols)                  # (G, M/G, N*out)
        by_image = yt.reshape(g.num_output, n, g.out_count).transpose(1, 0, 2)
        if bias is None:
            np.copyto(yv, by_image)
        else:
            np.add(by_image, bias.reshape(1, -1, 1), out=yv)   # transpose and bias, one pass
        return y

    def backward(self, x, dy, w, dx=None, dw=None, dbias=None):
        """Gradients of a forward: writes dx, adds into dw and dbias (each when given)."""
        g = self.geom
        n = dy.shape[0]
        self._buffers(n)
        dyv = dy.reshape(n, g.num_output, g.out_count)
        if dw is None and dx is None:
            if dbias is not None:
                dbias += dyv.sum(axis=(0, 2))
            return
        if self.by_image:
            return self._backward_by_image(x, dyv, w, dx, dw, dbias)
        # top diff as (G, M/G, N*out): the GEMM operand of both gradients
        dyt = np.ascontiguousarray(dyv.transpose(1, 0, 2)).reshape(
            g.group, g.num_output // g.group, n * g.out_count)
        if dbias is not None:
            dbias += dyt.reshape(g.num_output, -1).sum(axis=1)
        if dw is not None:
            col = self.prepare(x, reuse=True)
            cols = col.reshape(g.group, g.col_rows // g.group, n * g.out_count)
            dwg = dw.reshape(g.group, g.num_output // g.group, g.col_rows // g.group)
            dwg += np.matmul(dyt, cols.transpose(0, 2, 1))
        if dx is None:
            return
        if g.is_pointwise:
            dcol = np.matmul(self._grouped(w).transpose(0, 2, 1), dyt)
            np.copyto(dx.reshape(n, g.channels, g.out_count),
                      dcol.reshape(g.channels, n, g.out_count).transpose(1, 0, 2))
        elif self._flipped_geometry() is not None:
            self._backward_data_as_convolution(dy, w, dx)
        else:
            wt = self._grouped(w).transpose(0, 2, 1)
            if self.shared:
                # the columns' scratch: backward-filter is done with them
                dcol = threads.scratch("gathered_input", (g.col_rows, n * g.out_count),
                                       self.dtype)
                np.matmul(wt, dyt, out=dcol.reshape(g.group, -1, n * g.out_count))
            else:
                dcol = np.matmul(wt, dyt)                       # (G, K/G, N*out)
            if native.makes_columns(g, dcol, dx):
                dpad = None                     # the compiled col2im needs no padded copy
            elif self.shared:
                dpad = threads.scratch("padded_input", (g.channels, n) + g.padded_shape,
                                       self.dtype)
            else:
                if self._dpad is None:
                    self._dpad = np.empty((g.channels, n) + g.padded_shape, self.dtype)
                dpad = self._dpad
            col2im(dcol.reshape(g.col_rows, n * g.out_count), g, n, out=dx, pad_buffer=dpad)

    def _backward_by_image(self, x, dyv, w, dx, dw, dbias):
        g = self.geom
        n, k = dyv.shape[0], g.col_rows
        if dw is not None:
            col = self.prepare(x, reuse=True)
            # per image dy (M, out) against its columns; the ones row gives the bias gradient
            rows = k + 1 if dbias is not None else k
            if self._by_kernels(dyv, col):
                # one product whose depth is every image's positions (kernels/image_gemm.c)
                total = np.zeros((g.num_output, rows), self.dtype)
                native.gemm_images_filter(dyv, 0, col, 0, total, g.out_count)
            else:
                total = np.matmul(dyv, col[:, :rows].transpose(0, 2, 1)).sum(axis=0)
            dw.reshape(g.num_output, k)[...] += total[:, :k]
            if dbias is not None:
                dbias += total[:, k]
        elif dbias is not None:
            dbias += dyv.sum(axis=(0, 2))
        if dx is None:
            return
        if self._flipped_geometry() is not None:
            self._backward_data_as_convolution(dyv.reshape((n, g.num_output) + g.out_shape),
                                               w, dx)
            return
        dcol = np.matmul(w.reshape(g.num_output, k).T, dyv)            # (N, K, out)
        if self._dpad is None and not native.makes_columns(g, dcol, dx):
            self._dpad = np.empty((n, g.channels) + g.padded_shape, self.dtype)
        col2im_by_image(dcol, g, dx, self._dpad)

    def _by_kernels(self, *arrays):
        """Whether a by-image product goes by kernels/image_gemm.c: built, AVX-512, columns
        of KERNELS_MIN_ROWS rows or more, the arrays C-contiguous float32."""
        return native.image_gemm and native.lib is not None and \
            self.geom.col_rows >= KERNELS_MIN_ROWS and native.takes(*arrays)

    # -- backward-data as a forward convolution ---------------------------------------------
    def _flipped_geometry(self):
        """With stride 1, the input gradient is a convolution of the top gradient with the
        spatially flipped, in/out-swapped weights, padded by dilation*(kernel-1) - pad. That
        is one im2col of dy and a wide GEMM instead of a skinny GEMM and col2im's scatter."""
        if self._flipped is False:
            g = self.geom
            # it pays when dy has no more channels than x (its columns are no wider), and
            # where the columns are kept: a shared plan's (small maps) scatter back faster than
            # the flipped weights are copied
            usable = not self.shared and all(s == 1 for s in g.stride) and \
                g.num_output <= g.channels and all(
                p <= d * (k - 1) for p, d, k in zip(g.pad, g.dilation, g.kernel))
            self._flipped = None
            if usable:
                pad = tuple(d * (k - 1) - p for p, d, k in zip(g.pad, g.dilation, g.kernel))
                fg = ConvGeometry(g.num_output, g.channels, g.out_shape, g.kernel, g.stride,
                                  pad, g.dilation, g.group)
                self._flipped = ConvPlan(fg, self.dtype)
        return self._flipped

    def _backward_data_as_convolution(self, dy, w, dx):
        g = self.geom
        plan = self._flipped_geometry()
        gr = g.group
        nd = g.nd
        # w (M, C/G, *k) -> (C, M/G, *k) per group, flipped on every spatial axis
        wf = w.reshape((gr, g.num_output // gr, g.channels // gr) + g.kernel).swapaxes(1, 2)
        wf = wf[(Ellipsis,) + (slice(None, None, -1),) * nd]
        wf = np.ascontiguousarray(wf).reshape(plan.geom.weight_shape)
        plan.forward(dy, wf, None, dx)
