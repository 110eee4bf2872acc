"""The six solvers of Caffe by name, and the registry ``get_solver`` uses.

Each class names its rule (``type``: the update value is ``updates.UPDATE_RULES[type]``), checks
the fields the rule forbids and says how many history arrays per parameter the rule keeps.
"""
import os

from .. import io as pio
from ..proto import caffe_pb2
from .solver import Solver, SolverError  # noqa: F401


class SGDSolver(Solver):
    """Stochastic gradient descent with momentum (history = the momentum buffer)."""
    type = "SGD"


class NesterovSolver(SGDSolver):
    type = "Nesterov"


class AdaGradSolver(SGDSolver):
    type = "AdaGrad"

    def check_param(self):
        if self.param.momentum != 0:
            raise SolverError("Momentum cannot be used with AdaGrad (momentum: %g)"
                              % self.param.momentum)


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


class AdaDeltaSolver(SGDSolver):
    """history[i]: decayed squared gradients; history[i + N]: decayed squared updates."""
    type = "AdaDelta"
    history_sets = 2


class AdamSolver(SGDSolver):
    """history[i]: first moment m; history[i + N]: second moment v."""
    type = "Adam"
    history_sets = 2


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


def get_solver(param, job=None, solver_file=None):
    """A solver of the type the parameters name (pycaffe's ``caffe.get_solver``)."""
    if isinstance(param, (str, os.PathLike)):
        solver_file = os.fspath(param)
        param = pio.read_solver_param(solver_file)
    name = solver_type(param)
    if name not in SOLVERS:
        raise SolverError("Unknown solver type: %r (known types: %s)"
                          % (name, ", ".join(SOLVERS)))
    return SOLVERS[name](param, job=job, solver_file=solver_file)
