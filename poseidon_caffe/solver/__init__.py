"""Solvers and the training loop: ``get_solver``, the six solver classes by Caffe's names."""
from .solver import Solver, SolverError, TrainingDiverged, TRAIN, TEST  # noqa: F401
from .job import LocalJob  # noqa: F401
from .solvers import (SGDSolver, NesterovSolver, AdaGradSolver, RMSPropSolver,  # noqa: F401
                      AdaDeltaSolver, AdamSolver, SOLVERS, get_solver, solver_type)
from .snapshot import SnapshotError  # noqa: F401
from .signals import SignalHandler  # noqa: F401

__all__ = ["Solver", "SolverError", "TrainingDiverged", "LocalJob", "SGDSolver",
           "NesterovSolver", "AdaGradSolver", "RMSPropSolver", "AdaDeltaSolver", "AdamSolver",
           "get_solver", "SignalHandler", "SnapshotError"]
