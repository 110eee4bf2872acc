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
import numpy as np
import scipy.fft as sfft

from .threads import thread_count

WORKERS = thread_count()        # as many FFT threads as the BLAS has


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


class FFTConvPlan:
    """A ConvPlan with the same calls (forward / backward / prepare), computed by FFT."""

    def __init__(self, geom, dtype=np.float32):
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
        self._weights = None           # conj spectrum (F, G, C/G, M/G) of the forward's weights
        self._weights_source = None
        self._weights_buffer = None
        self._buffers = {}
        self._dft = self._dft_matrices()
        self.workers = WORKERS         # FFT threads; one when the batch is split over threads

    def workspace_bytes(self, n):
        """Bytes of the kept spectra (input and output, complex64) and of the zero-padded
        real buffer a batch of n needs."""
        g = self.geom
        spectra = self.freqs * n * (g.channels + g.num_output) * 8
        real = int(np.prod(self.shape, dtype=np.int64)) * n * max(g.channels, g.num_output)
        return spectra + real * np.dtype(self.dtype).itemsize

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

    def _conj_weight_spectrum(self, w):
        """(F, G, C/G, M/G) complex conjugate of the (dilated, zero-padded) weights' spectrum,
        made by conjugate DFT matrices (the forward needs conj(W), so no conjugating copy)."""
        g = self.geom
        gr, mg, cg = g.group, g.num_output // g.group, g.channels // g.group
        nd = self.nd
        # (M, C/G, *k) -> (*k, G, C/G, M/G)
        order = tuple(range(3, 3 + nd)) + (0, 2, 1)
        arr = np.ascontiguousarray(w.reshape((gr, mg, cg) + g.kernel).transpose(order))
        shape = (self.freqs, gr, cg, mg)
        if self._weights_buffer is None or self._weights_buffer.shape != shape:
            self._weights_buffer = np.empty(shape, dtype=np.complex64)
        for axis in reversed(range(nd)):
            # the last product lands in a kept buffer: a fresh one each call would page-fault
            arr = _along(self._dft[0][axis], arr, axis,
                         out=self._weights_buffer if axis == 0 else None)
        return self._weights_buffer

    def _filter_gradient(self, spec):
        """(F, G, M/G, C/G) spectrum -> (M, C/G, *k) real weight gradient at the kernel taps."""
        g = self.geom
        gr, mg, cg = g.group, g.num_output // g.group, g.channels // g.group
        nd = self.nd
        arr = spec.reshape(self.freq_shape + (gr, mg, cg))
        for axis in range(nd):
            arr = _along(self._dft[1][axis], arr, axis)
        # (*k, G, M/G, C/G) -> (G, M/G, C/G, *k)
        order = (nd, nd + 1, nd + 2) + tuple(range(nd))
        return arr.real.transpose(order).reshape(g.weight_shape)

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
        wc = self._conj_weight_spectrum(w)
        self._weights, self._weights_source = wc, w     # the backward right after reuses it
        ys = np.matmul(xs, wc)                                  # (F, G, N, M/G)
        self._spatial(ys, g.num_output, (0,) * g.nd, g.out_shape, y)
        if bias is not None:
            y += bias.reshape((1, -1) + (1,) * g.nd)
        return y

    def backward(self, x, dy, w, dx=None, dw=None, dbias=None):
        g = self.geom
        # the forward's weight spectrum serves only the backward right after it
        cached = self._weights if self._weights_source is w else None
        self._weights = self._weights_source = None
        if dbias is not None:
            dbias += dy.sum(axis=(0,) + tuple(range(2, 2 + g.nd)))
        if dx is None and dw is None:
            return
        # conj(DY) serves both products: dW = conj(DY)^T X, and dX = conj(conj(DY) conj(W)^T)
        dyc = np.conjugate(self._spectrum_of(dy, g.num_output, "dy", (0,) * g.nd))
        if dw is not None:
            xs = self.prepare(x, reuse=True)
            # (F, G, M/G, N) @ (F, G, N, C/G)
            spec = np.matmul(dyc.transpose(0, 1, 3, 2), xs)
            dw += self._filter_gradient(spec)
        if dx is not None:
            wc = cached if cached is not None else self._conj_weight_spectrum(w)
            xs = np.matmul(dyc, wc.transpose(0, 1, 3, 2))         # (F, G, N, C/G)
            np.conjugate(xs, out=xs)
            self._spatial(xs, g.channels, g.pad, g.in_shape, dx)
