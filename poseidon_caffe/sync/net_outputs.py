"""Poseidon's ``.netoutputs``: one CSV row per display, the smoothed loss and the train net's
outputs averaged over the workers (every worker takes part in the average; rank 0 writes)."""
import os
import time

import numpy as np


class NetOutputs:
    def __init__(self, solver, topology, scheduler, output_dir, prefix):
        self.topology = topology
        self.scheduler = scheduler
        self.wanted = bool(prefix or output_dir)
        self.path = None
        self.started = time.perf_counter()
        if self.wanted and topology.rank == 0:
            if prefix:
                self.path = prefix + ".netoutputs"        # Poseidon's -net_outputs prefix
            else:
                name = os.path.splitext(os.path.basename(solver.solver_file or "solver"))[0]
                self.path = os.path.join(output_dir, name + ".netoutputs")
            parent = os.path.dirname(self.path)
            if parent:
                os.makedirs(parent, exist_ok=True)

    def write(self, solver):
        if not self.wanted:
            return
        from ..solver.solver import output_values
        values = output_values(solver.net)
        local = np.array([solver.smoothed_loss] + [v for _, vals, _ in values for v in vals],
                         dtype=np.float64)
        world = self.topology.world
        total = self.scheduler.call(lambda: world.allreduce_object(local))
        mean = total / self.topology.size
        if self.path is None:
            return
        new = not os.path.exists(self.path)
        with open(self.path, "a") as f:
            if new:
                names = ["%s_%d" % (name, k) if len(vals) > 1 else name
                         for name, vals, _ in values for k in range(len(vals))]
                f.write(",".join(["iteration", "seconds", "smoothed_loss"] + names) + "\n")
            f.write(",".join([str(solver.iter), "%.3f" % (time.perf_counter() - self.started)]
                             + ["%g" % v for v in mean]) + "\n")
