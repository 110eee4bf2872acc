"""pycaffe's ``caffe.NCCL``: data-parallel training from a Python script, over MPI.

The shape is Caffe's ``python/train.py``: every solver (here one MPI rank) calls
``caffe.set_solver_count(N)`` and ``caffe.set_solver_rank(r)``, builds its solver, then
``nccl = caffe.NCCL(solver, uid)``, ``nccl.bcast()`` (rank 0's weights to all),
``solver.add_callback(nccl)`` and, when ``layer_wise_reduce`` is on (its default),
``solver.net.after_backward(nccl)``; ``solver.step(n)`` then trains. The gradients are summed
over the solvers with this project's ring allreduce and divided by N, so N solvers of batch B
take the steps of one solver of batch N x B, as in Caffe.

With ``layer_wise_reduce`` each layer's gradients are reduced as soon as backward has passed
it; otherwise (or when the net callback was not registered) all of them once the iteration's
gradients are complete. With one solver every operation is the identity, as Caffe's NCCL on
one GPU. ``uid`` names the group: every solver must pass the same one; ``NCCL.new_uid()``
under ``mpiexec`` draws it on rank 0 and hands it to every rank (call it on all ranks).
"""
import logging
import os

import numpy as np

from .. import log
from .. import solver_group

UID_BYTES = 16
_LAUNCHER_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE")


class NCCLError(RuntimeError):
    """The solvers cannot form one group; the message says which setting disagrees."""


def _launched_size():
    """How many ranks the MPI launcher started (1 when not started by a launcher)."""
    for name in _LAUNCHER_SIZE_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 1


class NCCL:
    def __init__(self, solver, uid):
        if isinstance(uid, str):
            uid = uid.encode("utf-8")
        if not isinstance(uid, (bytes, bytearray)):
            raise TypeError("NCCL(solver, uid): uid must be bytes (NCCL.new_uid()), not %s"
                            % type(uid).__name__)
        solver_group.check_consistent()
        self.solver = solver
        self.uid = bytes(uid)
        self.count = solver_group.solver_count()
        self.rank = solver_group.solver_rank()
        self._params = list(solver.net.learnable_params)
        self._layer_reduced = False
        self._topology = self._ring = None
        if self.count > 1:
            self._join()

    # -- forming the group ----------------------------------------------------------------
    @staticmethod
    def new_uid():
        """A group id (bytes). Under an MPI launcher with several ranks this is collective:
        rank 0 draws it and every rank returns the same value."""
        if _launched_size() > 1:
            from .communicator import world as job
            world = job()
            return world.bcast_object(os.urandom(UID_BYTES) if world.rank == 0 else None)
        return os.urandom(UID_BYTES)

    def _join(self):
        from .communicator import world as job
        from .counters import ByteCounters
        from .strategies.allreduce import RingAllreduce
        from .topology import Topology
        from .transport import Transport
        world = job()
        if world.size != self.count or world.rank != self.rank:
            raise NCCLError(
                "NCCL: this process is solver %d of %d (caffe.set_solver_rank / "
                "set_solver_count) but MPI rank %d of %d: start one process per solver with "
                "mpiexec -n %d and set the rank from MPI"
                % (self.rank, self.count, world.rank, world.size, self.count))
        uids = world.allgather_object(self.uid)
        others = [r for r, u in enumerate(uids) if u != uids[0]]
        if others:
            raise NCCLError("NCCL: solver(s) %s were given another uid than solver 0; every "
                            "solver of one group passes the same uid (NCCL.new_uid() called on "
                            "every rank returns it)" % ", ".join(map(str, others)))
        self._topology = Topology(world)
        counters = ByteCounters()
        self._ring = RingAllreduce(Transport(self._topology, counters), self._topology,
                                   counters)
        if self.rank != 0:
            # as Caffe, the root solver speaks for the group
            log.set_console_level(logging.WARNING)
        log.info("NCCL over MPI: %d solvers on %d host(s)", self.count,
                 self._topology.num_hosts)

    # -- moving values ----------------------------------------------------------------------
    @staticmethod
    def _pack(blobs, which):
        return np.concatenate([np.asarray(b.backend.to_host(getattr(b, which)),
                                          dtype=np.float32).ravel() for b in blobs])

    @staticmethod
    def _unpack(flat, blobs, which):
        offset = 0
        for blob in blobs:
            part = flat[offset:offset + blob.count].reshape(blob.shape)
            getattr(blob, which)[...] = blob.backend.to_device(part)
            offset += blob.count

    def bcast(self):
        """Give every solver the root solver's weights."""
        if self._ring is None or not self._params:
            return
        flat = self._pack(self._params, "data")
        self._topology.world.bcast_array(flat, root=0)
        self._unpack(flat, self._params, "data")

    def _reduce(self, blobs, what):
        if self._ring is None or not blobs:
            return
        flat = self._pack(blobs, "diff")
        self._ring.aggregate(flat, what, what)
        flat *= np.float32(1.0 / self.count)
        self._unpack(flat, blobs, "diff")

    # -- the solver callback (solver.add_callback(nccl)) -------------------------------------
    def on_start(self):
        self._layer_reduced = False

    def on_gradients_ready(self):
        if self.solver.param.layer_wise_reduce and self._layer_reduced:
            return                  # every layer was reduced as backward passed it
        self._reduce(self._params, "gradients")

    # -- the net callback (solver.net.after_backward(nccl)) ----------------------------------
    def run(self, layer_index):
        net = self.solver.net
        if not self.solver.param.layer_wise_reduce:
            raise NCCLError("NCCL as a net callback reduces layer by layer, but the solver sets "
                            "layer_wise_reduce: false; register it with solver.add_callback "
                            "only")
        if len(net.params_list) != len(net.learnable_params):
            raise NCCLError("layer-wise reduce does not support nets with shared weights (net "
                            "%r); set layer_wise_reduce: false in the solver" % net.name)
        self._layer_reduced = True
        self._reduce(net.layers[layer_index].blobs, "layer %s" % net.layer_names[layer_index])

    __call__ = run

    def close(self):
        if self._ring is not None:
            self._ring.close()
            self._topology.free()
            self._ring = self._topology = None
