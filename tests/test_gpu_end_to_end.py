"""GPU training at scale, everything together, on two emulated devices and real mpiexec: the
MNIST example's LeNet on a real LMDB, started as a user starts it (``mpiexec -n 2
poseidon-caffe train -gpu 0,1``, and a run_local.py's ``devices = [0, 1]``), each rank on its
own device with the batch ring, the device-kept loss and wait-free backprop through pinned
buffers. The snapshot equals a single CPU process's at twice the batch; each rank's log names
its GPU; and each iteration of a rank moves its batch in, its gradients (or an InnerProduct's
factors) out and the fresh weights (or every worker's factors) in, with no host wait."""
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from poseidon_caffe.data.mnist_embedded import ensure_mnist_lmdbs
from poseidon_caffe.io import read_net_weights
from poseidon_caffe.launch import launcher

from emulated_device import needs_compiler
from jobs import write_lenet_job

pytestmark = [pytest.mark.mpi, needs_compiler]

PY = sys.executable
MPIEXEC = os.path.join(os.path.dirname(PY), "mpiexec")
RANKS, BATCH, ITERS = 2, 8, 5
LAYERS = ("conv1", "conv2", "ip1", "ip2")
BATCH_BYTES = BATCH * (28 * 28 + 1) * 4          # a rank's data and labels, float32
PREFETCH = 4                                     # data_param's default: the ring's depth


def device_env():
    env = dict(os.environ, POSEIDON_NO_PROGRESS="1", POSEIDON_CAFFE_GPU="emulated",
               POSEIDON_CAFFE_EMULATED_DEVICES=str(RANKS))
    for name in ("POSEIDON_CAFFE_EMULATED_FAIL", "POSEIDON_CAFFE_EMULATED_MEMORY"):
        env.pop(name, None)
    return env


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return ensure_mnist_lmdbs(str(tmp_path_factory.mktemp("digits")))


@pytest.fixture(scope="module")
def cpu_weights(digits, tmp_path_factory):
    """The final snapshot of one CPU process training at batch RANKS * BATCH."""
    folder = tmp_path_factory.mktemp("cpu")
    solver = write_lenet_job(folder, "one", RANKS * BATCH, *digits, max_iter=ITERS)
    env = dict(os.environ, POSEIDON_NO_PROGRESS="1")
    env.pop("POSEIDON_CAFFE_GPU", None)
    proc = subprocess.run([PY, "-m", "poseidon_caffe.cli", "train", "-solver=" + solver],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, weights = read_net_weights(str(folder / ("one_iter_%d.caffemodel" % ITERS)))
    return weights


def check_same_weights(path, expected):
    """The tolerance of the CPU invariant tests (tests/test_sync_invariant.py)."""
    _, got = read_net_weights(str(path))
    worst = 0.0
    for layer in LAYERS:
        for a, b in zip(expected[layer], got[layer]):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=2e-6, err_msg=layer)
            worst = max(worst, float(np.max(np.abs(a - b))))
    return worst


def check_logs_name_their_gpu(logs, gpus):
    for rank, gpu in enumerate(gpus):
        text = (logs / ("caffe.rank%d.log" % rank)).read_text()
        assert "This rank drives GPU %d (the emulated device)" % gpu in text
        assert "drives GPU %d" % gpus[1 - rank] not in text
        assert "Optimization Done" in text


def check_transfers_per_iteration(worker, sizes):
    """A rank's copies over its iterations after the first (its stats' device_transfers):
    per iteration each exchanged blob's gradient out and fresh weights in, or for a blob sent
    as factors its layer's top diff and bottom data rows out and every worker's in; the
    prefetch thread's batches (data and labels) in; and no wait of the computation for the
    device. Returns (iterations, batches, host waits)."""
    moved = worker["device_transfers"]
    n = moved["iterations"]
    assert n == ITERS - 1
    out_calls = out_bytes = in_calls = in_bytes = 0
    for name, strategy in worker["plan"].items():
        if strategy == "sfb":
            N, M = sizes[name]                    # the weight is N outputs x M inputs
            out_calls += 2
            out_bytes += 4 * BATCH * (M + N)
            in_calls += 1
            in_bytes += 4 * RANKS * BATCH * (M + N)
        else:
            count = int(np.prod(sizes[name]))
            out_calls += 1
            out_bytes += 4 * count
            in_calls += 1
            in_bytes += 4 * count
    assert (moved["dtoh_calls"], moved["dtoh_bytes"]) == (n * out_calls, n * out_bytes)
    # the prefetch thread runs ahead of the computation by at most the ring: the batches it
    # pushed in the window are counted from its copies, two per batch
    batches, odd = divmod(moved["htod_calls"] - n * in_calls, 2)
    assert odd == 0 and abs(batches - n) <= PREFETCH + 1, moved
    assert moved["htod_bytes"] == n * in_bytes + batches * BATCH_BYTES, moved
    assert moved["host_syncs"] == 0, moved
    return n, batches, moved["host_syncs"]


def blob_sizes(weights):
    return {"%s[%d]" % (layer, i): blob.shape for layer in LAYERS
            for i, blob in enumerate(weights[layer])}


def test_mpiexec_gpu_list_trains_as_one_cpu_process_of_twice_the_batch(digits, cpu_weights,
                                                                      tmp_path):
    solver = write_lenet_job(tmp_path, "two", BATCH, *digits, max_iter=ITERS)
    proc = subprocess.run([MPIEXEC, "-n", str(RANKS), PY, "-m", "poseidon_caffe.cli", "train",
                           "-solver=" + solver, "-gpu", "0,1", "-output_dir=out"],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=300,
                          env=device_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_same_weights(tmp_path / ("two_iter_%d.caffemodel" % ITERS), cpu_weights)
    check_logs_name_their_gpu(tmp_path / "out", [0, 1])
    for rank in range(RANKS):
        worker = json.loads((tmp_path / "out" / ("sync_stats.rank%d.json" % rank)).read_text())
        check_transfers_per_iteration(worker, blob_sizes(cpu_weights))
        log = (tmp_path / "out" / ("caffe.rank%d.log" % rank)).read_text()
        assert "0 host waits" in log


def test_run_local_devices_with_sfb_train_as_one_cpu_process_of_twice_the_batch(
        digits, cpu_weights, tmp_path, monkeypatch):
    """What a run_local.py with ``devices = [0, 1]`` and ``sync = "sfb"`` does: one mpiexec,
    a rank per listed GPU; the InnerProduct weights travel as sufficient factors."""
    solver = write_lenet_job(tmp_path, "two", BATCH, *digits, max_iter=ITERS)
    (tmp_path / "localserver").write_text("0 127.0.0.1 9999\n")
    monkeypatch.delenv("POSEIDON_CAFFE_EMULATED_FAIL", raising=False)
    monkeypatch.delenv("POSEIDON_CAFFE_EMULATED_MEMORY", raising=False)
    for name, value in device_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    code = launcher.launch_from_settings(
        {"solver": solver, "devices": [0, 1], "sync": "sfb", "dataset": "digits"},
        repo_root=str(tmp_path), stream=io.StringIO())
    assert code == 0
    check_same_weights(tmp_path / ("two_iter_%d.caffemodel" % ITERS), cpu_weights)
    out = tmp_path / "output" / "caffe.digits.S0.M1.T2"
    check_logs_name_their_gpu(out / "logs.0", [0, 1])
    workers = json.loads((out / "caffe_stats.yaml").read_text())["workers"]
    assert [w["rank"] for w in workers] == [0, 1]
    for worker in workers:
        assert worker["plan"]["ip1[0]"] == "sfb" and worker["plan"]["ip2[0]"] == "sfb"
        check_transfers_per_iteration(worker, blob_sizes(cpu_weights))
