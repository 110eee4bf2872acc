"""Shapes of convolutions and poolings, shared by every backend (pure shape arithmetic)."""
import functools
import itertools

import numpy as np


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


class PoolGeometry:
    """One pooling: input (N, C, *in_shape) -> (N, C, *out_shape); out_shape given by the layer."""

    def __init__(self, in_shape, kernel, stride, pad, out_shape):
        self.in_shape = tuple(int(v) for v in in_shape)
        self.kernel = tuple(int(v) for v in kernel)
        self.stride = tuple(int(v) for v in stride)
        self.pad = tuple(int(v) for v in pad)
        self.out_shape = tuple(int(v) for v in out_shape)
        # the padded extent must hold the input and every window, including an overhanging last one
        self.padded_shape = tuple(max(p + i, (o - 1) * s + k) for i, k, s, p, o in
                                  zip(self.in_shape, self.kernel, self.stride, self.pad,
                                      self.out_shape))
        self.in_count = int(np.prod(self.in_shape))

    @functools.cached_property
    def taps(self):
        # listed on first use: a geometry is made at setup, before the net's memory is checked
        return list(itertools.product(*(range(k) for k in self.kernel)))

    def tap_slices(self, tap):
        return (Ellipsis,) + tuple(slice(t, t + s * (o - 1) + 1, s)
                                   for t, s, o in zip(tap, self.stride, self.out_shape))

    def interior(self):
        return (Ellipsis,) + tuple(slice(p, p + i) for p, i in zip(self.pad, self.in_shape))

    def window_sizes(self):
        """Caffe's AVE divisor per output position: the window clipped to input + pad."""
        sizes = None
        for i, k, s, p, o in zip(self.in_shape, self.kernel, self.stride, self.pad,
                                 self.out_shape):
            start = np.arange(o) * s - p
            end = np.minimum(start + k, i + p)
            size = (end - start).astype(np.float64)
            sizes = size if sizes is None else np.multiply.outer(sizes, size)
        return sizes

    def empty_windows(self):
        """Boolean map (out_shape) of windows that hold no input cell, or None if there are none.

        Without padding, Caffe's rounded-up output count can place a last window wholly past the
        input when the kernel is shorter than the stride; Caffe's MAX gives it -FLT_MAX, mask -1,
        and no gradient.
        """
        empty = None
        for axis, (i, k, s, p, o) in enumerate(zip(self.in_shape, self.kernel, self.stride,
                                                   self.pad, self.out_shape)):
            start = np.arange(o) * s - p
            on_axis = (start >= i) | (start + k <= 0)
            if not on_axis.any():
                continue
            shape = [1] * len(self.out_shape)
            shape[axis] = o
            on_axis = on_axis.reshape(shape)
            empty = on_axis if empty is None else empty | on_axis
        return None if empty is None else np.broadcast_to(empty, self.out_shape)

    def bottom_offsets(self):
        """(flat input index of each window's first tap, flat input offset of each tap)."""
        in_strides = np.cumprod((1,) + self.in_shape[::-1])[:-1][::-1]
        base = 0
        for axis, (s, p, o) in enumerate(zip(self.stride, self.pad, self.out_shape)):
            pos = (np.arange(o) * s - p) * in_strides[axis]
            base = np.add.outer(base, pos) if axis else pos
        taps = np.array([sum(t * st for t, st in zip(tap, in_strides)) for tap in self.taps],
                        dtype=np.int64)
        return np.asarray(base, dtype=np.int64), taps
