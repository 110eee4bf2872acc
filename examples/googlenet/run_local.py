#!/usr/bin/env python
"""Start googlenet training, as Poseidon's run_local.py does, in either of two ways:

    python examples/googlenet/run_local.py [HOSTFILE] [--dry-run]
        the whole job from here: one mpiexec over every host of the host file;
    python examples/googlenet/run_local.py <client_id> <hostfile> [use-yarn] [--dry-run]
        Poseidon's form, run once on every host (e.g. by a cluster script over ssh); the
        invocations join one MPI job, client 0 leading (see poseidon_caffe/launch/join.py).

HOSTFILE has Poseidon's format, one machine per line: <client_id> <ip> <port> (default: the
localserver file at the repository root). Output goes to
output/caffe.imagenet.S<table_staleness>.M<hosts>.T<devices>/: logs.<client_id>/ per client,
imagenet.netoutputs and caffe_stats.yaml.
"""
import os
import sys

# ---- settings (Poseidon's names): edit these -----------------------------------------------
solver = "examples/googlenet/solver.prototxt"
snapshot = ""                 # a .solverstate to resume from, or ""
devices = [0]                 # GPU ids per host: one rank per id, binding that GPU (e.g.
                              # [0, 1, 2, 3]); CPU workers when no GPU is present
table_staleness = 0           # stale-synchronous bound (0 = bulk synchronous)
svb = True                   # sufficient factors for InnerProduct weights across hosts
net_outputs = ""              # prefix of the .netoutputs file ("": <output>/imagenet)
stats_path = ""               # the job's sync statistics ("": <output>/caffe_stats.yaml)
consistency_model = "SSPPush"
# Bösen tuning knobs: accepted, logged, no effect here
num_table_threads = len(devices) + 1
num_rows_per_table = 32
num_comm_channels_per_client = 8
init_thread_access_table = True
# this project's own
sync = "auto"                 # auto | ps | sfb | allreduce
dwbp = True                   # wait-free backprop
ps_update = "server"          # server: one update of the averaged gradient; worker: Poseidon's
num_servers = 0               # dedicated parameter-server ranks (0: one shard per host)
dataset = "imagenet"
# ---------------------------------------------------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    try:
        from poseidon_caffe.tools.launch import run_local_script
    except KeyboardInterrupt:                 # Ctrl-C while the library loads: no traceback
        sys.exit(130)
    sys.exit(run_local_script(globals(), ROOT))
