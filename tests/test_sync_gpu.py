"""The sync engine's invariant with one rank per (emulated) device, on real mpiexec runs over
loopback: rank r drives device r; P device workers of batch B end with the weights of one CPU
worker of batch P*B in every sync mode, with wait-free backprop on and off, as two hosts or as
two devices of one host; a resumed device run ends as the uninterrupted one; and per iteration
a device rank moves exactly its gradients (or an InnerProduct's factors) out of the device and
the fresh weights (or every worker's factors) in, besides what a single device run moves."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import jobs
import test_sync_invariant as invariant
from poseidon_caffe.backend.cuda import build
from poseidon_caffe.io import read_net_weights

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(build.host_compiler() is None
                                 or shutil.which(build.host_compiler()) is None,
                                 reason="no C++ compiler for the emulated device's kernels")]

PY = sys.executable
MPIEXEC = invariant.MPIEXEC
RANKS = 2
BATCH = 4
ENV = dict(os.environ, POSEIDON_NO_PROGRESS="1", POSEIDON_CAFFE_GPU="emulated",
           POSEIDON_CAFFE_EMULATED_DEVICES=str(RANKS))

WORKER = r'''
import json, sys, types
import numpy as np
from mpi4py import MPI
sys.path.insert(0, sys.argv[1])
from poseidon_caffe import backend
backend.set_device(int(sys.argv[6]))          # this rank's device, as -gpu=<id> sets it
backend.set_mode_gpu()
import test_sync_invariant as t
from poseidon_caffe import sync
comm = MPI.COMM_WORLD
batch, rph, out = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
modes = [(m, d == "1") for m, d in (x.split(":") for x in sys.argv[5].split(","))]
X, Y = t.dataset(batch * comm.size)
driver = backend.get_backend().driver


def steps(solver, rank):
    """Train ITERS iterations; the device's copies of each iteration (step to step)."""
    windows = []
    for it in range(t.ITERS):
        before = driver.transfers.snapshot()
        solver.net.blobs["data"].data[...] = X[it, rank * batch:(rank + 1) * batch]
        solver.net.blobs["label"].data[...] = Y[it, rank * batch:(rank + 1) * batch]
        solver.step(1)
        windows.append(driver.transfers.since(before).__dict__)
    return windows


results, stats = {}, {"single": None}
if comm.rank == 0:
    # what one device alone moves per iteration: the batch, the labels, the loss
    stats["single"] = steps(t.make_solver(batch), 0)
for mode, dwbp in modes:
    solver = t.make_solver(batch)
    runner = sync.attach(solver, types.SimpleNamespace(sync=mode, dwbp=dwbp, svb=True,
                                                       staleness=0, ranks_per_host=rph))
    windows = steps(solver, comm.rank)
    runner.finish()
    weights = [b.data.copy() for b in solver.net.learnable_params]
    key = "%s_%d" % (mode, dwbp)
    results.update({"%s_%d" % (key, i): w for i, w in enumerate(weights)})
    diffs = [(b.synced_diff.dtoh_copies, b.synced_diff.htod_copies)
             for b in solver.net.learnable_params]
    items = [(i.name, i.count, i.strategy, i.sfb.M if i.sfb else 0, i.sfb.N if i.sfb else 0)
             for i in runner.engine.items]
    stats[key] = comm.gather(dict(runner.engine.stats(), windows=windows, diffs=diffs,
                                  items=items), root=0)
if comm.rank == 0:
    np.savez(out + ".npz", **results)
    with open(out + ".json", "w") as f:
        json.dump(stats, f)
'''


def per_rank(command):
    """mpiexec's MPMD form: rank r runs ``command(r)`` (its own -gpu)."""
    args = [MPIEXEC]
    for rank in range(RANKS):
        if rank:
            args.append(":")
        args += ["-n", "1"] + command(rank)
    return args


def run_job(tmp_path, ranks_per_host, modes):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = str(tmp_path / "result")
    tests = os.path.dirname(__file__)
    proc = subprocess.run(per_rank(lambda r: [PY, str(script), tests, str(BATCH),
                                              str(ranks_per_host), out, ",".join(modes),
                                              str(r)]),
                          capture_output=True, text=True, timeout=400, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out + ".json") as f:
        return np.load(out + ".npz"), json.load(f)


MODES = invariant.MODES


def test_device_workers_equal_one_cpu_worker_of_p_times_batch(tmp_path):
    ref = invariant.reference(RANKS * BATCH)       # on the CPU, in this process
    weights, stats = run_job(tmp_path, 1, MODES)
    for mode in MODES:
        key = mode.replace(":", "_")
        invariant.check_same(weights, ref, key)
        invariant.check_bytes_match_prediction(stats[key])
        # no gradient ever went through the blobs' host copies
        for rank in stats[key]:
            assert all(d == [0, 0] for d in rank["diffs"]), (key, rank["diffs"])
    plans = {key: stats[key][0]["plan"] for key in stats if key != "single"}
    assert set(plans["ps_1"].values()) == {"ps"}
    assert plans["sfb_1"]["ip1[0]"] == "sfb" and plans["sfb_1"]["conv1[0]"] == "ps"
    assert plans["auto_1"]["ip1[0]"] == "sfb"       # -svb on two hosts
    assert set(plans["allreduce_1"].values()) == {"allreduce"}


def test_two_devices_of_one_host_equal_the_flat_run(tmp_path):
    ref = invariant.reference(RANKS * BATCH)
    modes = ["auto:1", "allreduce:0", "ps:1"]
    weights, stats = run_job(tmp_path, 2, modes)
    for mode in modes:
        key = mode.replace(":", "_")
        invariant.check_same(weights, ref, key)
        assert [s["host"] for s in stats[key]] == [0, 0]


def expected_traffic(single, items, workers):
    """(dtoh calls, dtoh bytes, htod calls, htod bytes) of one steady iteration of a device
    rank: a single device's, plus per blob its gradient out and its fresh weights in, or, for
    a blob travelling as factors, its layer's top diff and bottom data rows out and every
    worker's in (one upload)."""
    dtoh_calls, dtoh_bytes = single["dtoh_calls"], single["dtoh_bytes"]
    htod_calls, htod_bytes = single["htod_calls"], single["htod_bytes"]
    for _, count, strategy, M, N in items:
        if strategy == "sfb":
            dtoh_calls += 2
            dtoh_bytes += 4 * BATCH * (M + N)
            htod_calls += 1
            htod_bytes += 4 * workers * BATCH * (M + N)
        else:
            dtoh_calls += 1
            dtoh_bytes += 4 * count
            htod_calls += 1
            htod_bytes += 4 * count
    return dtoh_calls, dtoh_bytes, htod_calls, htod_bytes


def test_a_device_rank_moves_its_gradients_out_and_fresh_weights_in(tmp_path):
    modes = ["ps:1", "allreduce:0", "sfb:1"]
    _, stats = run_job(tmp_path, 1, modes)
    single = stats["single"][-1]
    # the single run's own steps move no weights: the batch, labels and loss only
    assert single["htod_bytes"] < 4 * 3 * BATCH * 2 * 6 * 6
    for mode in modes:
        key = mode.replace(":", "_")
        for rank in stats[key]:
            want = expected_traffic(single, rank["items"], RANKS)
            # iteration 0 has no fresh weights to take in yet; 1 and 2 are steady
            for window in rank["windows"][1:]:
                got = (window["dtoh_calls"], window["dtoh_bytes"], window["htod_calls"],
                       window["htod_bytes"])
                assert got == want, (key, rank["rank"], got, want)
                assert window["dtod_calls"] == single["dtod_calls"]


@pytest.mark.parametrize("mode", ["ps", "sfb", "allreduce"])
def test_resumed_device_run_ends_with_the_uninterrupted_weights(tmp_path, mode):
    import test_sync_resume as resume
    (tmp_path / "net.prototxt").write_text(resume.NET)

    def train(prefix, max_iter, snapshot=""):
        solver = tmp_path / ("%s_solver.prototxt" % prefix)
        solver.write_text('net: "%s"\nbase_lr: 0.05 momentum: 0.9 weight_decay: 0.001\n'
                          'lr_policy: "step" gamma: 0.5 stepsize: 2 display: 0 '
                          'random_seed: 11\nmax_iter: %d snapshot: 3 snapshot_prefix: "%s"\n'
                          % (tmp_path / "net.prototxt", max_iter, tmp_path / prefix))
        args = ["-m", "poseidon_caffe.cli", "train", "-solver=%s" % solver, "-sync=%s" % mode,
                "-ranks_per_host=1", "-svb=true"] + (["-snapshot=%s" % snapshot]
                                                     if snapshot else [])
        proc = subprocess.run(per_rank(lambda r: [PY] + args + ["-gpu=%d" % r]),
                              capture_output=True, text=True, timeout=300, env=ENV)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "emulated device" in proc.stderr

    train("straight", 6)
    train("stopped", 3)
    train("stopped", 6, snapshot=str(tmp_path / "stopped_iter_3.solverstate"))
    jobs.assert_resumed_equals_straight(str(tmp_path))


@pytest.mark.parametrize("mode, extra", [
    ("allreduce", ""), ("ps", ""),
    # gradient accumulation and global-norm clipping: sfb's product is then taken on the host
    ("sfb", "iter_size: 2\nclip_gradients: 0.5\n"), ("sfb", "iter_size: 2\n")])
def test_device_workers_on_shards_equal_one_cpu_worker_of_twice_the_batch(tmp_path, mode,
                                                                          extra):
    from poseidon_caffe.data.mnist_embedded import ensure_mnist_lmdbs
    from jobs import write_lenet_job
    train_db, test_db = ensure_mnist_lmdbs(str(tmp_path / "digits"))

    def job(name, batch):
        # a test pass at iterations 2 and 4: the device's weights must be current for it
        solver = write_lenet_job(tmp_path, name, batch, train_db, test_db, extra)
        with open(solver) as f:
            text = f.read().replace("test_interval: 1000", "test_interval: 2")
        with open(solver, "w") as f:
            f.write(text)
        return solver

    def test_losses(log):
        return [float(line.split("loss = ")[1].split()[0]) for line in log.splitlines()
                if "Test net output" in line and "loss = " in line]

    one = job("one", 16)
    proc = subprocess.run([PY, "-m", "poseidon_caffe.cli", "train", "-solver=%s" % one],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, POSEIDON_NO_PROGRESS="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    expected = test_losses(proc.stderr)
    two = job("two", 8)
    proc = subprocess.run(per_rank(lambda r: [PY, "-m", "poseidon_caffe.cli", "train",
                                              "-solver=%s" % two, "-sync=%s" % mode,
                                              "-gpu=%d" % r]),
                          capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(expected) == 2
    np.testing.assert_allclose(test_losses(proc.stderr), expected, rtol=1e-4)
    _, single = read_net_weights(str(tmp_path / "one_iter_4.caffemodel"))
    _, joint = read_net_weights(str(tmp_path / "two_iter_4.caffemodel"))
    for layer in ("conv1", "conv2", "ip1", "ip2"):
        for a, b in zip(single[layer], joint[layer]):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=2e-6, err_msg=layer)


def _float_job(tmp_path, name, extra=""):
    import test_sync_update_rules as rules
    from jobs import write_float_db
    if not (tmp_path / "db").exists():
        write_float_db(tmp_path / "db", rules.X, rules.Y)
        (tmp_path / "net.prototxt").write_text(rules.NET % (tmp_path / "db"))
    solver = tmp_path / (name + ".prototxt")
    solver.write_text('net: "%s"\nbase_lr: %g momentum: %g weight_decay: %g lr_policy: "fixed"\n'
                      'max_iter: %d display: 0 snapshot_prefix: "%s"\nrandom_seed: 1\n%s'
                      % (tmp_path / "net.prototxt", rules.LR, rules.MOMENTUM, rules.DECAY,
                         rules.ITERS, tmp_path / name, extra))
    return solver, rules


def _train_on_devices(solver, args):
    proc = subprocess.run(per_rank(lambda r: [PY, "-m", "poseidon_caffe.cli", "train",
                                              "-solver=%s" % solver, "-gpu=%d" % r] + args),
                          capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("rule, sync", [("server", "ps"), ("worker", "ps"),
                                        ("worker", "allreduce"), ("server", "sfb")])
def test_update_rules_on_devices_match_numpy(tmp_path, rule, sync):
    solver, rules = _float_job(tmp_path, "m")
    _train_on_devices(solver, ["-sync=%s" % sync, "-ps_update=%s" % rule])
    _, weights = read_net_weights(str(tmp_path / ("m_iter_%d.caffemodel" % rules.ITERS)))
    w, b = rules.by_numpy(rule)
    np.testing.assert_allclose(weights["ip"][0].ravel(), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(weights["ip"][1].ravel(), [b], rtol=1e-5, atol=1e-6)


def test_worker_rule_on_devices_resumes_every_workers_own_history(tmp_path):
    solver, rules = _float_job(tmp_path, "whole", "snapshot: 2\n")
    _train_on_devices(solver, ["-sync=ps", "-ps_update=worker"])
    assert (tmp_path / "whole_iter_2.rank1.history.npz").exists()
    (tmp_path / ("whole_iter_%d.caffemodel" % rules.ITERS)).unlink()
    _train_on_devices(solver, ["-sync=ps", "-ps_update=worker",
                               "-snapshot=%s" % (tmp_path / "whole_iter_2.solverstate")])
    _, resumed = read_net_weights(str(tmp_path / ("whole_iter_%d.caffemodel" % rules.ITERS)))
    w, b = rules.by_numpy("worker")
    np.testing.assert_allclose(resumed["ip"][0].ravel(), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(resumed["ip"][1].ravel(), [b], rtol=1e-5, atol=1e-6)


def test_stale_synchronous_device_run_converges_within_the_bound(tmp_path):
    """With staleness s the pinned weights may be written while a device reads older ones:
    the reads stay within the bound and the run still learns."""
    import test_sync_staleness as stale
    staleness = 2
    script = tmp_path / "worker.py"
    script.write_text("import sys\nfrom poseidon_caffe import backend\n"
                      "backend.set_device(int(sys.argv[4]))\nbackend.set_mode_gpu()\n"
                      + stale.WORKER)
    out = tmp_path / "stats.json"
    proc = subprocess.run(per_rank(lambda r: [PY, str(script), str(staleness), "120", str(out),
                                              str(r)]),
                          capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = json.loads(out.read_text())
    reads = [age for r in ranks for age in r["stale_reads"].values()]
    assert max(reads) <= staleness
    for r in ranks:
        first, last = sum(r["losses"][:5]) / 5, sum(r["losses"][-5:]) / 5
        assert last < 0.01 * first, (first, last)
