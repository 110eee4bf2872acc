"""Pooling on the CPU: MAX, AVE and STOCHASTIC over N-d windows, one vectorised pass per tap.

A loop over the kernel taps (9 for a 3x3 window) reads one strided view of the padded input
per tap covering every image, channel and output position at once; nothing loops over images or
pixels. Window rules are Caffe's: MAX ignores padding (the padded cells hold -inf), AVE divides
by the window clipped to the padded input (padding counts, overhang past it does not),
STOCHASTIC has no padding.
"""
import numpy as np

from .geometry import PoolGeometry  # noqa: F401  (re-exported)

FLT_MIN = np.float32(np.finfo(np.float32).tiny)


class PoolPlan:
    """Forward and backward of one pooling geometry; keeps the winners of the last forward."""

    def __init__(self, geom, dtype=np.float32):
        self.geom = geom
        self.dtype = dtype
        self._pad = None
        self._pad_fill = None
        self._tap_index = None     # which tap won (MAX) or was drawn (STOCHASTIC train)
        self._inv_sizes = None
        self._test_terms = None

    def _padded(self, x, fill):
        g = self.geom
        if not any(g.pad) and g.padded_shape == g.in_shape:
            return x
        shape = x.shape[:2] + g.padded_shape
        if self._pad is None or self._pad.shape != shape or self._pad_fill != fill:
            self._pad = np.full(shape, fill, dtype=self.dtype)
            self._pad_fill = fill
        self._pad[g.interior()] = x
        return self._pad

    # -- MAX -------------------------------------------------------------------------------
    def max_forward(self, x, y):
        g = self.geom
        xp = self._padded(x, -np.inf)
        # taps run in row-major order and only a strictly greater value takes over, so the
        # winner is the last tap that took over: a running maximum of (took over) * tap
        index_type = np.uint8 if len(g.taps) < 256 else np.int32
        idx = np.zeros(y.shape, dtype=index_type)
        took = np.empty(y.shape, dtype=bool)
        tagged = np.empty(y.shape, dtype=index_type)
        for t, tap in enumerate(g.taps):
            v = xp[g.tap_slices(tap)]
            if t == 0:
                np.copyto(y, v)
                continue
            np.greater(v, y, out=took)
            np.maximum(y, v, out=y)
            np.multiply(took, index_type(t), out=tagged)
            np.maximum(idx, tagged, out=idx)
        self._tap_index = idx
        return y

    def mask(self):
        """Flat input index (within one channel) of each output's winner, Caffe's mask."""
        base, taps = self.geom.bottom_offsets()
        return base + taps[self._tap_index]

    def routed_backward(self, dy, dx):
        """dx = dy sent to the input element each output took (MAX and STOCHASTIC train)."""
        g = self.geom
        nc = dy.shape[0] * dy.shape[1]
        flat = self.mask().reshape(nc, -1)
        flat += (np.arange(nc, dtype=np.int64) * g.in_count)[:, None]
        summed = np.bincount(flat.ravel(), weights=dy.ravel(), minlength=nc * g.in_count)
        np.copyto(dx.reshape(-1), summed)
        return dx

    # -- AVE -------------------------------------------------------------------------------
    def _inverse_sizes(self):
        if self._inv_sizes is None:
            self._inv_sizes = (1.0 / self.geom.window_sizes()).astype(self.dtype)
        return self._inv_sizes

    def ave_forward(self, x, y):
        g = self.geom
        xp = self._padded(x, 0.0)
        y[...] = 0
        for tap in g.taps:
            y += xp[g.tap_slices(tap)]
        y *= self._inverse_sizes()
        return y

    def ave_backward(self, dy, dx):
        g = self.geom
        share = dy * self._inverse_sizes()
        dxp = np.zeros(dy.shape[:2] + g.padded_shape, dtype=self.dtype)
        for tap in g.taps:
            dxp[g.tap_slices(tap)] += share
        dx[...] = dxp[g.interior()]
        return dx

    # -- STOCHASTIC ------------------------------------------------------------------------
    def stochastic_forward_train(self, x, y, uniform):
        """Draw one element per window with probability x / sum(window); ``uniform`` in [0, 1)."""
        g = self.geom
        xp = self._padded(x, 0.0)      # overhang past the input adds nothing to a window
        total = np.zeros(y.shape, dtype=self.dtype)
        for tap in g.taps:
            total += xp[g.tap_slices(tap)]
        threshold = uniform.astype(self.dtype) * total
        running = np.zeros_like(total)
        found = np.zeros(y.shape, dtype=bool)
        idx = np.zeros(y.shape, dtype=np.int32)
        y[...] = 0
        for t, tap in enumerate(g.taps):
            v = xp[g.tap_slices(tap)]
            running += v
            pick = running >= threshold
            pick &= ~found
            np.copyto(y, v, where=pick)
            np.copyto(idx, t, where=pick)
            found |= pick
        self._tap_index = idx
        return y

    def stochastic_forward_test(self, x, y):
        """Each window's probability-weighted average: sum(x^2) / sum(x)."""
        g = self.geom
        xp = self._padded(x, 0.0)
        num = np.zeros(y.shape, dtype=self.dtype)
        den = np.full(y.shape, FLT_MIN, dtype=self.dtype)
        for tap in g.taps:
            v = xp[g.tap_slices(tap)]
            num += v * v
            den += v
        np.divide(num, den, out=y)
        self._test_terms = (num, den)
        return y

    def stochastic_backward_test(self, x, dy, dx):
        """Exact gradient of sum(x^2)/sum(x): (2 x den - num) / den^2 per window element."""
        g = self.geom
        num, den = self._test_terms
        a = dy * 2 / den
        b = dy * num / (den * den)
        xp = self._padded(x, 0.0)
        dxp = np.zeros(dy.shape[:2] + g.padded_shape, dtype=self.dtype)
        for tap in g.taps:
            sl = g.tap_slices(tap)
            dxp[sl] += a * xp[sl] - b
        dx[...] = dxp[g.interior()]
        return dx
