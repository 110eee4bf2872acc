"""poseidon-caffe: a Caffe-compatible trainer. Import it as pycaffe: ``import poseidon_caffe as caffe``.

This module is the face only: the names pycaffe users know, each defined in its own room.
"""
from . import thread_budget

thread_budget.apply()          # before numpy loads: ranks sharing a host share its cores

from . import io, proto  # noqa: F401,E402
from .backend import set_device, set_mode_cpu  # noqa: F401,E402
from .gpu_mode import set_mode_gpu  # noqa: F401,E402
from .blob import Blob  # noqa: F401,E402
from .classifier import Classifier  # noqa: F401,E402
from .detector import Detector  # noqa: F401,E402
from .layers import Layer, layer_type_list  # noqa: F401,E402
from .net import Net, TEST, TRAIN  # noqa: F401,E402
from .net_spec import NetSpec, layers, params, to_proto  # noqa: F401,E402
from .rng import set_random_seed  # noqa: F401,E402
from .solver import (AdaDeltaSolver, AdaGradSolver, AdamSolver, NesterovSolver,  # noqa: F401,E402
                     RMSPropSolver, SGDSolver, get_solver)
from .solver_group import (multiprocess, set_multiprocess, set_solver_count,  # noqa: F401,E402
                           set_solver_rank, solver_count, solver_rank)
from .sync.nccl_api import NCCL  # noqa: F401,E402  (mpi4py is loaded only by a group of >1)
from .timer import Timer  # noqa: F401,E402
from . import log  # noqa: F401,E402  (callable: caffe.log(message) writes one INFO line)

__version__ = "0.1.0"


def init_log(*args, **kwargs):
    """pycaffe's init_log: logging is always on here, in glog's line shape."""


def has_nccl():
    """True: caffe.NCCL is available (over MPI)."""
    return True
