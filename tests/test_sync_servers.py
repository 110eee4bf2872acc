"""Dedicated parameter-server ranks (-server_ranks=N), on real mpiexec runs over loopback: the
last N ranks hold the shards and build no net. P workers of batch B still end with the same
weights as one worker of batch P*B (ps mode, DWBP on and off, momentum); a snapshot gathers the
servers' history so that resuming continues exactly; the byte counters match the cost model for
dedicated servers (a host moves 2MN, a server node 2MN P/S); a stale-synchronous run converges
within its bound; a worker that raises ends the whole job, servers included, with its name."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import test_sync_invariant as inv
from poseidon_caffe.launch.command import build_command
from poseidon_caffe.sync import planner
from poseidon_caffe.sync.engine import FactorSource

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
ENV = dict(os.environ, POSEIDON_NO_PROGRESS="1")

WORKER = r'''
import json, sys, types
import numpy as np
from mpi4py import MPI
sys.path.insert(0, sys.argv[1])
import test_sync_invariant as t
from poseidon_caffe import sync
job = MPI.COMM_WORLD
batch, servers, out = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
modes = [(m, d == "1") for m, d in (x.split(":") for x in sys.argv[5].split(","))]
resume = sys.argv[6] == "1"

def options(mode, dwbp):
    return types.SimpleNamespace(sync=mode, dwbp=dwbp, svb=True, staleness=0, ranks_per_host=1,
                                 server_ranks=servers)

def run(solver, X, Y, rank, first, last):
    for it in range(first, last):
        solver.net.blobs["data"].data[...] = X[it, rank * batch:(rank + 1) * batch]
        solver.net.blobs["label"].data[...] = Y[it, rank * batch:(rank + 1) * batch]
        solver.step(1)

sessions = ["%s_%d" % (m, d) for m, d in modes] + (["resume_a", "resume_b"] if resume else [])
stats, results = {}, {}
if sync.is_server(options("ps", True)):
    for key in sessions:
        stats[key] = sync.serve(options("ps", True))
else:
    P = job.size - servers
    X, Y = t.dataset(batch * P)
    for mode, dwbp in modes:
        key = "%s_%d" % (mode, dwbp)
        solver = t.make_solver(batch)
        runner = sync.attach(solver, options(mode, dwbp))
        run(solver, X, Y, job.rank, 0, t.ITERS)
        runner.finish()
        results.update({"%s_%d" % (key, i): b.data.copy()
                        for i, b in enumerate(solver.net.learnable_params)})
        stats[key] = runner.engine.stats()
    if resume:
        solver = t.make_solver(batch)
        solver.param.snapshot_prefix = out + "_snap"
        runner = sync.attach(solver, options("ps", True))
        run(solver, X, Y, job.rank, 0, 2)
        state = runner.snapshot()
        runner.finish()
        stats["resume_a"] = runner.engine.stats()
        solver = t.make_solver(batch)
        solver.restore(state)
        runner = sync.attach(solver, options("ps", True))
        run(solver, X, Y, job.rank, 2, t.ITERS)
        runner.finish()
        results.update({"resume_%d" % i: b.data.copy()
                        for i, b in enumerate(solver.net.learnable_params)})
        stats["resume_b"] = runner.engine.stats()
everything = job.gather(stats, root=0)
if job.rank == 0:
    np.savez(out + ".npz", **results)
    with open(out + ".json", "w") as f:
        json.dump(everything, f)
'''


def run_job(tmp_path, workers, servers, batch, modes, resume):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = str(tmp_path / "result")
    proc = subprocess.run([MPIEXEC, "-n", str(workers + servers), sys.executable, str(script),
                           os.path.dirname(__file__), str(batch), str(servers), out,
                           ",".join(modes), "1" if resume else "0"],
                          capture_output=True, text=True, timeout=240, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out + ".json") as f:
        return np.load(out + ".npz"), json.load(f)


def check_bytes(ranks, workers, servers, key):
    """Each host moves 2MN per blob; the servers together move 2MN per blob per host."""
    hosts = [s[key] for s in ranks[:workers]]
    shards = [s[key] for s in ranks[workers:]]
    total_mn = 0
    for name, predicted in hosts[0]["predicted"].items():
        assert hosts[0]["plan"][name] == "ps"
        total_mn += predicted / (4 * 2.0)
        for h in hosts:
            row = h["measured"][name]
            assert row["sent"] + row["received"] == pytest.approx(predicted, rel=0.05)
            assert row["sent"] == pytest.approx(predicted / 2, rel=0.05)
    for s in shards:
        assert s["iterations"] == hosts[0]["iterations"]
    load = [sum(r["sent"] + r["received"] for r in s["measured"].values()) for s in shards]
    # 2MN P/S per server node on average (rows are split by whole rows, so not exactly even)
    assert np.mean(load) == pytest.approx(4 * 2.0 * total_mn * workers / servers, rel=0.01)


@pytest.mark.mpi
@pytest.mark.parametrize("servers", [1, 2])
def test_two_workers_with_dedicated_servers_equal_one_worker(tmp_path, servers):
    workers, batch = 2, 3
    ref = inv.reference(workers * batch)
    modes = ["ps:1", "ps:0"]
    resume = servers == 2
    weights, ranks = run_job(tmp_path, workers, servers, batch, modes, resume)
    for mode in modes:
        key = mode.replace(":", "_")
        inv.check_same(weights, ref, key)
        check_bytes(ranks, workers, servers, key)
        assert all(s[key]["stale_reads"] == {n: 0 for n in s[key]["plan"]}
                   for s in ranks[:workers])
    if resume:
        # the momentum history lives on the servers only: resuming without it would differ
        inv.check_same(weights, ref, "resume")
        assert ranks[workers]["resume_a"]["iterations"] == 2
        assert ranks[workers]["resume_b"]["iterations"] == inv.ITERS - 2


STALE = r'''
import json, sys, time, types
import numpy as np
from mpi4py import MPI
from google.protobuf import text_format
from poseidon_caffe import sync
from poseidon_caffe.proto import caffe_pb2
from poseidon_caffe.solver import get_solver
job = MPI.COMM_WORLD
staleness, iters, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
opts = types.SimpleNamespace(sync="ps", staleness=staleness, ranks_per_host=1, server_ranks=1)
if sync.is_server(opts):
    stats = sync.serve(opts)
else:
    sp = caffe_pb2.SolverParameter()
    text_format.Merge('base_lr: 0.05 momentum: 0.5 lr_policy: "fixed" display: 0 '
                      'random_seed: 1 max_iter: %d' % iters, sp)
    text_format.Merge("""
    layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 16 dim: 8 } } }
    layer { name: "y" type: "Input" top: "y" input_param { shape { dim: 16 dim: 2 } } }
    layer { name: "fit" type: "InnerProduct" bottom: "x" top: "fit"
      inner_product_param { num_output: 2 weight_filler { type: "constant" value: 0 } } }
    layer { name: "loss" type: "EuclideanLoss" bottom: "fit" bottom: "y" top: "loss" }
    """, sp.net_param)
    solver = get_solver(sp)
    runner = sync.attach(solver, opts)
    rng = np.random.default_rng(100 + job.rank)
    truth = np.random.default_rng(7).standard_normal((8, 2)).astype(np.float32)
    losses = []
    for it in range(iters):
        x = rng.standard_normal((16, 8)).astype(np.float32)
        solver.net.blobs["x"].data[...] = x
        solver.net.blobs["y"].data[...] = x @ truth
        solver.step(1)
        losses.append(float(solver.net.blobs["loss"].data))
        if job.rank == 1:
            time.sleep(0.01)   # a slow worker, so that the other runs ahead
    runner.finish()
    stats = runner.engine.stats()
    stats["losses"] = losses
everything = job.gather(stats, root=0)
if job.rank == 0:
    with open(out, "w") as f:
        json.dump(everything, f)
'''


@pytest.mark.mpi
def test_stale_synchronous_run_with_a_dedicated_server_respects_the_bound(tmp_path):
    staleness, iters = 2, 80
    script = tmp_path / "stale.py"
    script.write_text(STALE)
    out = tmp_path / "stale.json"
    proc = subprocess.run([MPIEXEC, "-n", "3", sys.executable, str(script), str(staleness),
                           str(iters), str(out)], capture_output=True, text=True, timeout=180,
                          env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    workers, server = json.loads(out.read_text())[:2], json.loads(out.read_text())[2]
    reads = [age for w in workers for age in w["stale_reads"].values()]
    assert max(reads) <= staleness
    assert max(reads) >= 1, "the fast worker never ran ahead: the bound was not exercised"
    assert server["iterations"] == iters
    for w in workers:
        first, last = sum(w["losses"][:5]) / 5, sum(w["losses"][-5:]) / 5
        assert last < 0.01 * first, (first, last)


RAISER = r'''
import sys, types
from mpi4py import MPI
from google.protobuf import text_format
from poseidon_caffe import sync
from poseidon_caffe.proto import caffe_pb2
from poseidon_caffe.solver import get_solver
opts = types.SimpleNamespace(sync="ps", ranks_per_host=1, server_ranks=1)
if sync.is_server(opts):
    sync.serve(opts)
    sys.exit(0)
sp = caffe_pb2.SolverParameter()
text_format.Merge('base_lr: 0.01 lr_policy: "fixed" display: 0 max_iter: 100', sp)
text_format.Merge(open(sys.argv[1]).read(), sp.net_param)
solver = get_solver(sp)
runner = sync.attach(solver, opts)
solver.step(3)
if MPI.COMM_WORLD.rank == 1:
    raise RuntimeError("disk full while reading a batch")
solver.step(100)
'''

NET = """name: "dummy"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 6 } shape { dim: 4 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


@pytest.mark.mpi
def test_worker_that_raises_ends_the_job_and_its_servers(tmp_path):
    (tmp_path / "net.prototxt").write_text(NET)
    script = tmp_path / "raiser.py"
    script.write_text(RAISER)
    proc = subprocess.run([MPIEXEC, "-n", "3", sys.executable, str(script),
                           str(tmp_path / "net.prototxt")], capture_output=True, text=True,
                          timeout=120, env=ENV)
    assert proc.returncode != 0
    assert re.search(r"rank 1 on host \S+ \(pid \d+\) failed in training: RuntimeError: disk "
                     r"full while reading a batch", proc.stderr), proc.stderr[-2000:]


class FakeItem:
    def __init__(self, rows, cols, fc):
        self.index, self.name, self.count, self.rows = 0, "blob", rows * cols, rows
        self.sfb = FactorSource(cols, rows, read=None) if fc else None


@pytest.mark.parametrize("K,P,S", [(32, 2, 1), (256, 8, 2), (64, 4, 4), (2048, 16, 4)])
@pytest.mark.parametrize("shape", [(4096, 9216, True), (96, 363, False), (1000, 1024, True)])
def test_planner_prices_dedicated_servers_by_the_busier_node(shape, K, P, S):
    N, M, fc = shape
    item = FakeItem(N, M, fc)
    worker, server = 4 * 2.0 * M * N, 4 * 2.0 * M * N * P / S
    costs = {"ps": max(worker, server), "allreduce": 4 * 4.0 * M * N * (P - 1) / P}
    if fc:
        costs["sfb"] = 4 * 2.0 * K * (P - 1) * (M + N)
    assert planner.prices(item, K, P, S, dedicated=True) == pytest.approx(costs)
    best = min(costs.values())
    expected = [n for n in ("ps", "sfb", "allreduce") if n in costs and costs[n] == best][0]
    assert planner.choose(item, "auto", K, P, S, dedicated=True) == expected
    assert planner.host_price("ps", M, N, K, P, S, dedicated=True) == worker


def test_launcher_places_dedicated_servers_after_the_workers():
    hosts = [(0, "10.0.0.1", 9999), (1, "10.0.0.2", 9999)]
    args = build_command(hosts, [0], "s.prototxt", use_gpu=True, mpiexec="mpiexec",
                                  python="py", num_servers=3)
    assert args[:3] == ["mpiexec", "-hosts", "10.0.0.1:1,10.0.0.2:1,10.0.0.1:1,10.0.0.2:1,"
                                             "10.0.0.1:1"]
    segments = " ".join(args[3:]).split(" : ")
    assert len(segments) == 5
    assert all("-server_ranks=3" in seg for seg in segments)
    # the workers drive a device each; a server drives none
    assert ["-gpu=0" in seg for seg in segments] == [True, True, False, False, False]
