"""Pooling on the CPU: MAX, AVE and STOCHASTIC over N-d windows.

MAX and AVE are separable: a window's maximum (or sum) is the maximum over its rows of each
row's maximum (or sum). So they run one spatial axis at a time, last axis first, each stage a
few strided whole-array passes (k taps of that axis): 2k passes in all instead of k^2. MAX
keeps, per stage, which tap of that axis won; the first maximum in row-major order wins, as in
Caffe, because each stage takes over only on a strictly greater value. The backward routes the
gradient back through the stages in reverse. Both run over cache-sized slices of the batch
(threads.over_batch), so the stages of one slice work in cache, side by side when two threads
are configured. STOCHASTIC is not separable: one pass per window tap over the whole batch.

Window rules are Caffe's: MAX ignores padding (the padded cells hold -inf), AVE divides by the
window clipped to the padded input (padding counts, overhang past it does not), STOCHASTIC
has no padding. Without padding nothing is copied: a tap whose window overhangs the input
covers only the outputs whose window reaches it.

Where the compiled kernels are built (native.py), 2-D MAX and AVE run there instead: one pass
over the input per forward and one scatter per backward, with Caffe's loops' values.
"""
import numpy as np

from . import native
from .threads import over_batch

FLT_MIN = np.float32(np.finfo(np.float32).tiny)
FLT_MAX = np.float32(np.finfo(np.float32).max)
SEPARABLE_MIN_CELLS = 27 * 27      # input cells per channel from which the stages are used


class PoolPlan:
    """Forward and backward of one pooling geometry; keeps the winners of the last forward."""

    def __init__(self, geom, dtype=np.float32):
        self.geom = geom
        self.dtype = dtype
        self._pad = None
        self._pad_fill = None
        self._tap_index = None     # which tap was drawn (STOCHASTIC train)
        self._took = None          # per stage and tap t > 0: did t take over (MAX)
        self._lead = None          # (N, C) of the last MAX forward by stages
        self._winners = None       # "stages", "taps" or "native": how the last forward kept
        #                            its winners
        self._pad_buffers = {}
        # the separable stages run last axis first; stage i reduces spatial axis order[i]
        self.order = tuple(reversed(range(len(geom.in_shape))))
        # measured: the stages win on large maps (AlexNet's 55x55 and 27x27, by 1.5-2x); on
        # small maps (16x16, 13x13, LeNet's) their short strided rows cost more than the
        # k^2 whole-array passes of the tap loop, which also routes the gradient by bincount
        self.separable = geom.in_count >= SEPARABLE_MIN_CELLS
        # the stages read the unpadded input, which a window wholly past it does not fit
        self._has_empty = geom.empty_windows() is not None
        # the compiled 2-D MAX and AVE passes, where built
        self.native = native.pools(geom)
        self._arg = None           # winners of the last compiled MAX forward: each one's
        #                            place in its window (native.max_pool_forward)
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

    # -- separable stages (MAX and AVE) ------------------------------------------------------
    def _extent(self):
        """The spatial extent the stages read: the padded input, or the input itself."""
        g = self.geom
        return g.padded_shape if any(g.pad) else g.in_shape

    def _source(self, x, lo, hi, fill):
        """Slice [lo, hi) of x as the stages read it: with padding, in a kept buffer whose
        borders hold ``fill``."""
        g = self.geom
        if not any(g.pad):
            return x[lo:hi]
        buf = self._pad_buffers.get(fill)
        shape = x.shape[:2] + g.padded_shape
        if buf is None or buf.shape != shape:
            buf = np.full(shape, fill, dtype=self.dtype)
            self._pad_buffers[fill] = buf
        part = buf[lo:hi]
        part[g.interior()] = x[lo:hi]
        return part

    def _stage_shape(self, stage, lead):
        """Shape after ``stage``: the extent on the axes not yet reduced, outputs after."""
        g = self.geom
        axis = self.order[stage]
        return tuple(lead) + self._extent()[:axis] + g.out_shape[axis:]

    def _tap(self, a, axis, tap):
        """(view of ``a`` that tap ``tap`` of spatial ``axis`` reads, number of outputs it
        covers): a window overhanging the extent has no cell at that tap."""
        g = self.geom
        s, o = g.stride[axis], g.out_shape[axis]
        count = min(o, max(0, -(-(a.shape[2 + axis] - tap) // s)))
        index = [slice(None)] * a.ndim
        index[2 + axis] = slice(tap, tap + s * (count - 1) + 1, s)
        return a[tuple(index)], count

    @staticmethod
    def _first(a, axis, count):
        index = [slice(None)] * a.ndim
        index[2 + axis] = slice(0, count)
        return a[tuple(index)]

    def _bytes_per_image(self, channels):
        return channels * int(np.prod(self._extent())) * 4 * 3

    # -- MAX -------------------------------------------------------------------------------
    def _native_takes(self, *arrays):
        return self.native and native.takes(*arrays)

    def max_forward(self, x, y):
        if self._native_takes(x, y):
            if self._arg is None or self._arg.shape != y.shape:
                self._arg = np.empty(y.shape, dtype=native.winner_type(self.geom))
            native.max_pool_forward(x, y, self._arg, self.geom)
            self._winners = "native"
            return y
        self._max_forward(x, y)
        empty = self.geom.empty_windows()
        if empty is not None:
            y[..., empty] = -FLT_MAX
        return y

    def _stages(self):
        return self.separable and not self._has_empty

    def _max_forward(self, x, y):
        if not self._stages():
            return self._max_by_taps(x, y)
        g = self.geom
        n = x.shape[0]
        shapes = [self._stage_shape(i, x.shape[:2]) for i in range(len(self.order))]
        if self._took is None or [t[0].shape for t in self._took if t] != \
                [s for s, axis in zip(shapes, self.order) if g.kernel[axis] > 1]:
            self._took = [[np.empty(shape, dtype=bool) for _ in range(g.kernel[axis] - 1)]
                          for shape, axis in zip(shapes, self.order)]

        def run(lo, hi):
            a = self._source(x, lo, hi, -np.inf)
            for i, axis in enumerate(self.order):
                last = i == len(self.order) - 1
                out = y[lo:hi] if last else np.empty(self._stage_shape(i, a.shape[:2]),
                                                     self.dtype)
                self._max_stage(a, axis, out, [t[lo:hi] for t in self._took[i]])
                a = out
        over_batch(run, n, self._bytes_per_image(x.shape[1]))
        self._winners = "stages"
        self._lead = x.shape[:2]
        return y

    def _max_stage(self, a, axis, out, took):
        """out = maximum over the taps of ``axis``; took[t-1] = tap t was strictly greater
        than every tap before it. Only a strictly greater value takes over and taps come in
        order, so the winner is the last tap that took over (the first maximum, as in Caffe).
        Two passes per tap: a comparison and a maximum."""
        o = out.shape[2 + axis]
        first, _ = self._tap(a, axis, 0)
        started = False             # out holds the maximum of the taps so far
        for t in range(1, self.geom.kernel[axis]):
            view, count = self._tap(a, axis, t)
            k = took[t - 1]
            if count < o:
                self._rest(k, axis, count)[...] = False
            if count == 0:
                continue
            if not started and count == o:
                np.greater(view, first, out=k)          # no copy of tap 0 needed
                np.maximum(first, view, out=out)
                started = True
                continue
            if not started:
                np.copyto(out, first)
                started = True
            m, k = self._first(out, axis, count), self._first(k, axis, count)
            np.greater(view, m, out=k)
            np.maximum(m, view, out=m)
        if not started:
            np.copyto(out, first)

    @staticmethod
    def _rest(a, axis, count):
        index = [slice(None)] * a.ndim
        index[2 + axis] = slice(count, None)
        return a[tuple(index)]

    def _stage_winners(self, stage):
        """Which tap of its axis won, per output of ``stage``: the last tap that took over."""
        took = self._took[stage]
        won = np.zeros(self._stage_shape(stage, self._lead),
                       dtype=np.uint8 if len(took) < 255 else np.int32)
        for t, k in enumerate(took, 1):
            np.maximum(won, k * won.dtype.type(t), out=won)
        return won

    def mask(self):
        """Flat input index (within one channel) of each output's winner, Caffe's mask; -1 for
        a window that holds no input cell."""
        flat = self._winner_indices()
        empty = self.geom.empty_windows()
        if empty is not None:
            flat = np.array(flat)
            flat[..., empty] = -1
        return flat

    def _winner_indices(self):
        if self._winners == "native":
            return self._native_indices()
        if self._winners == "taps":
            base, taps = self.geom.bottom_offsets()
            return base + taps[self._tap_index]
        g = self.geom
        winners = [self._stage_winners(i) for i in range(len(self.order))]
        final = winners[-1]
        grid = np.indices(final.shape, sparse=True)
        # walk the stages from the first axis: each stage's winners are addressed by the
        # winning positions found so far on the axes before it, and outputs on the others
        positions = []
        flat = 0
        for axis in range(len(g.in_shape)):
            stage = self.order.index(axis)
            where = tuple(grid[:2]) + tuple(positions) + tuple(grid[2 + axis:])
            won = winners[stage][where]
            pos = grid[2 + axis] * g.stride[axis] + won
            positions.append(pos)
            flat = flat * g.in_shape[axis] + (pos - g.pad[axis])
        return np.broadcast_to(flat, final.shape).astype(np.int64)

    def _native_indices(self):
        """The compiled forward's winners, places in their windows, as flat input indices:
        the window's corner plus the place's row and column taps; -1 where no winner."""
        g = self.geom
        place = self._arg.astype(np.int64)
        rows = np.arange(g.out_shape[0])[:, None] * g.stride[0] - g.pad[0] + place // g.kernel[1]
        cols = np.arange(g.out_shape[1]) * g.stride[1] - g.pad[1] + place % g.kernel[1]
        flat = rows * g.in_shape[1] + cols
        flat[self._arg == native.no_winner(self._arg.dtype)] = -1
        return flat

    def routed_backward(self, dy, dx):
        """dx = dy sent to the input element each output took (MAX and STOCHASTIC train)."""
        if self._winners == "native" and native.takes(dy, dx):
            return native.max_pool_backward(dy, self._arg, dx, self.geom)
        if self._winners in ("taps", "native"):
            return self._routed_by_taps(dy, dx)

        def run(lo, hi):
            g_ = dy[lo:hi]
            for i in reversed(range(len(self.order))):
                g_ = self._max_unstage(i, g_, [t[lo:hi] for t in self._took[i]])
            dx[lo:hi] = g_[self.geom.interior()] if any(self.geom.pad) else g_
        over_batch(run, dy.shape[0], self._bytes_per_image(dy.shape[1]))
        return dx

    def _max_unstage(self, stage, g_, took):
        """The adjoint of a MAX stage. Going down from the last tap, tap t gets the gradient
        where it took over, out of what the later taps left; tap 0 gets the rest. Taps below
        the stride cover disjoint cells and are written straight into the result."""
        axis = self.order[stage]
        s = self.geom.stride[axis]
        k = self.geom.kernel[axis]
        later = []                  # (tap, values) of taps at or past the stride, added last
        rest = g_
        prev = self._stage_input(stage, g_)
        for t in reversed(range(k)):
            view, count = self._tap(prev, axis, t)
            if count == 0:
                continue
            r = self._first(rest, axis, count)
            if t == 0:
                np.copyto(view, r)
                continue
            kt = self._first(took[t - 1], axis, count)
            if t < s:
                np.multiply(r, kt, out=view)
                part = view
            else:
                part = r * kt
                later.append((view, part))
            if rest is g_:
                rest = np.empty(g_.shape, self.dtype)
                if count < g_.shape[2 + axis]:
                    self._rest(rest, axis, count)[...] = self._rest(g_, axis, count)
                np.subtract(r, part, out=self._first(rest, axis, count))
            else:
                np.subtract(r, part, out=r)
        for view, part in later:
            view += part
        return prev

    def _stage_input(self, stage, g_):
        """A new array of the shape ``stage`` reads: empty when the taps below the stride cover
        every cell, zeros otherwise."""
        axis = self.order[stage]
        g = self.geom
        shape = (self._stage_shape(stage - 1, g_.shape[:2]) if stage else
                 g_.shape[:2] + self._extent())
        extent = shape[2 + axis]
        k, s, o = g.kernel[axis], g.stride[axis], g.out_shape[axis]
        covered = k >= s and o >= -(-extent // s)      # every cell under some tap t < s
        return np.empty(shape, self.dtype) if covered else np.zeros(shape, self.dtype)

    def _unstage(self, stage, g_, emit):
        """The adjoint of a stage: a new array of the stage's input shape holding, at each tap
        t's positions, ``emit(t, count, out)``'s values, summed where windows overlap. Taps
        below the stride land on disjoint cells and are written in place; later taps add."""
        axis = self.order[stage]
        g = self.geom
        shape = (self._stage_shape(stage - 1, g_.shape[:2]) if stage else
                 g_.shape[:2] + self._extent())
        extent = shape[2 + axis]
        k, s, o = g.kernel[axis], g.stride[axis], g.out_shape[axis]
        covered = k >= s and o >= -(-extent // s)      # every cell under some tap t < s
        prev = np.empty(shape, self.dtype) if covered else np.zeros(shape, self.dtype)
        scratch = None
        for t in range(k):
            view, count = self._tap(prev, axis, t)
            if count == 0:
                break
            if t < s:
                emit(t, count, view)
                continue
            if scratch is None:
                scratch = np.empty(g_.shape, self.dtype)
            part = self._first(scratch, axis, count)
            emit(t, count, part)
            view += part
        return prev

    def _max_by_taps(self, x, y):
        """One pass per window tap over the whole batch; the winner is the last tap that
        took over (strictly greater), kept as a running maximum of (took over) * tap."""
        g = self.geom
        read = self._reader(self._padded(x, -np.inf))
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
        self._winners = "taps"
        return y

    def _routed_by_taps(self, dy, dx):
        """One bincount over flat input indices (STOCHASTIC train's drawn taps)."""
        g = self.geom
        nc = dy.shape[0] * dy.shape[1]
        flat = self.mask().reshape(nc, -1)
        weights = dy.reshape(nc, -1)
        flat += (np.arange(nc, dtype=np.int64) * g.in_count)[:, None]
        empty = self.geom.empty_windows()
        if empty is not None:              # an empty window routes its gradient nowhere
            keep = ~empty.reshape(-1)
            flat, weights = flat[:, keep], weights[:, keep]
        summed = np.bincount(flat.ravel(), weights=weights.ravel(), minlength=nc * g.in_count)
        np.copyto(dx.reshape(-1), summed)
        return dx

    # -- AVE -------------------------------------------------------------------------------
    def _inverse_sizes(self):
        if self._inv_sizes is None:
            with np.errstate(divide="ignore"):   # an empty window divides by 0, as in Caffe
                self._inv_sizes = (1.0 / self.geom.window_sizes()).astype(self.dtype)
        return self._inv_sizes

    def ave_forward(self, x, y):
        if self._native_takes(x, y):
            return native.ave_pool_forward(x, y, self.geom)
        inverse = self._inverse_sizes()
        if not self._stages():
            read = self._reader(self._padded(x, 0.0))
            y[...] = 0
            for tap in self.geom.taps:
                y += read(tap)
            y *= inverse
            return y

        def run(lo, hi):
            a = self._source(x, lo, hi, 0.0)
            for i, axis in enumerate(self.order):
                last = i == len(self.order) - 1
                out = y[lo:hi] if last else np.empty(self._stage_shape(i, a.shape[:2]),
                                                     self.dtype)
                view, _ = self._tap(a, axis, 0)
                np.copyto(out, view)
                for t in range(1, self.geom.kernel[axis]):
                    view, count = self._tap(a, axis, t)
                    if count == 0:
                        break
                    part = self._first(out, axis, count)
                    np.add(part, view, out=part)
                a = out
            a *= inverse
        over_batch(run, x.shape[0], self._bytes_per_image(x.shape[1]))
        return y

    def ave_backward(self, dy, dx, add=False):
        if add:
            # into dx's values by the kernel where it serves, else made apart and added
            if not (self._native_takes(dy, dx) and native.ave_pool_backward_add(dy, dx,
                                                                                self.geom)):
                dx += self.ave_backward(dy, np.empty_like(dx))
            return dx
        if self._native_takes(dy, dx):
            return native.ave_pool_backward(dy, dx, self.geom)
        inverse = self._inverse_sizes()
        if not self._stages():
            share = dy * inverse
            return self._scatter(dy.shape, ((tap, share) for tap in self.geom.taps), dx)

        def run(lo, hi):
            g_ = dy[lo:hi] * inverse
            for i in reversed(range(len(self.order))):
                def emit(t, count, out, g_=g_, axis=self.order[i]):
                    np.copyto(out, self._first(g_, axis, count))
                g_ = self._unstage(i, g_, emit)
            dx[lo:hi] = g_[self.geom.interior()] if any(self.geom.pad) else g_
        over_batch(run, dy.shape[0], self._bytes_per_image(dy.shape[1]))
        return dx

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
        self._winners = "taps"
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
