"""Elementwise neuron maps on the CPU: forward and backward of each, by name.

The CUDA backend runs the kernels of cuda/kernels/neuron.cu under the same names and with the
same parameters, so a neuron layer calls ``backend.neuron_forward(kind, x, y, *params)`` and
``backend.neuron_backward(kind, dy, *inputs, dx, *params)`` on either backend. ``inputs`` is
what the gradient reads: the output for sigmoid, tanh and exp; the input for abs, bnll, power,
log and clip; both (input, output) for elu; for swish, the output and the sigmoid its forward
returned.
"""
import numpy as np

BNLL_EXP_LIMIT = 50.0       # Caffe's kBNLL_THRESHOLD on the exponent in backward


def _sigmoid(x, y):
    y[...] = 0.5 * np.tanh(0.5 * x) + 0.5        # the tanh form never overflows


def _sigmoid_grad(dy, y, dx):
    dx[...] = dy * y * (1 - y)


def _tanh(x, y):
    np.tanh(x, out=y)


def _tanh_grad(dy, y, dx):
    dx[...] = dy * (1 - y * y)


def _abs(x, y):
    np.abs(x, out=y)


def _abs_grad(dy, x, dx):
    dx[...] = dy * np.sign(x)


def _bnll(x, y):
    y[...] = np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


def _bnll_grad(dy, x, dx):
    e = np.exp(np.minimum(x, BNLL_EXP_LIMIT))
    dx[...] = dy * e / (e + 1)


def _power(x, y, power, scale, shift):
    base = shift + scale * x
    y[...] = base if power == 1 else np.power(base, power)


def _power_grad(dy, x, dx, power, scale, shift, diff_scale):
    if diff_scale == 0:
        dx[...] = 0
    elif power == 1:
        dx[...] = dy * diff_scale
    else:
        dx[...] = dy * diff_scale * np.power(shift + scale * x, power - 1)


def _exp(x, y, inner_scale, outer_scale):
    e = np.exp(inner_scale * x)
    if outer_scale != 1.0:
        e *= outer_scale
    y[...] = e


def _exp_grad(dy, y, dx, inner_scale):
    dx[...] = dy * y * inner_scale


def _log(x, y, scale, shift, base_scale):
    y[...] = np.log(shift + scale * x) * base_scale


def _log_grad(dy, x, dx, scale, shift, diff_scale):
    dx[...] = dy * diff_scale / (shift + scale * x)


def _threshold(x, y, threshold):
    y[...] = x > threshold


def _clip(x, y, lo, hi):
    np.clip(x, lo, hi, out=y)


def _clip_grad(dy, x, dx, lo, hi):
    dx[...] = dy * ((x >= lo) & (x <= hi))


def _elu(x, y, alpha):
    y[...] = np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


def _elu_grad(dy, x, y, dx, alpha):
    # d/dx alpha (e^x - 1) = y + alpha
    dx[...] = dy * np.where(x > 0, 1.0, y + alpha)


def _swish(x, y, half_beta):
    sigmoid = 0.5 * np.tanh(half_beta * x) + 0.5
    y[...] = x * sigmoid
    return sigmoid


def _swish_grad(dy, y, sigmoid, dx, beta):
    by = beta * y
    dx[...] = dy * (by + sigmoid * (1 - by))


FORWARD = {"sigmoid": _sigmoid, "tanh": _tanh, "abs": _abs, "bnll": _bnll, "power": _power,
           "exp": _exp, "log": _log, "threshold": _threshold, "clip": _clip, "elu": _elu,
           "swish": _swish}
BACKWARD = {"sigmoid": _sigmoid_grad, "tanh": _tanh_grad, "abs": _abs_grad,
            "bnll": _bnll_grad, "power": _power_grad, "exp": _exp_grad, "log": _log_grad,
            "clip": _clip_grad, "elu": _elu_grad, "swish": _swish_grad}
# how many arrays backward reads between dy and dx
BACKWARD_INPUTS = {"elu": 2, "swish": 2}
