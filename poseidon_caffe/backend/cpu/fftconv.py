"""Convolution by FFT for stride-1 geometries: the channel sums become small complex GEMMs.

With stride 1, a convolution of the zero-padded input with a kernel is a circular correlation
whose valid outputs never wrap, so per frequency f (of the padded size, rounded up to a fast
FFT length):

    forward           Y[n, m] = sum_c X[n, c] * conj(W[m, c])     -> crop [0, out)
    backward-data    dX[n, c] = sum_m DY[n, m] * W[m, c]          -> crop the interior
    backward-filter  dW[m, c] = sum_n conj(DY[n, m]) * X[n, c]    -> keep the kernel taps

with DY the spectrum of dy placed at the origin. Each sum is one batched GEMM over
(frequency, group). Arrays keep their spatial (frequency) axes first, (*space, G, N, K), so the
spectra come out of the FFT already in GEMM order and no complex array is ever transposed;
only the real inputs and outputs are, once, on their way in and out. The weights have only a
few taps, so their spectrum (and dW's way back) is a product with small DFT matrices instead
of one FFT per (output, input) channel pair.
"""
import threading

import numpy as np
import scipy.fft as sfft

from .threads import thread_count

WORKERS = thread_count()        # as many FFT threads as the BLAS has
# bytes of the weight gradient's spectrum made at a time
FILTER_BLOCK_BYTES = 8 * 1024 * 1024


def fft_shape(geom):
    return tuple(sfft.next_fast_len(p, real=True) for p in geom.padded_shape)


def _along(matrix, arr, axis, out=None):
    """``matrix`` (out, in) applied to axis ``axis`` of ``arr``, as one batched GEMM."""
    lead = int(np.prod(arr.shape[:axis], dtype=np.int64))
    rest = int(np.prod(arr.shape[axis + 1:], dtype=np.int64))
    shape = arr.shape[:axis] + (matrix.shape[0],) + arr.shape[axis + 1:]
    target = None if out is None else out.reshape(lead, matrix.shape[0], rest)
    result = np.matmul(matrix, arr.reshape(lead, arr.shape[axis], rest), out=target)
    return result.reshape(shape)


class WeightSpectrum:
    """The conjugate weight spectrum of one layer, made once per forward and read by the
    backward right after it; the plans of a layer's batch parts share one (it is the same for
    every part, and as large as a part's input spectrum several times over).

    ``renew`` (before a forward) marks it out of date; the first part to ask then makes it,
    the others wait for it under the lock. ``drop`` (after a backward) keeps the next backward
    from reading it: the weights may have changed in between."""

    def __init__(self):
        self.lock = threading.Lock()
        self.buffer = None
        self.source = None          # the weights array it was made from
        self.current = False

    def renew(self):
        self.current = False

    def drop(self):
        self.current = False
        self.source = None

    def get(self, w, make):
        """The spectrum of ``w``: made by ``make(buffer)`` unless current for this same
        array."""
        with self.lock:
            if not (self.current and self.source is w):
                self.buffer = make(self.buffer)
                self.source, self.current = w, True
            return self.buffer


class FFTConvPlan:
    """A ConvPlan with the same calls (forward / backward / prepare), computed by FFT.

    ``weights`` is the WeightSpectrum of the layer when the plan is one batch part of it (its
    owner renews and drops it); without it the plan keeps one of its own."""

    def __init__(self, geom, dtype=np.float32, weights=None):
        if any(s != 1 for s in geom.stride):
            raise ValueError("FFT convolution needs stride 1, got %s" % (geom.stride,))
        self.geom = geom
        self.dtype = dtype
        self.shape = fft_shape(geom)
        self.nd = geom.nd
        self.axes = tuple(range(self.nd))
        self.freq_shape = self.shape[:-1] + (self.shape[-1] // 2 + 1,)
        self.freqs = int(np.prod(self.freq_shape))
        self._spectrum = None          # (F, G, N, C/G) spectrum of the last prepared input
        self._source = None
        # conj spectrum (F, G, C/G, M/G) of the forward's weights
        self._owns_weights = weights is None
        self.weights = WeightSpectrum() if weights is None else weights
        self._buffers = {}
        self._dft = self._dft_matrices()
        self.workers = WORKERS         # FFT threads; one when the batch is split over threads

    def workspace_bytes(self, n):
        """Bytes a batch of n keeps between calls: the input's spectrum (complex64), the
        zero-padded real buffers of input and output gradient, and the weight spectrum."""
        g = self.geom
        spectra = self.freqs * n * g.channels * 8
        real = int(np.prod(self.shape, dtype=np.int64)) * n * (g.channels + g.num_output)
        weights = self.freqs * g.channels * (g.num_output // g.group) * 8
        return spectra + weights + real * np.dtype(self.dtype).itemsize

    # -- the kernel's small DFTs -------------------------------------------------------------
    def _dft_matrices(self):
        """Per spatial axis: conjugate forward (freq, taps) and inverse (taps, freq) DFT
        matrices at the dilated tap positions; the last axis keeps half the spectrum."""
        g = self.geom
        forward, inverse = [], []
        for axis, (length, k, d) in enumerate(zip(self.shape, g.kernel, g.dilation)):
            last = axis == self.nd - 1
            freq = np.arange(length // 2 + 1 if last else length)
            taps = np.arange(k) * d
            phase = 2j * np.pi * np.outer(freq, taps) / length
            forward.append(np.exp(phase).astype(np.complex64))     # conjugate DFT
            weight = np.ones(len(freq))
            if last:
                # the half spectrum stands for its mirror image too (not DC, nor Nyquist)
                weight[1:] = 2.0
                if length % 2 == 0:
                    weight[-1] = 1.0
            inverse.append((np.exp(phase).T * weight / length).astype(np.complex64))
        return forward, inverse

    def _conj_weight_spectrum(self, w, buffer=None):
        """(F, G, C/G, M/G) complex conjugate of the (dilated, zero-padded) weights' spectrum,
        made by conjugate DFT matrices (the forward needs conj(W), so no conjugating copy),
        into ``buffer`` when it has the shape."""
        g = self.geom
        gr, mg, cg = g.group, g.num_output // g.group, g.channels // g.group
        nd = self.nd
        # (M, C/G, *k) -> (*k, G, C/G, M/G)
        order = tuple(range(3, 3 + nd)) + (0, 2, 1)
        arr = np.ascontiguousarray(w.reshape((gr, mg, cg) + g.kernel).transpose(order))
        shape = (self.freqs, gr, cg, mg)
        if buffer is None or buffer.shape != shape:
            buffer = np.empty(shape, dtype=np.complex64)
        for axis in reversed(range(nd)):
            # the last product lands in a kept buffer: a fresh one each call would page-fault
            arr = _along(self._dft[0][axis], arr, axis, out=buffer if axis == 0 else None)
        return buffer

    def _add_filter_gradient(self, dyc, xs, dw):
        """dw (M, C/G, *k) += the real weight gradient at the kernel taps of conj(DY)
        (F, G, N, M/G) and X (F, G, N, C/G), a block of output channels at a time: the
        product at every frequency is as large as the weight spectrum (54 MB a batch part for
        AlexNet's conv2), a block of it a few MB."""
        g = self.geom
        gr, mg, cg = g.group, g.num_output // g.group, g.channels // g.group
        nd = self.nd
        step = max(1, FILTER_BLOCK_BYTES // (self.freqs * gr * cg * 8))
        # (G, M/G, C/G, *k) view of dw; (*k, G, m, C/G) -> (G, m, C/G, *k)
        contiguous = dw.flags.c_contiguous
        target = dw.reshape((gr, mg, cg) + g.kernel) if contiguous else \
            np.zeros((gr, mg, cg) + g.kernel, dw.dtype)
        order = (nd, nd + 1, nd + 2) + tuple(range(nd))
        for lo in range(0, mg, step):
            hi = min(mg, lo + step)
            # (F, G, m, N) @ (F, G, N, C/G)
            spec = np.matmul(dyc[..., lo:hi].transpose(0, 1, 3, 2), xs)
            arr = spec.reshape(self.freq_shape + (gr, hi - lo, cg))
            for axis in range(nd):
                arr = _along(self._dft[1][axis], arr, axis)
            target[:, lo:hi] += arr.real.transpose(order)
        if not contiguous:
            dw += target.reshape(dw.shape)

    # -- spatial-first real buffers ----------------------------------------------------------
    def _buffer(self, name, channels, n):
        shape = self.shape + (self.geom.group, n, channels // self.geom.group)
        buf = self._buffers.get(name)
        if buf is None or buf.shape != shape:
            buf = np.zeros(shape, dtype=self.dtype)
            self._buffers[name] = buf
        return buf

    def _spatial_first(self, a, channels):
        """(N, C, *space) -> view (*space, G, N, C/G)."""
        n = a.shape[0]
        nd = self.nd
        split = a.reshape((n, self.geom.group, channels // self.geom.group) + a.shape[2:])
        return split.transpose(tuple(range(3, 3 + nd)) + (1, 0, 2))

    def _spectrum_of(self, a, channels, name, offset):
        """rfft of ``a`` (N, C, *space) placed at ``offset`` in a zero buffer: (F, G, N, C/G)."""
        n = a.shape[0]
        buf = self._buffer(name, channels, n)
        region = tuple(slice(o, o + s) for o, s in zip(offset, a.shape[2:]))
        buf[region] = self._spatial_first(a, channels)
        spec = sfft.rfftn(buf, axes=self.axes, workers=self.workers)
        return spec.reshape((self.freqs,) + spec.shape[self.nd:])

    def _spatial(self, spec, channels, offset, size, out):
        """Inverse rfft of (F, G, N, C/G); its window at ``offset`` of ``size`` goes into
        ``out`` (N, C, *size)."""
        full = sfft.irfftn(spec.reshape(self.freq_shape + spec.shape[1:]), s=self.shape,
                           axes=self.axes, workers=self.workers)
        window = full[tuple(slice(o, o + s) for o, s in zip(offset, size))]
        np.copyto(self._spatial_first(out, channels), window)

    def prepare(self, x, reuse=False):
        """The spectrum of x that backward-filter needs; ``reuse`` takes the one the last
        forward made from this same array."""
        if reuse and self._source is x:
            return self._spectrum
        self._spectrum = self._spectrum_of(x, self.geom.channels, "x", self.geom.pad)
        self._source = x
        return self._spectrum

    # -- the three products ------------------------------------------------------------------
    def forward(self, x, w, bias, y):
        g = self.geom
        xs = self.prepare(x)
        if self._owns_weights:
            self.weights.renew()
        # the backward right after reuses it
        wc = self.weights.get(w, lambda buffer: self._conj_weight_spectrum(w, buffer))
        ys = np.matmul(xs, wc)                                  # (F, G, N, M/G)
        self._spatial(ys, g.num_output, (0,) * g.nd, g.out_shape, y)
        if bias is not None:
            y += bias.reshape((1, -1) + (1,) * g.nd)
        return y

    def backward(self, x, dy, w, dx=None, dw=None, dbias=None):
        g = self.geom
        if dbias is not None:
            dbias += dy.sum(axis=(0,) + tuple(range(2, 2 + g.nd)))
        if dx is None and dw is None:
            if self._owns_weights:
                self.weights.drop()
            return
        # conj(DY) serves both products: dW = conj(DY)^T X, and dX = conj(conj(DY) conj(W)^T)
        dyc = self._spectrum_of(dy, g.num_output, "dy", (0,) * g.nd)
        np.conjugate(dyc, out=dyc)          # in place: no second spectrum of dy
        if dw is not None:
            xs = self.prepare(x, reuse=True)
            self._add_filter_gradient(dyc, xs, dw)
        if dx is not None:
            # the forward's weight spectrum serves only the backward right after it
            wc = self.weights.get(w, lambda buffer: self._conj_weight_spectrum(w, buffer))
            xs = np.matmul(dyc, wc.transpose(0, 1, 3, 2))         # (F, G, N, C/G)
            del dyc
            np.conjugate(xs, out=xs)
            self._spatial(xs, g.channels, g.pad, g.in_shape, dx)
        if self._owns_weights:
            self.weights.drop()
