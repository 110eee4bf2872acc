"""Local response normalisation on the CPU, Caffe's two regions, as shifted whole-tensor sums.

ACROSS_CHANNELS: scale = k + alpha/n * sum of x^2 over the n channels centred on c.
WITHIN_CHANNEL:  scale = 1 + alpha/n^2 * sum of x^2 over the n x n spatial window centred on
                 the pixel, zero padded ((n-1)/2 each side, so the divisor is always n^2).
top = x * scale^-beta. Both windows are symmetric (n is odd), so the backward's sum over the
windows that contain an element is the same window sum.
"""
import numpy as np


def window_sum(a, size, axes):
    """Sum of ``a`` over a centred window of odd ``size`` along each of ``axes`` (zero padded).

    Each shift adds one slice of ``a`` into an overlapping slice of the result, so no padded
    copy is made: size-1 whole-tensor adds per axis.
    """
    half = (size - 1) // 2
    for axis in axes:
        out = a.copy()
        length = a.shape[axis]
        for shift in range(1, min(half, length - 1) + 1):
            lo = [slice(None)] * a.ndim
            hi = [slice(None)] * a.ndim
            lo[axis] = slice(0, length - shift)
            hi[axis] = slice(shift, length)
            lo, hi = tuple(lo), tuple(hi)
            out[hi] += a[lo]        # the element `shift` before
            out[lo] += a[hi]        # the element `shift` after
        a = out
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


def lrn_forward(x, size, alpha, beta, k, across_channels):
    """Returns (top, state) for ``x`` (N, C, H, W); ``state`` is what lrn_backward needs."""
    if across_channels:
        scale = window_sum(x * x, size, (1,))
        scale *= np.float32(alpha / size)
        scale += np.float32(k)
    else:
        scale = window_sum(x * x, size, (2, 3))
        scale *= np.float32(alpha / (size * size))
        scale += np.float32(1.0)
    factor = _negative_power(scale, beta)
    top = factor * x
    return top, (scale, factor)


def lrn_backward(x, top, state, dy, size, alpha, beta, across_channels):
    """d bottom = dy * scale^-beta - 2 alpha beta / norm * x * windowsum(dy * top / scale)."""
    scale, factor = state
    norm = size if across_channels else size * size
    axes = (1,) if across_channels else (2, 3)
    ratio = dy * top
    ratio /= scale
    accum = window_sum(ratio, size, axes)
    dx = factor * dy
    accum *= x
    accum *= np.float32(2.0 * alpha * beta / norm)
    dx -= accum
    return dx
