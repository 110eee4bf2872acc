"""Share the host's cores among the worker ranks that run on it.

Each MPI rank of a distributed job loads its own BLAS, which by default starts one thread per
core. With several ranks on one host that oversubscribes the cores, and BLAS threads that spin
while they wait turn a few milliseconds of work into hundreds (measured here: LeNet on 2 ranks
of a 2-core host ran 9x slower). So, before numpy is first imported, a rank that knows how many
ranks share its host gives BLAS its share of the cores — unless the user chose a count.
This module must not import numpy.
"""
import os

_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
# set by MPICH's hydra and by Open MPI's launcher
_LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")


def local_rank_count(environ=os.environ):
    for var in _LOCAL_SIZE_VARS:
        value = environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def apply(environ=os.environ, cores=None):
    """Set the BLAS thread count for this rank; returns it, or None when nothing was set."""
    if any(environ.get(var) for var in _THREAD_VARS):
        return None
    local = local_rank_count(environ)
    if local <= 1:
        return None
    share = max(1, (cores or os.cpu_count() or 1) // local)
    for var in _THREAD_VARS:
        environ[var] = str(share)
    return share
