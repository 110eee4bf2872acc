"""What each worker keeps beside a job's snapshot set, and puts back on resume: its random and
data-cursor state (``<prefix>_iter_N.rank<r>.rngstate``; rank 0's is the solver's own side
file) and, with ``-ps_update=worker``, its own solver history (``...rank<r>.history.npz``)."""
import io
import os

import numpy as np

from .. import log
from .. import rng
from ..solver import snapshot as snap


def rank_state_path(state_path, rank):
    """Rank ``rank``'s name beside the solver state ``state_path``."""
    for ext in (".solverstate.h5", ".solverstate"):
        if state_path.endswith(ext):
            return "%s.rank%d%s" % (state_path[:-len(ext)], rank, ext)
    return "%s.rank%d" % (state_path, rank)


def history_path(state_path, rank):
    """<prefix>_iter_N.rank<r>.history.npz beside the rank's .rngstate."""
    rank_state = snap.rngstate_filename(rank_state_path(state_path, rank))
    return rank_state[:-len(".rngstate")] + ".history.npz"


def restore(solver, topology, state_file, worker_updates):
    """Put back this rank's random and data-cursor state from the snapshot being resumed.
    Rank 0's is the solver's own side file (the solver restored it once already, but the
    per-rank seeding has just replaced it)."""
    if not state_file:
        return
    rank = topology.rank
    extra = snap.read_rngstate(state_file if rank == 0 else rank_state_path(state_file, rank))
    if rank == 0 and snap.written_with_side_files(state_file):
        # rank 0's own side file the solver's restore has checked; the other ranks' here
        missing = [snap.rngstate_filename(rank_state_path(state_file, r))
                   for r in range(1, topology.size)]
        missing = [path for path in missing if not os.path.exists(path)]
        if missing:
            log.warning("Snapshot set %s is incomplete: %s missing, so those ranks' random "
                        "generators and data positions are not restored: the resumed run "
                        "will not repeat an uninterrupted one", state_file,
                        " and ".join(missing) + (" are" if len(missing) > 1 else " is"))
    if extra is not None:
        rng.set_state(extra["rng"])
        solver.set_layer_resume_states(extra.get("layers", {}))
        log.info("Rank %d: restored its random and data-cursor state", rank)
    if worker_updates and rank != 0:
        _restore_worker_history(solver, rank, history_path(state_file, rank))


def _restore_worker_history(solver, rank, path):
    """With -ps_update=worker every worker keeps its own solver history; rank 0's is in
    the solver state, the others' beside their random state."""
    if not os.path.exists(path):
        log.warning("Rank %d: no %s; this worker resumes with rank 0's solver history",
                    rank, path)
        return
    with np.load(path) as saved:
        arrays = [saved["h%d" % i] for i in range(len(saved.files))]
    history = solver.history
    if len(arrays) != len(history) or any(a.shape != tuple(h.shape)
                                          for a, h in zip(arrays, history)):
        raise ValueError("%s holds %d history blobs that do not fit this solver's %d"
                         % (path, len(arrays), len(history)))
    params = solver.net.learnable_params
    for i, (target, array) in enumerate(zip(history, arrays)):
        # upload: the history may live on a device (the identity copy on the CPU)
        params[i % len(params)].backend.upload(array, target)
    log.info("Rank %d: restored its own solver history", rank)


def write_worker_history(solver, path):
    from ..io import atomic_write
    buf = io.BytesIO()
    params = solver.net.learnable_params
    np.savez(buf, **{"h%d" % i: params[i % len(params)].backend.to_host(h)
                     for i, h in enumerate(solver.history)})
    atomic_write(path, buf.getvalue())
