"""The solver's seam to the job it belongs to.

The training loop asks its job at a few fixed points: once an iteration's gradients are complete
(``after_gradients``: exchange them and update), at every iteration boundary
(``requested_action``: stop, snapshot or go on), between test batches (``pending_requests``),
for each test pass (``test``), for each snapshot (``snapshot``), around a run
(``claim_snapshot_prefix``) and when a data error ends it (``snapshot_after_failure``). A single
process is a job of one: ``LocalJob`` answers every question from the solver itself. The
distributed runner (``poseidon_caffe.sync``) gives the solver an object with the same methods
through ``Solver.set_job``, so the loop never changes shape and nothing is replaced from
outside.
"""
import contextlib

from .. import solver_group
from . import signals


class LocalJob:
    """A job of one process: the solver updates its own net, obeys its own signals, tests
    every batch itself and writes its own snapshots."""

    def after_gradients(self, solver):
        """The gradients of this iteration are complete: exchange them and update."""
        solver.apply_update()

    def requested_action(self, solver):
        """The action to take at this iteration boundary (signals.STOP, SNAPSHOT or NONE)."""
        return solver.local_action()

    def pending_requests(self, solver):
        """The requests to act on between two test batches: every one pending, as Caffe's test
        loop asks until none is left."""
        request = self.requested_action(solver)
        while request != signals.NONE:
            yield request
            request = self.requested_action(solver)

    def test(self, solver, test_net_id):
        """One test pass over test net ``test_net_id``: here, every batch in this process."""
        solver.test(test_net_id)

    def snapshot(self, solver):
        """Write the snapshot of this iteration; returns the solver state path."""
        return solver.write_snapshot()

    def snapshot_after_failure(self, solver):
        """A data error ends the run: keep the work so far in a snapshot."""
        solver.snapshot_before_failing()

    def claim_snapshot_prefix(self, solver):
        """A context holding the snapshot prefix for a run (``Solver.hold_snapshot_prefix``)
        in the process that writes the job's snapshots; nothing in the others."""
        if solver_group.root_solver():
            return solver.hold_snapshot_prefix()
        return contextlib.nullcontext()
