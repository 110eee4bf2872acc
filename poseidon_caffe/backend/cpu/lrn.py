"""Local response normalisation on the CPU, Caffe's two regions, as shifted whole-tensor sums.

ACROSS_CHANNELS: scale = k + alpha/n * sum of x^2 over the n channels centred on c.
WITHIN_CHANNEL:  scale = 1 + alpha/n^2 * sum of x^2 over the n x n spatial window centred on
                 the pixel, zero padded ((n-1)/2 each side, so the divisor is always n^2).
top = x * scale^-beta. Both windows are symmetric (n is odd), so the backward's sum over the
windows that contain an element is the same window sum.

Both directions run over cache-sized slices of the batch (threads.over_batch; rows
of one image when an image is bigger): the ten-odd
passes of one slice stay in cache, so memory is read and written about once per array, and
slices run side by side when two threads are configured. Only ``scale`` is kept for the
backward; scale^-beta is recomputed there from it, in cache, rather than stored and re-read.

Where the compiled kernels are built (native.py, kernels/lrn.c), ACROSS_CHANNELS runs there instead:
one pass over each image's planes in each direction, the window's planes read from cache
(the same values up to the order of float rounding); the scale is not kept but remade in the
backward, an image at a time, so a layer holds nothing the size of its input between the two.
Those passes take a part of the batch per thread, not slices.
"""
import ctypes

import numpy as np

from . import native, threads

_COMPILED = {}


def _compiled():
    """The compiled across-channels kernels (kernels/lrn.c), or None."""
    if "lib" not in _COMPILED:
        lib = native.lib
        if lib is not None and hasattr(lib, "lrn_across_forward"):
            p, i, l, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
            lib.lrn_across_forward.argtypes = [p, p, p, l, i, l, i, f, f, f]
            lib.lrn_across_backward.argtypes = [p, p, p, p, p, l, i, l, i, f, f, f]
            lib.lrn_across_forward.restype = lib.lrn_across_backward.restype = ctypes.c_int
        else:
            lib = None
        _COMPILED["lib"] = lib
    return _COMPILED["lib"]


def fast_roots(on=None):
    """Whether the compiled kernels take beta 0.75's and 0.5's powers from reciprocal-root
    estimates refined once (AVX-512's within 4 ulp, AVX2's within 5; the default) rather than
    from square roots and a division (the tests run both); ``on`` sets it. False without the
    kernels."""
    lib = _compiled()
    if lib is None:
        return False
    flag = ctypes.c_int.in_dll(lib, "lrn_fast_roots")
    if on is not None:
        flag.value = int(bool(on))
    return bool(flag.value)


def fast_root_lanes():
    """The vector width of the estimates in use: 16 (AVX-512), 8 (AVX2), or 0 (none: no such
    CPU, fast_roots off, or no kernels)."""
    lib = _compiled()
    return 0 if lib is None else lib.lrn_roots_lanes()


def _over_images(fn, x):
    """fn(lo, hi) over the images of x, a part per thread: the compiled passes keep an image
    in the cache themselves, and each part handed to Python's pool costs about 40 us (AlexNet's
    norm2 cut into 2 MB slices made 32 of them; two threads: forward 5.0-5.6 -> 4.1 ms)."""
    threads.over_parts(lambda i, lo, hi: fn(lo, hi), x.shape[0])


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


def _negative_power(scale, beta, out=None, work=None):
    """scale ** -beta, with the square-root forms for Caffe's usual betas; ``out`` and
    ``work`` (scale's shape) take the result and an intermediate when given."""
    out = np.empty_like(scale) if out is None else out
    if beta == 0.75:
        np.sqrt(scale, out=out)
        out *= np.sqrt(out, out=np.empty_like(scale) if work is None else work)
        return np.reciprocal(out, out=out)
    if beta == 0.5:
        np.sqrt(scale, out=out)
        return np.reciprocal(out, out=out)
    return np.power(scale, np.float32(-beta), out=out)


def _region(size, across_channels):
    """(axes of the window, the divisor of alpha)."""
    return ((1,), size) if across_channels else ((2, 3), size * size)


def _over_pieces(fn, x, across_channels):
    """Calls fn(piece) for index tuples that together cover x (N, C, H, W) once: slices of
    the batch, and when one image is bigger than a slice and the window runs across
    channels, blocks of rows of one image (AlexNet's first LRN: 1.2 MB an image)."""
    n, _, h, _ = x.shape
    per_image = int(np.prod(x.shape[1:])) * x.itemsize * 6     # arrays and temporaries
    blocks = 1
    if across_channels:
        blocks = min(h, max(1, -(-per_image // threads.SLICE_BYTES)))
    if blocks == 1:
        threads.over_batch(lambda lo, hi: fn((slice(lo, hi),)), n, per_image)
        return
    rows = -(-h // blocks)
    blocks = -(-h // rows)

    def run(lo, hi):
        for item in range(lo, hi):
            image, block = divmod(item, blocks)
            fn((slice(image, image + 1), slice(None), slice(block * rows, (block + 1) * rows)))
    threads.over_batch(run, n * blocks, per_image // blocks)


def lrn_forward(x, size, alpha, beta, k, across_channels, out=None, state=None):
    """Returns (top, state) for ``x`` (N, C, H, W); ``state`` is what lrn_backward needs.

    ``out`` receives top; a ``state`` from an earlier call of the same shape is reused."""
    axes, norm = _region(size, across_channels)
    if not across_channels:
        k = 1.0
    top = np.empty_like(x) if out is None else out
    lib = _compiled() if across_channels else None
    if lib is not None and native.takes(x, top):
        n, c = x.shape[:2]
        positions = int(np.prod(x.shape[2:]))

        def compiled(lo, hi):
            at = native.address
            if lib.lrn_across_forward(at(x[lo:hi]), at(top[lo:hi]), None, hi - lo, c,
                                      positions, size, alpha, beta, k):
                raise MemoryError("LRN: no memory for a plane of %d values" % positions)
        _over_images(compiled, x)
        return top, (None, k)           # the backward remakes the scale from x
    scale = (state[0] if state is not None and state[0] is not None and
             state[0].shape == x.shape else np.empty_like(x))
    coef, offset = np.float32(alpha / norm), np.float32(k)

    def run(piece):
        xs, sc = x[piece], scale[piece]
        a, b = (threads.scratch(name, xs.shape) for name in ("lrn_a", "lrn_b"))
        window_sum(np.multiply(xs, xs, out=a), size, axes, out=sc)
        sc *= coef
        sc += offset
        np.multiply(_negative_power(sc, beta, out=b, work=a), xs, out=top[piece])
    _over_pieces(run, x, across_channels)
    return top, (scale,)


def lrn_backward(x, top, state, dy, size, alpha, beta, across_channels, out=None):
    """d bottom = dy * scale^-beta - 2 alpha beta / norm * x * windowsum(dy * top / scale),
    written into ``out`` when given."""
    scale, k = state[0], (state[1] if len(state) > 1 else None)
    axes, norm = _region(size, across_channels)
    dx = np.empty_like(x) if out is None else out
    lib = _compiled() if across_channels else None
    if lib is not None and native.takes(x, top, dy, dx) and (scale is None or
                                                             native.takes(scale)):
        n, c = x.shape[:2]
        positions = int(np.prod(x.shape[2:]))

        def compiled(lo, hi):
            at = native.address
            if lib.lrn_across_backward(at(x[lo:hi]), at(top[lo:hi]),
                                       None if scale is None else at(scale[lo:hi]),
                                       at(dy[lo:hi]), at(dx[lo:hi]), hi - lo, c, positions,
                                       size, alpha, beta, k or 0.0):
                raise MemoryError("LRN: no memory for an image of %d values"
                                  % (c * positions))
        _over_images(compiled, x)
        return dx
    if scale is None:                   # a compiled forward kept none: remake it here
        scale = window_sum(x * x, size, axes)
        scale *= np.float32(alpha / norm)
        scale += np.float32(k)
    coef = np.float32(2.0 * alpha * beta / norm)

    def run(piece):
        sc = scale[piece]
        ratio, accum, power = (threads.scratch(name, sc.shape)
                               for name in ("lrn_a", "lrn_b", "lrn_c"))
        np.multiply(dy[piece], top[piece], out=ratio)
        ratio /= sc
        window_sum(ratio, size, axes, out=accum)
        accum *= x[piece]
        accum *= coef
        part = dx[piece]
        np.multiply(_negative_power(sc, beta, out=power, work=ratio), dy[piece], out=part)
        part -= accum
    _over_pieces(run, x, across_channels)
    return dx
