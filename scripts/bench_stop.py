"""What the job-wide stop agreement costs: time the compute thread spends in it at each
iteration boundary of a 2-rank LeNet run (MNIST shapes), next to the iteration time.

    python scripts/bench_stop.py [--iters 100] [--modes allreduce,ps]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sync import LENET  # noqa: E402

WORKER = r'''
import json, sys, time, types
import poseidon_caffe  # first: it gives each rank its share of the cores before numpy loads
import numpy as np
from mpi4py import MPI
from google.protobuf import text_format
from poseidon_caffe import sync
from poseidon_caffe.proto import caffe_pb2
from poseidon_caffe.solver import get_solver
net_text, iters, mode, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
comm = MPI.COMM_WORLD
sp = caffe_pb2.SolverParameter()
text_format.Merge('base_lr: 0.001 momentum: 0.9 lr_policy: "fixed" display: 0 random_seed: 1 '
                  'max_iter: 100000', sp)
text_format.Merge(open(net_text).read(), sp.net_param)
solver = get_solver(sp)
runner = sync.attach(solver, types.SimpleNamespace(sync=mode, ranks_per_host=1))
agreed = solver.requested_action
spent = []

def timed():
    t = time.perf_counter()
    action = agreed()
    spent.append(time.perf_counter() - t)
    return action
solver.requested_action = timed
rng = np.random.default_rng(comm.rank)
data, label = solver.net.blobs["data"], solver.net.blobs["label"]
data.data[...] = rng.standard_normal(data.shape)
label.data[...] = rng.integers(0, 10, label.shape)
solver.step(3)
del spent[:]
t0 = time.perf_counter()
solver.step(iters)
seconds = (time.perf_counter() - t0) / iters
runner.finish()
res = comm.gather({"seconds": seconds, "median": float(np.median(spent)),
                   "p90": float(np.percentile(spent, 90)), "mean": float(np.mean(spent))}, root=0)
if comm.rank == 0:
    json.dump(res, open(out, "w"))
'''


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--modes", default="allreduce,ps")
    a = parser.parse_args()
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    with tempfile.TemporaryDirectory() as tmp:
        worker, net, out = (os.path.join(tmp, n) for n in ("worker.py", "net.prototxt", "out.json"))
        with open(worker, "w") as f:
            f.write(WORKER)
        with open(net, "w") as f:
            f.write(LENET)
        for mode in a.modes.split(","):
            proc = subprocess.run([mpiexec, "-n", "2", sys.executable, worker, net, str(a.iters),
                                   mode, out], capture_output=True, text=True,
                                  env=dict(os.environ, POSEIDON_NO_PROGRESS="1"))
            if proc.returncode:
                raise SystemExit(proc.stderr[-3000:])
            with open(out) as f:
                for rank, r in enumerate(json.load(f)):
                    print("LeNet, 2 ranks, %-9s rank %d: %.1f ms/iter; stop agreement per "
                          "boundary: median %.1f us, 90%% %.1f us, mean %.1f us"
                          % (mode, rank, r["seconds"] * 1e3, r["median"] * 1e6,
                             r["p90"] * 1e6, r["mean"] * 1e6))


if __name__ == "__main__":
    main()
