"""Caffe's update rules as in-place functions over arrays.

Every function works on whatever slice of a parameter it is handed -- the whole blob in a local
solver, or the rows a parameter-server shard owns -- so both apply exactly the same math. The
arrays are modified in place; ``diff`` ends holding the value that ``data -= diff`` subtracts.

Order per parameter, as Caffe's SGDSolver::ApplyUpdate: (global clip) -> normalise by
iter_size -> regularise -> compute update value -> data -= diff.
"""
import math

import numpy as np

REGULARIZATION_TYPES = ("L2", "L1")


def _xp(array):
    if isinstance(array, np.ndarray):
        return np
    from ..backend import get_backend
    return get_backend().xp


def clip_scale(sumsq_diff, clip_gradients):
    """Scale factor for Caffe's clip_gradients (global L2 norm over all learnable params).

    Returns (l2norm, scale); scale is None when no clipping applies.
    """
    if clip_gradients < 0:
        return None, None
    l2norm = math.sqrt(sumsq_diff)
    if l2norm > clip_gradients:
        return l2norm, clip_gradients / l2norm
    return l2norm, None


def normalize(diff, iter_size):
    """Gradients accumulated over iter_size passes are averaged."""
    if iter_size != 1:
        diff *= 1.0 / iter_size


def regularize(data, diff, local_decay, regularization_type="L2"):
    """diff += local_decay * data (L2) or local_decay * sign(data) (L1)."""
    if not local_decay:
        return
    if regularization_type == "L2":
        diff += local_decay * data
    elif regularization_type == "L1":
        diff += local_decay * _xp(data).sign(data)
    else:
        raise ValueError("Unknown regularization type: %r (expected L2 or L1)"
                         % regularization_type)


def sgd(diff, history, local_rate, momentum):
    """history = local_rate * diff + momentum * history; diff = history."""
    history *= momentum
    history += local_rate * diff
    diff[...] = history


def nesterov(diff, history, local_rate, momentum):
    """Nesterov's accelerated gradient in Caffe's form:
    h_new = momentum * h + local_rate * diff; diff = (1 + momentum) * h_new - momentum * h."""
    previous = history.copy()
    history *= momentum
    history += local_rate * diff
    diff[...] = (1.0 + momentum) * history - momentum * previous


def adagrad(diff, history, local_rate, delta):
    """history += diff^2; diff = local_rate * diff / (sqrt(history) + delta)."""
    xp = _xp(diff)
    history += diff * diff
    diff *= local_rate / (xp.sqrt(history) + delta)


def rmsprop(diff, history, local_rate, rms_decay, delta):
    """history = rms_decay * history + (1 - rms_decay) * diff^2;
    diff = local_rate * diff / (sqrt(history) + delta)."""
    xp = _xp(diff)
    history *= rms_decay
    history += (1.0 - rms_decay) * (diff * diff)
    diff *= local_rate / (xp.sqrt(history) + delta)


def adadelta(diff, history, history_update, local_rate, momentum, delta):
    """Zeiler's AdaDelta as Caffe computes it (history: squared gradients, history_update:
    squared updates, both decayed by ``momentum``; the result is scaled by local_rate)."""
    xp = _xp(diff)
    history *= momentum
    history += (1.0 - momentum) * (diff * diff)
    diff *= xp.sqrt((history_update + delta) / (history + delta))
    history_update *= momentum
    history_update += (1.0 - momentum) * (diff * diff)
    diff *= local_rate


def adam(diff, m, v, local_rate, beta1, beta2, eps_hat, t):
    """Adam with bias correction, step t = iter + 1 (Caffe's AdamSolver):
    m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    diff = local_rate * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps_hat)."""
    xp = _xp(diff)
    correction = math.sqrt(1.0 - math.pow(beta2, t)) / (1.0 - math.pow(beta1, t))
    m *= beta1
    m += (1.0 - beta1) * diff
    v *= beta2
    v += (1.0 - beta2) * (diff * diff)
    diff[...] = (local_rate * correction) * m / (xp.sqrt(v) + eps_hat)
