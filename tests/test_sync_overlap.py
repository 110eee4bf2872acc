"""Several exchanges in flight at once, on real mpiexec runs over loopback: with N channels (by
default one per bucket) the communication thread starts up to N buckets' exchanges before the
first has ended (counted by the engine's own instrumentation), with one channel never two; either way P workers of batch B
still end with one worker's weights at batch P*B and the bytes the plan predicts, also as
2 hosts x 2 devices, where the devices' collectives run on every channel's communicators. An
exchange whose peer never comes names that peer when its deadline passes."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import test_sync_invariant as invariant  # noqa: E402

pytestmark = pytest.mark.mpi          # every test here runs mpiexec

WORKER = r'''
import json, sys, types
import numpy as np
from mpi4py import MPI
sys.path.insert(0, sys.argv[1])
import test_sync_invariant as t
from poseidon_caffe import sync
comm = MPI.COMM_WORLD
batch, rph, out = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
servers = int(sys.argv[6]) if len(sys.argv) > 6 else 0
X, Y = t.dataset(batch * (comm.size - servers))
results, stats = {}, {}
for run in sys.argv[5].split(","):
    mode, dwbp, channels, offload = (run.split(":") + ["262144"])[:4]
    # fuse_bytes 0: every blob is a bucket of its own, six of them; offload_size 0: every
    # update, factor product and replica copy on the worker thread
    options = types.SimpleNamespace(
        sync=mode, dwbp=dwbp == "1", svb=True, staleness=0, ranks_per_host=rph,
        comm_channels=int(channels), fuse_bytes=0, offload_size=int(offload),
        server_ranks=servers)
    if sync.is_server(options):
        stats[run] = sync.serve(options)
        continue
    solver = t.make_solver(batch)
    runner = sync.attach(solver, options)
    t.train(solver, X, Y, comm.rank, batch)
    runner.finish()
    results.update({"%s_%d" % (run, i): b.data.copy()
                    for i, b in enumerate(solver.net.learnable_params)})
    stats[run] = runner.engine.stats()
stats = comm.gather(stats, root=0)
if comm.rank == 0:
    stats = {run: [s[run] for s in stats] for run in stats[0]}
    np.savez(out + ".npz", **results)
    with open(out + ".json", "w") as f:
        json.dump(stats, f)
'''


def run_job(tmp_path, ranks, batch, ranks_per_host, runs, servers=0):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = str(tmp_path / "result")
    proc = subprocess.run([invariant.MPIEXEC, "-n", str(ranks + servers), sys.executable,
                           str(script), os.path.dirname(__file__), str(batch),
                           str(ranks_per_host), out, ",".join(runs), str(servers)],
                          capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, POSEIDON_NO_PROGRESS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    weights = np.load(out + ".npz")
    with open(out + ".json") as f:
        return weights, json.load(f)


def test_several_exchanges_are_in_flight_at_once_and_the_result_is_exact(tmp_path):
    ref = invariant.reference(2 * 4)
    # without DWBP the six buckets are handed over together after backward: four channels
    # start four of them at once, one channel one at a time
    runs = ["allreduce:0:4", "allreduce:0:1", "ps:0:4", "ps:1:3", "auto:1:0", "sfb:0:2"]
    weights, stats = run_job(tmp_path, 2, 4, 1, runs)
    for run in runs:
        invariant.check_same(weights, ref, run)
        invariant.check_bytes_match_prediction(stats[run])
        for s in stats[run]:
            channels = int(run.split(":")[2]) or 6      # 0: a channel per bucket
            assert s["channels"] == channels
            assert s["exchanges"] == 6 * invariant.ITERS
            assert 1 <= s["in_flight_peak"] <= channels
    for s in stats["allreduce:0:4"] + stats["ps:0:4"]:
        assert s["in_flight_peak"] >= 2 and s["overlapped_exchanges"] > 0
    for s in stats["allreduce:0:1"]:
        assert s["in_flight_peak"] == 1 and s["overlapped_exchanges"] == 0


def test_two_hosts_of_two_devices_overlap_exchanges_exactly(tmp_path):
    ref = invariant.reference(8)
    runs = ["ps:0:4", "allreduce:1:3", "auto:0:0"]
    weights, stats = run_job(tmp_path, 4, 2, 2, runs)
    for run in runs:
        invariant.check_same(weights, ref, run)
        invariant.check_bytes_match_prediction(stats[run])
        assert [s["host"] for s in stats[run]] == [0, 0, 1, 1]
    for s in stats["ps:0:4"]:
        assert s["in_flight_peak"] >= 2


def test_numeric_work_on_the_worker_thread_is_exact(tmp_path):
    """Updates, factor products, shard updates and replica copies handed to the worker
    thread (every one of them here) leave the weights one worker of batch P*B ends with."""
    ref = invariant.reference(2 * 4)
    runs = ["ps:1:0:0", "sfb:1:0:0", "allreduce:0:0:0", "auto:1:1:0"]
    weights, stats = run_job(tmp_path, 2, 4, 1, runs)
    for run in runs:
        invariant.check_same(weights, ref, run)
        invariant.check_bytes_match_prediction(stats[run])
    # 2 hosts of 2 devices: the level-1 collectives around the worker thread's work
    ref = invariant.reference(8)
    weights, stats = run_job(tmp_path, 4, 2, 2, ["ps:1:0:0", "allreduce:1:2:0"])
    for run in ("ps:1:0:0", "allreduce:1:2:0"):
        invariant.check_same(weights, ref, run)


def test_a_dedicated_server_updating_on_its_own_thread_is_exact(tmp_path):
    ref = invariant.reference(2 * 3)
    runs = ["ps:1:0:0", "ps:0:0:0"]
    weights, stats = run_job(tmp_path, 2, 3, 1, runs, servers=1)
    for run in runs:
        invariant.check_same(weights, ref, run)
        server = stats[run][2]
        assert server["iterations"] == invariant.ITERS


SILENT_PEER = r'''
import sys, time, types
import numpy as np
from mpi4py import MPI
sys.path.insert(0, sys.argv[1])
import test_sync_invariant as t
from poseidon_caffe import sync
comm = MPI.COMM_WORLD
solver = t.make_solver(2)
runner = sync.attach(solver, types.SimpleNamespace(sync="allreduce", ranks_per_host=1,
                                                   sync_timeout=2, fuse_bytes=0))
if comm.rank == 1:
    time.sleep(120)          # alive, but never exchanges: rank 0's deadline passes
X, Y = t.dataset(2 * comm.size)
t.train(solver, X, Y, comm.rank, 2)
'''


def test_an_exchange_past_its_deadline_names_the_silent_peer(tmp_path):
    script = tmp_path / "silent.py"
    script.write_text(SILENT_PEER)
    proc = subprocess.run([invariant.MPIEXEC, "-n", "2", sys.executable, str(script),
                           os.path.dirname(__file__)], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, POSEIDON_NO_PROGRESS="1"))
    assert proc.returncode != 0
    assert "rank 0 on host" in proc.stderr
    assert re.search(r"exchanging \S+ \(iteration 0\): no answer within 2 s from rank 1 "
                     r"\(host 1, ", proc.stderr), proc.stderr[-3000:]
