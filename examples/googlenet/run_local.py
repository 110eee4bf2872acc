#!/usr/bin/env python
"""Start googlenet training on every host of the host file and every device listed below.

    python examples/googlenet/run_local.py [HOSTFILE] [--dry-run]

HOSTFILE has Poseidon's format, one machine per line: <client_id> <ip> <port> (default: the
localserver file at the repository root). The mpiexec command is printed, then run; output
goes to output/caffe.imagenet.S<staleness>.M<hosts>.T<devices>/.
"""
import os
import sys

# ---- settings: edit these ------------------------------------------------------------------
solver_filename = "examples/googlenet/solver.prototxt"
snapshot_filename = ""        # a .solverstate to resume from, or ""
devices = [0]                 # GPU ids per host; CPU workers when no GPU is present
staleness = 0                 # stale-synchronous bound (0 = bulk synchronous)
svb = False                   # allow sufficient-factor broadcasting in auto mode
sync = "auto"                 # auto | ps | sfb | allreduce
dwbp = True                   # wait-free backprop
num_servers = 0               # dedicated parameter-server ranks (0: one shard per host)
dataset = "imagenet"
# ---------------------------------------------------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    os.chdir(ROOT)
    from poseidon_caffe.sync.launcher import run_local
    sys.exit(run_local(dict(solver_filename=solver_filename, snapshot_filename=snapshot_filename,
                            devices=devices, staleness=staleness, svb=svb, sync=sync, dwbp=dwbp,
                            num_servers=num_servers,
                            dataset=dataset), repo_root=ROOT))
