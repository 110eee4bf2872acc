"""Caffe's learning-rate policies as one pure function of (solver parameters, iteration, step).

The multistep policy carries a position (``current_step``) that a snapshot stores, so the
function takes the position in and hands the new one back instead of keeping state.
"""
import math

POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")


class LearningRatePolicyError(ValueError):
    """A learning-rate policy that is unknown or misses a field it needs; the message names it."""


def _pow(base, exponent):
    """base ** exponent as C's pow gives it: overflow is infinity and a negative base with a
    fractional exponent is NaN, where Python's math.pow would raise."""
    try:
        return math.pow(base, exponent)
    except OverflowError:
        return math.inf
    except ValueError:
        return math.nan


def _sigmoid(x):
    """1 / (1 + exp(-x)), going smoothly to 0 for very negative x instead of overflowing."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def learning_rate(param, it, current_step=0):
    """Return (rate, current_step) for iteration ``it`` under ``param.lr_policy``.

    fixed:     base_lr
    step:      base_lr * gamma ^ floor(iter / stepsize)
    exp:       base_lr * gamma ^ iter
    inv:       base_lr * (1 + gamma * iter) ^ (-power)
    multistep: base_lr * gamma ^ (number of stepvalue entries passed)
    poly:      base_lr * (1 - iter / max_iter) ^ power
    sigmoid:   base_lr * 1 / (1 + exp(-gamma * (iter - stepsize)))
    """
    policy = param.lr_policy
    base_lr = param.base_lr
    if policy == "fixed":
        return base_lr, current_step
    if policy == "step":
        if param.stepsize <= 0:
            raise LearningRatePolicyError("lr_policy \"step\" needs stepsize > 0 (got %d)"
                                          % param.stepsize)
        current_step = it // param.stepsize
        return base_lr * _pow(param.gamma, current_step), current_step
    if policy == "exp":
        return base_lr * _pow(param.gamma, it), current_step
    if policy == "inv":
        return base_lr * _pow(1.0 + param.gamma * it, -param.power), current_step
    if policy == "multistep":
        # one step per call at most, as Caffe: the solver asks once per iteration
        if current_step < len(param.stepvalue) and it >= param.stepvalue[current_step]:
            current_step += 1
        return base_lr * _pow(param.gamma, current_step), current_step
    if policy == "poly":
        if param.max_iter <= 0:
            raise LearningRatePolicyError("lr_policy \"poly\" needs max_iter > 0")
        frac = 1.0 - float(it) / param.max_iter
        return base_lr * _pow(frac, param.power), current_step
    if policy == "sigmoid":
        return base_lr * _sigmoid(param.gamma * (it - param.stepsize)), current_step
    raise LearningRatePolicyError("Unknown learning rate policy: %r (expected one of %s)"
                                  % (policy, ", ".join(POLICIES)))
