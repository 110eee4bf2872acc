"""PReLU's named ops on the CPU: numpy over whole arrays, the formulas the layer had inline
(so results are unchanged). The CUDA backend has the same names over kernels/prelu.cu
(cuda/prelu_ops.py). The forward may run in place (y is x); the backward reads the input the
layer kept."""
import numpy as np


class PReLUOps:

    def prelu_forward(self, x, y, slopes, shared):
        """x, y as (N, C, rest); slopes one per channel, or one shared."""
        s = slopes.reshape(1, 1, 1) if shared else slopes.reshape(1, -1, 1)
        y[...] = np.maximum(x, 0) + s * np.minimum(x, 0)

    def prelu_backward(self, x, dy, slopes, shared, dx=None, dslopes=None):
        """dx (when given) = dy scaled by the slope where x <= 0; dslopes (when given)
        += sum of dy x over the non-positive x, per channel or in all."""
        negative = x <= 0
        if dslopes is not None:
            contribution = (dy * x * negative).sum(axis=(0, 2), dtype=np.float64)
            if shared:
                dslopes += contribution.sum()
            else:
                dslopes += contribution
        if dx is not None:
            s = slopes.reshape(1, 1, 1) if shared else slopes.reshape(1, -1, 1)
            dx[...] = dy * np.where(negative, s, 1.0)
