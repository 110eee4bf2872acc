"""Caffe's ApplyUpdate per parameter over array slices (normalise, regularise, then the update
value of the solver's rule from ``solver.updates``), so that a parameter-server shard applies
to its rows exactly what a local solver applies.

``UpdateRule`` needs only the solver's parameters, each blob's lr and decay multipliers and the
learning rate of every clock; a worker builds it from its solver (``SolverRule``), a dedicated
server from what rank 0 sends it at start (``ServerRule`` with ``ScheduledRates``).
"""
import threading

import numpy as np

from ..solver import updates
from ..solver.lr_policy import learning_rate


class UpdateRule:
    def __init__(self, param, kind, lr_mult, decay_mult, rate_of):
        self.param = param
        self.kind = kind
        self.lr_mult = lr_mult              # index -> the blob's lr multiplier
        self.decay_mult = decay_mult        # index -> the blob's weight decay multiplier
        self.rate_of = rate_of              # clock -> the solver's learning rate

    def apply(self, index, data, diff, history, clock):
        """Caffe's update of one parameter (or rows of it): ``data -= update(diff)``."""
        self.compute(index, data, diff, history, clock)
        data -= diff

    def compute(self, index, data, diff, history, clock):
        """Turn the gradient in ``diff`` into the update value, in place (history advances);
        ``data`` is read for weight decay only."""
        p, u = self.param, updates
        u.normalize(diff, p.iter_size)
        u.regularize(data, diff, p.weight_decay * self.decay_mult[index], p.regularization_type)
        rate = self.rate_of(clock) * self.lr_mult[index]
        u.update_value(self.kind, p, diff, history, rate, clock)


class SolverRule(UpdateRule):
    """A worker's rule: the solver's fields, its net's multipliers, and the rates the solver
    computed (``rates`` is filled by the runner, one entry per clock)."""

    def __init__(self, solver):
        self.solver = solver
        self.net = solver.net
        self.rates = {}
        super().__init__(solver.param, solver.type, self.net.params_lr,
                         self.net.params_weight_decay, self.rates.__getitem__)

    def history(self, index):
        return [h.reshape(-1) for h in self.solver.param_history(index)]

    def initial_history(self, index):
        return [np.asarray(h, dtype=np.float32) for h in self.history(index)]


class ScheduledRates:
    """The learning rate of each clock from the solver's policy, computed in clock order from
    where the workers' solver stood at start (multistep carries its position along)."""

    def __init__(self, param, start_clock, current_step, keep=64):
        self.param = param
        self.next_clock = int(start_clock)
        self.step = int(current_step)
        self.rates = {}
        self.keep = int(keep)
        self.lock = threading.Lock()     # updates run on more than one thread

    def __call__(self, clock):
        with self.lock:
            return self._rate(clock)

    def _rate(self, clock):
        while self.next_clock <= clock:
            self.rates[self.next_clock], self.step = learning_rate(self.param, self.next_clock,
                                                                   self.step)
            self.next_clock += 1
        rate = self.rates[clock]
        for old in [c for c in self.rates if c < self.next_clock - self.keep]:
            del self.rates[old]
        return rate
