"""Local response normalisation on the CPU, Caffe's two regions, as shifted whole-tensor sums.

ACROSS_CHANNELS: scale = k + alpha/n * sum of x^2 over the n channels centred on c.
WITHIN_CHANNEL:  scale = 1 + alpha/n^2 * sum of x^2 over the n x n spatial window centred on
                 the pixel, zero padded ((n-1)/2 each side, so the divisor is always n^2).
top = x * scale^-beta. Both windows are symmetric (n is odd), so the backward's sum over the
windows that contain an element is the same window sum.
"""
import numpy as np


def window_sum(a, size, axes):
    """Sum of ``a`` over a centred window of odd ``size`` along each of ``axes`` (zero padded)."""
    half = (size - 1) // 2
    for axis in axes:
        length = a.shape[axis]
        padded_shape = list(a.shape)
        padded_shape[axis] = length + 2 * half
        padded = np.zeros(padded_shape, dtype=a.dtype)
        inner = [slice(None)] * a.ndim
        inner[axis] = slice(half, half + length)
        padded[tuple(inner)] = a
        out = np.zeros_like(a)
        for shift in range(size):
            window = [slice(None)] * a.ndim
            window[axis] = slice(shift, shift + length)
            out += padded[tuple(window)]
        a = out
    return a


def lrn_forward(x, size, alpha, beta, k, across_channels):
    """Returns (top, scale); ``x`` is (N, C, H, W)."""
    if across_channels:
        scale = window_sum(x * x, size, (1,))
        scale *= np.float32(alpha / size)
        scale += np.float32(k)
    else:
        scale = window_sum(x * x, size, (2, 3))
        scale *= np.float32(alpha / (size * size))
        scale += np.float32(1.0)
    top = np.power(scale, np.float32(-beta)) * x
    return top, scale


def lrn_backward(x, top, scale, dy, size, alpha, beta, across_channels):
    """d bottom = dy * scale^-beta - 2 alpha beta / norm * x * windowsum(dy * top / scale)."""
    norm = size if across_channels else size * size
    axes = (1,) if across_channels else (2, 3)
    ratio = dy * top
    ratio /= scale
    accum = window_sum(ratio, size, axes)
    dx = np.power(scale, np.float32(-beta)) * dy
    accum *= x
    accum *= np.float32(2.0 * alpha * beta / norm)
    dx -= accum
    return dx
