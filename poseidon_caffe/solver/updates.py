"""Caffe's update rules as in-place functions over arrays.

Every function works on whatever slice of a parameter it is handed -- the whole blob in a local
solver, or the rows a parameter-server shard owns -- so both apply exactly the same math. The
arrays are modified in place; ``diff`` ends holding the value that ``data -= diff`` subtracts.

Order per parameter, as Caffe's SGDSolver::ApplyUpdate: (global clip) -> normalise by
iter_size -> regularise -> compute update value -> data -= diff. ``clip_scale`` and
``update_value`` are the two steps the solver and the sync engine share: the engine calls them
on gradients that went through the network, so both apply the same rule the same way.
"""
import math

import numpy as np

from .. import log

REGULARIZATION_TYPES = ("L2", "L1")


def _xp(array):
    if isinstance(array, np.ndarray):
        return np
    from ..backend import get_backend
    return get_backend().xp


def clip_scale(sumsq_diff, clip_gradients):
    """The factor Caffe's clip_gradients scales every gradient by, given the sum of squares of
    all learnable parameters' diffs; None when no clipping applies (a negative
    ``clip_gradients`` turns it off). Logs Caffe's line when it scales."""
    if clip_gradients is None or clip_gradients < 0:
        return None
    l2norm = math.sqrt(sumsq_diff)
    if l2norm <= clip_gradients:
        return None
    scale = clip_gradients / l2norm
    log.info("Gradient clipping: scaling down gradients (L2 norm %g > %g) by scale factor %g",
             l2norm, clip_gradients, scale)
    return scale


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


# -- the update value of each rule, by solver type ---------------------------------------------
# Each takes the SolverParameter, the diff (turned into the update value in place), the
# parameter's history arrays (one or two), its local rate and the iteration.

def _sgd_value(param, diff, history, local_rate, iteration):
    sgd(diff, history[0], local_rate, param.momentum)


def _nesterov_value(param, diff, history, local_rate, iteration):
    nesterov(diff, history[0], local_rate, param.momentum)


def _adagrad_value(param, diff, history, local_rate, iteration):
    adagrad(diff, history[0], local_rate, param.delta)


def _rmsprop_value(param, diff, history, local_rate, iteration):
    rmsprop(diff, history[0], local_rate, param.rms_decay, param.delta)


def _adadelta_value(param, diff, history, local_rate, iteration):
    adadelta(diff, history[0], history[1], local_rate, param.momentum, param.delta)


def _adam_value(param, diff, history, local_rate, iteration):
    adam(diff, history[0], history[1], local_rate, param.momentum, param.momentum2, param.delta,
         iteration + 1)


UPDATE_RULES = {"SGD": _sgd_value, "Nesterov": _nesterov_value, "AdaGrad": _adagrad_value,
                "RMSProp": _rmsprop_value, "AdaDelta": _adadelta_value, "Adam": _adam_value}


def update_value(kind, param, diff, history, local_rate, iteration):
    """Turn ``diff`` into the update value of the rule of solver type ``kind``, in place
    (``history`` advances); ``iteration`` is the one being computed (Adam counts from it)."""
    rule = UPDATE_RULES.get(kind)
    if rule is None:
        raise ValueError("no update rule for solver type %r (known types: %s)"
                         % (kind, ", ".join(UPDATE_RULES)))
    rule(param, diff, history, local_rate, iteration)
