"""The six update rules of Caffe as Solver subclasses, and the registry ``get_solver`` uses."""
import os

from .. import io as pio
from ..proto import caffe_pb2
from . import updates
from .solver import Solver, SolverError  # noqa: F401


class SGDSolver(Solver):
    """Stochastic gradient descent with momentum (history = the momentum buffer)."""
    type = "SGD"

    def local_rate(self, param_id, rate):
        return rate * self.net.params_lr[param_id]

    def compute_update_value(self, param_id, rate):
        blob = self.net.learnable_params[param_id]
        updates.sgd(blob.diff, self.history[param_id], self.local_rate(param_id, rate),
                    self.param.momentum)


class NesterovSolver(SGDSolver):
    type = "Nesterov"

    def compute_update_value(self, param_id, rate):
        blob = self.net.learnable_params[param_id]
        updates.nesterov(blob.diff, self.history[param_id], self.local_rate(param_id, rate),
                         self.param.momentum)


class AdaGradSolver(SGDSolver):
    type = "AdaGrad"

    def check_param(self):
        if self.param.momentum != 0:
            raise SolverError("Momentum cannot be used with AdaGrad (momentum: %g)"
                              % self.param.momentum)

    def compute_update_value(self, param_id, rate):
        blob = self.net.learnable_params[param_id]
        updates.adagrad(blob.diff, self.history[param_id], self.local_rate(param_id, rate),
                        self.param.delta)


class RMSPropSolver(SGDSolver):
    type = "RMSProp"

    def check_param(self):
        if self.param.momentum != 0:
            raise SolverError("Momentum cannot be used with RMSProp (momentum: %g)"
                              % self.param.momentum)
        # Caffe's check: 0 <= rms_decay < 1 (at 1 the squared-gradient average never moves)
        if not 0.0 <= self.param.rms_decay < 1.0:
            raise SolverError("rms_decay should lie in [0, 1) (got %g)"
                              % self.param.rms_decay)

    def compute_update_value(self, param_id, rate):
        blob = self.net.learnable_params[param_id]
        updates.rmsprop(blob.diff, self.history[param_id], self.local_rate(param_id, rate),
                        self.param.rms_decay, self.param.delta)


class AdaDeltaSolver(SGDSolver):
    """history[i]: decayed squared gradients; history[i + N]: decayed squared updates."""
    type = "AdaDelta"
    history_sets = 2

    def compute_update_value(self, param_id, rate):
        blob = self.net.learnable_params[param_id]
        n = len(self.net.learnable_params)
        updates.adadelta(blob.diff, self.history[param_id], self.history[param_id + n],
                         self.local_rate(param_id, rate), self.param.momentum, self.param.delta)


class AdamSolver(SGDSolver):
    """history[i]: first moment m; history[i + N]: second moment v."""
    type = "Adam"
    history_sets = 2

    def compute_update_value(self, param_id, rate):
        blob = self.net.learnable_params[param_id]
        n = len(self.net.learnable_params)
        updates.adam(blob.diff, self.history[param_id], self.history[param_id + n],
                     self.local_rate(param_id, rate), self.param.momentum,
                     self.param.momentum2, self.param.delta, self.iter + 1)


SOLVERS = {cls.type: cls for cls in (SGDSolver, NesterovSolver, AdaGradSolver, RMSPropSolver,
                                     AdaDeltaSolver, AdamSolver)}
_LEGACY = {caffe_pb2.SolverParameter.SGD: "SGD", caffe_pb2.SolverParameter.NESTEROV: "Nesterov",
           caffe_pb2.SolverParameter.ADAGRAD: "AdaGrad",
           caffe_pb2.SolverParameter.RMSPROP: "RMSProp",
           caffe_pb2.SolverParameter.ADADELTA: "AdaDelta", caffe_pb2.SolverParameter.ADAM: "Adam"}


def solver_type(param):
    """The type string, reading the legacy ``solver_type`` enum when only it is set."""
    if param.HasField("solver_type"):
        if param.HasField("type"):
            raise SolverError("Failed to upgrade solver: old solver_type field (enum) and new "
                              "type field (string) cannot be both specified.")
        return _LEGACY[param.solver_type]
    return param.type


def get_solver(param, exchange=None, solver_file=None):
    """A solver of the type the parameters name (pycaffe's ``caffe.get_solver``)."""
    if isinstance(param, (str, os.PathLike)):
        solver_file = os.fspath(param)
        param = pio.read_solver_param(solver_file)
    name = solver_type(param)
    if name not in SOLVERS:
        raise SolverError("Unknown solver type: %r (known types: %s)"
                          % (name, ", ".join(SOLVERS)))
    return SOLVERS[name](param, exchange=exchange, solver_file=solver_file)
