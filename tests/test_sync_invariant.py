"""The invariant of the sync engine, on real mpiexec runs over loopback: with staleness 0,
P workers of batch B end with the same weights as one worker of batch P*B, in every mode, with
wait-free backprop on and off; 2 hosts x 2 devices equal the flat run; byte counters match the
planner's prediction and show the off-host traffic on host leaders only."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from google.protobuf import text_format

from poseidon_caffe.proto import caffe_pb2
from poseidon_caffe.solver import get_solver
from poseidon_caffe.sync.shard_store import PIECE_VALUES

pytestmark = pytest.mark.mpi          # every test here runs mpiexec

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
ITERS = 3

NET = """
name: "tiny"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: %(B)d dim: 2 dim: 6 dim: 6 } } }
layer { name: "label" type: "Input" top: "label" input_param { shape { dim: %(B)d } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "ip1" type: "InnerProduct" bottom: "conv1" top: "ip1"
  inner_product_param { num_output: 12 weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "relu2" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""
SOLVER = ('base_lr: 0.1 momentum: 0.9 weight_decay: 0.001 lr_policy: "step" gamma: 0.5 '
          'stepsize: 2 display: 0 random_seed: 5 max_iter: %d' % ITERS)


def make_solver(batch):
    sp = caffe_pb2.SolverParameter()
    text_format.Merge(SOLVER, sp)
    text_format.Merge(NET % {"B": batch}, sp.net_param)
    return get_solver(sp)


def dataset(total_batch):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((ITERS, total_batch, 2, 6, 6)).astype(np.float32)
    Y = rng.integers(0, 3, (ITERS, total_batch)).astype(np.float32)
    return X, Y


def train(solver, X, Y, rank, batch):
    for it in range(ITERS):
        solver.net.blobs["data"].data[...] = X[it, rank * batch:(rank + 1) * batch]
        solver.net.blobs["label"].data[...] = Y[it, rank * batch:(rank + 1) * batch]
        solver.step(1)
    return [b.data.copy() for b in solver.net.learnable_params]


WORKER = r'''
import json, sys, types
import numpy as np
from mpi4py import MPI
sys.path.insert(0, sys.argv[1])
import test_sync_invariant as t
from poseidon_caffe import sync
from poseidon_caffe.sync import shard_store
shard_store.PIECE_VALUES = int(sys.argv[6])
comm = MPI.COMM_WORLD
batch, rph, out = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
modes = [(m, d == "1") for m, d in (x.split(":") for x in sys.argv[5].split(","))]
X, Y = t.dataset(batch * comm.size)
results, stats = {}, {}
for mode, dwbp in modes:
    solver = t.make_solver(batch)
    runner = sync.attach(solver, types.SimpleNamespace(sync=mode, dwbp=dwbp, svb=True,
                                                       staleness=0, ranks_per_host=rph))
    t.train(solver, X, Y, comm.rank, batch)
    runner.finish()   # the last exchanges may still be in flight until here
    weights = [b.data.copy() for b in solver.net.learnable_params]
    key = "%s_%d" % (mode, dwbp)
    results.update({"%s_%d" % (key, i): w for i, w in enumerate(weights)})
    stats[key] = comm.gather(runner.engine.stats(), root=0)
if comm.rank == 0:
    np.savez(out + ".npz", **results)
    with open(out + ".json", "w") as f:
        json.dump(stats, f)
'''

MODES = ["ps:1", "ps:0", "sfb:1", "sfb:0", "allreduce:1", "allreduce:0", "auto:1", "auto:0"]


def run_job(tmp_path, ranks, batch, ranks_per_host, modes, piece_values=PIECE_VALUES):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = str(tmp_path / "result")
    env = dict(os.environ, POSEIDON_NO_PROGRESS="1")
    proc = subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, str(script),
                           os.path.dirname(__file__), str(batch), str(ranks_per_host), out,
                           ",".join(modes), str(piece_values)], capture_output=True,
                          text=True, timeout=240,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    weights = np.load(out + ".npz")
    with open(out + ".json") as f:
        stats = json.load(f)
    return weights, stats


def reference(total_batch):
    X, Y = dataset(total_batch)
    return train(make_solver(total_batch), X, Y, 0, total_batch)


def check_same(weights, ref, key):
    for i, expected in enumerate(ref):
        got = weights["%s_%d" % (key, i)]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=2e-6,
                                   err_msg="%s, learnable blob %d" % (key, i))


def check_bytes_match_prediction(rank_stats):
    """Off-host bytes averaged over the host leaders equal the plan's per-host prediction."""
    leaders = [s for s in rank_stats if s["is_leader"]]
    for name, predicted in leaders[0]["predicted"].items():
        measured = np.mean([s["measured"].get(name, {}).get("sent", 0)
                            + s["measured"].get(name, {}).get("received", 0) for s in leaders])
        assert measured == pytest.approx(predicted, rel=0.05, abs=1.0), name


@pytest.mark.parametrize("ranks,batch", [(2, 4), (4, 2)])
def test_p_workers_equal_one_worker_of_p_times_batch(tmp_path, ranks, batch):
    ref = reference(ranks * batch)
    weights, stats = run_job(tmp_path, ranks, batch, 1, MODES)
    for mode in MODES:
        key = mode.replace(":", "_")
        check_same(weights, ref, key)
        check_bytes_match_prediction(stats[key])
    plans = {key: stats[key][0]["plan"] for key in stats}
    assert set(plans["ps_1"].values()) == {"ps"}
    assert plans["sfb_1"]["ip1[0]"] == "sfb" and plans["sfb_1"]["conv1[0]"] == "ps"
    assert set(plans["allreduce_1"].values()) == {"allreduce"}
    # every worker ends with the same replica
    assert all(s["iterations"] == ITERS for s in stats["auto_1"])


def test_parameter_server_in_pieces_equals_one_worker(tmp_path):
    # pieces of 16 values: every row of every blob travels as a message of its own
    ref = reference(8)
    weights, stats = run_job(tmp_path, 4, 2, 1, ["ps:1", "ps:0"], piece_values=16)
    for key in ("ps_1", "ps_0"):
        check_same(weights, ref, key)
        check_bytes_match_prediction(stats[key])


def test_two_hosts_of_two_devices_equal_the_flat_run(tmp_path):
    ref = reference(8)
    modes = ["auto:1", "allreduce:1", "ps:0"]
    weights, stats = run_job(tmp_path, 4, 2, 2, modes)
    for mode in modes:
        key = mode.replace(":", "_")
        check_same(weights, ref, key)
        ranks = stats[key]
        assert [s["host"] for s in ranks] == [0, 0, 1, 1]
        for s in ranks:
            off_host = sum(row["sent"] + row["received"] for row in s["measured"].values())
            on_host = sum(row["local_sent"] + row["local_received"]
                          for row in s["measured"].values())
            if s["is_leader"]:
                assert off_host > 0 and on_host > 0
            else:
                # a device talks only to its host's leader: no off-host exchange of its own
                assert off_host == 0 and on_host > 0
        check_bytes_match_prediction(ranks)
        if mode == "allreduce:1":
            # the ring runs over the 2 hosts: 2 MN (P-1)/P each way with P = 2, not P = 4
            count = sum(weights["%s_%d" % (key, i)].size for i in range(6))
            predicted = sum(ranks[0]["predicted"].values())
            assert predicted == pytest.approx(4 * 4.0 * count * (2 - 1) / 2)
