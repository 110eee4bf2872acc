"""Which solver of a multi-worker job this process is (pycaffe's ``solver_count`` /
``solver_rank`` / ``set_multiprocess``).

Set them before building the solver, as Caffe's ``python/train.py`` does: the training data
layers built afterwards read this solver's share of the records (record k goes to solver
k mod count), the solver's random seed is offset by the rank, and only the root solver
(rank 0) runs the test nets and writes snapshots. ``caffe.NCCL(solver, uid)`` then joins the
solvers over MPI. A plain single process keeps the defaults: one solver, rank 0.
"""
import threading

_lock = threading.Lock()
_state = {"count": 1, "rank": 0, "multiprocess": False}


class SolverGroupError(ValueError):
    pass


def _publish_data_share():
    # the data layers learn their share only once rank and count agree
    count, rank = _state["count"], _state["rank"]
    if 0 <= rank < count:
        from . import data
        data.set_worker(rank, count)


def solver_count():
    return _state["count"]


def set_solver_count(count):
    count = int(count)
    if count < 1:
        raise SolverGroupError("solver_count must be at least 1 (got %d)" % count)
    with _lock:
        _state["count"] = count
        _publish_data_share()


def solver_rank():
    return _state["rank"]


def set_solver_rank(rank):
    rank = int(rank)
    if rank < 0:
        raise SolverGroupError("solver_rank must be 0 or more (got %d)" % rank)
    with _lock:
        _state["rank"] = rank
        _publish_data_share()


def root_solver():
    return _state["rank"] == 0


def multiprocess():
    return _state["multiprocess"]


def set_multiprocess(value):
    """Recorded for pycaffe scripts; every solver here is its own process in any case (MPI
    ranks), so Python layers train under several solvers without restriction."""
    _state["multiprocess"] = bool(value)


def check_consistent():
    """A clear error when the rank does not fit the count (set_solver_rank too large)."""
    count, rank = _state["count"], _state["rank"]
    if rank >= count:
        raise SolverGroupError("solver_rank %d does not fit solver_count %d: call "
                               "caffe.set_solver_count(N) and caffe.set_solver_rank(r) with "
                               "0 <= r < N" % (rank, count))
