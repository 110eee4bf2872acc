"""The solver's update (``solver/update_rule.py``) as the exchanges apply it: by clock, over
array slices, so that a parameter-server shard applies to its rows exactly what a local solver
applies.

``ClockedRule`` pairs the update with the learning rate of each clock; a worker builds it from
its solver (``SolverRule``), a dedicated server from what rank 0 sends it at start
(``ClockedRule`` over ``ScheduledRates``).
"""
import threading

import numpy as np

from ..solver.lr_policy import learning_rate


class ClockedRule:
    """``rule`` (a ``solver.update_rule.UpdateRule``) at the learning rate ``rate_of(clock)``."""

    def __init__(self, rule, rate_of):
        self.rule = rule
        self.rate_of = rate_of              # clock -> the solver's learning rate

    def apply(self, index, data, diff, history, clock):
        """Caffe's update of one parameter (or rows of it): ``data -= update(diff)``."""
        self.rule.apply(index, data, diff, history, self.rate_of(clock), clock)

    def compute(self, index, data, diff, history, clock):
        """Turn the gradient in ``diff`` into the update value, in place (history advances);
        ``data`` is read for weight decay only."""
        self.rule.compute(index, data, diff, history, self.rate_of(clock), clock)


class SolverRule(ClockedRule):
    """A worker's rule: the solver's fields, its net's multipliers, and the rates the solver
    computed (``rate_at`` records one per clock as the compute thread reaches it).

    On a device the solver's history lives there; the host updates of the exchanges (on the
    communication thread, which never touches the device) run on a host copy of it, read once
    here and written back by ``store_history`` before a snapshot. A blob whose update runs on
    the device (``apply_on_device``) keeps its history there."""

    def __init__(self, solver, keep=8):
        self.solver = solver
        self.net = solver.net
        self.rates = {}                  # clock -> the solver's learning rate at it
        self.keep = int(keep)            # clocks kept behind the newest (the staleness, more)
        super().__init__(solver.update_rule, self.rates.__getitem__)
        self.host_copies = None
        params = self.net.learnable_params
        if any(blob.backend.on_device for blob in params):
            self.host_copies = {
                index: [blob.backend.to_host(h).reshape(-1)
                        for h in solver.param_history(index)]
                for index, blob in enumerate(params)}

    def rate_at(self, clock):
        """The solver's learning rate at ``clock`` (the compute thread's current iteration),
        kept for the exchanges of that clock, which may run on after the solver moved on."""
        rates = self.rates
        if clock not in rates:
            rates[clock] = self.solver.get_learning_rate()
            for old in [c for c in rates if c < clock - self.keep]:
                del rates[old]
        return rates[clock]

    def history(self, index):
        if self.host_copies is not None:
            return self.host_copies[index]
        return [h.reshape(-1) for h in self.solver.param_history(index)]

    def keep_on_device(self, index):
        """``index`` is updated on the device with the solver's own history."""
        if self.host_copies is not None:
            self.host_copies.pop(index, None)

    def store_history(self):
        """Write the host copies of the history back into the solver's device arrays (before
        a snapshot); nothing to do on the CPU."""
        if self.host_copies is None:
            return
        params = self.net.learnable_params
        for index, copies in self.host_copies.items():
            for target, host in zip(self.solver.param_history(index), copies):
                params[index].backend.upload(host.reshape(target.shape), target)

    def apply_on_device(self, index, data, diff, clock):
        """Caffe's update of one parameter on the device: the solver's own kernels and
        history (what a single-device solver runs), ``diff`` the averaged gradient."""
        self.rule.apply_on_device(self.net.learnable_params[index].backend, index, data, diff,
                                  self.solver.param_history(index), self.rate_of(clock), clock)

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
