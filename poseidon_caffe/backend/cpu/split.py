"""Convolution and pooling cut into batch parts, one per thread, each running its whole chain;
and im2col convolution cut into chunks of images, one after another, to bound its columns.

BLAS and the FFT thread only their own calls; the copies around them (im2col, transposes,
spectrum fills, the small per-frequency GEMMs) and pooling's passes run on one core. With
several threads configured, these plans give each thread a contiguous part of the batch and a
plan of its own, with BLAS held to one thread, so every step runs on every core. Parameter
gradients are summed over the parts: the first part adds into the gradient itself, the others
into partials in their thread's scratch (shared by every layer), then one add each.

The columns of a large map (a net's first layer at 224x224: 236 MB for 32 images) cost more
memory than the GEMMs need to run wide: ChunkedConvPlan runs a part's images a chunk at a
time, each chunk's GEMMs still thousands of columns wide, and remakes a chunk's columns in
backward instead of keeping the whole batch's.
"""
import numpy as np

from . import threads
from .threads import over_parts

# A pooling of less work than this (its outputs' window taps and its input cells, over the
# batch) runs whole on the calling thread: handing a part to the other thread, asleep between
# layers, costs more than the part saves (two threads, forward / backward: VGG-16's pool5 at
# 64x64, 0.5M, 0.36-0.45 / 0.44 ms split in the net's flow, 0.28-0.32 / 0.36-0.37 whole;
# CIFAR-10 quick's pool3, 1.3M, 0.32-0.39 / 0.26 and 0.26-0.27 / 0.25-0.27; VGG's pool4, 2M,
# called alone, 0.20 / 0.18 split and 0.13 / 0.11 whole), and from 2.7M the split pays
# (called alone, whole -> split: CIFAR's pool2, 0.27 / 0.36 -> 0.26 / 0.29; AlexNet's pool5,
# 4M, 0.45 / 0.39 -> 0.34 / 0.31)
SPLIT_POOL_WORK = 2.5e6


class SplitConvPlan:
    """The ConvPlan calls (forward / backward / prepare) over batch parts; ``make_plan(n)``
    builds the plan of one part of ``n`` images. ``shared``, when given, is what the parts'
    plans share of one forward (the FFT's weight spectrum): renewed before each forward,
    dropped after each backward."""

    def __init__(self, geom, make_plan, threads, shared=None):
        self.geom = geom
        self.threads = threads
        self.shared = shared
        self._make_plan = make_plan
        self._plans = []            # per part: (part size, plan)
        self._source = None         # the array of the last forward / prepare
        self._source_parts = None   # its part views: a part plan knows its input by identity

    def workspace_bytes(self, n):
        """The parts together hold one batch's work buffers."""
        plan = self._plans[0][1] if self._plans else self._make_plan(1)
        return plan.workspace_bytes(n)

    def shared_workspace_bytes(self, n):
        """Each thread's scratch holds the work arrays of its part, and each thread past the
        first a partial weight and bias gradient."""
        plan = self._plans[0][1] if self._plans else self._make_plan(1)
        part = -(-n // self.threads)
        params = int(np.prod(self.geom.weight_shape, dtype=np.int64)) + self.geom.num_output
        return self.threads * getattr(plan, "shared_workspace_bytes", lambda n: 0)(part) + \
            (self.threads - 1) * params * 4

    def _plan(self, i, size):
        while len(self._plans) <= i:
            self._plans.append((None, None))
        if self._plans[i][0] != size:
            self._plans[i] = (size, self._make_plan(size))
        return self._plans[i][1]

    def _keep(self, x, views):
        self._source = x
        self._source_parts = views

    def prepare(self, x):
        n = x.shape[0]
        views = {}

        def run(i, lo, hi):
            views[i] = x[lo:hi]
            self._plan(i, hi - lo).prepare(views[i])
        over_parts(run, n, self.threads)
        self._keep(x, views)

    def forward(self, x, w, bias, y):
        n = x.shape[0]
        views = {}
        if self.shared is not None:
            self.shared.renew()

        def run(i, lo, hi):
            views[i] = x[lo:hi]
            self._plan(i, hi - lo).forward(views[i], w, bias, y[lo:hi])
        over_parts(run, n, self.threads)
        self._keep(x, views)
        return y

    @staticmethod
    def _partial(name, i, like):
        """A zeroed partial gradient for part ``i`` in the calling thread's scratch."""
        buf = threads.scratch("split_%s_%d" % (name, i), like.shape, like.dtype)
        buf[...] = 0
        return buf

    def backward(self, x, dy, w, dx=None, dw=None, dbias=None):
        n = dy.shape[0]
        # the part views the last forward gave each plan: a plan knows its input by identity
        kept = self._source_parts if x is not None and x is self._source else None
        partials = {}

        def run(i, lo, hi):
            xi = None if x is None else (kept[i] if kept and i in kept else x[lo:hi])
            # the first part adds into the gradients themselves, the others into partials
            dwi = dw if dw is None or i == 0 else self._partial("dw", i, dw)
            dbi = dbias if dbias is None or i == 0 else self._partial("db", i, dbias)
            self._plan(i, hi - lo).backward(xi, dy[lo:hi], w,
                                            dx=None if dx is None else dx[lo:hi],
                                            dw=dwi, dbias=dbi)
            partials[i] = (dwi, dbi)
        over_parts(run, n, self.threads)
        if self.shared is not None:
            self.shared.drop()
        for i in sorted(partials)[1:]:
            for target, part in zip((dw, dbias), partials[i]):
                if target is not None:
                    target += part


class ChunkedConvPlan:
    """The ConvPlan calls over chunks of at most ``chunk`` images (near-equal ones), one after
    another, each by a plan for that chunk size (``make_plan(k, columns)``); only the last
    chunk's columns stay between calls. The plans run one after another, so they share one
    storage for their columns (``columns`` hands out views of it; shared plans take the
    thread's scratch instead). Parameter gradients accumulate over the chunks (the plans add
    into dw and dbias)."""

    def __init__(self, geom, make_plan, chunk):
        self.geom = geom
        self.chunk = chunk
        self._make_plan = make_plan
        self._plans = {}            # chunk size -> plan (two sizes at most: k and the rest)
        self._last = None           # (array, view) of the last chunk of the last forward
        self._storage = None        # the columns of every chunk size's plan

    def _columns(self, shape, dtype):
        """A view of the shared storage. Only the last chunk's plan keeps its columns for
        backward, and the last chunk runs last: the other plan's columns, overwritten, are
        made again when next needed (its chunks are never the same array twice)."""
        need = int(np.prod(shape, dtype=np.int64))
        if self._storage is None or self._storage.size < need or self._storage.dtype != dtype:
            self._storage = np.empty(need, dtype)
        return self._storage[:need].reshape(shape)

    def _plan(self, k):
        if k not in self._plans:
            self._plans[k] = self._make_plan(k, self._columns)
        return self._plans[k]

    def _sizes(self, n):
        return sorted({hi - lo for lo, hi in self._bounds(n)})

    def workspace_bytes(self, n):
        plans = [(size, self._plan(size)) for size in self._sizes(n)]
        columns = [plan.column_bytes(size) for size, plan in plans]
        return sum(plan.workspace_bytes(size) for size, plan in plans) - sum(columns) + \
            max(columns)

    def shared_workspace_bytes(self, n):
        """The largest chunk's work arrays where the plans keep them in the thread's scratch."""
        return max(getattr(self._plan(size), "shared_workspace_bytes", lambda k: 0)(size)
                   for size in self._sizes(n))

    def _bounds(self, n):
        return threads.near_equal(n, -(-n // self.chunk))

    def _view(self, x, lo, hi, last):
        # the last chunk's plan knows its input by identity: give it the view it saw
        if last and self._last is not None and self._last[0] is x:
            return self._last[1]
        return x[lo:hi]

    def prepare(self, x):
        bounds = self._bounds(x.shape[0])
        lo, hi = bounds[-1]
        view = x[lo:hi]
        self._plan(hi - lo).prepare(view)
        self._last = (x, view)

    def forward(self, x, w, bias, y):
        bounds = self._bounds(x.shape[0])
        for lo, hi in bounds:
            view = x[lo:hi]
            self._plan(hi - lo).forward(view, w, bias, y[lo:hi])
        self._last = (x, view)
        return y

    def backward(self, x, dy, w, dx=None, dw=None, dbias=None):
        bounds = self._bounds(dy.shape[0])
        # the last chunk first: its columns are still there
        for i, (lo, hi) in reversed(list(enumerate(bounds))):
            xi = None if x is None else self._view(x, lo, hi, i == len(bounds) - 1)
            self._plan(hi - lo).backward(xi, dy[lo:hi], w,
                                         dx=None if dx is None else dx[lo:hi],
                                         dw=dw, dbias=dbias)


class SplitPoolPlan:
    """The PoolPlan calls over batch parts, each part with a PoolPlan of its own; a pooling
    of less than ``min_work`` (SPLIT_POOL_WORK) in one part, on the calling thread."""

    def __init__(self, geom, make_plan, threads, min_work=SPLIT_POOL_WORK):
        self.geom = geom
        self.threads = threads
        self.min_work = min_work
        self._make_plan = make_plan
        self._plans = []
        self._bounds = None
        self._separable = None      # choices of path made on this plan, for every part
        self._native = None

    @property
    def separable(self):
        return self._plan(0).separable

    @separable.setter
    def separable(self, value):
        self._separable = value
        for plan in self._plans:
            plan.separable = value

    @property
    def native(self):
        return self._plan(0).native

    @native.setter
    def native(self, value):
        self._native = value
        for plan in self._plans:
            plan.native = value

    def _plan(self, i):
        while len(self._plans) <= i:
            plan = self._make_plan()
            if self._separable is not None:
                plan.separable = self._separable
            if self._native is not None:
                plan.native = self._native
            self._plans.append(plan)
        return self._plans[i]

    def _parts(self, batch):
        """How many parts a call on ``batch`` (N, C, ...: the input or the top's gradient,
        so a forward and its backward are cut alike) runs in."""
        g = self.geom                   # plain ints: numpy's prod takes microseconds a call
        (oh, ow), (kh, kw), (h, w) = g.out_shape, g.kernel, g.in_shape
        work = batch.shape[0] * batch.shape[1] * (oh * ow * kh * kw + h * w)
        return self.threads if work >= self.min_work else 1

    def _each(self, method, n, *arrays):
        """``method`` of each part's plan on the part's slices of ``arrays``."""
        def run(i, lo, hi):
            getattr(self._plan(i), method)(*(a[lo:hi] for a in arrays))
        return over_parts(run, n, self._parts(arrays[0]))

    def max_forward(self, x, y):
        self._bounds = self._each("max_forward", x.shape[0], x, y)
        return y

    def mask(self):
        return np.concatenate([self._plan(i).mask() for i in range(len(self._bounds))])

    def routed_backward(self, dy, dx):
        self._each("routed_backward", dy.shape[0], dy, dx)
        return dx

    def ave_forward(self, x, y):
        self._each("ave_forward", x.shape[0], x, y)
        return y

    def ave_backward(self, dy, dx, add=False):
        def run(i, lo, hi):
            self._plan(i).ave_backward(dy[lo:hi], dx[lo:hi], add)
        over_parts(run, dy.shape[0], self._parts(dy))
        return dx

    def stochastic_forward_train(self, x, y, uniform):
        self._bounds = self._each("stochastic_forward_train", x.shape[0], x, y, uniform)
        return y

    def stochastic_forward_test(self, x, y):
        self._each("stochastic_forward_test", x.shape[0], x, y)
        return y

    def stochastic_backward_test(self, x, dy, dx):
        self._each("stochastic_backward_test", dy.shape[0], x, dy, dx)
        return dx
