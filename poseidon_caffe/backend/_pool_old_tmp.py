"""Pooling on the CPU: MAX, AVE and STOCHASTIC over N-d windows, one vectorised pass per tap.

A loop over the kernel taps (9 for a 3x3 window) reads one strided view of the padded input
per tap covering every image, channel and output position at once; nothing loops over images
or pixels. (Splitting the input into its stride phases first, for unit-stride rows, measured
no better overall: it wins on AlexNet's maps and loses on CIFAR-10's.) Window rules are
Caffe's: MAX ignores padding (the padded cells hold -inf), AVE divides by the window clipped
to the padded input (padding counts, overhang past it does not), STOCHASTIC has no padding.
"""
import numpy as np

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

    def _reader(self, xp):
        """tap -> the (N, C, *out) view of ``xp`` that tap reads."""
        g = self.geom
        return lambda tap: xp[g.tap_slices(tap)]

    def _scatter(self, shape, contributions, dx):
        """dx = the sum of every tap's (N, C, *out) contribution at that tap's positions."""
        g = self.geom
        padded = np.zeros(shape[:2] + g.padded_shape, dtype=self.dtype)
        for tap, value in contributions:
            padded[g.tap_slices(tap)] += value
        dx[...] = padded[g.interior()]
        return dx

    # -- MAX -------------------------------------------------------------------------------
    def max_forward(self, x, y):
        g = self.geom
        read = self._reader(self._padded(x, -np.inf))
        # taps run in row-major order and only a strictly greater value takes over, so the
        # winner is the last tap that took over: a running maximum of (took over) * tap
        index_type = np.uint8 if len(g.taps) < 256 else np.int32
        idx = np.zeros(y.shape, dtype=index_type)
        took = np.empty(y.shape, dtype=bool)
        tagged = np.empty(y.shape, dtype=index_type)
        for t, tap in enumerate(g.taps):
            v = read(tap)
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
        """dx = dy sent to the input element each output took (MAX and STOCHASTIC train).

        One bincount over flat input indices: faster here than a masked add per tap."""
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
        read = self._reader(self._padded(x, 0.0))
        y[...] = 0
        for tap in g.taps:
            y += read(tap)
        y *= self._inverse_sizes()
        return y

    def ave_backward(self, dy, dx):
        share = dy * self._inverse_sizes()
        return self._scatter(dy.shape, ((tap, share) for tap in self.geom.taps), dx)

    # -- STOCHASTIC ------------------------------------------------------------------------
    def stochastic_forward_train(self, x, y, uniform):
        """Draw one element per window with probability x / sum(window); ``uniform`` in [0, 1)."""
        g = self.geom
        read = self._reader(self._padded(x, 0.0))   # overhang adds nothing to a window
        total = np.zeros(y.shape, dtype=self.dtype)
        for tap in g.taps:
            total += read(tap)
        threshold = uniform.astype(self.dtype) * total
        running = np.zeros_like(total)
        found = np.zeros(y.shape, dtype=bool)
        idx = np.zeros(y.shape, dtype=np.int32)
        y[...] = 0
        for t, tap in enumerate(g.taps):
            v = read(tap)
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
        read = self._reader(self._padded(x, 0.0))
        num = np.zeros(y.shape, dtype=self.dtype)
        den = np.full(y.shape, FLT_MIN, dtype=self.dtype)
        for tap in g.taps:
            v = read(tap)
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
        read = self._reader(self._padded(x, 0.0))
        return self._scatter(dy.shape, ((tap, a * read(tap) - b) for tap in g.taps), dx)
