"""Benchmark of the sync engine on one machine (ranks play hosts: ranks_per_host=1).

For LeNet (MNIST shapes) and Caffe's CIFAR-10 quick net on 1, 2 and 4 ranks: iterations per
second, off-host bytes per iteration per worker by mode, and the share of communication hidden
by wait-free backprop: (T_dwbp_off - T_dwbp_on) / (T_dwbp_off - T_compute), T_compute being
the 1-rank iteration time at the same per-worker batch.

    python scripts/bench_sync.py [--iters 20] [--ranks 1,2,4] [--modes auto,ps,sfb,allreduce]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

WORKER = r'''
import json, sys, time, types
import poseidon_caffe  # first: it gives each rank its share of the cores before numpy loads
import numpy as np
from mpi4py import MPI
from google.protobuf import text_format
from poseidon_caffe import sync
from poseidon_caffe.proto import caffe_pb2
from poseidon_caffe.solver import get_solver
net_text, iters, mode, dwbp, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1", sys.argv[5]
comm = MPI.COMM_WORLD
sp = caffe_pb2.SolverParameter()
text_format.Merge('base_lr: 0.001 momentum: 0.9 lr_policy: "fixed" display: 0 random_seed: 1 max_iter: 100000', sp)
text_format.Merge(open(net_text).read(), sp.net_param)
solver = get_solver(sp)
runner = None
if comm.size > 1:
    runner = sync.attach(solver, types.SimpleNamespace(sync=mode, dwbp=dwbp, svb=True, ranks_per_host=1))
rng = np.random.default_rng(comm.rank)
data, label = solver.net.blobs["data"], solver.net.blobs["label"]
data.data[...] = rng.standard_normal(data.shape)
label.data[...] = rng.integers(0, 10, label.shape)
solver.step(3)
if runner: runner.engine.sync_point()
comm.Barrier()
t0 = time.perf_counter()
solver.step(iters)
if runner: runner.engine.sync_point()
seconds = (time.perf_counter() - t0) / iters
result = {"seconds": seconds}
if runner:
    runner.finish()
    st = runner.engine.stats()
    result["bytes"] = sum(r["sent"] + r["received"] for r in st["measured"].values())
    result["predicted"] = sum(st["predicted"].values())
    result["plan"] = st["plan"]
res = comm.gather(result, root=0)
if comm.rank == 0:
    json.dump(res, open(out, "w"))
'''

LENET = """
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 64 dim: 1 dim: 28 dim: 28 } } }
layer { name: "label" type: "Input" top: "label" input_param { shape { dim: 64 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 20 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2" convolution_param { num_output: 50 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1" inner_product_param { num_output: 500 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""

CIFAR = """
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 50 dim: 3 dim: 32 dim: 32 } } }
layer { name: "label" type: "Input" top: "label" input_param { shape { dim: 50 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 32 pad: 2 kernel_size: 5 weight_filler { type: "gaussian" std: 0.0001 } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "relu1" type: "ReLU" bottom: "pool1" top: "pool1" }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2" convolution_param { num_output: 32 pad: 2 kernel_size: 5 weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "conv3" type: "Convolution" bottom: "pool2" top: "conv3" convolution_param { num_output: 64 pad: 2 kernel_size: 5 weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "relu3" type: "ReLU" bottom: "conv3" top: "conv3" }
layer { name: "pool3" type: "Pooling" bottom: "conv3" top: "pool3" pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool3" top: "ip1" inner_product_param { num_output: 64 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" inner_product_param { num_output: 10 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


def run(tmp, net, ranks, iters, mode, dwbp):
    worker = os.path.join(tmp, "worker.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    net_path = os.path.join(tmp, "net.prototxt")
    with open(net_path, "w") as f:
        f.write(net)
    out = os.path.join(tmp, "out.json")
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    proc = subprocess.run([mpiexec, "-n", str(ranks), sys.executable, worker, net_path, str(iters),
                           mode, "1" if dwbp else "0", out], capture_output=True, text=True,
                          env=dict(os.environ, POSEIDON_NO_PROGRESS="1"))
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    with open(out) as f:
        return json.load(f)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--modes", default="auto,ps,sfb,allreduce")
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, net in (("LeNet", LENET), ("CIFAR-10 quick", CIFAR)):
            compute = run(tmp, net, 1, a.iters, "auto", True)[0]["seconds"]
            print("%s: 1 rank: %.2f iter/s (compute alone %.1f ms/iter)"
                  % (name, 1 / compute, compute * 1e3))
            for ranks in [int(r) for r in a.ranks.split(",") if int(r) > 1]:
                for mode in a.modes.split(","):
                    on = run(tmp, net, ranks, a.iters, mode, True)
                    off = run(tmp, net, ranks, a.iters, mode, False)
                    t_on = max(r["seconds"] for r in on)
                    t_off = max(r["seconds"] for r in off)
                    per_worker = sum(r["bytes"] for r in on) / len(on)
                    comm = t_off - compute
                    hidden = (t_off - t_on) / comm if comm > 0 else float("nan")
                    print("%s: %d ranks %-9s %6.2f iter/s (dwbp off %6.2f), %9.1f KB/iter/worker "
                          "(predicted %9.1f), comm hidden by DWBP %5.1f%%"
                          % (name, ranks, mode, 1 / t_on, 1 / t_off, per_worker / 1024,
                             on[0]["predicted"] / 1024, 100 * hidden))
                    sys.stdout.flush()


if __name__ == "__main__":
    main()
