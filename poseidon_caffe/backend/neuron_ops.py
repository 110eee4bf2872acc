"""The neuron layers' named ops on the CPU: numpy over whole arrays, the formulas the layers
had inline (so results are unchanged). The CUDA backend has the same names over
kernels/neuron.cu and kernels/prelu.cu (cuda/neuron_ops.py).

Every forward may run in place (y is x); a backward writes dx and reads what its layer keeps
(the input, or the output where the gradient is a function of it).
"""
import numpy as np


class NeuronOps:

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

    def elu_forward(self, x, y, alpha):
        negative_part = alpha * np.expm1(np.minimum(x, 0))
        y[...] = np.where(x > 0, x, negative_part)

    def elu_backward(self, x, y, dy, dx, alpha):
        # d/dx alpha (e^x - 1) = y + alpha
        dx[...] = dy * np.where(x > 0, 1.0, y + alpha)

    def sigmoid_forward(self, x, y):
        # the tanh form never overflows
        y[...] = 0.5 * np.tanh(0.5 * x) + 0.5

    def sigmoid_backward(self, y, dy, dx):
        dx[...] = dy * y * (1 - y)

    def tanh_forward(self, x, y):
        np.tanh(x, out=y)

    def tanh_backward(self, y, dy, dx):
        dx[...] = dy * (1 - y * y)

    def abs_forward(self, x, y):
        np.abs(x, out=y)

    def abs_backward(self, x, dy, dx):
        dx[...] = dy * np.sign(x)

    def bnll_forward(self, x, y):
        y[...] = np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))

    def bnll_backward(self, x, dy, dx, exp_limit):
        e = np.exp(np.minimum(x, exp_limit))
        dx[...] = dy * e / (e + 1)

    def power_forward(self, x, y, power, scale, shift):
        base = shift + scale * x
        y[...] = base if power == 1 else np.power(base, power)

    def power_backward(self, x, dy, dx, power, scale, shift):
        diff_scale = power * scale
        if diff_scale == 0:
            dx[...] = 0
        elif power == 1:
            dx[...] = dy * diff_scale
        else:
            base = shift + scale * x
            dx[...] = dy * diff_scale * np.power(base, power - 1)

    def exp_forward(self, x, y, inner_scale, outer_scale):
        e = np.exp(inner_scale * x)
        if outer_scale != 1.0:
            e *= outer_scale
        y[...] = e

    def exp_backward(self, y, dy, dx, inner_scale):
        dx[...] = dy * y * inner_scale

    def log_forward(self, x, y, scale, shift, base_scale):
        y[...] = np.log(shift + scale * x) * base_scale

    def log_backward(self, x, dy, dx, scale, shift, base_scale):
        dx[...] = dy * (scale * base_scale) / (shift + scale * x)

    def threshold_forward(self, x, y, threshold):
        y[...] = x > threshold

    def clip_forward(self, x, y, lo, hi):
        np.clip(x, lo, hi, out=y)

    def clip_backward(self, x, dy, dx, lo, hi):
        dx[...] = dy * ((x >= lo) & (x <= hi))

    def swish_forward(self, x, y, beta):
        """y = x sigmoid(beta x); returns the sigmoid, which backward reads."""
        sigmoid = 0.5 * np.tanh(0.5 * beta * x) + 0.5
        y[...] = x * sigmoid
        return sigmoid

    def swish_backward(self, y, sigmoid, dy, dx, beta):
        by = beta * y
        dx[...] = dy * (by + sigmoid * (1 - by))
