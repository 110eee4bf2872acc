"""The CUDA backend's pooling plan (the call contract of backend/ops.py's pool_plan): max,
average and stochastic pooling by the kernels of pooling.cu, the winners of the last forward
kept for the backward."""
import numpy as np

from . import kernels

I32 = np.int32


class PoolPlan:
    """Max, average and stochastic pooling over (N, C, H, W) with the pooling kernels; keeps
    the winners of the last forward (an int mask, and a float copy for the mask top)."""

    def __init__(self, backend, geom):
        self.backend = backend
        self.geom = geom
        self._mask = self._top_mask = None
        self._num = self._den = None

    def _args(self):
        g = self.geom
        return g.in_shape + g.out_shape + g.kernel + g.stride

    def _winners(self, shape):
        if self._mask is None or self._mask.shape != shape:
            self._mask = self.backend.empty(shape, I32)
            self._top_mask = self.backend.empty(shape)
        return self._mask

    def max_forward(self, x, y):
        mask = self._winners(y.shape)
        self.backend.launcher.run(kernels.pooling.max_pool_forward, y.size, x.ptr, *self._args(),
                                  *self.geom.pad, y.ptr, mask.ptr, self._top_mask.ptr)

    def mask(self):
        return self._top_mask

    def routed_backward(self, dy, dx):
        # stochastic pooling has no padding, so its winners route with the same geometry
        self.backend.launcher.run(kernels.pooling.max_pool_backward, dx.size, dy.ptr,
                                  self._mask.ptr, *self._args(), *self.geom.pad, dx.ptr)

    def ave_forward(self, x, y):
        self.backend.launcher.run(kernels.pooling.ave_pool_forward, y.size, x.ptr, *self._args(),
                                  *self.geom.pad, y.ptr)

    def ave_backward(self, dy, dx, add=False):
        out = self.backend.empty(dx.shape) if add else dx
        self.backend.launcher.run(kernels.pooling.ave_pool_backward, dx.size, dy.ptr,
                                  *self._args(), *self.geom.pad, out.ptr)
        if add:
            self.backend.axpby(1.0, out, 1.0, dx)

    def stochastic_forward_train(self, x, y, uniform):
        mask = self._winners(y.shape)
        draws = self.backend.to_device(uniform)
        self.backend.launcher.run(kernels.pooling.sto_pool_forward_train, y.size, x.ptr,
                                  *self._args(), draws.ptr, y.ptr, mask.ptr)

    def stochastic_forward_test(self, x, y):
        be = self.backend
        self._num, self._den = be.empty(y.shape), be.empty(y.shape)
        be.launcher.run(kernels.pooling.sto_pool_forward_test, y.size, x.ptr, *self._args(), y.ptr,
                        self._num.ptr, self._den.ptr)

    def stochastic_backward_test(self, x, dy, dx):
        self.backend.launcher.run(kernels.pooling.sto_pool_backward_test, dx.size, x.ptr, dy.ptr,
                                  self._num.ptr, self._den.ptr, *self._args(), dx.ptr)
