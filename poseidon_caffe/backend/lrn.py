"""Local response normalisation on the CPU, Caffe's two regions, as shifted whole-tensor sums.

ACROSS_CHANNELS: scale = k + alpha/n * sum of x^2 over the n channels centred on c.
WITHIN_CHANNEL:  scale = 1 + alpha/n^2 * sum of x^2 over the n x n spatial window centred on
                 the pixel, zero padded ((n-1)/2 each side, so the divisor is always n^2).
top = x * scale^-beta. Both windows are symmetric (n is odd), so the backward's sum over the
windows that contain an element is the same window sum.

Both directions run over cache-sized slices of the batch (threads.over_batch): the ten-odd
passes of one slice stay in cache, so memory is read and written about once per array, and
slices run side by side when two threads are configured. Only ``scale`` is kept for the
backward; scale^-beta is recomputed there from it, in cache, rather than stored and re-read.
"""
import numpy as np

from .threads import over_batch


def window_sum(a, size, axes, out=None):
    """Sum of ``a`` over a centred window of odd ``size`` along each of ``axes`` (zero padded).

    Each shift adds one slice of ``a`` into an overlapping slice of the result, so no padded
    copy is made: size-1 whole-tensor adds per axis.
    """
    half = (size - 1) // 2
    for i, axis in enumerate(axes):
        result = out if (out is not None and i == len(axes) - 1) else np.empty_like(a)
        np.copyto(result, a)
        length = a.shape[axis]
        for shift in range(1, min(half, length - 1) + 1):
            lo = [slice(None)] * a.ndim
            hi = [slice(None)] * a.ndim
            lo[axis] = slice(0, length - shift)
            hi[axis] = slice(shift, length)
            lo, hi = tuple(lo), tuple(hi)
            result[hi] += a[lo]        # the element `shift` before
            result[lo] += a[hi]        # the element `shift` after
        a = result
    return a


def _negative_power(scale, beta):
    """scale ** -beta, with the square-root forms for Caffe's usual betas."""
    if beta == 0.75:
        root = np.sqrt(scale)
        root *= np.sqrt(root)
        return np.reciprocal(root, out=root)
    if beta == 0.5:
        root = np.sqrt(scale)
        return np.reciprocal(root, out=root)
    return np.power(scale, np.float32(-beta))


def _region(size, across_channels):
    """(axes of the window, the divisor of alpha)."""
    return ((1,), size) if across_channels else ((2, 3), size * size)


def _bytes_per_image(x):
    return int(np.prod(x.shape[1:])) * x.itemsize * 6


def lrn_forward(x, size, alpha, beta, k, across_channels, out=None, state=None):
    """Returns (top, state) for ``x`` (N, C, H, W); ``state`` is what lrn_backward needs.

    ``out`` receives top; a ``state`` from an earlier call of the same shape is reused."""
    axes, norm = _region(size, across_channels)
    if not across_channels:
        k = 1.0
    top = np.empty_like(x) if out is None else out
    scale = state[0] if state is not None and state[0].shape == x.shape else np.empty_like(x)
    coef, offset = np.float32(alpha / norm), np.float32(k)

    def run(lo, hi):
        xs, sc = x[lo:hi], scale[lo:hi]
        window_sum(xs * xs, size, axes, out=sc)
        sc *= coef
        sc += offset
        np.multiply(_negative_power(sc, beta), xs, out=top[lo:hi])
    over_batch(run, x.shape[0], _bytes_per_image(x))
    return top, (scale,)


def lrn_backward(x, top, state, dy, size, alpha, beta, across_channels, out=None):
    """d bottom = dy * scale^-beta - 2 alpha beta / norm * x * windowsum(dy * top / scale),
    written into ``out`` when given."""
    (scale,) = state
    axes, norm = _region(size, across_channels)
    dx = np.empty_like(x) if out is None else out
    coef = np.float32(2.0 * alpha * beta / norm)

    def run(lo, hi):
        sc = scale[lo:hi]
        ratio = dy[lo:hi] * top[lo:hi]
        ratio /= sc
        accum = window_sum(ratio, size, axes)
        accum *= x[lo:hi]
        accum *= coef
        part = dx[lo:hi]
        np.multiply(_negative_power(sc, beta), dy[lo:hi], out=part)
        part -= accum
    over_batch(run, x.shape[0], _bytes_per_image(x))
    return dx
